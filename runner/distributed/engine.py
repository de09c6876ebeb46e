"""A step's life on a worker, dispatch, and the recovery pass.

Step life: load the run's latest checkpoint; skip if the activation is no longer
in flight (already committed: re-send what its commit made ready, idempotently)
or the run is not running; take the activation's lease; run the method; commit
its changes with compare-and-set on the run's sequence (retrying on conflict);
then dispatch what the commit made ready. A late duplicate attempt is fenced by
the store and changes nothing.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from runner.errors import CommitConflict, RunNotFound, StaleAttempt
from runner.flow import events as ev
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.orchestrator import Activation
from runner.flow.state import reducers_for
from runner.flow.steps import StepResult, run_step
from runner.settings import RunnerSettings, get_settings
from runner.store.models import Checkpoint, RunStatus, StepError
from runner.store.redis import RedisProvider

from .coord import Coordinator

log = logging.getLogger("runner.worker")

START_TASK = "runner.start_run"
RECOVER_TASK = "runner.recover"


class FlowNotAllowed(RunNotFound):
    """The run's flow is not in the workers' allow-list."""


@dataclass
class Runtime:
    """Everything a worker or producer needs: app, store, coordinator, registry."""

    app: Celery
    store: RedisProvider
    coord: Coordinator
    settings: RunnerSettings
    flows: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, app: Celery, settings: RunnerSettings | None = None) -> Runtime:
        """A runtime on ``app``'s Redis."""
        settings = settings or get_settings()
        store = RedisProvider(app.conf.runner_redis_url, prefix=settings.prefix)
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
    sent = []
    for act, key, is_new in zip(acts, keys, fresh, strict=True):
        if not is_new:
            continue
        if force:
            rt.coord.redispatch_stamp(run_id, key)
        rt.app.send_task(
            task_name(flow_name, act.method),
            kwargs={"run_id": run_id, "activation": act.id, "epoch": epoch},
            task_id=task_id(run_id, epoch, act.id),
            kwargsrepr=f"run={run_id} step={act.id}",
        )
        sent.append(act.id)
    return sent


def start_run(rt: Runtime, run_id: str) -> list[str]:
    """Body of the generic start task: check the allow-list, dispatch the starts."""
    latest = rt.store.latest(run_id)
    if latest is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    name = str(latest.meta.get("name"))
    if name not in rt.flows or rt.flows[name].flow_path() != latest.flow:
        err = FlowNotAllowed(
            f"flow {latest.flow} is not in this worker's allow-list (RUNNER_FLOW_MODULES)",
            run_id=run_id,
        )
        _commit(rt, run_id, lambda c: tr.Transition(_failed_run(c, err)))
        raise err
    pending = orch.pending(tr.record_of(latest))
    return dispatch(rt, name, run_id, _epoch(latest), pending)


def execute(
    rt: Runtime, task: Any, flow_cls: Any, run_id: str, activation: str, epoch: int, attempt: int
) -> dict[str, Any]:
    """Body of every step task (see the module docstring)."""
    latest = rt.store.latest(run_id)
    if latest is None or _epoch(latest) != epoch:
        return {"skipped": "unknown run or stale epoch"}
    record = tr.record_of(latest)
    act = _activation(record, activation)
    if act is None:
        return {"skipped": "already committed", "sent": _resend(rt, latest, activation)}
    if latest.status is not RunStatus.RUNNING:
        return {"skipped": f"run is {latest.status.value}"}
    key, token = _key(epoch, activation), uuid.uuid4().hex
    if not rt.coord.claim(run_id, key, token):
        raise task.retry(countdown=rt.settings.lease_seconds / 2, max_retries=None)
    flow = flow_cls()
    graph = flow_cls.graph()
    _emit(flow, run_id, ev.METHOD_STARTED, act.method, data={"attempt": attempt})
    try:
        with rt.coord.heartbeat(run_id, key, token):
            arg = orch.argument_for(graph, record, act)
            result = run_step(flow, graph, act, dict(latest.state), arg)
        result.attempts = attempt
        if result.paused is not None:
            reason = result.paused
            _commit(rt, run_id, lambda c: _paused(c, act, reason))
            _emit(flow, run_id, ev.FLOW_PAUSED, act.method, data={"reason": reason})
            return {"run_id": run_id, "step": activation, "paused": reason}
        if result.error is not None:
            return _on_error(rt, task, flow, act, result, epoch, attempt)
        committed = _commit(rt, run_id, lambda c: _done(graph, flow_cls, c, act, result, token))
    finally:
        rt.coord.release(run_id, key, token)
    if committed is None:
        return {"skipped": "another attempt committed"}
    ckpt, step = committed
    _emit(flow, run_id, ev.METHOD_FINISHED, act.method, duration=result.duration)
    sent = []
    if ckpt.status is RunStatus.RUNNING:
        sent = dispatch(rt, flow_cls.flow_name(), run_id, epoch, step.ready)
    elif ckpt.status is RunStatus.SUCCEEDED:
        _emit(flow, run_id, ev.FLOW_FINISHED, None)
    return {"run_id": run_id, "step": activation, "seq": ckpt.seq, "dispatched": sent}


def _done(
    graph: Any, flow_cls: Any, latest: Checkpoint, act: Activation, result: StepResult, token: str
) -> tr.Transition | None:
    if _activation(tr.record_of(latest), act.id) is None:
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
        reducers=reducers_for(flow_cls.state_type()),
        attempt=token,
    )


def _paused(latest: Checkpoint, act: Activation, reason: str) -> tr.Transition | None:
    if _activation(tr.record_of(latest), act.id) is None:
        return None
    return tr.step_paused(latest, act, reason)


def _on_error(
    rt: Runtime, task: Any, flow: Any, act: Activation, result: StepResult, epoch: int, attempt: int
) -> dict[str, Any]:
    assert result.error is not None
    spec = flow.graph().methods[act.method]
    retries = spec.retries if spec.retries is not None else rt.settings.step_retries
    if attempt <= retries:
        base = spec.retry_backoff if spec.retry_backoff is not None else rt.settings.retry_backoff
        delay = min(base * 2 ** (attempt - 1), rt.settings.retry_backoff_max)
        raise task.retry(
            kwargs={**task.request.kwargs, "attempt": attempt + 1},
            countdown=delay * (0.5 + random.random() / 2),
            max_retries=None,
        )
    error = StepError.from_exception(result.error, attempt)
    run_id = flow_run_id = task.request.kwargs["run_id"]

    def build(latest: Checkpoint) -> tr.Transition | None:
        if _activation(tr.record_of(latest), act.id) is None:
            return None
        status = RunStatus.FAILED if latest.status is RunStatus.RUNNING else latest.status
        return tr.step_failed(latest, act, error, status=status)

    _commit(rt, run_id, build)
    _emit(flow, flow_run_id, ev.METHOD_FAILED, act.method, error=f"{error.type}: {error.message}")
    _emit(flow, flow_run_id, ev.FLOW_FAILED, None, error=f"{error.type}: {error.message}")
    return {"run_id": run_id, "step": act.id, "failed": error.type, "attempts": attempt}


def _commit(
    rt: Runtime, run_id: str, build: Callable[[Checkpoint], tr.Transition | None]
) -> tuple[Checkpoint, tr.Transition] | None:
    """Compare-and-set loop: rebuild on the newest checkpoint until the commit lands."""
    for _ in range(200):
        latest = rt.store.latest(run_id)
        if latest is None:
            raise RunNotFound(f"no run {run_id}", run_id=run_id)
        step = build(latest)
        if step is None:
            return None
        try:
            ckpt = rt.store.commit(step.checkpoint, expected_seq=latest.seq)
        except CommitConflict:
            time.sleep(random.random() / 1000)
            continue
        except StaleAttempt:
            return None
        return ckpt, step
    raise CommitConflict(f"run {run_id}: too many concurrent commits", run_id=run_id)


def commit_status(
    rt: Runtime, run_id: str, event: str, status: RunStatus, **meta: Any
) -> Checkpoint:
    """Commit a status-only checkpoint (cancel, pause) with compare-and-set."""
    done = _commit(rt, run_id, lambda c: tr.Transition(tr.status_change(c, event, status, **meta)))
    assert done is not None
    return done[0]


def _resend(rt: Runtime, latest: Checkpoint, activation: str) -> list[str]:
    """After a redelivery: dispatch (idempotently) what the first commit made ready."""
    if latest.status is not RunStatus.RUNNING:
        return []
    name = str(latest.meta.get("name"))
    pending = orch.pending(tr.record_of(latest))
    return dispatch(rt, name, latest.run_id, _epoch(latest), pending)


def recover(rt: Runtime, *, force: bool = False) -> dict[str, list[str]]:
    """Re-dispatch in-flight steps whose lease expired or that were never started.

    Run by every worker every ``recovery_interval`` (one at a time, by a lock)
    and by ``runner recover`` (``force``: no lock). Returns run id -> re-sent ids.
    """
    interval = rt.settings.recovery_interval
    if not force and not rt.coord.try_lock(interval * 0.9):
        return {}
    now, grace = time.time(), rt.settings.lease_seconds
    resent: dict[str, list[str]] = {}
    for run_id in rt.coord.active_runs():
        latest = rt.store.latest(run_id)
        if latest is None or latest.status is not RunStatus.RUNNING:
            continue
        epoch, record = _epoch(latest), tr.record_of(latest)
        leases, sent_at = rt.coord.leases(run_id), rt.coord.dispatched(run_id)
        stale = []
        for act in orch.pending(record):
            key = _key(epoch, act.id)
            expiry = leases.get(key)
            if expiry is not None and expiry > now:
                continue
            if expiry is None and now - sent_at.get(key, 0.0) < grace:
                continue
            stale.append(act)
        if stale:
            name = str(latest.meta.get("name"))
            resent[run_id] = dispatch(rt, name, run_id, epoch, stale, force=True)
    return resent


def _failed_run(latest: Checkpoint, err: Exception) -> Checkpoint:
    ckpt = tr.status_change(latest, ev.FLOW_FAILED, RunStatus.FAILED)
    ckpt.error = StepError(type=type(err).__name__, message=str(err))
    return ckpt


def _activation(record: orch.ExecutionRecord, activation: str) -> Activation | None:
    for act in orch.pending(record):
        if act.id == activation:
            return act
    return None


def _epoch(ckpt: Checkpoint) -> int:
    return int(ckpt.meta.get("epoch", 0))


def _key(epoch: int, activation: str) -> str:
    return f"{epoch}/{activation}" if epoch else activation


def _emit(flow: Any, run_id: str, kind: str, method: str | None, **fields: Any) -> None:
    ev.emit(
        ev.FlowEvent(type=kind, run_id=run_id, flow=flow.flow_name(), method=method, **fields),
        getattr(flow, "_listeners", ()),
    )
