"""Run timers: when the recovery pass must act on a run, however recently it committed (a
delayed start), however busy it is (a deadline) or however long it has been paused (an
unanswered ``ask``'s timeout).

A timer is a hint: the run's checkpoint says what is due (``RunMeta.scheduling.not_before``,
``RunMeta.scheduling.deadline``, ``RunMeta.human.awaiting.deadline``), and the pass acts
only on what the checkpoint says. So a timer set for a run that then was not created, or one
left behind by a process killed before it dropped it, changes nothing; and one is dropped
only after the run was dealt with, so a pass killed midway (a worker's SIGKILL) leaves it for
the next one, on any worker.
"""

from __future__ import annotations

from typing import Any

from . import scripts
from .keys import RedisHandle

DEADLINES = "deadlines"
"""Runs to cancel at their deadline."""
STARTS = "starts"
"""Runs whose steps may be sent from then on (a delayed start)."""
ANSWERS = "answers"
"""Runs awaiting an answer until a deadline (``ask(timeout=)``), answered ``None`` then."""


class Timers:
    """The timers of one kind in a deployment's Redis."""

    def __init__(self, store: RedisHandle, kind: str) -> None:
        self.client: Any = store.client
        self.key = store.keys.timers(kind)
        self.drop = self.client.register_script(scripts.TIMER_DONE)

    def set(self, run_id: str, at: float) -> None:
        """Act on ``run_id`` at ``at`` (epoch seconds); replaces its timer."""
        self.client.zadd(self.key, {run_id: at})

    def due(self, now: float, limit: int = 500) -> list[str]:
        """Runs whose timer is not after ``now``, the earliest first."""
        found = self.client.zrangebyscore(self.key, "-inf", now, start=0, num=limit)
        return [raw.decode() for raw in found]

    def when(self, run_id: str) -> float | None:
        """When ``run_id``'s timer is due, or ``None``."""
        at = self.client.zscore(self.key, run_id)
        return None if at is None else float(at)

    def done(self, run_id: str, now: float) -> bool:
        """Drop ``run_id``'s timer if it is not after ``now``; ``True`` if dropped."""
        return bool(self.drop(keys=[self.key], args=[run_id, repr(now)]))
