"""Crews inside flows: a flow method runs a crew as a *child run* and returns its output.

``return self.run_crew(crew, inputs)`` in a flow method (see :class:`RunsCrews`):

* **in process** the crew runs inline and its :class:`CrewOutput` is the method's output.
  The child run's id is derived from the parent run and the method's activation, and its
  checkpoints go to the crew's store (else the parent flow's), so when the parent is
  resumed the method resumes the child at its first unfinished task instead of starting
  the crew again.
* **on workers** (inside :func:`deferring`, which the engine enters around a step) the
  method returns a :class:`ChildRun` marker instead. The engine hands it to
  :func:`start_child`, which links the child to the parent's in-flight activation and
  starts the child's run; nothing blocks the worker. When the child run ends,
  :func:`on_child_finished` commits the parent's activation with the child's output (or
  fails it) and dispatches what became ready. :func:`waiting` tells the recovery pass
  which activations wait on a live child (not to be re-dispatched) and repairs a lost
  notification.

Links are in checkpoint ``meta``: the child's ``meta["parent"] = {"run_id", "activation"}``;
the parent's ``meta["children"][activation] = {"run_id", "flow", "name", "waiting",
"before", "after"}``, where ``before``/``after`` hold the state fields the method changed
before it returned the marker (applied when the activation commits, as a finished step's
are) and ``waiting`` turns false then.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, model_serializer

from runner.checkpointing import CheckpointConfig
from runner.crew.crew import Crew, CrewOutput
from runner.errors import CommitConflict, DefinitionError, RunnerError
from runner.flow import events as ev
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.orchestrator import Activation
from runner.flow.state import diff, reducers_for
from runner.store.models import Checkpoint, RunStatus, StepError

if TYPE_CHECKING:
    from runner.distributed.engine import Runtime

CHILD_KEY = "__runner_child__"
"""The one key of a :class:`ChildRun`'s JSON form (how the engine recognises it)."""

CHILD_STARTED = "child_run_started"
"""Event of the parent checkpoint that links an activation to its child run."""

_defer: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "runner_defer_children", default=False
)


class ChildRunFailed(RunnerError):
    """A child run ended failed or cancelled, so the parent method that started it failed."""


class ChildRun(BaseModel):
    """What ``run_crew`` returns on a worker: "run this child; its output is mine"."""

    flow: str
    """Import path of the child (``module:variable`` of a crew)."""
    name: str
    """The child's flow name (the workers' registry key)."""
    inputs: dict[str, Any] = Field(default_factory=dict)
    """The child's kickoff inputs."""

    @model_serializer(mode="wrap")
    def _marked(self, handler: Any) -> dict[str, Any]:
        return {CHILD_KEY: handler(self)}

    def _not_yet(self) -> DefinitionError:
        return DefinitionError(
            f"on workers run_crew starts {self.name} as a child run and has no output yet: "
            "return it from the method and read the CrewOutput in a @listen method's argument",
            crew=self.name,
        )

    @property
    def raw(self) -> str:
        """Not available: see :meth:`_not_yet`."""
        raise self._not_yet()

    @property
    def tasks_output(self) -> list[Any]:
        """Not available: see :meth:`_not_yet`."""
        raise self._not_yet()

    def to_dict(self) -> dict[str, Any]:
        """Not available: see :meth:`_not_yet`."""
        raise self._not_yet()

    @classmethod
    def from_output(cls, output: Any) -> ChildRun | None:
        """The marker a step returned (in its JSON form), or ``None`` for any other output."""
        if isinstance(output, Mapping) and set(output) == {CHILD_KEY}:
            return cls.model_validate(output[CHILD_KEY])
        return None


@contextmanager
def deferring() -> Iterator[None]:
    """Inside this block ``run_crew`` returns a :class:`ChildRun` instead of running inline."""
    token = _defer.set(True)
    try:
        yield
    finally:
        _defer.reset(token)


def child_run_id(parent_run_id: str, activation: str) -> str:
    """The child run of a parent activation: the same on every attempt and resume."""
    return f"{parent_run_id}-{activation.replace('#', '-')}"


# --- the authoring side -------------------------------------------------------------------


class RunsCrews:
    """Mixin giving a flow ``self.run_crew(crew, inputs)``: ``class F(RunsCrews, Flow[S])``."""

    def run_crew(self, crew: Crew, inputs: dict[str, Any] | None = None) -> Any:
        """Run ``crew`` as a child run; return it from the method (see the module docs)."""
        return run_crew(self, crew, inputs)


def run_crew(flow: Any, crew: Crew, inputs: dict[str, Any] | None = None) -> Any:
    """Run ``crew`` as a child of the flow method calling this: a :class:`CrewOutput` in
    process, a :class:`ChildRun` marker on workers."""
    if not isinstance(crew, Crew):
        raise DefinitionError(f"run_crew takes a Crew, not {crew!r}")
    inputs = dict(inputs or {})
    activation = running_activation(flow)
    method = None if activation is None else orch.parse_activation(activation)[0]
    if method is not None and type(flow).graph().spec(method).is_router:
        raise DefinitionError(
            f"{method} is a router: run the crew in a @listen method and route on its output",
            method=method,
        )
    if _defer.get():
        crew.require_importable()
        crew.check_inputs(inputs)
        return ChildRun(flow=crew.flow_path(), name=crew.name, inputs=inputs)
    config = _child_config(flow, crew)
    if activation is None or config is None:
        return crew.kickoff(inputs)  # nowhere to resume from: a plain inline run
    child_id = child_run_id(flow.flow_id, activation)
    latest = config.store().latest(child_id)
    if latest is None:
        crew.check_inputs(inputs)
        return crew._kickoff({**inputs, "id": child_id}, config)
    if latest.status is RunStatus.SUCCEEDED:
        return crew.output(latest.state)
    return crew._kickoff(inputs, config, from_checkpoint=latest.id)


def running_activation(flow: Any) -> str | None:
    """The id (``method#n``) of ``flow``'s step running in this thread, if any.

    Read from the frame of :func:`runner.flow.steps.run_step`, the one place both
    executors call a method through (it exposes no context variable of its own).
    """
    from runner.flow.steps import run_step

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is run_step.__code__ and frame.f_locals.get("flow") is flow:
            act = frame.f_locals.get("activation")
            return act.id if isinstance(act, Activation) else None
        frame = frame.f_back
    return None


def _child_config(flow: Any, crew: Crew) -> CheckpointConfig | None:
    """The crew's own checkpoint config, else the parent flow's store with crew defaults."""
    own = crew.as_flow().checkpoint
    if isinstance(own, CheckpointConfig):
        return own
    store = flow._sink().store
    return None if store is None else CheckpointConfig(provider=store)


# --- the worker side: called by the engine ------------------------------------------------


def start_child(
    rt: Runtime,
    parent_run_id: str,
    activation: Activation,
    epoch: int,
    child: ChildRun,
    *,
    base_state: dict[str, Any] | None = None,
    new_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Link ``activation`` of the parent to its child run and make sure the child runs.

    Idempotent: a redelivered step links the same child again (no new checkpoint), and
    the child's steps are sent once (dispatch markers). A child that already exists is not
    started again: if it succeeded the parent's activation commits now; if it failed or
    was cancelled (the parent is being resumed) it is resumed at its first unfinished task.
    ``base_state``/``new_state`` are the state the method started from and left; ``epoch``
    the parent's epoch the attempt ran in (a stale attempt changes nothing).
    """
    from runner.distributed.engine import _commit

    child_id = child_run_id(parent_run_id, activation.id)
    result: dict[str, Any] = {"run_id": parent_run_id, "step": activation.id, "child": child_id}
    try:
        child_cls = _flow_class(rt, child.name, child.flow)
    except RunnerError as exc:
        _fail_parent(rt, parent_run_id, activation.id, None, exc)
        return {**result, "failed": type(exc).__name__}
    link: dict[str, Any] = {"run_id": child_id, "flow": child.flow, "name": child.name}
    link["waiting"] = True
    link.update(_stash(base_state or {}, new_state or base_state or {}))
    _commit(rt, parent_run_id, lambda latest: _linked(latest, epoch, activation, link))
    parent = rt.store.latest(parent_run_id)
    if parent is None or _epoch(parent) != epoch or _waiting_on(parent, activation.id) is None:
        return {**result, "skipped": "the activation is no longer waiting"}
    existing = rt.store.latest(child_id)
    if existing is None:
        _create(rt, child_cls, child_id, child.inputs, parent_run_id, activation.id)
    elif existing.status is RunStatus.SUCCEEDED:
        return {**result, "dispatched": on_child_finished(rt, existing)}
    elif existing.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        from runner.distributed import control

        control.resume(child_id, rt=rt)
        return {**result, "resumed": True}
    from runner.distributed.engine import dispatch_pending

    created = rt.store.latest(child_id)
    return {**result, "dispatched": dispatch_pending(rt, created) if created else []}


def on_child_finished(rt: Runtime, child_ckpt: Checkpoint) -> list[str]:
    """After a run ended: if it is a child, commit (or fail) the parent activation waiting
    on it and dispatch what became ready. Returns the activations dispatched.

    Idempotent and safe to call for any checkpoint: it does nothing unless ``child_ckpt``
    ended a child run whose parent is running and still waits on exactly this child.
    """
    from runner.distributed.engine import _commit, dispatch

    link = child_ckpt.meta.get("parent")
    if not link or not child_ckpt.status.finished:
        return []
    parent_id, act_id = str(link["run_id"]), str(link["activation"])
    parent = rt.store.latest(parent_id)
    if parent is None or _waiting_on(parent, act_id) != child_ckpt.run_id:
        return []
    if child_ckpt.status is not RunStatus.SUCCEEDED:
        _fail_parent(rt, parent_id, act_id, child_ckpt, None)
        return []
    parent_cls = _flow_class(rt, str(parent.meta.get("name")), str(parent.flow))
    child_cls = _flow_class(rt, str(child_ckpt.meta.get("name")), str(child_ckpt.flow))
    output = _result_of(child_cls, child_ckpt)

    def build(latest: Checkpoint) -> tr.Transition | None:
        act = orch.pending_activation(tr.record_of(latest), act_id)
        if act is None or _waiting_on(latest, act_id) != child_ckpt.run_id:
            return None
        entry = latest.meta["children"][act_id]
        step = tr.step_done(
            parent_cls.graph(),
            latest,
            act,
            base_state=entry.get("before", {}),
            new_state=entry.get("after", {}),
            output=output,
            label=None,
            reducers=reducers_for(parent_cls.state_type()),
            attempt=f"child:{child_ckpt.run_id}",
        )
        done = {k: entry[k] for k in ("run_id", "flow", "name")} | {"waiting": False}
        step.checkpoint.meta["children"] = {**latest.meta["children"], act_id: done}
        return step

    committed = _commit(rt, parent_id, build)
    if committed is None:
        return []
    ckpt, step = committed
    _emit(ckpt, ev.METHOD_FINISHED)
    if ckpt.status is RunStatus.SUCCEEDED:
        _emit(ckpt, ev.FLOW_FINISHED)
    if ckpt.status is not RunStatus.RUNNING:
        return []
    return dispatch(rt, parent_cls.flow_name(), parent_id, _epoch(ckpt), step.ready)


def waiting(rt: Runtime, latest: Checkpoint) -> set[str]:
    """In-flight activations of ``latest``'s run that wait on a live child run.

    For the recovery pass: these must not be re-dispatched. A linked child that already
    ended is reported to the parent here (a lost notification) and also skipped; one that
    does not exist (a crash before it was created) is not waiting, so recovery re-runs
    the parent's method, which creates it.
    """
    found = set()
    for act_id, entry in latest.meta.get("children", {}).items():
        if _waiting_on(latest, act_id) is None:
            continue
        child = rt.store.latest(str(entry["run_id"]))
        if child is None:
            continue
        if child.status.finished:
            on_child_finished(rt, child)
        found.add(act_id)
    return found


# --- helpers ------------------------------------------------------------------------------


def _stash(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The state fields a method changed: their values before and after."""
    changes = diff(base, new)
    touched = set(changes.set) | set(changes.removed)
    return {"before": {k: base[k] for k in touched if k in base}, "after": dict(changes.set)}


def _linked(
    latest: Checkpoint, epoch: int, act: Activation, link: dict[str, Any]
) -> tr.Transition | None:
    """The parent checkpoint linking ``act`` to its child; ``None`` if nothing to write
    (also when ``epoch`` is stale: the attempt of an earlier resume must not relink)."""
    children = latest.meta.get("children", {})
    if _epoch(latest) != epoch or latest.status is not RunStatus.RUNNING:
        return None
    if orch.pending_activation(tr.record_of(latest), act.id) is None:
        return None
    if children.get(act.id) == link:
        return None
    ckpt = tr.with_record(
        latest,
        tr.record_of(latest),
        event=CHILD_STARTED,
        step=act.method,
        meta={**latest.meta, "ready": [], "children": {**children, act.id: link}},
    )
    return tr.Transition(ckpt)


def _waiting_on(latest: Checkpoint | None, act_id: str) -> str | None:
    """The child run id ``act_id`` waits on, if it is in flight in a running run.

    A link copied into a fork names the source run's child, not this run's: not waiting.
    """
    if latest is None or latest.status is not RunStatus.RUNNING:
        return None
    entry = latest.meta.get("children", {}).get(act_id)
    child_id = child_run_id(latest.run_id, act_id)
    if not entry or not entry.get("waiting") or entry.get("run_id") != child_id:
        return None
    return child_id if orch.pending_activation(tr.record_of(latest), act_id) is not None else None


def _create(
    rt: Runtime, flow_cls: Any, child_id: str, inputs: dict[str, Any], parent: str, act: str
) -> None:
    """The child run's first checkpoint, linked to its parent (once, however often called)."""
    from runner.distributed.client import first_checkpoint

    first = first_checkpoint(flow_cls, {**inputs, "id": child_id})
    first.checkpoint.meta["parent"] = {"run_id": parent, "activation": act}
    with contextlib.suppress(CommitConflict):  # an earlier attempt created it
        rt.store.commit(first.checkpoint, expected_seq=0)


def _fail_parent(
    rt: Runtime,
    parent_id: str,
    act_id: str,
    child: Checkpoint | None,
    exc: BaseException | None,
) -> None:
    """Fail the parent's activation: its child ended badly, or could not be started."""
    from runner.distributed.engine import _commit

    if exc is None:
        assert child is not None
        why = f"{child.error.type}: {child.error.message}" if child.error else child.status.value
        exc = ChildRunFailed(
            f"child run {child.run_id} {child.status.value} at {child.step}: {why}",
            run_id=child.run_id,
            step=child.step,
        )
    error = StepError.from_exception(exc)

    def build(latest: Checkpoint) -> tr.Transition | None:
        act = orch.pending_activation(tr.record_of(latest), act_id)
        if act is None or latest.status is not RunStatus.RUNNING:
            return None
        if child is not None and _waiting_on(latest, act_id) != child.run_id:
            return None
        return tr.step_failed(latest, act, error, status=RunStatus.FAILED)

    committed = _commit(rt, parent_id, build)
    if committed is not None:
        described = f"{error.type}: {error.message}"
        _emit(committed[0], ev.METHOD_FAILED, error=described)
        _emit(committed[0], ev.FLOW_FAILED, error=described)


def _flow_class(rt: Runtime, name: str, path: str) -> Any:
    """The registered flow ``name`` if it is the one at ``path``; else import ``path``."""
    from runner.distributed.client import load_flow

    known = rt.flows.get(name)
    if known is not None and known.flow_path() == path:
        return known
    if rt.flows:  # a worker: only allow-listed flows run here
        from runner.distributed.engine import FlowNotAllowed

        raise FlowNotAllowed(
            f"flow {path} is not in this worker's allow-list (RUNNER_FLOW_MODULES)", flow=path
        )
    return load_flow(path)


def _result_of(flow_cls: Any, ckpt: Checkpoint) -> Any:
    """A finished child's output: a crew's :class:`CrewOutput`, a flow's last output."""
    result_of = getattr(flow_cls, "result_of", None)
    if callable(result_of):
        return result_of(ckpt.state)
    return orch.last_output(tr.record_of(ckpt))


def _emit(ckpt: Checkpoint, kind: str, **fields: Any) -> None:
    """Tell the process's event listeners about the parent's step (or run) ``ckpt`` ended."""
    step = ckpt.step if kind in (ev.METHOD_FINISHED, ev.METHOD_FAILED) else None
    name = str(ckpt.meta.get("name"))
    ev.emit(ev.FlowEvent(type=kind, run_id=ckpt.run_id, flow=name, method=step, **fields))


def _epoch(ckpt: Checkpoint) -> int:
    return int(ckpt.meta.get("epoch", 0))


__all__ = [
    "ChildRun",
    "ChildRunFailed",
    "CrewOutput",
    "RunsCrews",
    "deferring",
    "on_child_finished",
    "run_crew",
    "start_child",
    "waiting",
]
