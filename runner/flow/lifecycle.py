"""How one attempt of a step settles: the one place that decides a step's outcome.

Both executors (in process, :mod:`runner.flow.local`, and on Celery workers,
:mod:`runner.distributed.engine`) and the engine's child runs call these functions;
none of them re-implements any of it. Everything here is pure: the caller runs the
method, asks :func:`decide` whether to retry, and otherwise hands :func:`settle` the
run's latest checkpoint to get the checkpoint to commit (on workers inside a
compare-and-set loop, so :func:`settle` may be called again on a newer checkpoint).

Outcomes:

* **done**: the method returned; its state changes and output are committed and the
  listeners it made ready are returned. A step that makes a method exceed its
  ``max_calls`` (a loop), or that breaks the graph's rules, fails the run instead
  (:class:`~runner.errors.CycleLimitExceeded`, :class:`~runner.errors.DefinitionError`).
* **paused**: the method asked for a human; the run waits, the step re-runs on resume.
* **retry**: the method raised and has retries left; nothing is committed, the next
  attempt starts after :func:`retry_delay`.
* **failed**: retries are spent (or the error is one no retry can fix); the failure
  checkpoint records the error and the run fails. The step stays in flight, so a
  resume re-runs it.
* **child**: the method started a child run (on workers): the activation is linked to
  the child and committed when the child ends (:func:`child_linked`,
  :func:`child_finished`, :func:`child_failed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runner.errors import CycleLimitExceeded, DefinitionError, RunnerError
from runner.flow import events as ev
from runner.flow import orchestrator as orch
from runner.flow import patches, usage
from runner.flow import transition as tr
from runner.flow.attempt import Asked, Halted, Raised, Returned, Slept, StepResult
from runner.flow.children import ChildRun, child_run_id
from runner.flow.graph import FlowGraph, MethodSpec
from runner.flow.orchestrator import Activation, ExecutionRecord
from runner.flow.state import Reducer, diff
from runner.settings import RunnerSettings
from runner.store.models import (
    FLOW_FAILED,
    Checkpoint,
    ChildLink,
    RunStatus,
    StepError,
    UsageMetrics,
)
from runner.store.pending import FEEDBACK

log = logging.getLogger("runner.lifecycle")

CHILD_STARTED = "child_run_started"
"""Event of the parent checkpoint that links an activation to its child run."""


class Outcome(StrEnum):
    """What an attempt of a step came to."""

    DONE = "done"
    PAUSED = "paused"
    SLEEPING = "sleeping"
    RETRY = "retry"
    FAILED = "failed"
    CHILD = "child"


@dataclass
class Settled:
    """A settled attempt: its outcome and the checkpoint to commit for it."""

    outcome: Outcome
    transition: tr.Transition
    error: BaseException | None = None
    """What failed the step (``FAILED``)."""
    pauses_run: bool = False
    """``PAUSED`` and the run was running: this commit ends the run's part (its epoch), as a
    later pause of the same part (a parallel step's question) does not."""


UNRETRYABLE: tuple[type[BaseException], ...] = (DefinitionError, CycleLimitExceeded)
"""Errors a new attempt of the same code cannot fix: they fail the step at once."""


def retries_for(spec: MethodSpec, settings: RunnerSettings) -> int:
    """How many retries a failing step gets: its decorator's, else the settings'."""
    return spec.retries if spec.retries is not None else settings.step_retries


def retry_delay(spec: MethodSpec, settings: RunnerSettings, attempt: int, jitter: float) -> float:
    """Seconds before attempt ``attempt + 1``: exponential from the step's (or the
    settings') backoff, capped by ``retry_backoff_max``, scaled by ``0.5 + jitter / 2``
    (``jitter`` in [0, 1)) so that steps failing together do not retry together."""
    base = spec.retry_backoff if spec.retry_backoff is not None else settings.retry_backoff
    return min(base * 2 ** (attempt - 1), settings.retry_backoff_max) * (0.5 + jitter / 2)


def decide(result: StepResult, spec: MethodSpec, settings: RunnerSettings) -> Outcome:
    """The outcome of an attempt, before anything is committed (``result.attempts`` is
    the attempt's number): whether it is retried is decided here, once."""
    match result.end:
        case Asked() | Halted():
            return Outcome.PAUSED
        case Slept():
            return Outcome.SLEEPING
        case Returned(output=output):
            return Outcome.CHILD if ChildRun.from_output(output) else Outcome.DONE
        case Raised(error=error):
            if isinstance(error, UNRETRYABLE) or result.attempts > retries_for(spec, settings):
                return Outcome.FAILED
            return Outcome.RETRY


def child_started(result: StepResult) -> ChildRun | None:
    """The child run the attempt started (its output's marker, on workers), if any."""
    end = result.end
    return ChildRun.from_output(end.output) if isinstance(end, Returned) else None


def in_flight(
    latest: Checkpoint, epoch: int, activation_id: str, record: ExecutionRecord | None = None
) -> bool:
    """The epoch rule: whether ``activation_id`` is still to be committed in ``epoch``.

    A resume or restart starts a new epoch: an attempt from an earlier one commits
    nothing (the resumed run re-runs the step under a new key), except one an answer
    carried into the new epoch (it was running; :func:`~runner.flow.transition.epoch_of`),
    and an activation that is no longer in flight was committed by another attempt.
    """
    if tr.epoch_of(latest, activation_id) != epoch:
        return False
    record = tr.record_of(latest) if record is None else record
    return orch.pending_activation(record, activation_id) is not None


def settle(
    graph: FlowGraph,
    latest: Checkpoint,
    result: StepResult,
    outcome: Outcome,
    *,
    epoch: int,
    reducers: dict[str, Reducer],
    version: str,
    token: str | None = None,
    worker: str | None = None,
    record: ExecutionRecord | None = None,
) -> Settled | None:
    """The checkpoint that settles ``result`` (decided as ``outcome``) onto ``latest``.

    ``None`` when the activation is no longer in flight in ``epoch`` (another attempt
    committed it, or a resume began a new epoch): the attempt commits nothing.
    ``token`` is the attempt's fencing token; ``record`` is ``latest``'s record if the
    caller has it. ``outcome`` is ``DONE``, ``PAUSED``, ``SLEEPING`` or ``FAILED`` (a retry
    and a child start commit nothing here); a sleep already recorded also gives ``None``.
    ``version`` is this code's (:func:`~runner.flow.versions.of` with the executor's
    settings), which the checkpoints record.
    """
    act = result.activation
    if not in_flight(latest, epoch, act.id, record):
        return None
    settled: Settled
    match outcome, result.end:
        case Outcome.PAUSED, Asked(new_state=new_state, awaiting=awaiting):
            paused = tr.step_awaiting(
                latest,
                act,
                awaiting,
                base_state=result.base_state,
                new_state=new_state,
                reducers=reducers,
                attempt=token,
                record=record,
            )
            settled = Settled(outcome, paused, pauses_run=latest.status is RunStatus.RUNNING)
        case Outcome.PAUSED, Halted(reason=reason):
            paused = tr.step_paused(latest, act, reason, record=record)
            settled = Settled(outcome, paused, pauses_run=latest.status is RunStatus.RUNNING)
        case Outcome.SLEEPING, Slept(new_state=new_state, sleep=sleep):
            sleeping = tr.step_sleeping(
                latest,
                act,
                base_state=result.base_state,
                new_state=new_state,
                wake_at=sleep.wake_at,
                index=sleep.index,
                reducers=reducers,
                attempt=token,
                record=record,
            )
            if sleeping is None:
                return None
            settled = Settled(outcome, sleeping)
        case Outcome.DONE, Returned() as returned:
            try:
                finished = _done(graph, latest, result, returned, reducers, token, record)
                settled = Settled(outcome, finished)
            except (CycleLimitExceeded, DefinitionError) as exc:  # e.g. a loop past max_calls
                settled = _failed(latest, act, exc, result.attempts, record)
        case Outcome.FAILED, Raised(error=error):
            settled = _failed(latest, act, error, result.attempts, record)
        case _:
            raise ValueError(
                f"settle() takes done, paused, sleeping or failed as the attempt ended, not "
                f"{outcome} for {type(result.end).__name__}"
            )
    ckpt = settled.transition.checkpoint
    ckpt.worker, ckpt.duration, ckpt.attempts = worker, result.duration, result.attempts
    stamp(version, ckpt, settled.transition.closing)
    if isinstance(result.end, Asked | Slept):  # the step runs again: it decides the same
        ckpt.meta = patches.recorded_in(ckpt.meta, act.id, result.patches)
    # What a resume will not spend again: a completed step's, and a reviewed method's (its
    # output under review is kept with the pause; the method never runs again).
    reviewed = isinstance(result.end, Asked) and result.end.awaiting.kind == FEEDBACK
    done = act.method if settled.outcome is Outcome.DONE or reviewed else None
    usage.charge(ckpt, settled.transition.closing, result.usage, done)
    return settled


def stamp(version: str, *ckpts: Checkpoint | None) -> None:
    """Record on ``ckpts`` (being built) that this code wrote them: its ``version``."""
    for ckpt in ckpts:
        if ckpt is not None:
            ckpt.version = version


def _done(
    graph: FlowGraph,
    latest: Checkpoint,
    result: StepResult,
    returned: Returned,
    reducers: dict[str, Reducer],
    token: str | None,
    record: ExecutionRecord | None,
) -> tr.Transition:
    return tr.step_done(
        graph,
        latest,
        result.activation,
        base_state=result.base_state,
        new_state=returned.new_state,
        output=returned.output,
        label=returned.label,
        reducers=reducers,
        attempt=token,
        record=record,
        review=returned.review,
    )


def _failed(
    latest: Checkpoint,
    act: Activation,
    error: BaseException,
    attempts: int,
    record: ExecutionRecord | None,
) -> Settled:
    # A run cancelled while the step ran stays cancelled: the failure is recorded on it.
    status = RunStatus.FAILED if latest.status is RunStatus.RUNNING else latest.status
    described = StepError.from_exception(error, attempts)
    step = tr.step_failed(latest, act, described, status=status, record=record)
    return Settled(Outcome.FAILED, step, error)


def described(error: BaseException) -> str:
    """An error as events and logs give it: ``Type: message``."""
    return f"{type(error).__name__}: {error}"


def announce(
    settled: Settled,
    listeners: Sequence[ev.EventListener] = (),
    *,
    duration: float | None = None,
    before_closing: Callable[[], None] | None = None,
) -> None:
    """Tell what a committed settle came to: the one path after a step's commit, in both
    executors and for child runs.

    ``method_execution_finished`` (after a ``state_conflict`` for each field parallel steps
    both wrote, also logged), ``method_execution_failed`` or ``flow_paused`` (when it pauses
    a running run, with the same duration, ``epoch`` and ``opened_at`` as an end); then, if the
    commit ended the run, ``flow_finished`` or ``flow_failed``, once per run, with the
    duration of the run's part that ended (from its start, or its latest resume) and, in
    ``data``, that part's ``epoch`` and ``opened_at``. ``duration`` is the step's (its last
    attempt's), where known. When the commit ended the run, ``before_closing`` runs first,
    before the step's own events (workers wait there for other processes still telling
    theirs), so the run's last step and its end are the last events, as in process.
    """
    step = settled.transition
    ckpt = step.checkpoint
    for name in step.conflicts:
        log.warning(
            "run %s: state field %r written by parallel steps; last commit (%s) wins",
            ckpt.run_id,
            name,
            ckpt.activation or ckpt.step,
        )
    if not ev.wanted(listeners):
        return
    closing = step.closing
    if closing is not None and before_closing is not None:
        before_closing()
    run_id, flow = ckpt.run_id, str(ckpt.meta.name)
    error = None if settled.error is None else described(settled.error)
    if settled.outcome is Outcome.PAUSED:
        data: dict[str, Any] = {"reason": ckpt.meta.human.pause_reason}
        took = None
        if settled.pauses_run:  # the part of the run this pause ends, as for the run's end
            opened = ckpt.meta.opened_at
            took = None if opened is None else max(ckpt.created_at - opened, 0.0)
            data |= {"epoch": ckpt.meta.epoch, "opened_at": opened}
        ev.tell(ev.FLOW_PAUSED, run_id, flow, listeners, method=ckpt.step, duration=took, data=data)
    elif settled.outcome is Outcome.FAILED:
        ev.tell(
            ev.METHOD_FAILED,
            run_id,
            flow,
            listeners,
            method=ckpt.step,
            duration=duration,
            error=error,
        )
    else:
        for name in step.conflicts:
            data = {"field": name}
            ev.tell(ev.STATE_CONFLICT, run_id, flow, listeners, method=ckpt.step, data=data)
        ev.tell(ev.METHOD_FINISHED, run_id, flow, listeners, method=ckpt.step, duration=duration)
    if closing is not None:
        opened = closing.meta.opened_at
        took = None if opened is None else max(closing.created_at - opened, 0.0)
        # The part of the run that ended: its epoch (a resume opens the next) and its start.
        part = {"epoch": closing.meta.epoch, "opened_at": opened}
        ev.tell(closing.event, run_id, flow, listeners, duration=took, error=error, data=part)


def run_failed(latest: Checkpoint, error: RunnerError) -> tr.Transition | None:
    """Fail a running run as a whole (its flow cannot run here); ``None`` if not running."""
    if latest.status is not RunStatus.RUNNING:
        return None
    ckpt = tr.status_change(latest, FLOW_FAILED, RunStatus.FAILED)
    ckpt.error = StepError(type=type(error).__name__, message=str(error))
    return tr.Transition(ckpt)


# --- child runs -----------------------------------------------------------------------------


def child_link(child: ChildRun, run_id: str, result: StepResult) -> ChildLink:
    """The parent's link to child ``run_id``, keeping the state fields the method changed
    before it started the child (applied when the activation commits)."""
    base = result.base_state
    new = result.end.new_state if isinstance(result.end, Returned) else base
    changes = diff(base, new)
    touched = set(changes.set) | set(changes.removed)
    return ChildLink(
        run_id=run_id,
        flow=child.flow,
        name=child.name,
        before={k: base[k] for k in touched if k in base},
        after=dict(changes.set),
        usage=result.usage,
    )


def child_linked(
    latest: Checkpoint, epoch: int, activation_id: str, link: ChildLink
) -> tr.Transition | None:
    """The parent checkpoint linking an in-flight activation to its child run; ``None``
    if there is nothing to write (already linked, not running, or a stale ``epoch``)."""
    if latest.status is not RunStatus.RUNNING or not in_flight(latest, epoch, activation_id):
        return None
    link = link.model_copy(update={"epoch": epoch})
    if latest.meta.links.children.get(activation_id) == link:
        return None
    act = orch.pending_activation(tr.record_of(latest), activation_id)
    assert act is not None
    ckpt = tr.with_record(
        latest,
        tr.record_of(latest),
        event=CHILD_STARTED,
        step=act.method,
        meta=latest.meta.updated(
            ready=[], children={**latest.meta.links.children, activation_id: link}
        ),
    )
    return tr.Transition(ckpt)


def waiting_on(latest: Checkpoint | None, activation_id: str) -> str | None:
    """The child run id ``activation_id`` waits on, if it is in flight in a running run.

    A link copied into a fork names the source run's child, not this run's: not waiting. A
    link made in an earlier epoch is not waiting either: the new epoch runs the activation
    again, which links (and, if it stopped with the run, resumes) the child; a child that
    ended before that, stopped with its parent, does not end the activation.
    """
    if latest is None or latest.status is not RunStatus.RUNNING:
        return None
    link = latest.meta.links.children.get(activation_id)
    child_id = child_run_id(latest.run_id, activation_id)
    if link is None or not link.waiting or link.run_id != child_id:
        return None
    if link.epoch is not None and link.epoch != tr.epoch_of(latest, activation_id):
        return None
    pending = orch.pending_activation(tr.record_of(latest), activation_id)
    return child_id if pending is not None else None


def child_finished(
    graph: FlowGraph,
    latest: Checkpoint,
    activation_id: str,
    child_id: str,
    output: Any,
    reducers: dict[str, Reducer],
    spent: UsageMetrics | None = None,
) -> Settled | None:
    """Commit the parent's activation with its child's output (a finished step, with the
    state changes the method made before it started the child, and what the method and
    the child, ``spent``, used); ``None`` if the activation no longer waits on that child."""
    if waiting_on(latest, activation_id) != child_id:
        return None
    act = orch.pending_activation(tr.record_of(latest), activation_id)
    assert act is not None
    link = latest.meta.links.children[activation_id]
    step = tr.step_done(
        graph,
        latest,
        act,
        base_state=link.before,
        new_state=link.after,
        output=output,
        label=None,
        reducers=reducers,
        attempt=f"child:{child_id}",
    )
    done = link.model_copy(update={"waiting": False, "before": {}, "after": {}})
    children = {**latest.meta.links.children, activation_id: done}
    step.checkpoint.meta = step.checkpoint.meta.updated(children=children)
    step.closing = tr.closing_of(latest, step.checkpoint)  # with the link as it is now
    usage.charge(step.checkpoint, step.closing, usage.joined(link.usage, spent), act.method)
    return Settled(Outcome.DONE, step)


def child_failed(
    latest: Checkpoint,
    activation_id: str,
    error: BaseException,
    child_id: str | None,
    spent: UsageMetrics | None = None,
) -> Settled | None:
    """Fail the parent's activation: its child ended badly (``child_id``, having used
    ``spent``) or could not be started (``None``); ``None`` if there is nothing to fail."""
    if latest.status is not RunStatus.RUNNING:
        return None
    act = orch.pending_activation(tr.record_of(latest), activation_id)
    if act is None:
        return None
    if child_id is not None and waiting_on(latest, activation_id) != child_id:
        return None
    failed = _failed(latest, act, error, 1, None)
    link = latest.meta.links.children.get(activation_id)
    before = link.usage if link is not None and link.run_id == child_id else None
    step = failed.transition
    usage.charge(step.checkpoint, step.closing, usage.joined(before, spent), None)
    return failed
