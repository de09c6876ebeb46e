"""The pages under docs/ name, for each claim, the test that holds it: those tests exist, and
the README links every page."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
CITED = re.compile(r"`(test_\w+\.py)::(test_\w+)`")
# Each page states its claims with tests; fewer citations than this means claims went unproved.
AT_LEAST = {"delivery.md": 30, "architecture.md": 25, "reliability.md": 6}


def defined_tests(file: str) -> set[str]:
    """Names of the test functions at the top level of ``tests/<file>``."""
    path = ROOT / "tests" / file
    if not path.exists():
        return set()
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_test_a_docs_page_names_exists(page: Path) -> None:
    named = CITED.findall(page.read_text())
    assert len(named) >= AT_LEAST.get(page.name, 0), f"{page.name} proves too few claims"
    missing = [f"{f}::{t}" for f, t in named if t not in defined_tests(f)]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_readme_links_every_docs_page(page: Path) -> None:
    assert f"docs/{page.name}" in (ROOT / "README.md").read_text()
