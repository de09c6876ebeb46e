"""Cancelling a run: the one place that does it, for ``runner cancel``, the API, the console
and a run's deadline.

1. A compare-and-set commit records the status ``cancelled`` (and why, for a deadline); it
   is declined when the run already finished. The commit drops the run's leases and
   dispatch markers, so no step is sent after it, and a message already queued is skipped
   when it arrives (its run is cancelled).
2. The attempts in flight at that checkpoint are told to stop: Celery's public
   ``control.revoke(..., terminate=True, signal="SIGTERM")`` for their task ids
   (``<run>:<epoch>:<activation>``, deterministic), broadcast on the deployment's control
   exchange. A prefork worker kills the pool process running the step (Celery starts
   another and acknowledges the message, so it is not delivered again); a worker holding
   the message without running it drops it.
3. A pool that cannot terminate a job (threads, solo: Celery logs that it does not
   implement it), or a worker the broadcast did not reach, lets the method run to its end;
   the attempt then finds its run cancelled and commits nothing
   (:func:`runner.distributed.step.execute`).

Either way the stopped step is still in flight in the cancelled checkpoint, and ``runner
resume`` runs it again in a new epoch, under new task ids the revoke does not touch.
"""

from __future__ import annotations

import logging

from runner.flow import transition as tr
from runner.store.models import FLOW_CANCELLED, Checkpoint, RunStatus

from .engine import Runtime, commit_on_latest, task_id

log = logging.getLogger("runner.worker")


def cancel_run(rt: Runtime, run_id: str, reason: str | None = None) -> Checkpoint | None:
    """Cancel ``run_id`` and stop its attempts in flight (see the module docstring); the
    checkpoint that records it, or ``None`` when the run had already finished.

    ``reason`` is kept as the run's ``cancel_reason`` (``None``: cancelled by hand).
    ``RunNotFound`` when there is no such run.
    """

    def build(latest: Checkpoint) -> tr.Transition | None:
        if latest.status.finished:
            return None
        return tr.Transition(
            tr.status_change(latest, FLOW_CANCELLED, RunStatus.CANCELLED, cancel_reason=reason)
        )

    done = commit_on_latest(rt, run_id, build)
    if done is None:
        return None
    ckpt = done[0]
    stop_attempts(rt, ckpt)
    return ckpt


def stop_attempts(rt: Runtime, ckpt: Checkpoint) -> list[str]:
    """Ask the workers to stop the attempts of the steps in flight at ``ckpt``; the task ids
    revoked (none if the broadcast failed: the attempts then finish and commit nothing)."""
    ids = [task_id(ckpt.run_id, ckpt.meta.epoch, act) for act in ckpt.in_flight]
    if not ids:
        return []
    try:
        rt.app.control.revoke(ids, terminate=True, signal="SIGTERM")
    except Exception as exc:
        # The cancel is committed; an attempt the broadcast missed commits nothing when it
        # ends. A broker that is down or refuses the control channel costs only that time.
        log.warning(
            "run %s cancelled, but its workers could not be told to stop %s (%s: %s); "
            "they finish the method and commit nothing",
            ckpt.run_id,
            ", ".join(ckpt.in_flight),
            type(exc).__name__,
            exc,
        )
        return []
    log.info("run %s cancelled: told the workers to stop %s", ckpt.run_id, ", ".join(ids))
    return ids
