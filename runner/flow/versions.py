"""Which code version a run's checkpoints were written by.

Every checkpoint records the version of the code that wrote it (:attr:`Checkpoint.version
<runner.store.models.Checkpoint.version>`): the deployment's ``RUNNER_APP_VERSION`` when set,
else a hash of the flow's definition (its name, its graph's fingerprint: the methods' names,
roles and conditions) and its state model's schema (:func:`code_hash`). Workers announce the
version they run (:mod:`runner.distributed.versioned`); ``runner status``, ``runner runs
--version``, the console and its API show a run's.

Pure but for reading the settings: the transitions and the lifecycle stamp what they write
with :func:`of`.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import weakref
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from runner import ids
from runner.errors import RunnerError, StateUnreadable
from runner.flow.graph import FlowGraph
from runner.settings import RunnerSettings, get_settings
from runner.store.models import Checkpoint


def code_hash(graph: FlowGraph) -> str:
    """12 hex digits of a hash of ``graph``'s flow name, wiring and state schema: what
    changes when a method is added, removed or rewired, or the state model changes."""
    return _hash_of(graph.name, graph.fingerprint, graph.schema)


@functools.lru_cache(maxsize=256)
def _hash_of(name: str, fingerprint: str, schema: str) -> str:
    # Cached on the strings themselves (every step stamps its checkpoints with it): the
    # same inputs always hash the same, and a changed graph is a new key.
    return hashlib.sha256(f"{name}\n{fingerprint}\n{schema}".encode()).hexdigest()[:12]


def of(graph: FlowGraph, settings: RunnerSettings | None = None) -> str:
    """The code version checkpoints of ``graph``'s flow written here record:
    ``RUNNER_APP_VERSION``, else :func:`code_hash`."""
    chosen = (settings or get_settings()).app_version
    return chosen or code_hash(graph)


# --- state that evolves ---------------------------------------------------------------------

UPGRADE_ATTR = "__runner_state_upgrade__"
"""The attribute :func:`state_upgrade` marks a hook with: the versions it maps from."""

Hook = Callable[[dict[str, Any]], dict[str, Any]]


def state_upgrade(*from_versions: str) -> Callable[[Hook], Any]:
    """Mark a function of a flow class as the map of a state ``from_versions`` wrote (a
    dict, as stored) to one its state model reads now (a dict)::

        @state_upgrade("2026.11.1")
        def split_name(old: dict) -> dict:
            first, _, last = old.pop("name").partition(" ")
            return {**old, "first": first, "last": last}

    It runs once per run: when code of another version first loads a state one of those
    versions wrote (a resume, an answer, a step of a run in flight), and the run records it
    (``RunMeta.versions.upgrades``); what it returns is the state from then on. Without a hook, a
    stored state is read through the model as it is now: a new field takes its default, a
    dropped one is ignored, anything else is refused naming the field and the run.
    """
    if not from_versions or not all(isinstance(v, str) and v for v in from_versions):
        raise TypeError("@state_upgrade takes the version(s) whose state it maps, as strings")

    def mark(fn: Hook) -> Any:
        setattr(fn, UPGRADE_ATTR, tuple(from_versions))
        return staticmethod(fn)

    return mark


def upgrade_hooks(flow_cls: type) -> dict[str, Hook]:
    """Version -> the ``@state_upgrade`` hook of ``flow_cls`` (its bases' too) mapping it."""
    found = _hooks.get(flow_cls)
    if found is None:
        # Once per class: every step reads its state through them, and the scan of each
        # class's namespace cost a worker more than the rest of reading it.
        found = _hooks[flow_cls] = {}
        for klass in reversed(flow_cls.__mro__):
            for value in vars(klass).values():
                fn = value.__func__ if isinstance(value, staticmethod) else value
                for version in getattr(fn, UPGRADE_ATTR, ()):
                    found[version] = fn
    return found


_hooks: weakref.WeakKeyDictionary[type, dict[str, Hook]] = weakref.WeakKeyDictionary()


def upgraded(
    flow_cls: Any, state: dict[str, Any], written_by: str | None
) -> tuple[dict[str, Any], str | None]:
    """``state`` (JSON) that ``written_by`` wrote, as this code's hook for that version maps
    it, and the entry the run records (``"<from> -> <to>"``); unchanged and ``None`` when
    this code wrote it or has no hook for it."""
    hook = upgrade_hooks(flow_cls).get(written_by) if written_by is not None else None
    now = of(flow_cls.graph()) if hook is not None else None
    if hook is None or written_by == now:
        return state, None
    mapped = hook(copy.deepcopy(state))
    if not isinstance(mapped, dict):
        raise TypeError(
            f"@state_upgrade({written_by!r}) {getattr(hook, '__name__', hook)} returned "
            f"{type(mapped).__name__}, not the state as a dict"
        )
    if "id" in state:
        mapped.setdefault("id", state["id"])
    return mapped, f"{written_by} -> {now}"


def read_state(
    flow_cls: Any, state: dict[str, Any], written_by: str | None, run_id: str
) -> tuple[dict[str, Any], str | None]:
    """:func:`upgraded`, checked against ``flow_cls``'s state model:
    :class:`StateUnreadable` in one line naming the field, the run and the fix if the model
    cannot read it."""
    data, entry = upgraded(flow_cls, state, written_by)
    model = flow_cls.state_type()
    if model is not None:
        try:
            model.model_validate(data)  # read only: the model is dropped
        except ValidationError as exc:
            raise unreadable(flow_cls, exc, run_id, written_by) from None
    return data, entry


def unreadable(
    flow_cls: Any, exc: ValidationError, run_id: str, written_by: str | None
) -> StateUnreadable:
    """The one-line refusal of a stored state ``flow_cls``'s model cannot read."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "state"
    model = flow_cls.state_type()
    by = written_by or "an unversioned run"
    fixes = [f"give {field} a default"] if err["type"] == "missing" else []
    if written_by:
        fixes.append(
            f"map the old state with @state_upgrade({written_by!r}) on {flow_cls.__name__}"
        )
    fix = ", or ".join(fixes) or f"make {field} read the stored value"
    return StateUnreadable(
        f"run {run_id}: its state (written by {by}) does not load into "
        f"{getattr(model, '__name__', 'the state model')}: {field}: {err['msg']}; {fix}",
        run_id=run_id,
        field=field,
        version=written_by,
    )


# --- where a step may run: version as one more input to routing -------------------------------


def cannot_continue(flow_cls: Any, ckpt: Checkpoint) -> list[str]:
    """Why ``flow_cls`` (the code here) cannot continue the run at ``ckpt``, each reason one
    line (none: it can): methods the run recorded or waits on that it lacks, a state its
    model cannot read."""
    from runner.flow import orchestrator as orch

    reasons: list[str] = []
    graph = flow_cls.graph()
    if ckpt.fingerprint != graph.fingerprint:
        try:
            orch.check_graph(graph, ckpt.record, checkpoint_id=ckpt.id)
        except RunnerError as exc:
            reasons.append(str(exc))
    try:
        read_state(flow_cls, ckpt.state, ckpt.version, ckpt.run_id)
    except (RunnerError, TypeError) as exc:
        reasons.append(str(exc))
    return reasons


def hand_to(
    flow_cls: Any, ckpt: Checkpoint, *, mine: str, policy: str, carried: str | None = None
) -> str | None:
    """The version of the workers a step of the run at ``ckpt`` is handed to, or ``None``:
    it runs here (code of version ``mine``). ``carried``: the version the step's message
    names (a hand-back's), which a worker of that version never hands on.

    ``pinned``: the run's steps run on the version that started it (``RunMeta.versions.pinned``).
    ``compatible``: here, unless this code cannot continue the run (:func:`cannot_continue`)
    and the version that wrote its latest checkpoint is another, which can.
    """
    if carried is not None and carried == mine:
        return None
    if policy == "pinned":
        wanted = ckpt.meta.versions.pinned
        return wanted if wanted and wanted != mine else None
    wrote = ckpt.version
    if wrote is None or wrote == mine or not cannot_continue(flow_cls, ckpt):
        return None
    return wrote


def waiting_for(ckpt: Checkpoint, policy: str) -> list[str]:
    """The versions a step of the run at ``ckpt`` may have been handed to, most likely
    first (the pinned one, else the one that wrote ``ckpt``)."""
    found = [ckpt.meta.versions.pinned] if policy == "pinned" else []
    found.append(ckpt.version)
    return list(dict.fromkeys(v for v in found if v))


# --- what a deploy would break: runner check-deploy -------------------------------------------


def deploy_problems(flow_cls: Any, ckpt: Checkpoint) -> list[str]:
    """Why ``flow_cls`` (candidate code) could not continue the run at ``ckpt`` as it stands,
    each one line (none: it can): methods it recorded or waits on that are gone, a condition
    changed under a pending step, a pending review's outcome the method no longer has, a state
    the model cannot read, a patch whose old branch a waiting step needs."""
    found = cannot_continue(flow_cls, ckpt)
    graph = flow_cls.graph()
    record = ckpt.record
    for act in record.in_flight:
        method = ids.method_of(act)
        spec = graph.methods.get(method)
        if spec is None:
            continue  # named by cannot_continue
        trigger = record.triggers.get(act)
        if trigger is not None and spec.condition is not None:
            from runner.flow.conditions import leaves

            if trigger not in leaves(spec.condition):
                found.append(
                    f"{method}: its pending step was triggered by {trigger!r}, which it "
                    "no longer listens to (its condition changed)"
                )
        for change, decided in ckpt.meta.replay.patches.get(act, {}).items():
            now = patch_calls(flow_cls, method).get(change)
            if decided is False and now != "patched":
                what = "deprecates it" if now == "deprecated" else "no longer has it"
                found.append(
                    f"{method}: its waiting step took the old branch of patch {change!r}; "
                    f"the new code {what} (keep `if self.patched({change!r})` until it ends)"
                )
    waiting = ckpt.meta.human.awaiting
    spec = graph.methods.get(waiting.method) if waiting is not None else None
    if waiting is not None and waiting.emit and spec is not None and spec.labels is not None:
        gone = [label for label in waiting.emit if label not in spec.labels]
        if gone:
            found.append(
                f"{waiting.method}: its pending review's outcome(s) {', '.join(gone)} are no "
                "longer among its labels"
            )
    return found


def patch_calls(flow_cls: Any, method: str) -> dict[str, str]:
    """Change id -> ``patched`` or ``deprecated``: the ``self.patched("id")`` and
    ``self.deprecate_patch("id")`` calls with a literal id in ``method``'s source."""
    import ast
    import inspect
    import textwrap

    fn = getattr(flow_cls, method, None)
    fn = inspect.unwrap(fn) if callable(fn) else None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))) if fn is not None else None
    except (OSError, TypeError, SyntaxError):
        return {}
    found: dict[str, str] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("patched", "deprecate_patch")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            kind = "patched" if node.func.attr == "patched" else "deprecated"
            found.setdefault(node.args[0].value, kind)
    return found
