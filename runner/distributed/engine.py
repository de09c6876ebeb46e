"""A step's life on a worker, dispatch, and the recovery pass.

Step life, in two Redis round trips besides Celery's own:

1. **begin** (one Lua call): read the run's latest checkpoint and take the
   activation's lease. Skip if the run is unknown, in another epoch or not running,
   or if the activation is no longer in flight (already committed: a redelivery;
   it sends only what nobody marked dispatched, so normally nothing); retry later
   if a live attempt holds the lease; fail the run if its flow is not the one this
   worker registered under that name.
2. run the method on its own copy of that state; a per-process heartbeat renews
   the lease meanwhile.
3. **commit** (one Lua call) its changes with compare-and-set on the run's
   sequence, first against the checkpoint read in 1, re-reading on conflict. The
   commit drops the lease, fences late duplicates (another attempt of the same
   activation changes nothing) and marks the activations it made ready dispatched.
4. ``send_task`` for each of them.

A worker killed anywhere in between is repaired by redelivery (late acks, reject on
worker loss) or by :func:`recover`, which re-sends in-flight activations whose
lease expired, or that were marked dispatched ``lease_seconds`` ago and never
started (the committer died before sending, or the message was lost).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from runner.crew import child
from runner.errors import CommitConflict, FlowImportError, RunnerError, RunNotFound, StaleAttempt
from runner.flow import events as ev
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.orchestrator import Activation
from runner.flow.state import reducers_for
from runner.flow.steps import StepResult, run_step
from runner.settings import RunnerSettings, get_settings
from runner.store.models import Checkpoint, RunStatus, StepError
from runner.store.redis import RedisProvider

from .coord import DONE, HELD, OK, Coordinator, attempt_token, holder_is_dead

log = logging.getLogger("runner.worker")

START_TASK = "runner.start_run"
RECOVER_TASK = "runner.recover"


class FlowNotAllowed(FlowImportError):
    """The run's flow is not in the workers' allow-list (``RUNNER_FLOW_MODULES``)."""


@dataclass
class Runtime:
    """Everything a worker or producer needs: app, store, coordinator, registry."""

    app: Celery
    store: RedisProvider
    coord: Coordinator
    settings: RunnerSettings
    flows: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(
        cls, app: Celery, settings: RunnerSettings | None = None, *, patient: bool = False
    ) -> Runtime:
        """A runtime on ``app``'s Redis (``patient``: retry Redis errors for seconds)."""
        settings = settings or get_settings()
        store = RedisProvider(app.conf.runner_redis_url, prefix=settings.prefix, patient=patient)
        return cls(app, store, Coordinator(store, settings.lease_seconds), settings)


def task_name(flow_name: str, method: str) -> str:
    """The Celery task name of a flow method: ``<Flow>.<method>``."""
    return f"{flow_name}.{method}"


def task_id(run_id: str, epoch: int, activation: str) -> str:
    """Deterministic task id of an activation."""
    return f"{run_id}:{epoch}:{activation}"


def dispatch(
    rt: Runtime,
    flow_name: str,
    run_id: str,
    epoch: int,
    acts: list[Activation],
    *,
    force: bool = False,
) -> list[str]:
    """Send each activation once (``force`` re-sends); return the ids sent."""
    if not acts:
        return []
    keys = [_key(epoch, a.id) for a in acts]
    fresh = [True] * len(acts) if force else rt.coord.mark_dispatched(run_id, keys)
    chosen = [act for act, is_new in zip(acts, fresh, strict=True) if is_new]
    for act in chosen if force else ():
        rt.coord.redispatch_stamp(run_id, _key(epoch, act.id))
    return send(rt, flow_name, run_id, epoch, chosen)


def send(rt: Runtime, flow_name: str, run_id: str, epoch: int, acts: list[Activation]) -> list[str]:
    """Send each activation's task (already marked dispatched); return the ids sent."""
    for act in acts:
        rt.app.send_task(
            task_name(flow_name, act.method),
            kwargs={"run_id": run_id, "activation": act.id, "epoch": epoch},
            task_id=task_id(run_id, epoch, act.id),
            kwargsrepr=f"run={run_id} step={act.id}",
        )
    return [act.id for act in acts]


def allowed_flow(rt: Runtime, latest: Checkpoint) -> Any | None:
    """The registered flow class that runs ``latest``'s run, or ``None``.

    The run names its flow by display name (the task names' prefix) and import
    path; both must match a class this worker imported from its allow-list.
    """
    flow_cls = rt.flows.get(str(latest.meta.get("name")))
    if flow_cls is None or flow_cls.flow_path() != latest.flow:
        return None
    return flow_cls


def fail_not_allowed(rt: Runtime, run_id: str, detail: str = "") -> FlowNotAllowed | None:
    """Fail a running run whose flow this worker may not run; the error, if it failed it."""
    latest = rt.coord.read(run_id)
    if latest is None or latest.status is not RunStatus.RUNNING:
        return None
    err = FlowNotAllowed(
        f"flow {latest.flow} is not in this worker's allow-list (RUNNER_FLOW_MODULES)"
        + (f": {detail}" if detail else ""),
        run_id=run_id,
        flow=latest.flow,
    )

    def build(c: Checkpoint) -> tr.Transition | None:
        if c.status is not RunStatus.RUNNING:
            return None
        return tr.Transition(_failed_run(c, err))

    log.error("run %s failed: %s", run_id, err)
    return err if _commit(rt, run_id, build) is not None else None


def start_run(rt: Runtime, run_id: str) -> list[str]:
    """Check a new run's flow against the allow-list and dispatch its starts.

    Body of the ``runner.start_run`` task (``submit`` dispatches the starts itself;
    the steps check the allow-list when they run).
    """
    latest = rt.coord.read(run_id)
    if latest is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    flow_cls = allowed_flow(rt, latest)
    if flow_cls is None:
        err = fail_not_allowed(rt, run_id)
        if err is not None:
            raise err
        return []
    if latest.status is not RunStatus.RUNNING:
        return []
    pending = orch.pending(tr.record_of(latest))
    return dispatch(rt, flow_cls.flow_name(), run_id, _epoch(latest), pending)


@dataclass
class _Lease:
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

    def __enter__(self) -> _Lease:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        try:
            self.release()
        except RunnerError:
            if exc_type is None:
                raise
            # Already failing: keep that error; the lease lapses by itself.
            log.warning("could not release lease %s of run %s", self.key, self.run_id)


def execute(
    rt: Runtime, task: Any, flow_cls: Any, run_id: str, activation: str, epoch: int, attempt: int
) -> dict[str, Any]:
    """Body of every step task (see the module docstring)."""
    key, token = _key(epoch, activation), attempt_token()
    latest, outcome, holder = rt.coord.begin(run_id, key, token)
    with _Lease(rt, run_id, key, token, held=outcome == OK) as lease:
        if latest is None or _epoch(latest) != epoch:
            return {"skipped": "unknown run or stale epoch"}
        act = orch.pending_activation(tr.record_of(latest), activation)
        if act is None or outcome == DONE:
            return {"skipped": "already committed", "sent": dispatch_pending(rt, latest)}
        if latest.status is not RunStatus.RUNNING:
            return {"skipped": f"run is {latest.status.value}"}
        if latest.flow != flow_cls.flow_path():
            lease.release()
            fail_not_allowed(rt, run_id, f"{flow_cls.flow_name()} here is {flow_cls.flow_path()}")
            return {"run_id": run_id, "step": activation, "failed": FlowNotAllowed.__name__}
        if outcome == HELD:
            if not (holder_is_dead(holder) and rt.coord.take_over(run_id, key, holder, token)):
                raise task.retry(countdown=rt.settings.lease_seconds / 2, max_retries=None)
            log.warning("run %s step %s: took over from dead attempt %s", run_id, act.id, holder)
            lease.held = True
        return _run(rt, task, flow_cls, latest, act, lease, attempt)


def _run(
    rt: Runtime,
    task: Any,
    flow_cls: Any,
    latest: Checkpoint,
    act: Activation,
    lease: _Lease,
    attempt: int,
) -> dict[str, Any]:
    """Run the method of ``act`` on ``latest``'s state and commit what it did."""
    run_id, flow, graph = latest.run_id, flow_cls(), flow_cls.graph()
    record, epoch = tr.record_of(latest), _epoch(latest)
    _emit(flow, run_id, ev.METHOD_STARTED, act.method, data={"attempt": attempt})
    with rt.coord.heartbeat(run_id, lease.key, lease.token):
        arg = orch.argument_for(graph, record, act)
        with child.deferring():  # run_crew returns a ChildRun marker instead of blocking
            result = run_step(flow, graph, act, dict(latest.state), arg)
        result.attempts = attempt
        marker = child.ChildRun.from_output(result.output) if result.error is None else None
        if marker is not None:
            return child.start_child(
                rt,
                run_id,
                act,
                epoch,
                marker,
                base_state=result.base_state,
                new_state=result.new_state,
            )
        if result.paused is not None:
            reason = result.paused
            _commit(rt, run_id, lambda c: _paused(c, epoch, act, reason))
            _emit(flow, run_id, ev.FLOW_PAUSED, act.method, data={"reason": reason})
            return {"run_id": run_id, "step": act.id, "paused": reason}
        if result.error is not None:
            return _on_error(rt, task, flow, epoch, act, result, lease, attempt)
        reducers = reducers_for(flow_cls.state_type())
        committed = _commit(
            rt,
            run_id,
            lambda c: _done(graph, reducers, c, epoch, act, result, lease.token),
            first=latest,
            mark_ready=True,
        )
    if committed is None:
        return {"skipped": "another attempt committed"}
    lease.held = False  # the commit dropped it
    ckpt, step = committed
    for name in step.conflicts:
        log.warning(
            "run %s: state field %r written by parallel steps; last commit (%s) wins",
            run_id,
            name,
            act.id,
        )
        _emit(flow, run_id, ev.STATE_CONFLICT, act.method, data={"field": name})
    _emit(flow, run_id, ev.METHOD_FINISHED, act.method, duration=result.duration)
    sent = []
    if ckpt.status is RunStatus.RUNNING:  # the commit marked them dispatched
        sent = send(rt, flow_cls.flow_name(), run_id, _epoch(ckpt), step.ready)
    elif ckpt.status is RunStatus.SUCCEEDED:
        _emit(flow, run_id, ev.FLOW_FINISHED, None)
    return {"run_id": run_id, "step": act.id, "seq": ckpt.seq, "dispatched": sent}


def _done(
    graph: Any,
    reducers: Any,
    latest: Checkpoint,
    epoch: int,
    act: Activation,
    result: StepResult,
    token: str,
) -> tr.Transition | None:
    if not _in_flight(latest, epoch, act):
        return None
    assert result.new_state is not None
    return tr.step_done(
        graph,
        latest,
        act,
        base_state=result.base_state,
        new_state=result.new_state,
        output=result.output,
        label=result.label,
        reducers=reducers,
        attempt=token,
    )


def _paused(latest: Checkpoint, epoch: int, act: Activation, reason: str) -> tr.Transition | None:
    if not _in_flight(latest, epoch, act):
        return None
    return tr.step_paused(latest, act, reason)


def _on_error(
    rt: Runtime,
    task: Any,
    flow: Any,
    epoch: int,
    act: Activation,
    result: StepResult,
    lease: _Lease,
    attempt: int,
) -> dict[str, Any]:
    """Retry the step with backoff, or fail the run once its retries are spent."""
    assert result.error is not None
    run_id = lease.run_id
    spec = flow.graph().methods[act.method]
    retries = spec.retries if spec.retries is not None else rt.settings.step_retries
    described = f"{type(result.error).__name__}: {result.error}"
    if attempt <= retries:
        base = spec.retry_backoff if spec.retry_backoff is not None else rt.settings.retry_backoff
        delay = min(base * 2 ** (attempt - 1), rt.settings.retry_backoff_max)
        delay *= 0.5 + random.random() / 2
        # Free the lease for the retry and date the marker to when the retry is due,
        # so the recovery pass does not take a waiting retry for a lost message.
        lease.release()
        rt.coord.redispatch_stamp(run_id, lease.key, at=time.time() + delay)
        log.warning(
            "run %s step %s attempt %d failed (%s); retrying in %.2fs",
            run_id,
            act.id,
            attempt,
            described,
            delay,
        )
        raise task.retry(
            kwargs={**task.request.kwargs, "attempt": attempt + 1},
            countdown=delay,
            max_retries=None,
        )
    error = StepError.from_exception(result.error, attempt)

    def build(latest: Checkpoint) -> tr.Transition | None:
        if not _in_flight(latest, epoch, act):
            return None
        status = RunStatus.FAILED if latest.status is RunStatus.RUNNING else latest.status
        return tr.step_failed(latest, act, error, status=status)

    _commit(rt, run_id, build)
    _emit(flow, run_id, ev.METHOD_FAILED, act.method, duration=result.duration, error=described)
    _emit(flow, run_id, ev.FLOW_FAILED, None, error=described)
    return {"run_id": run_id, "step": act.id, "failed": error.type, "attempts": attempt}


def _commit(
    rt: Runtime,
    run_id: str,
    build: Callable[[Checkpoint], tr.Transition | None],
    *,
    first: Checkpoint | None = None,
    mark_ready: bool = False,
) -> tuple[Checkpoint, tr.Transition] | None:
    """Compare-and-set loop: rebuild on the newest checkpoint until the commit lands.

    ``first`` is a checkpoint the caller already read, tried before re-reading.
    ``mark_ready``: the same atomic commit marks the activations it makes ready
    dispatched (when the run goes on running), for the caller to :func:`send`.
    ``None`` when ``build`` declines or another attempt of the step committed.
    Tells waiters when the committed checkpoint stops the run.
    """
    latest = first
    for _ in range(200):
        if latest is None:
            latest = rt.coord.read(run_id)
            if latest is None:
                raise RunNotFound(f"no run {run_id}", run_id=run_id)
        step = build(latest)
        if step is None:
            return None
        marks: list[str] = []
        if mark_ready and step.checkpoint.status is RunStatus.RUNNING:
            marks = [_key(_epoch(step.checkpoint), a.id) for a in step.ready]
        try:
            ckpt = rt.store.commit(step.checkpoint, expected_seq=latest.seq, dispatching=marks)
        except CommitConflict:
            latest = None
            time.sleep(random.random() / 1000)
            continue
        except StaleAttempt:
            return None
        if ckpt.status is not RunStatus.RUNNING:
            rt.coord.notify_stopped(run_id, ckpt.status.value)
            if ckpt.status.finished and "parent" in ckpt.meta:
                child.on_child_finished(rt, ckpt)
        return ckpt, step
    raise CommitConflict(f"run {run_id}: too many concurrent commits", run_id=run_id)


def commit_status(
    rt: Runtime, run_id: str, event: str, status: RunStatus, **meta: Any
) -> Checkpoint:
    """Commit a status-only checkpoint (cancel, pause) with compare-and-set."""
    done = _commit(rt, run_id, lambda c: tr.Transition(tr.status_change(c, event, status, **meta)))
    assert done is not None
    return done[0]


def dispatch_pending(rt: Runtime, latest: Checkpoint) -> list[str]:
    """Dispatch (idempotently) a running run's in-flight steps not yet sent: after a
    redelivery, what the first commit made ready; for a new child run, its starts."""
    if latest.status is not RunStatus.RUNNING:
        return []
    name = str(latest.meta.get("name"))
    pending = orch.pending(tr.record_of(latest))
    return dispatch(rt, name, latest.run_id, _epoch(latest), pending)


def recover(rt: Runtime, *, force: bool = False) -> dict[str, list[str]]:
    """Re-dispatch in-flight steps whose lease expired or that were never sent.

    Run by every worker every ``recovery_interval`` (one at a time, by a lock)
    and by ``runner recover`` (``force``: no lock). Runs of flows this worker did
    not register are left to workers that did. Returns run id -> re-sent ids.
    """
    interval = rt.settings.recovery_interval
    if not force and not rt.coord.try_lock(interval * 0.9):
        return {}
    resent: dict[str, list[str]] = {}
    for run_id in rt.coord.active_runs():
        latest = rt.coord.read(run_id)
        if latest is None or latest.status is not RunStatus.RUNNING:
            continue
        flow_cls = allowed_flow(rt, latest)
        if flow_cls is None:
            continue
        stale = _stale(rt, latest)
        if stale and "children" in latest.meta:
            waiting = child.waiting(rt, latest)
            stale = [act for act in stale if act.id not in waiting]
        if stale:
            epoch = _epoch(latest)
            resent[run_id] = dispatch(rt, flow_cls.flow_name(), run_id, epoch, stale, force=True)
    return resent


def _stale(rt: Runtime, latest: Checkpoint) -> list[Activation]:
    """In-flight activations of ``latest`` that nobody runs and no message will bring.

    A lease that expired means its attempt died. With no lease, the activation is
    taken to be queued (or its retry waiting) until ``lease_seconds`` after it was
    marked sent; after that its message is presumed lost (its sender died between
    marking and sending, or a worker died holding it unacknowledged). One never
    marked (a resume or fork whose caller died before dispatching) counts from the
    latest checkpoint.
    """
    now, grace = time.time(), rt.settings.lease_seconds
    leases, sent_at = rt.coord.snapshot(latest.run_id)
    epoch, stale = _epoch(latest), []
    for act in orch.pending(tr.record_of(latest)):
        key = _key(epoch, act.id)
        expiry = leases.get(key)
        if expiry is not None:
            if expiry > now:
                continue
        elif now - sent_at.get(key, latest.created_at) < grace:
            continue
        stale.append(act)
    return stale


def _failed_run(latest: Checkpoint, err: Exception) -> Checkpoint:
    ckpt = tr.status_change(latest, ev.FLOW_FAILED, RunStatus.FAILED)
    ckpt.error = StepError(type=type(err).__name__, message=str(err))
    return ckpt


def _in_flight(latest: Checkpoint, epoch: int, act: Activation) -> bool:
    """Whether ``act`` is still to be committed in ``epoch`` (a resume starts a new one:
    an attempt from before it commits nothing, the resumed run re-runs the step)."""
    pending = orch.pending_activation(tr.record_of(latest), act.id)
    return _epoch(latest) == epoch and pending is not None


def _epoch(ckpt: Checkpoint) -> int:
    return int(ckpt.meta.get("epoch", 0))


def _key(epoch: int, activation: str) -> str:
    return f"{epoch}/{activation}" if epoch else activation


def _emit(flow: Any, run_id: str, kind: str, method: str | None, **fields: Any) -> None:
    ev.emit(
        ev.FlowEvent(type=kind, run_id=run_id, flow=flow.flow_name(), method=method, **fields),
        getattr(flow, "_listeners", ()),
    )
