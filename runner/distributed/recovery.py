"""The recovery pass: re-send in-flight steps that nobody runs and no message will bring.

Run by every worker every ``recovery_interval`` (one at a time, by a lock) and by
``runner recover`` (no lock). A step is re-sent when its lease expired (its attempt
died), or when it was marked sent ``lease_seconds`` ago and never started (its sender
died between marking and sending, or a worker died holding the message).
"""

from __future__ import annotations

import time

from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.orchestrator import Activation
from runner.store.models import Checkpoint, RunStatus

from .engine import Runtime, allowed_flow, dispatch, waiting_children


def recover(rt: Runtime, *, force: bool = False) -> dict[str, list[str]]:
    """Re-dispatch in-flight steps whose lease expired or that were never sent.

    ``force``: no lock (``runner recover``). Runs of flows this worker did not
    register are left to workers that did. Returns run id -> re-sent ids.
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
        if stale and latest.meta.children:
            waiting = waiting_children(rt, latest)
            stale = [act for act in stale if act.id not in waiting]
        if stale:
            epoch = latest.meta.epoch
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
    coordination = rt.coord.coordination(latest.run_id)
    leases, sent_at = coordination.leases, coordination.markers
    epoch, stale = latest.meta.epoch, []
    for act in orch.pending(tr.record_of(latest)):
        key = tr.activation_key_in(epoch, act.id)
        expiry = leases.get(key)
        if expiry is not None:
            if expiry > now:
                continue
        elif now - sent_at.get(key, latest.created_at) < grace:
            continue
        stale.append(act)
    return stale
