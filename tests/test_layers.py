"""The package's shape: no import cycles in ``runner``, no private names across modules.

Layers import downward only (store -> flow core -> executors -> crews -> CLI/console);
a cycle, even through a function-level import, means two modules decide one thing.
"""

from __future__ import annotations

import ast
from pathlib import Path

RUNNER = Path(__file__).resolve().parent.parent / "runner"


def _module(path: Path) -> str:
    parts = list(path.relative_to(RUNNER.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names imported from it) for every import in the file, however deep."""
    tree = ast.parse(path.read_text())
    here = _module(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    # Imports for type checking only never run, so they cannot make a cycle.
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, [alias.name for alias in node.names]))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in RUNNER.rglob("*.py")}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target, names in _imports(path):
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            # ``from pkg import mod`` imports the module, not the package's other names.
            only_modules = names and len(submodules) == len(names)
            for candidate in submodules if only_modules else [target, *submodules]:
                if candidate in modules and candidate != name:
                    edges[name].add(candidate)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            # A package's __init__ re-exporting its submodules is not a cycle of design.
            if nxt == node.rpartition(".")[0] or node == nxt.rpartition(".")[0]:
                continue
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_runner_has_no_import_cycle() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_no_module_imports_a_private_name_from_another_module() -> None:
    offenders = []
    for path in RUNNER.rglob("*.py"):
        for target, names in _imports(path):
            if target.startswith("runner"):
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                offenders += [f"{_module(path)}: {target}.{n}" for n in private]
    assert offenders == []
