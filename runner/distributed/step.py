"""A step's life on a worker: begin, run the method, settle, commit, send.

1. **begin** the attempt (one Lua call): read the run's latest checkpoint and take the
   activation's lease. A step whose run is unknown, stopped or in another epoch is
   skipped (a WARNING says why); one already committed is a duplicate (a redelivery:
   it sends only what nobody marked dispatched, normally nothing); one whose lease a
   live attempt holds is retried later.
2. **run** the method on its own copy of that state; a per-process heartbeat renews
   the lease meanwhile.
3. **settle**: :mod:`runner.flow.lifecycle` decides the outcome (done, paused, retry,
   failed, child run) and builds the checkpoint.
4. **commit** it with compare-and-set (:func:`runner.distributed.engine.commit_on_latest`); the
   commit drops the lease, fences late duplicates and marks the steps it made ready
   dispatched;
5. **send** those steps: with a Redis broker, the commit's own script writes their
   messages (see :mod:`runner.distributed.outbox`); otherwise they are sent after it.
6. **tell** the step's events to the flow's listeners, after the commit; a commit that ended
   the run tells its step's events and the run's only once other processes have told theirs
   (:meth:`~runner.distributed.coord.Coordinator.telling`).

Celery sees the outcome as it is, so Flower and ``celery events`` tell the truth:
SUCCESS for a committed step (or a pause), RETRY with the real error for a retry,
FAILURE carrying the original error (:class:`~runner.errors.StepFailed`) for a step
that failed its run, and the custom state DUPLICATE (event ``task-duplicate``) for a
redelivered attempt that commits nothing.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from celery.exceptions import Ignore, Retry

from runner import ids
from runner.errors import CorruptCheckpoint, EncryptionKeyError, RunnerError, StepFailed
from runner.flow import events as ev
from runner.flow import lifecycle, streaming, usage, versions
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.attempt import Asked, Halted, Raised, Slept, StepResult, run_step
from runner.flow.context import WORKER, Answers, Patches, Sleeps, StepContext
from runner.flow.flow import bind_trigger_payload, listeners_of, set_usage_metrics
from runner.flow.graph import TRIGGER_PAYLOAD
from runner.flow.human_feedback import restore_history
from runner.flow.lifecycle import Outcome
from runner.flow.orchestrator import Activation
from runner.flow.state import reducers_for
from runner.observe import metrics
from runner.store import codec as codecs
from runner.store.models import Checkpoint, RunStatus, UsageMetrics
from runner.store.timers import ANSWERS, STARTS

from . import handoff, limits, routing
from .cancel import follow_parent
from .coord import DONE, HELD, OK, attempt_token, holder_is_dead
from .engine import (
    FlowNotAllowed,
    Runtime,
    commit_on_latest,
    dispatch_pending,
    fail_not_allowed,
    kwargs_repr,
    message_priority,
    start_child,
    task_id,
    task_name,
)
from .recovery import quarantine

log = logging.getLogger("runner.worker")

T = TypeVar("T")

DUPLICATE_EVENT = "task-duplicate"
"""Custom Celery event of an attempt that commits nothing (Flower shows state DUPLICATE)."""


@dataclass
class Lease:
    """An attempt's lease on an activation, released on exit unless the commit dropped it."""

    rt: Runtime
    run_id: str
    key: str
    token: str
    held: bool

    def release(self) -> None:
        if self.held:
            self.held = False
            self.rt.coord.release(self.run_id, self.key, self.token)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None and not issubclass(exc_type, _ACCOUNTED):
            # The attempt broke off with nothing committed, and Celery acks a task that
            # raised: no message will bring the step back. Keep the lease (the heartbeat
            # stops), so it lapses and recovery re-sends the step.
            return
        try:
            self.release()
        except RunnerError:
            if exc_type is None:
                raise
            # Already failing: keep that error; the lease lapses by itself.
            log.warning("could not release lease %s of run %s", self.key, self.run_id)


class CancelledMeanwhile(Exception):
    """The attempt's run was cancelled while it ran: it commits nothing (see
    :mod:`runner.distributed.cancel`)."""


_ACCOUNTED = (Retry, Ignore, StepFailed)
"""How an attempt can end that leaves its step settled or on its way again: a retry
(published), a duplicate or a hand-back (``Ignore``), a failure (committed)."""


def execute(
    rt: Runtime,
    task: Any,
    flow_cls: Any,
    run_id: str,
    activation: str,
    epoch: int,
    attempt: int,
    deployment: str | None = None,
    spent: dict[str, Any] | str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Body of every step task (see the module docstring). ``spent``: the token usage of the
    step's earlier attempts (a retry carries it, sealed when encryption is on), which its
    own usage includes; ``version``: the code version the step was handed to
    (:func:`_hand_over`)."""
    if deployment is not None and deployment != rt.settings.prefix:
        return _hand_back(rt, task, run_id, activation, deployment)
    key, token = ids.activation_key_in(epoch, activation), attempt_token()
    try:
        latest, found, holder = rt.coord.begin_attempt(run_id, key, token)
    except CorruptCheckpoint as exc:
        quarantine(rt, run_id, str(exc))
        return {"run_id": run_id, "step": activation, "skipped": "its run is corrupt"}
    except EncryptionKeyError as exc:
        # This worker lacks the run's key (or has a wrong one): the step goes back to the
        # queue for a worker that has it, said in one line, the run untouched.
        log.error("run %s step %s not run here: %s", run_id, activation, exc)
        raise task.retry(
            countdown=rt.settings.lease_seconds,
            max_retries=None,
            kwargsrepr=kwargs_repr(run_id, activation, attempt),
        ) from None
    if found == HELD and _take_over(rt, run_id, key, holder, token):
        found = OK
    with Lease(rt, run_id, key, token, held=found == OK) as lease:
        act = _runnable(rt, task, flow_cls, latest, run_id, activation, epoch, found)
        if isinstance(act, dict):
            return act
        assert latest is not None
        if found == OK:
            mine = versions.of(flow_cls.graph(), rt.settings)
            policy = rt.settings.version_policy
            elsewhere = versions.hand_to(
                flow_cls, latest, mine=mine, policy=policy, carried=version
            )
            if elsewhere is not None:
                return _hand_over(rt, task, lease, latest, elsewhere)
        if found == HELD:  # a live attempt runs it: look again when its lease could lapse
            raise task.retry(
                countdown=rt.settings.lease_seconds / 2,
                max_retries=None,
                kwargsrepr=kwargs_repr(run_id, activation, attempt),
            )
        with (
            _admitted(rt, task, flow_cls, latest, act, lease, attempt),
            rt.coord.heartbeat(run_id, key, token),
        ):
            flow, result = _run(rt, flow_cls, latest, act, attempt)
            if spent is not None:
                earlier = _spent_of(rt, run_id, activation, spent)
                result.usage = usage.joined(earlier, result.usage)
            return _settle(rt, task, flow_cls, flow, latest, result, lease)


@contextmanager
def _admitted(
    rt: Runtime,
    task: Any,
    flow_cls: Any,
    latest: Checkpoint,
    act: Activation,
    lease: Lease,
    attempt: int,
) -> Iterator[None]:
    """Run the block under the step's rate and concurrency limits (:mod:`.limits`), or
    defer the step while a limit holds it back."""
    with limits.admission(
        rt.store,
        rt.settings,
        flow_cls,
        flow_cls.graph().methods[act.method],
        latest.state,
        f"{lease.run_id}|{act.id}",
        lease.token,
    ) as waiting:
        if waiting is not None:
            _defer(rt, task, lease, waiting, attempt)
        yield


def _defer(rt: Runtime, task: Any, lease: Lease, waiting: limits.Waiting, attempt: int) -> NoReturn:
    """Hand a step a limit holds back to a message due when it may start, freeing the
    pool slot now. As with a retry, this process holds the step as its sender (a soft
    lease) until the message is published; then it is queued, or held by the worker that
    received it (its receiving lease), so it is never lost while it waits."""
    if rt.coord.take_over(lease.run_id, lease.key, lease.token, handoff.sender_token()):
        lease.held = False
    log.info(
        "run %s step %s waits %.2fs for limit %s",
        lease.run_id,
        lease.key,
        waiting.seconds,
        waiting.limit,
    )
    sent = task.retry(
        countdown=waiting.seconds,
        max_retries=None,
        kwargsrepr=kwargs_repr(lease.run_id, task.request.kwargs.get("activation", ""), attempt),
        throw=False,
    )
    handoff.let_go(rt.coord, lease.run_id, [lease.key])
    raise sent


def _hand_over(
    rt: Runtime, task: Any, lease: Lease, latest: Checkpoint, version: str
) -> dict[str, Any]:
    """Hand a step this worker cannot run (or may not: pinned) to the workers of ``version``:
    its message, the same task id, goes to their queue (:func:`.routing.version_queue`),
    naming the version; the run is not failed. As :func:`_defer`, this process holds the step
    as its sender until the message is published, then it is queued."""
    if rt.coord.take_over(lease.run_id, lease.key, lease.token, handoff.sender_token()):
        lease.held = False
    request = task.request
    kwargs = {**(request.kwargs or {}), "version": version}
    queue = routing.version_queue(routing.task_queue(rt.app, task.name), version)
    rt.app.send_task(
        task.name,
        kwargs=kwargs,
        task_id=request.id,
        queue=queue,
        kwargsrepr=kwargs_repr(lease.run_id, str(kwargs.get("activation", ""))),
        priority=message_priority(rt, task.name, latest.meta.scheduling.priority),
        ignore_result=not rt.settings.task_results,
    )
    handoff.let_go(rt.coord, lease.run_id, [lease.key])
    log.info("run %s step %s: handed to a worker of version %s", lease.run_id, lease.key, version)
    return {"run_id": lease.run_id, "step": kwargs.get("activation"), "handed_to": version}


def _take_over(rt: Runtime, run_id: str, key: str, holder: str, token: str) -> bool:
    """Take the lease from ``holder`` if it is an attempt whose process died. (A soft
    lease, see :mod:`~runner.distributed.handoff`, gave way to this attempt in begin.)"""
    if holder_is_dead(holder) and rt.coord.take_over(run_id, key, holder, token):
        log.warning("run %s step %s: took over from dead attempt %s", run_id, key, holder)
        metrics.took_over()
        return True
    return False


def _runnable(
    rt: Runtime,
    task: Any,
    flow_cls: Any,
    latest: Checkpoint | None,
    run_id: str,
    activation: str,
    epoch: int,
    found: str,
) -> Activation | dict[str, Any]:
    """The activation to run, or the reply of a step that is not to run."""
    if latest is None:
        return _skipped(run_id, activation, "its run is unknown here")
    if (runs_in := tr.epoch_of(latest, activation)) != epoch:
        why = f"it was sent in epoch {epoch} and the run runs it in epoch {runs_in}"
        return _skipped(run_id, activation, why)
    act = orch.pending_activation(tr.record_of(latest), activation)
    if act is None or found == DONE:
        sent = dispatch_pending(rt, latest)
        _duplicate(task, run_id, activation, "it was already committed", sent)
    if latest.status is not RunStatus.RUNNING:
        return _skipped(run_id, activation, f"the run is {latest.status.value}")
    # A canceller that died between its parent's cancel and this child's leaves the child
    # running: its next step finishes the cancel instead of spending more on a dead tree.
    if latest.meta.links.parent is not None and follow_parent(rt, run_id, latest) is not None:
        return _skipped(run_id, activation, "its parent run was cancelled")
    if latest.flow != flow_cls.flow_path():
        detail = f"{flow_cls.flow_name()} here is {flow_cls.flow_path()}"
        err = fail_not_allowed(rt, run_id, detail)
        raise StepFailed(
            f"run {run_id} step {activation}: {FlowNotAllowed.__name__}: {err or detail}",
            run_id=run_id,
            step=activation,
        )
    return act


def _run(
    rt: Runtime, flow_cls: Any, latest: Checkpoint, act: Activation, attempt: int
) -> tuple[Any, StepResult]:
    """Run ``act``'s method once on a copy of ``latest``'s state."""
    flow, graph = flow_cls(), flow_cls.graph()
    set_usage_metrics(flow, usage.last_of(latest))  # self.usage_metrics: the run's part so far
    restore_history(flow, latest.meta.human.feedback)  # self.last_human_feedback: the run's so far
    if latest.meta.trigger_payload is not None:
        bind_trigger_payload(flow, {TRIGGER_PAYLOAD: latest.meta.trigger_payload})
    run_id, name, listeners = latest.run_id, str(latest.meta.name), listeners_of(flow)
    if attempt == 1 and act.id == latest.meta.opener:
        ev.tell(ev.FLOW_STARTED, run_id, name, listeners)
    ev.tell(
        ev.METHOD_STARTED, run_id, name, listeners, method=act.method, data={"attempt": attempt}
    )
    arg = orch.argument_for(graph, tr.record_of(latest), act)
    meta = latest.meta
    ctx = StepContext(
        flow,
        act,
        WORKER,
        attempt,
        Answers(list(meta.human.answers.get(act.id) or ()), review=meta.human.reviews.get(act.id)),
        # The sleeps earlier attempts reached: ``self.sleep`` passes those whose time has come.
        Sleeps(list(meta.replay.sleeps.get(act.id, []))),
        patches=Patches(dict(meta.replay.patches.get(act.id, {}))),
        version=latest.version,
        # A child run (a crew inside a flow) streams into its parent's stream.
        stream_to=streaming.target(
            rt.store, run_id, meta.links.parent.run_id if meta.links.parent else None
        ),
        # The run's committed outputs (what a declared flow's ``${outputs.step}`` reads).
        outputs=dict(tr.record_of(latest).outputs),
    )
    return flow, run_step(flow, graph, ctx, dict(latest.state), arg)


def _settle(
    rt: Runtime,
    task: Any,
    flow_cls: Any,
    flow: Any,
    latest: Checkpoint,
    result: StepResult,
    lease: Lease,
) -> dict[str, Any]:
    """Commit what the attempt came to, then tell Celery (see the module docstring)."""
    run_id, act = latest.run_id, result.activation
    epoch, graph = tr.epoch_of(latest, act.id), flow_cls.graph()
    outcome = lifecycle.decide(result, graph.methods[act.method], rt.settings)
    end = result.end
    if outcome is Outcome.RETRY and isinstance(end, Raised):
        _retry(rt, task, graph.methods[act.method], result, end.error, lease)
    if outcome is Outcome.CHILD and (marker := lifecycle.child_started(result)) is not None:
        started = start_child(rt, run_id, epoch, marker, result)
        # A cancel of the parent that came while the child was being created may have
        # looked for it too early: the child then goes with its parent.
        follow_parent(rt, started["child"])
        return started
    recorded = latest.meta.replay.sleeps.get(act.id, [])
    if isinstance(end, Slept) and end.sleep.index < len(recorded):
        # Sent before the wake-up of a sleep already recorded (a resume, a duplicate):
        # nothing to commit; the recovery pass sends the step again once it is due.
        return _asleep(rt, latest, act.id, end)
    if isinstance(end, Asked) and end.awaiting.deadline is not None:
        # Set before the commit, so no run paused on a question lacks its timer (one left
        # for a pause that was not committed changes nothing: the pass reads the run).
        rt.store.set_timer(ANSWERS, run_id, end.awaiting.deadline)
    try:
        committed = _commit_settled(
            rt,
            flow_cls,
            run_id,
            result,
            outcome,
            epoch=epoch,
            token=lease.token,
            worker=task.request.hostname,
            first=latest,
            listeners=listeners_of(flow),
            duration=result.duration,
        )
    except CancelledMeanwhile:
        return _skipped(run_id, act.id, "its run was cancelled while it ran; a resume runs it")
    if committed is None:
        _duplicate(task, run_id, act.id, "another attempt committed it", [])
    ckpt, settled = committed
    lease.held = False  # the commit dropped it
    if settled.outcome is Outcome.SLEEPING and isinstance(end, Slept):
        return _asleep(rt, ckpt, act.id, end)
    if settled.outcome is Outcome.FAILED:
        _step_failed(ckpt, settled, result)
    if settled.outcome is Outcome.PAUSED and isinstance(end, Asked | Halted):
        return {"run_id": run_id, "step": act.id, "paused": end.reason, "checkpoint": ckpt.id}
    # A running run's ready steps were sent by the commit.
    sent = [a.id for a in settled.transition.ready] if ckpt.status is RunStatus.RUNNING else []
    return {
        "run_id": run_id,
        "step": act.id,
        "seq": ckpt.seq,
        "checkpoint": ckpt.id,
        "dispatched": sent,
    }


def _asleep(rt: Runtime, ckpt: Checkpoint, act: str, slept: Slept) -> dict[str, Any]:
    """The step ``act`` committed its durable sleep: the recovery pass wakes it (its start
    timer brings the run in then); this attempt ends, its lease dropped by the commit (or
    released on the way out)."""
    wake_at = slept.sleep.wake_at
    rt.store.set_timer(STARTS, ckpt.run_id, wake_at)
    log.info("run %s step %s sleeps until %s", ckpt.run_id, act, time.ctime(wake_at))
    return {"run_id": ckpt.run_id, "step": act, "sleeping_until": wake_at, "checkpoint": ckpt.id}


def _commit_settled(
    rt: Runtime,
    flow_cls: Any,
    run_id: str,
    result: StepResult,
    outcome: Outcome,
    *,
    epoch: int,
    token: str,
    worker: str | None,
    first: Checkpoint | None = None,
    listeners: Sequence[ev.EventListener] = (),
    duration: float | None = None,
) -> tuple[Checkpoint, lifecycle.Settled] | None:
    """Commit ``result`` settled as ``outcome`` with compare-and-set, sending the steps it
    makes ready, then tell its events to ``listeners`` and the registered ones (a sleep
    tells none; ``duration``: the step's, if known) under :meth:`Coordinator.telling
    <runner.distributed.coord.Coordinator.telling>`. An attempt's own end and one killed at
    the hard time limit both commit this way. ``None`` when another attempt committed the
    step; :class:`CancelledMeanwhile` when the run was cancelled in this epoch (nothing is
    committed)."""
    graph, reducers = flow_cls.graph(), reducers_for(flow_cls.state_type())
    version = versions.of(graph, rt.settings)

    def build(latest: Checkpoint) -> lifecycle.Settled | None:
        cancelled = latest.status is RunStatus.CANCELLED
        if cancelled and tr.epoch_of(latest, result.activation.id) == epoch:
            # Checked inside the compare-and-set loop: a cancel committed first wins, and
            # the step stays in flight for a resume (a pool that could not stop the attempt).
            raise CancelledMeanwhile(run_id)
        return lifecycle.settle(
            graph,
            latest,
            result,
            outcome,
            epoch=epoch,
            reducers=reducers,
            token=token,
            worker=worker,
            version=version,
        )

    # Whatever it settles as, the attempt has ended: the commit drops its lease, so a step
    # that paused or slept (still in flight) is not taken for a running one.
    released = (ids.activation_key_in(epoch, result.activation.id), token)
    with rt.coord.telling(run_id, token, ev.wanted(listeners)) as others_told:
        committed = commit_on_latest(
            rt, run_id, build, first=first, send_ready=True, released=released
        )
        if committed is not None and committed[1].outcome is not Outcome.SLEEPING:
            lifecycle.announce(
                committed[1], listeners, duration=duration, before_closing=others_told
            )
    return committed


def _spent_for(rt: Runtime, run_id: str, activation: str, spent: UsageMetrics) -> Any:
    """The ``spent`` argument of a retry's message: the usage as JSON, sealed when
    encryption is on (a message, and so Flower, carries no payload in clear)."""
    codec = codecs.of_settings(rt.settings)
    if codec is None:
        return spent.model_dump(mode="json")
    where = codecs.field_context(run_id, f"spent|{activation}")
    return codec.seal(spent.model_dump_json().encode(), where)


def _spent_of(rt: Runtime, run_id: str, activation: str, spent: Any) -> UsageMetrics:
    """The usage a retry's message carries (:func:`_spent_for`)."""
    if isinstance(spent, str):
        where = codecs.field_context(run_id, f"spent|{activation}")
        what = f"the usage of step {activation} of run {run_id} in its retry's message"
        spent = codecs.open_value(codecs.of_settings(rt.settings), spent, where, what)
        return UsageMetrics.model_validate_json(spent)
    return UsageMetrics.model_validate(spent)


def _retry(
    rt: Runtime, task: Any, spec: Any, result: StepResult, error: BaseException, lease: Lease
) -> NoReturn:
    """Hand the next attempt to Celery's retry, with the real error (``result``'s)."""
    kwargs = {**task.request.kwargs, "attempt": result.attempts + 1}
    if result.usage is not None:  # the next attempt's usage includes this one's
        kwargs["spent"] = _spent_for(rt, lease.run_id, result.activation.id, result.usage)
    retry = _hand_on(
        rt,
        spec,
        result,
        error,
        lease,
        lambda delay: task.retry(
            exc=error,
            kwargs=kwargs,
            countdown=delay,
            max_retries=None,
            kwargsrepr=kwargs_repr(lease.run_id, result.activation.id, result.attempts + 1),
            throw=False,
        ),
    )
    raise retry


def _hand_on(
    rt: Runtime,
    spec: Any,
    result: StepResult,
    error: BaseException,
    lease: Lease,
    publish: Callable[[float], T],
) -> T:
    """Hand a failed attempt's step on to its next attempt, which ``publish`` sends with the
    retry delay; what ``publish`` returned.

    Until the retry is published this process holds the step as its sender (a soft
    lease: if it dies first, the lease lapses and recovery re-sends the step); then the
    step is queued, or held by the worker that received the retry.
    """
    attempt = result.attempts
    delay = lifecycle.retry_delay(spec, rt.settings, attempt, random.random())
    if rt.coord.take_over(lease.run_id, lease.key, lease.token, handoff.sender_token()):
        lease.held = False
    log.warning(
        "run %s step %s attempt %d failed (%s); retrying in %.2fs",
        lease.run_id,
        result.activation.id,
        attempt,
        lifecycle.described(error),
        delay,
    )
    sent = publish(delay)
    handoff.let_go(rt.coord, lease.run_id, [lease.key])
    return sent


def _step_failed(ckpt: Checkpoint, settled: lifecycle.Settled, result: StepResult) -> NoReturn:
    """The failure checkpoint is committed: end the task as FAILURE with the error."""
    error = settled.error
    assert error is not None
    act = result.activation.id
    # Celery logs this once, at ERROR, with the traceback of ``error`` (the cause).
    raise StepFailed(
        f"run {ckpt.run_id} step {act} failed after {result.attempts} attempt(s): "
        f"{lifecycle.described(error)}",
        run_id=ckpt.run_id,
        step=act,
        checkpoint=ckpt.id,
        error_type=type(error).__name__,
        error_message=str(error),
    ) from error


def _skipped(run_id: str, activation: str, why: str) -> dict[str, Any]:
    log.warning("run %s step %s skipped: %s", run_id, activation, why)
    return {"run_id": run_id, "step": activation, "skipped": why}


def _duplicate(task: Any, run_id: str, activation: str, why: str, sent: list[str]) -> NoReturn:
    """End a redelivered or duplicate attempt that commits nothing: not a second SUCCESS."""
    log.warning("run %s step %s is a duplicate: %s (re-sent %s)", run_id, activation, why, sent)
    task.send_event(DUPLICATE_EVENT, run_id=run_id, step=activation, reason=why)
    raise Ignore()


def _hand_back(rt: Runtime, task: Any, run_id: str, activation: str, deployment: str) -> NoReturn:
    """A step of another deployment reached this worker (queues shared by configuration):
    leave it to its owners by putting it back on the queue it came from."""
    log.error(
        "run %s step %s belongs to deployment %r, not %r; handing it back to its queue",
        run_id,
        activation,
        deployment,
        rt.settings.prefix,
    )
    queue = (task.request.delivery_info or {}).get("routing_key") or rt.settings.queue
    task.retry(countdown=1, max_retries=None, queue=queue, throw=False)
    raise Ignore()


def hard_time_limit(
    rt: Runtime,
    flow_cls: Any,
    kwargs: dict[str, Any],
    error: BaseException,
    worker: str | None = None,
) -> str:
    """Settle an attempt the pool killed at Celery's hard ``time_limit`` (in the worker's
    main process; Celery has already acked its message and marked it FAILURE).

    The killed attempt counts as a failed one: the step is retried while it has retries
    left, else the run fails with ``error``, so a step that always overruns its limit ends
    instead of being re-sent for ever. Returns what was done: ``retried``, ``failed``, or
    why nothing was (another attempt answers for the step, it was committed, ...).
    """
    run_id, activation = str(kwargs["run_id"]), str(kwargs["activation"])
    epoch, attempt = int(kwargs.get("epoch", 0)), int(kwargs.get("attempt", 1))
    key, token = ids.activation_key_in(epoch, activation), attempt_token()
    latest, found, holder = rt.coord.begin_attempt(run_id, key, token)
    if found == HELD:
        # The pool kills the attempt right after telling us; give it a moment to be gone.
        deadline = time.monotonic() + 2 * rt.settings.lease_seconds
        while not holder_is_dead(holder) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not (holder_is_dead(holder) and rt.coord.take_over(run_id, key, holder, token)):
            return "another attempt holds the step"
        found = OK
    if found != OK:
        return f"nothing to settle ({found})"
    with Lease(rt, run_id, key, token, held=True) as lease:
        if latest is None or latest.status is not RunStatus.RUNNING:
            return "the run is not running"
        if not lifecycle.in_flight(latest, epoch, activation):
            return "the step is no longer in flight"
        act = orch.pending_activation(tr.record_of(latest), activation)
        assert act is not None
        graph = flow_cls.graph()
        spec = graph.methods[act.method]
        name = task_name(flow_cls.flow_name(), act.method)
        result = StepResult(act, dict(latest.state), Raised(error), attempts=attempt)
        if lifecycle.decide(result, spec, rt.settings) is Outcome.RETRY:
            _hand_on(
                rt,
                spec,
                result,
                error,
                lease,
                lambda delay: rt.app.send_task(
                    name,
                    kwargs={**kwargs, "attempt": attempt + 1},
                    task_id=task_id(run_id, epoch, activation),
                    countdown=delay,
                    kwargsrepr=kwargs_repr(run_id, activation, attempt + 1),
                    # A fresh message, not Celery's retry: the step's priority given anew.
                    priority=message_priority(rt, name, latest.meta.scheduling.priority),
                ),
            )
            return "retried"
        try:
            committed = _commit_settled(
                rt,
                flow_cls,
                run_id,
                result,
                Outcome.FAILED,
                epoch=epoch,
                token=token,
                worker=worker,
            )
        except CancelledMeanwhile:
            return "the run was cancelled"
        if committed is None:
            return "another attempt committed the step"
        log.error(
            "run %s step %s failed after %d attempt(s): killed at its hard time limit (%s)",
            run_id,
            activation,
            attempt,
            lifecycle.described(error),
        )
        return "failed"
