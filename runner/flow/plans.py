"""The resume planner: whether a run may go on from a checkpoint, and how.

Every way of resuming a run asks :func:`plan_resume`: ``resume(run_id)`` and
``runner resume`` on the workers, ``runner resume --location`` and
``kickoff(from_checkpoint=...)`` / ``Flow.from_checkpoint(...).kickoff()`` in process, the
console and its API (through ``resume``). Answering a paused run
(``RunHandle.resume(feedback=)``, ``runner resume --feedback``, ``Flow.from_pending(...)
.resume``) asks :func:`plan_answer`. Each refusal is raised here, so it has one wording and
one exit code wherever it comes from: :class:`~runner.errors.InvalidInputs`,
:class:`~runner.errors.CheckpointNotFound` (bad input, exit 2) or
:class:`~runner.errors.RunStateError` (the run's state forbids it, exit 1).

Pure: the caller reads the run's record, its latest checkpoint and the source checkpoint,
and carries the plan out (commits :meth:`ResumePlan.opening` with compare-and-set on the
run's sequence number, then runs what it made ready).

**Running elsewhere.** On workers a run whose status is ``running`` is refused (its
steps would commit into the rewound run; workers' recovery takes care of a crashed
worker). In process the same holds, except for what no one drives any longer: a run whose
latest checkpoint this process wrote, or a process on this host that has ended wrote (a
kickoff interrupted by Ctrl-C or a crash), or, in a store workers never use (a JSON
directory, SQLite), one that no in-process run claims (see :class:`Here`).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.errors import CheckpointNotFound, InvalidInputs, RunStateError
from runner.flow import conversation, results, versions
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.flow import apply_inputs
from runner.flow.graph import FlowGraph
from runner.store.models import Answer, Checkpoint, RunInfo, RunStatus

_PROCESS = re.compile(r"^(?P<host>.*) \(pid (?P<pid>\d+)\)$")


def this_process() -> str:
    """What checkpoints written by an in-process run of this process record as their
    ``worker``: ``host (pid N)`` (read each time: a forked child is another process)."""
    return f"{socket.gethostname()} (pid {os.getpid()})"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


@dataclass(frozen=True)
class Here:
    """The process that resumes a run in process (``None`` in its place: on the workers)."""

    process: str = field(default_factory=this_process)
    """Its identity (:func:`this_process`)."""
    workers_share_store: bool = True
    """Whether workers may drive runs in the store (the deployment's Redis), so a running
    run whose latest checkpoint no in-process run wrote is theirs."""
    alive: Callable[[int], bool] = process_alive
    """Whether a process of this host is alive."""

    def drives_elsewhere(self, latest: Checkpoint) -> bool:
        """Whether someone other than this process may still be driving ``latest``'s run."""
        writer = latest.worker
        if writer == self.process:
            return False
        found = _PROCESS.match(writer or "")
        if found is None:
            # Workers (a step's host name, or a commit of the producer's with none); an
            # in-process run before processes were named recorded the bare host name.
            return self.workers_share_store and writer != socket.gethostname()
        if found["host"] != socket.gethostname():
            return True  # another machine's process: nothing here can tell it ended
        return self.alive(int(found["pid"]))


@dataclass(frozen=True)
class ResumePlan:
    """What a resume does: continue ``source`` in a new epoch with ``state``."""

    run_id: str
    source: Checkpoint
    state: dict[str, Any]
    """The source's state with the inputs applied, validated by the flow's model (JSON)."""
    latest_id: str | None
    """The run's latest checkpoint when planned (``None``: the store keeps none)."""
    version: str | None = None
    """The code version resuming it (recorded on the resume's checkpoint)."""
    upgrade: str | None = None
    """The state upgrade (``@state_upgrade``) loading ``source``'s state ran, if any
    (recorded in ``RunMeta.versions.upgrades``)."""
    running: frozenset[str] = frozenset()
    """Activations still running in the paused run (a parallel step's attempt): when it
    goes on from where it stands, they go on into the new epoch (``RunMeta.carried``)."""
    done: bool = False
    """Nothing is left to run at ``source`` and the caller asked for the run's result then
    (``kickoff(from_checkpoint=...)``, as CrewAI's): :attr:`result` is what it returns."""
    result: Any = None

    def opening(self, latest: Checkpoint | None) -> tr.Transition:
        """The checkpoint that resumes the run on ``latest`` (the run's latest as the commit
        reads it); :class:`RunStateError` if the run moved on since it was planned, since
        resuming then would drop what was committed meanwhile."""
        now = latest.id if latest is not None else None
        if self.latest_id is not None and now != self.latest_id:
            raise changed_while_resuming(self.run_id, latest)
        opened = tr.resumed(latest or self.source, self.source, self.state, running=self.running)
        if self.version is not None:
            opened.checkpoint.version = self.version
        return upgrade_recorded(opened, self.upgrade)


def upgrade_recorded(opened: tr.Transition, upgrade: str | None) -> tr.Transition:
    """``opened`` with ``upgrade`` (if any) added to its run's ``RunMeta.versions.upgrades``."""
    if upgrade is not None:
        meta = opened.checkpoint.meta
        opened.checkpoint.meta = meta.updated(upgrades=[*meta.versions.upgrades, upgrade])
    return opened


def changed_while_resuming(run_id: str, latest: Checkpoint | None) -> RunStateError:
    """The refusal of a resume whose run another process changed meanwhile."""
    seq = f"seq {latest.seq}" if latest is not None else "another checkpoint"
    return RunStateError(
        f"run {run_id} changed while resuming (now at {seq}); try again", run_id=run_id
    )


def plan_resume(
    flow: Any,
    source: Checkpoint,
    inputs: Mapping[str, Any] | None = None,
    *,
    run_id: str | None = None,
    info: RunInfo | None = None,
    latest: Checkpoint | None = None,
    here: Here | None = None,
    done_is_result: bool = False,
    running: Collection[str] = (),
) -> ResumePlan:
    """The plan to continue run ``run_id`` (default: ``source``'s) from ``source`` with
    ``inputs``, or the refusal.

    ``flow`` is an object of the run's flow class (its state model validates the inputs);
    ``info`` and ``latest`` are the run's record and latest checkpoint in its store (``None``
    when the store keeps none); ``here`` is the process resuming in process (``None``: on
    the workers). The source is *named* when it is not the run's latest (an older
    checkpoint, ``--from``): a run that succeeded, or awaits an answer, may be continued
    from an older checkpoint, never from where it stands. ``done_is_result``: a source
    with nothing left to run (a succeeded run's latest included) gives a plan that is
    :attr:`ResumePlan.done` with the run's result there (``kickoff(from_checkpoint=)``, as
    CrewAI's), not a refusal (``resume``: fork it to run it again). ``running``: the
    activations an attempt still runs (on workers, a live lease).
    """
    run_id = run_id or source.run_id
    if source.run_id != run_id:
        raise CheckpointNotFound(
            f"checkpoint {source.id} belongs to run {source.run_id}, not {run_id}",
            checkpoint_id=source.id,
        )
    at_latest = latest is None or latest.id == source.id
    status = info.status if info is not None else (latest or source).status
    if at_latest and status is RunStatus.SUCCEEDED and not done_is_result:
        raise RunStateError(f"run {run_id} already succeeded; fork it to run again", run_id=run_id)
    if status is RunStatus.RUNNING and (
        here is None or here.drives_elsewhere(latest if latest is not None else source)
    ):
        # Even from an older checkpoint: steps still running would commit into the rewound run.
        raise RunStateError(f"run {run_id} is running; cancel it first", run_id=run_id)
    awaiting = (latest or source).meta.human.awaiting if at_latest else None
    if awaiting is not None:
        raise RunStateError(
            f"run {run_id} awaits an answer at {awaiting.method}: "
            f"{awaiting.message!r}; give it (runner resume {run_id} --feedback TEXT)",
            run_id=run_id,
        )
    given = dict(inputs or {})
    if str(given.get("id", run_id)) != run_id:
        raise InvalidInputs(
            f"inputs cannot change a resumed run's id ({run_id}); fork it instead",
            run_id=run_id,
        )
    flow_cls = type(flow)
    check_graph(flow_cls.graph(), source)
    check_fields(flow_cls, given)
    loaded, upgrade = versions.read_state(flow_cls, source.state, source.version, run_id)
    state = apply_inputs(flow, given, loaded)
    latest_id = latest.id if latest is not None else None
    version = versions.of(flow_cls.graph())
    if not orch.pending(tr.record_of(source)):
        if done_is_result:
            result = results.run_result(source, flow_cls)
            return ResumePlan(
                run_id, source, state, latest_id, version, upgrade, done=True, result=result
            )
        raise RunStateError(f"checkpoint {source.id} has no step left to run", run_id=run_id)
    return ResumePlan(
        run_id, source, state, latest_id, version, upgrade, running=frozenset(running)
    )


@dataclass(frozen=True)
class AnswerPlan:
    """What an answer does: the run goes on from ``paused`` with ``answer`` recorded."""

    run_id: str
    paused: Checkpoint
    answer: Answer
    state: dict[str, Any] | None = None
    """The paused run's state as this code loads it, when a ``@state_upgrade`` mapped it."""
    upgrade: str | None = None
    version: str | None = None
    """The code version that mapped it (the answer's checkpoint then records it: its state
    is that version's, and no later load maps it again)."""
    running: frozenset[str] = frozenset()
    """Activations still running at ``paused`` (a parallel step's attempt): they go on into
    the answered epoch rather than run again (``RunMeta.carried``)."""

    def opening(self, latest: Checkpoint | None) -> tr.Transition:
        """The checkpoint that records the answer on ``latest`` (the run's latest as the
        commit reads it); :class:`RunStateError` if the run moved on since it paused (it
        was answered, resumed or cancelled meanwhile: this answer is not for it; or a
        parallel step committed: :meth:`still_asked` says whether to plan again)."""
        if latest is not None and latest.id != self.paused.id:
            raise RunStateError(
                f"run {self.run_id} changed while answering (now at seq {latest.seq}); try again",
                run_id=self.run_id,
            )
        opened = tr.answered(latest or self.paused, self.answer, self.running)
        if self.state is not None:
            opened.checkpoint.state = dict(self.state)
            opened.checkpoint.version = self.version
        return upgrade_recorded(opened, self.upgrade)

    def still_asked(self, latest: Checkpoint | None) -> bool:
        """Whether ``latest``, a checkpoint after ``paused``, still asks the question this
        answer is for, in the same part of the run: a parallel step committed meanwhile (a
        step that paused too leaves the run's question in place), so the answer is planned
        again on ``latest``, its state and its running steps."""
        return (
            latest is not None
            and latest.status is RunStatus.PAUSED
            and latest.meta.epoch == self.paused.meta.epoch
            and latest.meta.human.awaiting == self.paused.meta.human.awaiting
        )


def plan_answer(
    graph: FlowGraph,
    latest: Checkpoint,
    text: str | None,
    *,
    by: str | None = None,
    outcome: str | None = None,
    step: str | None = None,
    flow_cls: Any = None,
    running: Collection[str] = (),
) -> AnswerPlan:
    """The plan to give run ``latest.run_id`` (at ``latest``) the answer it awaits, or the
    refusal: a run that awaits nothing, a ``step`` that is not the one it awaits now (the
    answerer read another question), an ``outcome`` that is not one of its labels, a state
    ``flow_cls`` (the code answering, if given) cannot load (:mod:`runner.flow.versions`).
    ``running``: the activations an attempt still runs (on workers, a live lease)."""
    run_id = latest.run_id
    awaited = latest.meta.human.awaiting
    if awaited is None or latest.status is not RunStatus.PAUSED:
        raise RunStateError(
            f"run {run_id} awaits no answer (it is {latest.status.value})", run_id=run_id
        )
    if step is not None and step not in (awaited.activation, awaited.method):
        raise RunStateError(
            f"run {run_id} now awaits {awaited.method} ({awaited.message!r}), not {step}: "
            "read the question again before answering",
            run_id=run_id,
        )
    if outcome is not None and outcome not in (awaited.emit or ()):
        labels = ", ".join(awaited.emit or ()) or "none"
        raise InvalidInputs(
            f"{outcome!r} is not an outcome of {awaited.method}; its outcomes: {labels}",
            run_id=run_id,
        )
    check_graph(graph, latest)
    answer = Answer(text=text, outcome=outcome, by=by, awaited=awaited)
    still = frozenset(running)
    if flow_cls is None:
        return AnswerPlan(run_id, latest, answer, running=still)
    loaded, upgrade = versions.read_state(flow_cls, latest.state, latest.version, run_id)
    if upgrade is None:
        return AnswerPlan(run_id, latest, answer, running=still)
    version = versions.of(flow_cls.graph())
    return AnswerPlan(run_id, latest, answer, loaded, upgrade, version, running=still)


def check_graph(graph: FlowGraph, ckpt: Checkpoint) -> None:
    """Refuse a checkpoint whose completed or pending methods no longer exist (a changed
    fingerprint alone is fine: the run resumes when every step it recorded still exists)."""
    if ckpt.fingerprint != graph.fingerprint:
        orch.check_graph(graph, tr.record_of(ckpt), checkpoint_id=ckpt.id)


def check_fields(flow_cls: Any, values: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidInputs` naming keys the flow's state model would silently drop.

    A typo in ``--set`` or ``--input`` must not pass unnoticed. Dict state, models that
    allow extra fields, and models that read their raw input (a ``before``/``wrap`` model
    validator, e.g. a crew's state collecting kickoff inputs) take any key.
    """
    model = flow_cls.state_type()
    if model is None or _takes_any_key(model):
        return
    unknown = sorted(key for key in values if key not in model.model_fields)
    if unknown:
        raise InvalidInputs(
            f"{model.__name__} has no field(s) {', '.join(unknown)} "
            f"(fields: {', '.join(model.model_fields)})",
            flow=flow_cls.flow_name(),
            unknown=unknown,
        )


def _takes_any_key(model: Any) -> bool:
    if model.model_config.get("extra") == "allow":
        return True
    validators = model.__pydantic_decorators__.model_validators.values()
    return any(v.info.mode in ("before", "wrap") for v in validators)


@dataclass(frozen=True)
class TurnPlan:
    """What a conversational turn does: the run starts again from its starts, in a new
    epoch, with ``state`` (the user's message appended to the history)."""

    run_id: str
    latest_id: str
    graph: FlowGraph
    state: dict[str, Any]
    upgrade: str | None = None

    def opening(self, latest: Checkpoint | None) -> tr.Transition:
        """The turn's first checkpoint on ``latest`` (the run's latest as the commit reads
        it); :class:`RunStateError` if the run moved on since the turn was planned (another
        turn began meanwhile: this one would drop it)."""
        if latest is None or latest.id != self.latest_id:
            raise RunStateError(
                f"run {self.run_id} changed while taking a turn; try again", run_id=self.run_id
            )
        opened = tr.restart(self.graph, latest, self.state)
        return upgrade_recorded(opened, self.upgrade)


def plan_turn(flow: Any, latest: Checkpoint, message: Any) -> TurnPlan:
    """The plan to give run ``latest.run_id`` (at ``latest``) a conversational turn with
    ``message``, or the refusal: a flow that is not conversational, an empty message
    (:class:`InvalidInputs`), a run that is running (its turn is not over) or awaits an
    answer (:class:`RunStateError`). A run whose last turn failed or was cancelled takes
    the next one (the history keeps the message it did not answer)."""
    run_id = latest.run_id
    flow_cls = type(flow)
    conversation.refuse_unless_conversational(flow_cls, f"a turn (run {run_id})")
    if latest.status is RunStatus.RUNNING:
        raise RunStateError(
            f"run {run_id} is still running its turn; wait for its reply before the next",
            run_id=run_id,
        )
    if latest.meta.human.awaiting is not None:
        awaiting = latest.meta.human.awaiting
        raise RunStateError(
            f"run {run_id} awaits an answer at {awaiting.method}: {awaiting.message!r}; "
            f"give it (runner resume {run_id} --feedback TEXT)",
            run_id=run_id,
        )
    loaded, upgrade = versions.read_state(flow_cls, latest.state, latest.version, run_id)
    previous = (
        results.run_result(latest, flow_cls) if latest.status is RunStatus.SUCCEEDED else None
    )
    opened = conversation.open_turn(flow_cls, loaded, message, previous)
    state = apply_inputs(flow, {}, opened)
    return TurnPlan(run_id, latest.id, flow_cls.graph(), state, upgrade)
