"""Turning one step's result into the run's next checkpoint.

Both executors (in process and on Celery workers) go through these functions, so
a run started by one can be resumed by the other. Everything here is pure: the
caller reads the latest checkpoint, calls one of these, and commits the result
(on workers with compare-and-set on the sequence number, retrying on conflict).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from runner import ids
from runner.flow import epochs, usage, versions
from runner.flow import orchestrator as orch
from runner.flow.graph import FlowGraph
from runner.flow.orchestrator import Activation, ExecutionRecord
from runner.flow.state import Reducer, apply_changes, diff
from runner.store.models import (
    FLOW_FAILED,
    FLOW_FINISHED,
    FLOW_PAUSED,
    FLOW_RESUMED,
    FLOW_STARTED,
    METHOD_FAILED,
    METHOD_FINISHED,
    Answer,
    Awaiting,
    Checkpoint,
    RunMeta,
    RunStatus,
    StepError,
    Versions,
)
from runner.store.pending import FEEDBACK

OPENING = frozenset({FLOW_STARTED, FLOW_RESUMED})
"""Events of a checkpoint that opens an epoch of a run (a start, restart, resume or fork)."""


@dataclass
class Transition:
    """A checkpoint to commit and the activations it makes ready."""

    checkpoint: Checkpoint
    ready: list[Activation] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    record: ExecutionRecord | None = None
    """The checkpoint's record (the same object as ``checkpoint.record``)."""
    closing: Checkpoint | None = None
    """When ``checkpoint`` ends the run: the run's closing checkpoint (``flow_finished`` or
    ``flow_failed``), committed right after it (on workers in the same atomic write)."""


def record_of(ckpt: Checkpoint) -> ExecutionRecord:
    """The orchestrator record stored in a checkpoint (validated when the checkpoint was;
    records are replaced, never changed in place, so it is shared, not copied)."""
    return ckpt.record


def with_record(ckpt: Checkpoint, record: ExecutionRecord, **update: Any) -> Checkpoint:
    """A new checkpoint (fresh id) carrying ``record`` and ``update``.

    Its ``state`` is a new dict and its ``meta`` a new model (unless given); values inside
    are shared with ``ckpt``, which is safe as checkpoints are replaced, never changed in place.
    """
    fields: dict[str, Any] = {
        "id": ids.checkpoint_id(),
        "seq": 0,
        "record": record,
        "activation": None,
        "attempt": None,
        "error": None,
        "worker": None,
        "duration": None,
        "attempts": None,
        "usage": None,
        "created_at": time.time(),
    }
    fields.update(update)
    fields.setdefault("state", dict(ckpt.state))
    meta = fields.setdefault("meta", ckpt.meta.model_copy())
    if fields.get("event", ckpt.event) in OPENING:  # the epoch's first ready step tells its start
        opener = meta.ready[0] if meta.ready else None
        fields["meta"] = meta.updated(opener=opener, opened_at=fields["created_at"])
    return ckpt.model_copy(update=fields)


def start(
    graph: FlowGraph, run_id: str, state: dict[str, Any], *, flow: str, name: str, **extra: Any
) -> Transition:
    """The first checkpoint of a fresh run and its start activations."""
    record, ready = orch.ready_starts(graph, ExecutionRecord())
    base = Checkpoint(
        run_id=run_id,
        event=FLOW_STARTED,
        state=state,
        flow=flow,
        fingerprint=graph.fingerprint,
        version=versions.of(graph),
        meta=RunMeta(
            name=name, ready=[a.id for a in ready], versions=Versions(pinned=versions.of(graph))
        ),
        **extra,
    )
    return Transition(with_record(base, record, status=RunStatus.RUNNING), ready, record=record)


def restart(graph: FlowGraph, latest: Checkpoint, state: dict[str, Any]) -> Transition:
    """Re-run a known run from its starts (CrewAI's ``inputs={"id": X}``)."""
    record, ready = orch.ready_starts(graph, ExecutionRecord())
    ckpt = with_record(
        latest,
        record,
        event=FLOW_STARTED,
        step=None,
        state=state,
        status=RunStatus.RUNNING,
        fingerprint=graph.fingerprint,
        version=versions.of(graph),
        meta=epochs.carry(
            latest.meta,
            epochs.Opening.RESTART,
            ready=[a.id for a in ready],
            epoch=latest.meta.epoch + 1,
            usage=usage.restarted(latest.meta.usage),
            pinned=versions.of(graph),
        ),
    )
    return Transition(ckpt, ready, record=record)


def step_done(
    graph: FlowGraph,
    latest: Checkpoint,
    activation: Activation,
    *,
    base_state: dict[str, Any],
    new_state: dict[str, Any],
    output: Any,
    label: str | None,
    reducers: dict[str, Reducer],
    attempt: str | None = None,
    record: ExecutionRecord | None = None,
    review: Any = None,
) -> Transition:
    """Apply a finished step's state changes and output onto ``latest``.

    ``record`` is ``latest``'s record if the caller has it; ``review`` the JSON of the
    ``HumanFeedbackResult`` a reviewed step came to (kept in ``meta.human.feedback``). A run that
    already failed keeps its status and error: a parallel step finishing later does not
    hide the failure.
    """
    changes = diff(base_state, new_state)
    merged, conflicts = apply_changes(latest.state, base_state, changes, reducers)
    before = record_of(latest) if record is None else record
    record, ready = orch.complete(graph, before, activation.id, output, label)
    finished = orch.is_finished(record) and latest.status is RunStatus.RUNNING
    update: dict[str, Any] = {"ready": [a.id for a in ready], "conflicts": conflicts}
    update.update(notes_without(latest.meta, activation.id))
    if review is not None:
        update["feedback"] = [*latest.meta.human.feedback, review]
    meta = latest.meta.updated(**update)
    ckpt = with_record(
        latest,
        record,
        event=METHOD_FINISHED,
        step=activation.method,
        activation=activation_key(latest, activation.id),
        attempt=attempt,
        state=merged,
        status=RunStatus.SUCCEEDED if finished else latest.status,
        error=latest.error if latest.status is RunStatus.FAILED else None,
        meta=meta,
    )
    return Transition(ckpt, ready, conflicts, record, closing_of(latest, ckpt))


ACTIVATION_NOTES = ("sleeps", "answers", "reviews", "patches", "carried")
"""The :class:`RunMeta` fields that keep notes per activation for its later attempts."""


def notes_without(meta: RunMeta, activation_id: str) -> dict[str, Any]:
    """``meta``'s per-activation notes without ``activation_id``'s (the fields that had
    some): they serve only its attempts, so they go with its commit, and a loop of sleeps or
    reviews does not pile them up in every later checkpoint (the checkpoints of its pauses
    and answers keep them in the run's history)."""
    return {
        name: {key: note for key, note in notes.items() if key != activation_id}
        for name in ACTIVATION_NOTES
        if activation_id in (notes := meta.field(name))
    }


def epoch_of(latest: Checkpoint, activation_id: str) -> int:
    """The epoch whose attempts may commit ``activation_id`` onto ``latest``: the run's, or
    the earlier one its attempt still runs in (``RunMeta.carried``: a paused or failed run
    went on from where it stood, by an answer or a resume, while the step ran)."""
    return latest.meta.carried.get(activation_id, latest.meta.epoch)


def activation_key(latest: Checkpoint, activation_id: str) -> str:
    """The store's idempotency key of an activation: unique across restarts of a run id."""
    return ids.activation_key_in(epoch_of(latest, activation_id), activation_id)


def attempt_epoch(ckpt: Checkpoint, activation_id: str) -> int:
    """The epoch of the attempt whose commit ``ckpt`` is (read off its idempotency key), else
    the one that may commit ``activation_id`` there (:func:`epoch_of`)."""
    if ckpt.activation:
        return ids.epoch_of_key(ckpt.activation)
    return epoch_of(ckpt, activation_id)


def step_failed(
    latest: Checkpoint,
    activation: Activation,
    error: StepError,
    *,
    status: RunStatus,
    record: ExecutionRecord | None = None,
) -> Transition:
    """A failure checkpoint: the activation stays in flight so resume re-runs it."""
    step = _step_stopped(latest, activation, METHOD_FAILED, status, record, error=error)
    step.closing = closing_of(latest, step.checkpoint)
    return step


def closing_of(latest: Checkpoint, ckpt: Checkpoint) -> Checkpoint | None:
    """The run's closing checkpoint when ``ckpt``, committed onto ``latest``, ends the run:
    ``flow_finished`` if it succeeds it, ``flow_failed`` (the failing step and its error)
    if it fails it; ``None`` otherwise (the run goes on, or had already stopped: a run
    fails once, however many of its parallel steps fail)."""
    if latest.status is not RunStatus.RUNNING:
        return None
    if ckpt.status is RunStatus.SUCCEEDED:
        event, step = FLOW_FINISHED, None
    elif ckpt.status is RunStatus.FAILED:
        event, step = FLOW_FAILED, ckpt.step
    else:
        return None
    meta = ckpt.meta.updated(ready=[])
    return with_record(ckpt, record_of(ckpt), event=event, step=step, error=ckpt.error, meta=meta)


def step_sleeping(
    latest: Checkpoint,
    activation: Activation,
    *,
    base_state: dict[str, Any],
    new_state: dict[str, Any],
    wake_at: float,
    index: int,
    reducers: dict[str, Reducer],
    attempt: str | None = None,
    record: ExecutionRecord | None = None,
) -> Transition | None:
    """The step reached its ``index``-th durable sleep: its state so far applied onto
    ``latest``, the wake-up time recorded, the step still in flight. ``None`` when that
    sleep is recorded already (another attempt got there first). Committed under an
    idempotency key of its own (:func:`sleep_key`), so the attempt after the wake-up can
    commit the step."""
    recorded = latest.meta.replay.sleeps.get(activation.id, [])
    if len(recorded) != index:
        return None
    merged, conflicts = apply_changes(
        latest.state, base_state, diff(base_state, new_state), reducers
    )
    record = record_of(latest) if record is None else record
    sleeps = {**latest.meta.replay.sleeps, activation.id: [*recorded, wake_at]}
    ckpt = with_record(
        latest,
        record,
        event=STEP_SLEEPING,
        step=activation.method,
        activation=sleep_key(activation_key(latest, activation.id), index),
        attempt=attempt,
        state=merged,
        meta=latest.meta.updated(ready=[], conflicts=conflicts, sleeps=sleeps),
    )
    return Transition(ckpt, [], conflicts, record)


STEP_SLEEPING = "step_sleeping"
"""Event of the checkpoint a step commits when it reaches a durable sleep."""


def sleep_key(key: str, index: int) -> str:
    """The idempotency key of an activation's ``index``-th sleep (its activation key is
    kept for the commit that completes it)."""
    return f"{key}~sleep{index}"


def step_paused(
    latest: Checkpoint,
    activation: Activation,
    reason: str,
    *,
    record: ExecutionRecord | None = None,
) -> Transition:
    """The run waits for a human; the step stays in flight and re-runs on resume.

    As in :func:`step_awaiting`, a question the run already asks stays asked, its reason
    too: this step pauses again when the answer's epoch sends it."""
    human = latest.meta.human
    if latest.status is RunStatus.PAUSED and human.awaiting is not None:
        reason = human.pause_reason or reason
    return _step_stopped(
        latest, activation, FLOW_PAUSED, RunStatus.PAUSED, record, pause_reason=reason
    )


def step_awaiting(
    latest: Checkpoint,
    activation: Activation,
    awaiting: Awaiting,
    *,
    base_state: dict[str, Any],
    new_state: dict[str, Any],
    reducers: dict[str, Reducer],
    attempt: str | None = None,
    record: ExecutionRecord | None = None,
) -> Transition:
    """The step waits for a person's answer: its state so far applied onto ``latest``,
    what it awaits recorded (``meta.human.awaiting``), the run paused, the step in flight until
    :func:`answered` sends it again.

    A run asks one question at a time, and the first one stays asked: a step pausing a run
    that already awaits an answer (a parallel step's) leaves that question in place. Its own
    waits for the answer's epoch, which sends the step again: a review is kept in
    ``meta.human.reviews`` (the method does not run again), a question is asked again."""
    merged, conflicts = apply_changes(
        latest.state, base_state, diff(base_state, new_state), reducers
    )
    record = record_of(latest) if record is None else record
    where = {"activation": activation.id, "method": activation.method}
    awaiting = awaiting.model_copy(update=where)
    reviews = latest.meta.human.reviews
    if awaiting.kind == FEEDBACK:  # the output under review outlives this pause
        reviews = {**reviews, activation.id: awaiting}
    human = latest.meta.human
    if latest.status is RunStatus.PAUSED and human.awaiting is not None:
        asked, reason = human.awaiting, human.pause_reason
    else:
        asked, reason = awaiting, awaiting.message
    meta = latest.meta.updated(
        ready=[],
        conflicts=conflicts,
        awaiting=asked,
        pause_reason=reason,
        reviews=reviews,
    )
    ckpt = with_record(
        latest,
        record,
        event=FLOW_PAUSED,
        step=activation.method,
        attempt=attempt,
        state=merged,
        status=RunStatus.PAUSED,
        meta=meta,
    )
    return Transition(ckpt, [], conflicts, record)


def answered(latest: Checkpoint, answer: Answer, running: Collection[str] = ()) -> Transition:
    """``latest`` (paused, awaiting ``answer.awaited``) goes on in a new epoch with the
    answer recorded for the activation that waited, which is sent again with the rest.

    ``running``: activations an attempt still runs (a live lease), as a parallel step may
    while another pauses: carried on, not sent again (see :func:`resumed`)."""
    act = answer.awaited.activation
    answers = {**latest.meta.human.answers, act: [*latest.meta.human.answers.get(act, []), answer]}
    still = set(running) - {act}
    return resumed(
        latest, latest, latest.state, epochs.Opening.ANSWER, running=still, answers=answers
    )


def _step_stopped(
    latest: Checkpoint,
    activation: Activation,
    event: str,
    status: RunStatus,
    record: ExecutionRecord | None,
    *,
    error: StepError | None = None,
    pause_reason: str | None = None,
) -> Transition:
    """A checkpoint of a step that did not complete: nothing becomes ready."""
    record = record_of(latest) if record is None else record
    ckpt = with_record(
        latest,
        record,
        event=event,
        step=activation.method,
        status=status,
        error=error,
        meta=latest.meta.updated(ready=[], pause_reason=pause_reason),
    )
    return Transition(ckpt, record=record)


GOES_ON: frozenset[RunStatus] = frozenset({RunStatus.PAUSED, RunStatus.FAILED})
"""The statuses a run may still have steps running in when it is resumed where it stands:
paused (a parallel step runs on) or failed (a parallel branch runs on, and commits). A
cancelled run's attempts were stopped."""


def goes_on(latest: Checkpoint, source: Checkpoint) -> bool:
    """Whether resuming the run at ``source`` goes on from where it stands: its latest
    checkpoint, paused or failed. Only then does :func:`resumed` carry the steps still
    running (so only then are their leases worth reading)."""
    return source.id == latest.id and latest.status in GOES_ON


def resumed(
    latest: Checkpoint,
    source: Checkpoint,
    state: dict[str, Any],
    opening: epochs.Opening = epochs.Opening.RESUME,
    running: Collection[str] = (),
    **meta: Any,
) -> Transition:
    """Continue from ``source`` (the latest or an older checkpoint) in a new epoch that
    ``opening`` opens (its metadata carried as :mod:`runner.flow.epochs` says); ``meta``
    gives the further :class:`RunMeta` fields that opening sets.

    A new epoch gives the re-dispatched steps fresh idempotency keys and task ids,
    so their earlier attempts (also from later history) can neither block nor
    duplicate them. Except for ``running``, the activations an attempt still runs (a
    live lease) when the run goes on from where it stands (:func:`goes_on`: an answer, or a
    resume of its latest checkpoint, paused or failed): sending one again would run its
    method twice, so its attempt goes on and commits into the new epoch under its own key
    (``RunMeta.carried``).
    """
    record = record_of(source)
    carried = (
        {a: epoch_of(latest, a) for a in record.in_flight if a in running}
        if goes_on(latest, source)
        else {}
    )
    pending = [a for a in orch.pending(record) if a.id not in carried]
    ckpt = with_record(
        source,
        record,
        event=FLOW_RESUMED,
        step=None,
        state=state,
        status=RunStatus.RUNNING,
        meta=epochs.carry(
            source.meta,
            opening,
            ready=[a.id for a in pending],
            epoch=max(latest.meta.epoch, source.meta.epoch) + 1,
            resumed_from=source.id,
            usage=usage.resumed(latest.meta.usage, source.meta.usage),
            carried=carried,
            **meta,
        ),
    )
    return Transition(ckpt, pending, record=record)


def status_change(
    latest: Checkpoint,
    event: str,
    status: RunStatus,
    *,
    record: ExecutionRecord | None = None,
    **meta: Any,
) -> Checkpoint:
    """A checkpoint that only changes the run's status (cancel, pause, resume); ``meta``
    sets :class:`RunMeta` fields."""
    return with_record(
        latest,
        record_of(latest) if record is None else record,
        event=event,
        step=None,
        status=status,
        meta=latest.meta.updated(**{**meta, "ready": []}),
    )
