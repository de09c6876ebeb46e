"""The package's shape: layers, no import cycles in ``runner``, no private names across
modules, and a public seam between the engine and ``Flow``.

Layers import downward only (store -> flow core -> executors -> crews -> console -> CLI,
the package itself on top); a cycle, even through a function-level import, means two
modules decide one thing.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

RUNNER = Path(__file__).resolve().parent.parent / "runner"


def _module(path: Path) -> str:
    parts = list(path.relative_to(RUNNER.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once for every check of this file (none changes it)."""
    return ast.parse(path.read_text())


def _imports(path: Path, type_only: bool = False) -> list[tuple[str, list[str]]]:
    """(module imported, names imported from it) for every import in the file, however deep;
    imports for type checking only if ``type_only``."""
    tree = _parsed(path)
    here = _module(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    # Imports for type checking only never run, so they cannot make a cycle.
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if not type_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
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


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    modules = {_module(p): p for p in RUNNER.rglob("*.py")}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target, names in _imports(path, type_only):
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


def test_no_two_modules_name_each_other_even_for_type_checking() -> None:
    # Such a pair (a handle typed by the crew that makes it) is one concern split in two, or
    # wants a protocol on the lower side.
    cycle = _cycle(_graph(type_only=True))
    assert cycle is None, " -> ".join(cycle or [])


def test_no_module_imports_a_private_name_from_another_module() -> None:
    offenders = []
    for path in RUNNER.rglob("*.py"):
        for target, names in _imports(path):
            if target.startswith("runner"):
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                offenders += [f"{_module(path)}: {target}.{n}" for n in private]
    assert offenders == []


LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "store",
        (
            "runner.errors",
            "runner.ids",
            "runner.settings",
            "runner.embedded",
            "runner.store",
            "runner.checkpointing",
            "runner.views",
        ),
    ),
    ("flow core", ("runner.flow",)),
    ("executors", ("runner.distributed", "runner.flow.local", "runner.observe", "runner.worker")),
    ("crews", ("runner.crew",)),
    ("console", ("runner.console",)),
    ("CLI", ("runner.cli",)),
    ("package", ("runner", "runner.__main__")),
)
"""Each module's layer, lowest first: the longest prefix that names it (``runner`` names only
the package's own ``__init__``). A module may import its own layer and those below."""


def _layer(module: str) -> int | None:
    found: tuple[int, int] | None = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            named = module == prefix or (prefix != "runner" and module.startswith(prefix + "."))
            if named and (found is None or len(prefix) > found[1]):
                found = (rank, len(prefix))
    return None if found is None else found[0]


def _imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The runner modules a file imports (module- or function-level, not type-checking only)."""
    found = set()
    for target, names in _imports(path):
        submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
        for candidate in submodules or [target]:
            if candidate in modules:
                found.add(candidate)
    return found


def test_every_module_of_runner_has_a_layer() -> None:
    unplaced = [_module(p) for p in RUNNER.rglob("*.py") if _layer(_module(p)) is None]
    assert unplaced == []


def test_layers_import_downward_only() -> None:
    modules = {_module(p): p for p in RUNNER.rglob("*.py")}
    upward = []
    for name, path in sorted(modules.items()):
        here = _layer(name)
        for target in sorted(_imported_modules(path, modules)):
            there = _layer(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{name} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]})")
    assert upward == []


def _flow_private_members() -> set[str]:
    from runner.flow.flow import Flow

    names = {*vars(Flow), *vars(Flow())}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _flow_private_uses(tree: ast.AST, private: set[str]) -> list[str]:
    """``x._member`` of a Flow private member outside a class, or inside one deriving from a
    Flow (an override counts); in other classes ``self.``/``cls.`` are their own."""
    found = []

    def visit(node: ast.AST, own: bool) -> None:
        if isinstance(node, ast.ClassDef):
            own = not any("Flow" in ast.unparse(base) for base in node.bases)
            if not own:
                found.extend(
                    f"def {item.name}"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and item.name in private
                )
        elif isinstance(node, ast.Attribute) and node.attr in private:
            of_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not (own and of_self):
                found.append(ast.unparse(node))
        for child in ast.iter_child_nodes(node):
            visit(child, own)

    visit(tree, False)
    return found


def test_nothing_outside_runner_flow_uses_a_private_member_of_flow() -> None:
    private = _flow_private_members()
    assert {"_state", "_dump", "_sink", "_listeners"} <= private  # the check sees them
    offenders = []
    for path in RUNNER.rglob("*.py"):
        if path.is_relative_to(RUNNER / "flow"):
            continue
        uses = _flow_private_uses(_parsed(path), private)
        offenders += [f"{_module(path)}: {use}" for use in uses]
    assert offenders == []


def _defs(names: set[str]) -> list[tuple[str, str | None, str]]:
    """(module, enclosing class or None, name) of every function defined with one of ``names``."""
    found = []
    for path in RUNNER.rglob("*.py"):
        tree = _parsed(path)
        classes = {
            id(f): c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in names:
                found.append((_module(path), classes.get(id(node)), node.name))
    return found


def test_commit_means_writing_a_checkpoint_and_nothing_is_just_begin() -> None:
    # A store's commit writes one checkpoint; the engine's compare-and-set loop, a step's
    # settling and an attempt's start have names of their own.
    defs = _defs({"commit", "_commit", "begin", "_begin", "_messages"})
    assert defs, "the check sees the stores' commits"
    others = [d for d in defs if not (d[0].startswith("runner.store.") and "commit" in d[2])]
    assert others == []
    assert all(cls is not None for _, cls, _ in defs)


def test_no_two_modules_are_named_alike() -> None:
    # ``steps`` beside ``step`` reads as one module in two places.
    stems = {p.stem for p in RUNNER.rglob("*.py") if p.stem != "__init__"}
    assert sorted(s for s in stems if f"{s}s" in stems) == []


def test_the_store_defines_its_immutable_records_as_named_tuples() -> None:
    # Every command imports the store: a frozen dataclass costs a cold command ~0.4 ms to
    # define on Python 3.11 (see runner/store/__init__.py), a NamedTuple a seventh of that.
    frozen = [
        f"{_module(path)}.{node.name}"
        for path in (RUNNER / "store").rglob("*.py")
        for node in ast.walk(_parsed(path))
        if isinstance(node, ast.ClassDef)
        and any(
            "dataclass" in ast.unparse(d) and "frozen" in ast.unparse(d)
            for d in node.decorator_list
        )
    ]
    assert frozen == []
