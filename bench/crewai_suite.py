"""CrewAI's own flow tests as the measure of our drop-in compatibility (`make crewai-suite`).

Takes CrewAI's test files from its repository (a bare git directory or a checkout: the
first argument, else ``CREWAI_REPO``, else the mirror below), writes them into a temporary
directory with their bodies unchanged and only their ``crewai`` import lines rewritten by
the explicit table :data:`MODULES` (as a user moving a flow over changes imports), runs
pytest on each file with this venv against the real Redis database the tests use
(``RUNNER_TEST_DB``), and prints a table per file and the failures grouped by cause.

Nothing is copied into this repository: the files live in the temporary directory only.

**What an import becomes.** ``from crewai.x import A`` becomes ``from <ours> import A``
when :data:`MODULES` maps ``crewai.x`` and ``<ours>`` has ``A``; otherwise ``A`` is bound to
a placeholder that raises ``ModuleNotFoundError("no counterpart in runner: crewai.x.A")``
when a test uses it (called, read, or a class built on it instantiated). So a crewai-only
name fails the tests that use it, not the whole file: such tests count as failures.

**Excluded tests** (the rule, applied to a test function's source text, decorators
included, together with the source of every module-level function or class of the file it
names, and of those they name in turn): a test is left out, and listed, when it reads
CrewAI's event bus or its private internals, that is when that source

* names ``crewai_event_bus`` or ``crewai.events``, or a name the file imports from a
  ``crewai.events`` module (its event classes);
* reads or sets an attribute whose name starts with one underscore (``obj._x``; dunders
  such as ``__name__`` are public);
* patches a CrewAI object by its import path (``patch("crewai....")``,
  ``patch.object(crewai...)``) or names a private CrewAI module (a ``._x`` path segment
  after ``crewai.``), or a name the file imports from one.

Everything else counts. The percentage is passed / (tests - excluded).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_REPO = "/work/.mirror/crewAIInc+crewAI/repo"
TEST_DIR = "lib/crewai/tests"
FILES = (
    "test_flow_definition.py",
    "test_flow_from_definition.py",
    "test_flow_visualization.py",
    "test_flow_conversation.py",
)

MODULES: dict[str, str] = {
    # the authoring surface: `from crewai.flow import Flow, start, ...`
    "crewai": "runner",
    "crewai.flow": "runner",
    "crewai.flow.flow": "runner",
    "crewai.flow.dsl": "runner",
    "crewai.flow.persistence": "runner",
    "crewai.flow.persistence.base": "runner",
    "crewai.flow.async_feedback": "runner",
    "crewai.flow.async_feedback.types": "runner",
    "crewai.flow.flow_config": "runner",
    "crewai.state.checkpoint_config": "runner",
    "crewai.state.provider.json_provider": "runner",
    # flows as data
    "crewai.flow.flow_definition": "runner.flow.definition",
    "crewai.flow.expressions": "runner.flow.expressions",
    "crewai.project.crew_definition": "runner.flow.definition",
    "crewai.flow.visualization": "runner.flow.visualization",
    "crewai.flow.visualization.builder": "runner.flow.visualization",
    # conversations
    "crewai.flow.conversation": "runner.flow.conversation",
    # tools a definition's `call: tool` names
    "crewai.tools": "runner",
    "crewai.experimental": "runner",
    "crewai.experimental.conversational": "runner.flow.conversation",
}
"""CrewAI module -> ours. A module not here has no counterpart."""

EVENT_MODULE = re.compile(r"^crewai\.events(\.|$)")
PRIVATE_MODULE = re.compile(r"^crewai(\.\w+)*\._\w")
PRIVATE_ATTR = re.compile(r"\.(_[A-Za-z0-9]\w*)")
DIRECT = re.compile(
    r"crewai_event_bus|crewai\.events|patch(\.object)?\(\s*[\"']?crewai[.\"']|crewai(\.\w+)*\._\w"
)

SHIM = '''"""CrewAI names with no counterpart in runner (written by bench/crewai_suite.py)."""


class Missing:
    """A crewai-only name: any use raises, naming it."""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def _fail(self, *args, **kwargs):
        raise ModuleNotFoundError(f"no counterpart in runner: {self._name}")

    __call__ = _fail

    def __getattr__(self, attr):
        self._fail()

    def __getitem__(self, key):
        self._fail()

    def __mro_entries__(self, bases):
        name = self._name

        class Unavailable:
            def __init__(self, *args, **kwargs):
                raise ModuleNotFoundError(f"no counterpart in runner: {name}")

        return (Unavailable,)


def bind(module, names):
    """``names`` as (name, alias) from ``module`` when it has them, else placeholders."""
    import importlib

    try:
        target = importlib.import_module(module) if module else None
    except ImportError:
        target = None
    out = []
    for name, source in names:
        if target is not None and hasattr(target, name):
            out.append(getattr(target, name))
        else:
            out.append(Missing(f"{source}.{name}"))
    return out


def module(ours, source):
    """Our module for ``import crewai.x as m``, else a placeholder."""
    import importlib

    if ours:
        try:
            return importlib.import_module(ours)
        except ImportError:
            pass
    return Missing(source)
'''

CONFTEST = '''"""Deselects the excluded tests and records each outcome (bench/crewai_suite.py)."""

import json
import os

EXCLUDED = set(json.loads(os.environ["CREWAI_SUITE_EXCLUDED"]))
OUT = os.environ["CREWAI_SUITE_OUT"]
RESULTS = {}


def pytest_collection_modifyitems(config, items):
    kept, dropped = [], []
    for item in items:
        (dropped if item.originalname in EXCLUDED else kept).append(item)
    for item in dropped:
        RESULTS[item.nodeid] = {"outcome": "excluded", "cause": ""}
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)


def _cause(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0] if crash.message else ""
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


def pytest_runtest_logreport(report):
    entry = RESULTS.setdefault(report.nodeid, {"outcome": "passed", "cause": ""})
    if report.skipped and report.when in ("setup", "call"):
        entry.update(outcome="skipped", cause=_cause(report))
    elif report.failed and report.when == "call":
        entry.update(outcome="failed", cause=_cause(report))
    elif report.failed and entry["outcome"] == "passed":
        entry.update(outcome="errored", cause=_cause(report))


def pytest_collectreport(report):
    if report.failed:
        RESULTS[report.nodeid or "<collection>"] = {"outcome": "errored", "cause": _cause(report)}


def pytest_sessionfinish(session):
    with open(OUT, "w") as f:
        json.dump(RESULTS, f)
'''


def read_source(repo: str, name: str) -> str:
    """A test file of CrewAI's, from a git directory (its HEAD) or a checkout."""
    path = Path(repo)
    if (path / TEST_DIR / name).is_file():
        return (path / TEST_DIR / name).read_text(encoding="utf-8")
    done = subprocess.run(
        ["git", f"--git-dir={repo}", "show", f"HEAD:{TEST_DIR}/{name}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"crewai-suite: cannot read {TEST_DIR}/{name} from {repo}")
    return done.stdout


@dataclass
class Rewritten:
    """A test file with its crewai imports rewritten, and what the rule excludes."""

    text: str
    excluded: list[str]
    tests: list[str] = field(default_factory=list)


def rewrite_import(node: ast.stmt, indent: str) -> str | None:
    """The lines replacing one ``crewai`` import statement, or None for other imports."""
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        source = node.module
        if not (source == "crewai" or source.startswith("crewai.")):
            return None
        ours = MODULES.get(source, "")
        names = [(a.name, a.asname or a.name) for a in node.names]
        targets = ", ".join(alias for _, alias in names) + ","
        pairs = ", ".join(f"({n!r}, {source!r})" for n, _ in names)
        return f"{indent}{targets} = _crewai_suite_shim.bind({ours!r}, [{pairs}])"
    if isinstance(node, ast.Import):
        lines = []
        for alias in node.names:
            if not (alias.name == "crewai" or alias.name.startswith("crewai.")):
                return None
            if alias.asname is None:
                # `import crewai.x` binds `crewai`; no test here does it, so say so plainly.
                raise SystemExit(f"crewai-suite: no rule for `import {alias.name}` without `as`")
            ours = MODULES.get(alias.name, "")
            lines.append(
                f"{indent}{alias.asname} = _crewai_suite_shim.module({ours!r}, {alias.name!r})"
            )
        return "\n".join(lines)
    return None


def imported_from(tree: ast.Module, pattern: re.Pattern[str]) -> set[str]:
    """Names the file imports (anywhere) from modules matching ``pattern``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and pattern.search(node.module):
            names.update(a.asname or a.name for a in node.names)
    return names


def is_excluded(source: str, flagged: set[str]) -> bool:
    """The exclusion rule (module docstring) on one test's source."""
    if DIRECT.search(source):
        return True
    if any(not m.startswith("__") for m in PRIVATE_ATTR.findall(source)):
        return True
    words = set(re.findall(r"\b\w+\b", source))
    return bool(words & flagged)


def rewrite(text: str) -> Rewritten:
    """Rewrite the file's crewai imports; list its tests and the excluded ones."""
    tree = ast.parse(text)
    lines = text.splitlines()
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)  # type: ignore[union-attr]
            new = rewrite_import(node, indent)
            if new is not None:
                edits.append((node.lineno - 1, node.end_lineno or node.lineno, new))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = [new]
    future = [i for i, line in enumerate(lines) if line.startswith("from __future__")]
    at = future[-1] + 1 if future else 0
    lines.insert(at, "import _crewai_suite_shim")

    flagged = imported_from(tree, EVENT_MODULE) | imported_from(tree, PRIVATE_MODULE)
    helpers = {
        node.name: source_of(text, node)
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    tests, excluded = [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
            "test"
        ):
            tests.append(node.name)
            if is_excluded(with_helpers(source_of(text, node), helpers), flagged):
                excluded.append(node.name)
    return Rewritten("\n".join(lines) + "\n", sorted(set(excluded)), tests)


def source_of(text: str, node: ast.stmt) -> str:
    """A definition's source, its decorators included."""
    decorators = getattr(node, "decorator_list", [])
    first = min([d.lineno for d in decorators] + [node.lineno])
    return "\n".join(text.splitlines()[first - 1 : node.end_lineno])


def with_helpers(source: str, helpers: dict[str, str]) -> str:
    """``source`` and the module-level definitions it names, transitively."""
    seen: set[str] = set()
    todo = [source]
    parts = []
    while todo:
        part = todo.pop()
        parts.append(part)
        for word in set(re.findall(r"\b\w+\b", part)) & helpers.keys() - seen:
            seen.add(word)
            todo.append(helpers[word])
    return "\n".join(parts)


@dataclass
class FileResult:
    """One file's outcomes."""

    name: str
    outcomes: dict[str, dict[str, str]]
    excluded_names: list[str]

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.outcomes.values() if r["outcome"] == outcome)

    @property
    def measured(self) -> int:
        return sum(1 for r in self.outcomes.values() if r["outcome"] != "excluded")


def run_file(workdir: Path, name: str, rewritten: Rewritten, timeout: int) -> FileResult:
    """pytest on one rewritten file, in its own process."""
    (workdir / name).write_text(rewritten.text, encoding="utf-8")
    out = workdir / f"{name}.results.json"
    db = os.environ.get("RUNNER_TEST_DB", "11")
    if db == "0":
        raise SystemExit("crewai-suite: RUNNER_TEST_DB=0 is refused (never the default DB)")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") or k == "RUNNER_TEST_DB"
    }
    env.update(
        RUNNER_REDIS_URL=f"redis://127.0.0.1:6379/{db}",
        CREWAI_SUITE_EXCLUDED=json.dumps(rewritten.excluded),
        CREWAI_SUITE_OUT=str(out),
        # The caller's PYTHONPATH after the test files' directory: it may name another
        # checkout of runner to measure (its runner/ then shadows the installed one).
        PYTHONPATH=os.pathsep.join(p for p in (str(workdir), os.environ.get("PYTHONPATH")) if p),
        PYTHONDONTWRITEBYTECODE="1",
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--timeout={timeout}",
            "--rootdir",
            str(workdir),
            str(workdir / name),
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    outcomes = json.loads(out.read_text()) if out.exists() else {}
    broken = [v["cause"] for k, v in outcomes.items() if "::" not in k]
    if broken or not outcomes:
        # The file did not import: each of its tests (by function) counts as errored.
        cause = broken[0] if broken else "pytest wrote no results"
        outcomes = {
            f"{name}::{t}": {
                "outcome": "excluded" if t in rewritten.excluded else "errored",
                "cause": cause,
            }
            for t in rewritten.tests
        }
    return FileResult(name, outcomes, rewritten.excluded)


def normalized(cause: str) -> str:
    """A cause with its specifics (quoted values, numbers, addresses) blurred, to group."""
    cause = re.sub(r"0x[0-9a-f]+", "0x…", cause)
    cause = re.sub(r"'[^']*'", "'…'", cause)
    return cause[:140]


def table(results: list[FileResult]) -> str:
    """The per-file table."""
    head = "| file | tests | excluded | passed | failed | errored | skipped | passed % |"
    rows = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        measured = r.measured
        pct = f"{100 * r.count('passed') / measured:.0f}%" if measured else "-"
        rows.append(
            f"| {r.name} | {len(r.outcomes)} | {r.count('excluded')} | {r.count('passed')} "
            f"| {r.count('failed')} | {r.count('errored')} | {r.count('skipped')} | {pct} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "repo",
        nargs="?",
        default=os.environ.get("CREWAI_REPO", DEFAULT_REPO),
        help="CrewAI's git directory or a checkout (default: $CREWAI_REPO, else the mirror)",
    )
    parser.add_argument("--file", action="append", help="only these files (names)")
    parser.add_argument("--timeout", type=int, default=60, help="per-test timeout, seconds")
    parser.add_argument("--causes", type=int, default=12, help="cause groups shown per file")
    parser.add_argument("--keep", action="store_true", help="keep and print the temp dir")
    args = parser.parse_args(argv)

    results = []
    tmp = tempfile.mkdtemp(prefix="crewai-suite-")
    workdir = Path(tmp)
    (workdir / "_crewai_suite_shim.py").write_text(SHIM, encoding="utf-8")
    (workdir / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    for name in args.file or FILES:
        rewritten = rewrite(read_source(args.repo, name))
        results.append(run_file(workdir, name, rewritten, args.timeout))

    print(table(results))
    for r in results:
        print(f"\n## {r.name}")
        if r.excluded_names:
            print("excluded:", ", ".join(r.excluded_names))
        causes = Counter(
            normalized(v["cause"])
            for v in r.outcomes.values()
            if v["outcome"] in ("failed", "errored")
        )
        for cause, n in causes.most_common(args.causes):
            print(f"  {n:4d}  {cause}")
        if args.keep:
            for node, v in sorted(r.outcomes.items()):
                if v["outcome"] in ("failed", "errored"):
                    print(f"    {v['outcome']}: {node}: {v['cause'][:160]}")
    if args.keep:
        print(f"\nfiles in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
