"""The recovery pass: re-send in-flight steps that nobody answers for and no message will bring.

Run by every worker every ``recovery_interval`` (one at a time, by a lock) and by
``runner recover`` (no lock). How a step in flight is told apart:

* **running, or about to**: it has a live lease. The attempt that runs it holds one
  (renewed by a heartbeat); so does the sender between the commit that made it ready and
  the broker accepting its message, and a worker holding the message without running it
  (prefetched, or a retry's countdown) until an attempt begins
  (:mod:`runner.distributed.handoff`).
* **lost**: its lease expired. Whoever held it died (a worker, a pool child, a sender)
  or was cut off from Redis for the whole lease: it is re-sent.
* **queued**: it was marked sent and has no lease. Its message is in the broker's queue
  (a backlog), and is never re-sent, however long it waits there. With a Redis broker, two
  exceptions, read from the broker (:class:`BrokerView`): a message a worker took off the
  queue more than ``lease_seconds`` ago and never acknowledged, with no lease recorded for
  it (that worker died between taking it and recording it), and a message sent more than
  ``lease_seconds`` ago that is neither queued nor taken (a worker died with it in the
  reply to its ``BRPOP``; found nowhere twice, :data:`HANDOFF_SETTLE` apart, since a live
  worker's message is nowhere too for a moment). Either is re-sent, once (RabbitMQ requeues
  such messages itself).
  The broker is read through :class:`~runner.distributed.broker.BrokerView`, the adapter
  that owns kombu's layout; in a process whose check found that layout changed, recovery
  goes by leases only.
* **never sent**: no marker and no lease (a resume or fork whose caller died before
  dispatching): re-sent ``lease_seconds`` after the run's latest checkpoint.
* **asleep**: a step that reached a durable sleep (``self.sleep``) committed and let go of
  its lease; it is sent again once its wake-up time passed (its start timer brings the run
  into the pass then), and only if not sent since it fell asleep.
* **not due**: a run whose ``not_before`` is still ahead (a delayed start) has its steps
  never sent on purpose; once that time passed they are sent at once, as never sent. Its
  start timer (:mod:`runner.store.timers`) brings it into the pass then, however recently it
  committed, and is dropped only after the pass sent them.

Before all that, the pass cancels the runs whose deadline passed (:func:`enforce_deadlines`),
answers ``None`` for the runs paused on an ``ask`` whose timeout passed
(:func:`answer_overdue`), starts the runs of the schedules' due ticks (:mod:`.schedules`)
and expires finished runs by policy, archived first (:mod:`.retention`).

So a pass reads only the runs where one of these can show (:meth:`Coordinator.runs_to_check
<runner.distributed.coord.Coordinator.runs_to_check>`, and those with a message a dead worker
took): a run that committed within the last lease and has no lapsed lease has none.

A run whose data cannot be read (a corrupt snapshot, missing keys, a checkpoint naming no
flow) is **quarantined**: its status becomes ``corrupt`` (``runner runs --status
corrupt``), it leaves the set of running runs, and one ERROR names it. Nothing about one
run stops the pass over the others.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from runner import ids
from runner.errors import (
    CorruptCheckpoint,
    EncryptionKeyError,
    RunNotFound,
    RunStateError,
    StoreUnavailable,
)
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow import versions
from runner.flow.orchestrator import Activation
from runner.observe import metrics
from runner.store.models import Checkpoint, RunStatus
from runner.store.timers import ANSWERS, DEADLINES, STARTS
from runner.views import scheduled_until, start_came_due, woken_at

from .answers import deliver
from .cancel import cancel_run
from .engine import (
    Runtime,
    allowed_flow,
    dispatch_in_epochs,
    run_of_task,
    task_id,
    task_name,
    waiting_children,
)
from .retention import enforce_retention
from .schedules import fire_due

if TYPE_CHECKING:
    # Imported where a pass runs: a process that only reads runs never imports kombu.
    from .broker import BrokerView

log = logging.getLogger("runner.worker")

QUARANTINED = "quarantined"
"""Event recorded on the metadata of a run that recovery quarantined."""

HANDOFF_SETTLE = 0.25
"""Seconds the pass waits before its second look at a step whose message it found nowhere.
A live worker that has just popped a message off the queue holds it in neither the queue nor
kombu's ``unacked`` hash until kombu records it there, a moment later (longer on a loaded
CPU): found nowhere twice, it is lost; found taken, running or committed the second time, it
is not sent again (which would start it twice, the begin turning the copy away)."""


def settle_handoff() -> None:
    """Wait :data:`HANDOFF_SETTLE` seconds: what a worker between its pop and its record of
    a message needs to record it."""
    time.sleep(HANDOFF_SETTLE)


class Unreadable(Exception):
    """A run's data cannot be read; the message says what is wrong (never leaves this module)."""


class _SecondLook(NamedTuple):
    """A run with steps sent a lease ago whose messages the pass found nowhere: looked for
    again once the pass's other runs are done and :data:`HANDOFF_SETTLE` has passed."""

    latest: Checkpoint
    marked: dict[str, float]
    """Activation key -> dispatch marker, as the first look read them."""
    nowhere: list[tuple[Activation, str, str, str]]
    """(activation, key, task id, task name) of each."""


T = TypeVar("T")


def recover(rt: Runtime, *, force: bool = False) -> dict[str, list[str]]:
    """Re-dispatch in-flight steps whose lease expired or that were never sent.

    ``force``: no lock (``runner recover``). Runs of flows this worker did not
    register are left to workers that did. Returns run id -> re-sent ids.
    """
    interval = rt.settings.recovery_interval
    if not force and not rt.coord.try_lock(interval * 0.9):
        return {}
    from .broker import BrokerView

    resent: dict[str, list[str]] = {}
    broker = BrokerView(rt.app, rt.settings.lease_seconds, rt.settings.queue)
    # Only runs where a step can be lost are read: a lapsed lease, no commit for a whole
    # lease (a step never sent, or whose message was lost, shows only then), or a message
    # taken by a dead worker. A busy deployment's runs commit all the time and cost the
    # pass one pipeline.
    now = time.time()
    for duty in (enforce_deadlines, answer_overdue, fire_due, enforce_retention):
        try:
            duty(rt, now)
        except StoreUnavailable:
            raise
        except Exception:
            # A bug in one duty must not keep the pass from re-sending lost steps.
            log.exception("recovery pass: %s failed; the pass goes on", duty.__name__)
    due = set(rt.store.due_timers(STARTS, now))
    held_by_dead = {run_of_task(task) for task in broker.taken_long_ago()}
    looks: list[_SecondLook] = []
    for run_id in rt.coord.runs_to_check(now, held_by_dead | due):
        done = _for_run(rt, run_id, functools.partial(_recover_run, rt, run_id, broker))
        if done is not None:
            sent, look = done
            if sent:
                resent[run_id] = sent
            if look is not None:
                looks.append(look)
    if looks:
        settle_handoff()  # once for the pass: a worker's moment between its pop and record
        for look in looks:
            run_id = look.latest.run_id
            lost = _for_run(rt, run_id, functools.partial(_look_again, rt, look, broker))
            if lost:
                resent[run_id] = [*resent.get(run_id, []), *lost]
    for run_id in due:
        rt.store.drop_timer(STARTS, run_id, now)  # sent above (or not running): not needed again
    metrics.recovered(sum(len(sent) for sent in resent.values()))
    return resent


def quarantine(rt: Runtime, run_id: str, reason: str) -> bool:
    """Mark ``run_id`` corrupt and take it out of the running runs; ``True`` if this call did.

    Logged once, at ERROR, with the run's id: a run already marked is left as it is.
    Its keys are kept for an operator to inspect (``runner status``) or delete.
    """
    info = rt.store.run(run_id)
    if info is not None and info.status is RunStatus.CORRUPT:
        return False
    why = f"{CorruptCheckpoint.__name__}: {reason}"
    try:
        rt.store.update_run(run_id, status=RunStatus.CORRUPT, event=QUARANTINED, error=why)
    except RunNotFound:
        log.error("run %s is in the running set but has no metadata: %s", run_id, reason)
        return False
    log.error("run %s quarantined (status corrupt), its data cannot be read: %s", run_id, reason)
    metrics.quarantined()
    return True


def _for_run(rt: Runtime, run_id: str, work: Callable[[], T]) -> T | None:
    """``work()`` on one run of the pass; ``None`` when it failed, so the pass goes on."""
    try:
        return work()
    except StoreUnavailable:
        raise  # Redis is gone for every run: the caller retries the pass
    except (CorruptCheckpoint, Unreadable) as exc:
        quarantine(rt, run_id, str(exc))
    except EncryptionKeyError as exc:
        # This worker lacks the run's key (RUNNER_ENCRYPTION_KEYS): a worker that has it
        # recovers the run; its data is fine, so it is not quarantined.
        log.error("recovery of run %s skipped: %s", run_id, exc)
    except Exception:
        # A bug, not bad data: name the run and go on with the others.
        log.exception("recovery of run %s failed; the pass goes on", run_id)
    return None


def _recover_run(
    rt: Runtime, run_id: str, broker: BrokerView
) -> tuple[list[str], _SecondLook | None]:
    """The steps of the run re-sent now, and those to look for again (see :func:`_stale`)."""
    latest = rt.coord.read(run_id)
    if latest is None:
        raise Unreadable(f"run {run_id} is running but its latest checkpoint is missing")
    if latest.status is not RunStatus.RUNNING:
        return [], None
    if scheduled_until(latest) is not None:
        return [], None  # a delayed start, not due: its timer brings it back then
    if not latest.meta.name or not latest.flow:
        raise Unreadable(f"checkpoint {latest.id} of run {run_id} names no flow")
    flow_cls = allowed_flow(rt, latest)
    if flow_cls is None:
        return [], None
    try:
        pending = orch.pending(tr.record_of(latest))
    except (KeyError, TypeError, ValueError) as exc:
        raise Unreadable(f"checkpoint {latest.id} of run {run_id}: bad record ({exc!r})") from None
    stale, look = _stale(rt, latest, pending, broker)
    return _resend(rt, latest, stale), look


def _resend(rt: Runtime, latest: Checkpoint, stale: list[Activation]) -> list[str]:
    """Send ``stale`` again, but for steps waiting on a child run; the ids sent."""
    if stale and latest.meta.links.children:
        waiting = waiting_children(rt, latest)
        stale = [act for act in stale if act.id not in waiting]
    if not stale:
        return []
    return dispatch_in_epochs(rt, latest, stale, force=True)


def _stale(
    rt: Runtime, latest: Checkpoint, pending: list[Activation], broker: BrokerView
) -> tuple[list[Activation], _SecondLook | None]:
    """The activations of ``pending`` nobody answers for (see the module docstring), and
    those whose message is nowhere, to be looked for again (:func:`_still_nowhere`)."""
    now = time.time()
    found = rt.coord.coordination(latest.run_id)
    leases, marked = found.leases, found.markers
    stale = []
    nowhere: list[tuple[Activation, str, str, str]] = []
    twins = versions.waiting_for(latest, rt.settings.version_policy)
    for act in pending:
        epoch = tr.epoch_of(latest, act.id)
        key, task = ids.activation_key_in(epoch, act.id), task_id(latest.run_id, epoch, act.id)
        expiry = leases.get(key)
        wake = woken_at(latest, act.id)
        if wake is not None and marked.get(key, 0.0) < wake:
            # Asleep (not sent since it fell asleep): woken once its time has come and no
            # attempt holds it any more; the re-send stamps its marker past the wake-up.
            if wake <= now and (expiry is None or expiry <= now):
                stale.append(act)
            continue
        if expiry is not None:
            if expiry <= now:
                stale.append(act)  # lost: its holder died
        elif key not in marked:
            if now - latest.created_at >= rt.settings.lease_seconds or start_came_due(latest, now):
                stale.append(act)  # never sent (or held back until now)
        elif marked[key] <= broker.taken_long_ago().get(task, 0.0):
            # Taken off the queue by a worker that died before recording it, and not
            # re-sent since (a re-send stamps the marker later than that delivery).
            stale.append(act)
        elif now - marked[key] >= rt.settings.lease_seconds:
            name = task_name(str(latest.meta.name), act.method)
            if broker.lost(task, name, twins):
                nowhere.append((act, key, task, name))  # or in a worker's hand
    return stale, _SecondLook(latest, marked, nowhere) if nowhere else None


def _look_again(rt: Runtime, look: _SecondLook, broker: BrokerView) -> list[str]:
    """Send again the steps of ``look`` still nowhere (:func:`_still_nowhere`); the ids sent."""
    return _resend(rt, look.latest, _still_nowhere(rt, look, broker))


def _still_nowhere(rt: Runtime, look: _SecondLook, broker: BrokerView) -> list[Activation]:
    """Of the steps sent a lease ago whose message the pass found nowhere, those lost in the
    hand-off: still nowhere after :data:`HANDOFF_SETTLE`, with no attempt holding a lease,
    not sent again and no commit of the run meanwhile (the next pass decides then)."""
    run_id = look.latest.run_id
    info = rt.store.run(run_id)
    if info is None or info.seq != look.latest.seq:
        return []
    again = rt.coord.coordination(run_id)
    twins = versions.waiting_for(look.latest, rt.settings.version_policy)
    return [
        act
        for act, key, task, name in look.nowhere
        if key not in again.leases
        and again.markers.get(key) == look.marked[key]
        and broker.lost_afresh(task, name, twins)
    ]


DEADLINE_PASSED = "its deadline passed"


def enforce_deadlines(rt: Runtime, now: float) -> list[str]:
    """Cancel every unfinished run whose deadline is not after ``now``, as ``runner cancel``
    does, with the reason recorded (``RunMeta.cancel_reason``); the ids cancelled.

    Read from the deadline timers, so a run is cancelled even if no worker ran it then
    (every worker was down: the first pass after decides); the run's own checkpoint says
    whether its deadline passed. A timer is dropped once its run is dealt with.
    """
    cancelled = []
    for run_id in rt.store.due_timers(DEADLINES, now):
        try:
            latest = rt.coord.read(run_id)
            deadline = None if latest is None else latest.meta.scheduling.deadline
            if latest is not None and deadline is not None and deadline > now:
                # Set by a submit that lost the run to another.
                rt.store.set_timer(DEADLINES, run_id, deadline)
                continue
            if latest is not None and deadline is not None and _cancel_late(rt, run_id, deadline):
                cancelled.append(run_id)
        except (CorruptCheckpoint, RunNotFound):
            pass  # nothing to cancel: recovery quarantines what it cannot read
        rt.store.drop_timer(DEADLINES, run_id, now)
    return cancelled


def answer_overdue(rt: Runtime, now: float) -> list[str]:
    """Answer ``None`` (:func:`~runner.distributed.answers.deliver`, as a person's answer
    comes) for every run still paused on a question whose deadline is not after
    ``now`` (``ask(timeout=)``): the step runs again and that ``ask`` returns ``None``. The
    ids answered.

    Read from the answer timers (set when the question is committed), so the answer comes
    however long the run has been paused and whichever worker is up then; the run's own
    checkpoint says whether it still waits. A run of a flow this worker does not run is
    left to one that does.
    """
    answered = []
    for run_id in rt.store.due_timers(ANSWERS, now):
        try:
            latest = rt.coord.read(run_id)
        except CorruptCheckpoint:
            latest = None  # nothing to answer: recovery quarantines what it cannot read
        awaited = None if latest is None else latest.meta.human.awaiting
        if latest is not None and awaited is not None and awaited.deadline is not None:
            if allowed_flow(rt, latest) is None:
                continue
            if awaited.deadline > now:
                rt.store.set_timer(ANSWERS, run_id, awaited.deadline)  # a later question of the run
                continue
            # Answered, resumed or cancelled meanwhile (RunStateError): nothing is due.
            with contextlib.suppress(RunStateError):
                deliver(rt, run_id, None)
                answered.append(run_id)
                log.info("run %s: %r had no answer in time; None", run_id, awaited.message)
        rt.store.drop_timer(ANSWERS, run_id, now)
    return answered


def _cancel_late(rt: Runtime, run_id: str, deadline: float) -> bool:
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(deadline))
    reason = f"{DEADLINE_PASSED} ({at})"
    if cancel_run(rt, run_id, reason) is None:
        return False  # it finished first
    log.warning("run %s cancelled: %s", run_id, reason)
    return True
