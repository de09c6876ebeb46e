"""Firing schedules (:mod:`runner.store.schedules`): each tick starts one run, exactly once.

Every worker's recovery pass (:func:`runner.distributed.recovery.recover`) calls
:func:`fire_due`. Exactly once does not rest on the pass running on one worker: a tick's run
id is derived from the schedule and the tick (:func:`~runner.store.schedules.run_id_of`), and
``submit(id=..., if_exists="return")`` creates a run by one create-only commit, so a tick
fired by two workers, or again by a worker that died before recording it, makes one run. The
pass brings at-least-once: it runs on every worker (one at a time, a lock that lapses with its
holder), and a schedule's next tick is recorded only after its runs were submitted. So no
separate beat process needs to be kept alive, and no tick depends on one.
"""

from __future__ import annotations

import logging

from runner.errors import RunExists, StoreFull, StoreUnavailable
from runner.store.schedules import Schedule, run_id_of

from .client import submit
from .engine import Runtime

log = logging.getLogger("runner.worker")

MAX_TICKS = 100_000
"""Ticks looked at per schedule and pass: a schedule missed for longer catches up over passes."""


def fire_due(rt: Runtime, now: float) -> list[str]:
    """Start the runs of every schedule's ticks due at ``now``; the run ids submitted."""
    fired: list[str] = []
    for schedule in rt.store.schedules():
        if schedule.paused:
            continue
        try:
            fired += _fire(rt, schedule, now)
        except StoreUnavailable:
            raise
        except StoreFull as exc:
            # Its tick stays due: it fires on a pass that finds room.
            log.warning("schedule %s waits: %s", schedule.name, exc)
        except Exception:
            # A flow that no longer imports, inputs it refuses: say so, go on with the others.
            log.exception("schedule %s could not fire", schedule.name)
    return fired


def _fire(rt: Runtime, schedule: Schedule, now: float) -> list[str]:
    due = rt.store.next_tick(schedule.name)
    if due is None:
        due = schedule.tick_after(schedule.created_at)
    ticks: list[float] = []
    for tick in schedule.ticks(due - 1e-6):
        if tick > now or len(ticks) >= MAX_TICKS:
            due = tick
            break
        ticks.append(tick)
    if not ticks:
        return []
    fired = []
    for tick in ticks if schedule.catch_up else ticks[-1:]:
        run_id = run_id_of(schedule.name, tick)
        try:
            submit(schedule.flow, schedule.inputs, id=run_id, priority=schedule.priority, rt=rt)
        except RunExists:
            log.warning("schedule %s: run %s exists with other inputs", schedule.name, run_id)
        fired.append(run_id)
    rt.store.advance_schedule(schedule.name, due)
    return fired
