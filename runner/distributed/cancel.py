"""Cancelling a run: the one place that does it, for ``runner cancel``, the API, the console
and a run's deadline.

1. A compare-and-set commit records the status ``cancelled`` (and why: a deadline, a
   parent's cancel); it is declined when the run already finished. The commit drops the
   run's leases and dispatch markers, so no step is sent after it, and a message already
   queued is skipped when it arrives (its run is cancelled).
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

A cancel takes the run's whole tree: the child runs its in-flight steps wait on (crews a step
started, see :mod:`runner.flow.children`), and theirs, are cancelled the same way, every
status first (top down), then every attempt told to stop. Each child's ``cancel_reason``
names its parent (and the parent's own reason). Resuming the parent sends its waiting step
again, which resumes the child at its first unfinished task
(:func:`runner.distributed.engine.start_child`). A child its parent's step created just as
the parent was cancelled, after the cancel looked for children, is cancelled by
:func:`follow_parent`, which the step calls once the child is started; each step of a
child run calls it too before it runs, so a canceller that died between its parent's cancel
and the child's leaves the child running no further than its current step. A child cancelled by
itself only ends that child: its parent's step fails with it, as when it fails.
"""

from __future__ import annotations

import contextlib
import logging

from runner.errors import RunNotFound
from runner.flow import transition as tr
from runner.flow.children import child_run_id
from runner.store.models import FLOW_CANCELLED, Checkpoint, RunStatus

from .engine import Runtime, commit_on_latest, task_id

log = logging.getLogger("runner.worker")


def cancel_run(rt: Runtime, run_id: str, reason: str | None = None) -> Checkpoint | None:
    """Cancel ``run_id`` and its child runs and stop their attempts in flight (see the module
    docstring); the checkpoint that records the run's cancel, or ``None`` when the run had
    already finished.

    ``reason`` is kept as the run's ``cancel_reason`` (``None``: cancelled by hand).
    ``RunNotFound`` when there is no such run.
    """
    tree = _commit_cancels(rt, run_id, reason)
    if not tree:
        return None
    for ckpt in tree:
        stop_attempts(rt, ckpt)
    return tree[0]


def follow_parent(rt: Runtime, child_id: str, child: Checkpoint | None = None) -> Checkpoint | None:
    """Cancel child run ``child_id`` if its parent is cancelled (see the module docstring):
    for a step that started the child, once it is started, and before each step of a child
    run (``child``: its latest checkpoint, when the caller has just read it). The child's
    cancel checkpoint, or ``None`` when its parent is not cancelled or the child is not
    running."""
    child = child if child is not None else rt.store.latest(child_id)
    link = None if child is None else child.meta.links.parent
    if child is None or link is None or child.status.finished:
        return None
    parent = rt.store.latest(link.run_id)
    if parent is None or parent.status is not RunStatus.CANCELLED:
        return None
    if child_id not in waited_on(parent):
        return None
    return cancel_run(rt, child_id, _parent_cancelled(parent.run_id, parent.meta.cancel_reason))


def _parent_cancelled(parent_id: str, reason: str | None) -> str:
    """The ``cancel_reason`` of a child run cancelled with its parent."""
    return f"its parent run {parent_id} was cancelled" + (f": {reason}" if reason else "")


def waited_on(ckpt: Checkpoint) -> list[str]:
    """The child runs ``ckpt``'s in-flight steps wait on (a link copied into a fork names
    the source run's child, which is not this run's)."""
    return [
        link.run_id
        for act, link in ckpt.meta.links.children.items()
        if link.waiting and act in ckpt.in_flight and link.run_id == child_run_id(ckpt.run_id, act)
    ]


def _commit_cancels(rt: Runtime, run_id: str, reason: str | None) -> list[Checkpoint]:
    """Commit the cancel of ``run_id``, then of the children it waits on, and theirs; the
    checkpoints that record them, top down (none when the run had already finished)."""

    def build(latest: Checkpoint) -> tr.Transition | None:
        if latest.status.finished:
            return None
        return tr.Transition(
            tr.status_change(latest, FLOW_CANCELLED, RunStatus.CANCELLED, cancel_reason=reason)
        )

    done = commit_on_latest(rt, run_id, build)
    if done is None:
        return []
    ckpt = done[0]
    tree = [ckpt]
    why = _parent_cancelled(run_id, reason)
    for child_id in waited_on(ckpt):
        # A linked child not created yet is cancelled by follow_parent once it is.
        with contextlib.suppress(RunNotFound):
            tree += _commit_cancels(rt, child_id, why)
    return tree


def stop_attempts(rt: Runtime, ckpt: Checkpoint) -> list[str]:
    """Ask the workers to stop the attempts of the steps in flight at ``ckpt``; the task ids
    revoked (none if the broadcast failed: the attempts then finish and commit nothing)."""
    ids = [task_id(ckpt.run_id, tr.epoch_of(ckpt, act), act) for act in ckpt.in_flight]
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
