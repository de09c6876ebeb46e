"""The Redis side of :class:`~runner.store.base.DeploymentStore`'s own records: one line per
method, each handing over to the store module that owns the records' keys, scripts and
decoding (:mod:`.limits`, :mod:`.queues`, :mod:`.roster`, :mod:`.timers`, :mod:`.schedules`).

A mixin of :class:`~runner.store.redis.RedisProvider`, kept apart so the checkpoint store's
module holds checkpoints only. Redis errors are wrapped as the provider wraps its own
(:class:`~runner.errors.StoreUnavailable`, :class:`~runner.errors.StoreError`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import cached_property
from typing import Any

from .keys import Keys
from .limits import LimitBook, LimitUse, RateLimit, Refusal, SlotLimit
from .queues import QueueBook
from .roster import FORGET_AFTER, WorkerFacts, WorkerRecord
from .schedules import Schedule, ScheduleBook
from .timers import Timers


class DeploymentRecords:
    """Limits, queue consumers, the workers' roster, run timers and schedules of the
    deployment in ``client``."""

    client: Any
    keys: Keys

    def _wrapped(self) -> AbstractContextManager[None]:
        # The provider's own: Redis errors as the runner's (see RedisProvider).
        return _unwrapped()

    @cached_property
    def _limits(self) -> LimitBook:
        return LimitBook(self.client, self.keys)

    @cached_property
    def _queues(self) -> QueueBook:
        return QueueBook(self.client, self.keys)

    @cached_property
    def _timers(self) -> dict[str, Timers]:
        return {}

    def _timer(self, kind: str) -> Timers:
        found = self._timers.get(kind)
        if found is None:
            found = self._timers[kind] = Timers(self, kind)
        return found

    # -- limits -------------------------------------------------------------------------------

    def set_rate(self, name: str, rate: str, burst: int) -> None:
        """See :meth:`DeploymentStore.set_rate <runner.store.base.DeploymentStore.set_rate>`."""
        with self._wrapped():
            self._limits.set_rate(name, rate, burst)

    def named_rates(self) -> dict[str, tuple[str, int]]:
        """The named limits set: name -> ``(rate, burst)``."""
        with self._wrapped():
            return self._limits.rates()

    def admit(
        self,
        rates: Sequence[RateLimit],
        slots: Sequence[SlotLimit],
        token: str,
        member: str,
        lease_seconds: float,
        poll_seconds: float,
    ) -> Refusal | None:
        """See :meth:`LimitBook.admit <runner.store.limits.LimitBook.admit>`."""
        with self._wrapped():
            return self._limits.admit(rates, slots, token, member, lease_seconds, poll_seconds)

    def release_slots(self, names: Sequence[str], token: str) -> None:
        """See :meth:`LimitBook.release <runner.store.limits.LimitBook.release>`."""
        with self._wrapped():
            self._limits.release(names, token)

    def renew_slots(self, held: Sequence[tuple[str, str]], lease_seconds: float) -> None:
        """See :meth:`LimitBook.renew <runner.store.limits.LimitBook.renew>`."""
        with self._wrapped():
            self._limits.renew(held, lease_seconds)

    def limit_uses(self) -> list[LimitUse]:
        """See :meth:`LimitBook.uses <runner.store.limits.LimitBook.uses>`."""
        with self._wrapped():
            return self._limits.uses()

    # -- queue consumers ----------------------------------------------------------------------

    def announce_queues(
        self, queues: Sequence[str], worker: str, ttl: float, facts: WorkerFacts | None = None
    ) -> None:
        """See :meth:`QueueBook.announce <runner.store.queues.QueueBook.announce>`."""
        with self._wrapped():
            self._queues.announce(queues, worker, ttl, facts)

    def retire_queues(self, queues: Sequence[str], worker: str) -> None:
        """See :meth:`QueueBook.retire <runner.store.queues.QueueBook.retire>`."""
        with self._wrapped():
            self._queues.retire(queues, worker)

    def queue_consumers(self, queue: str) -> list[str]:
        """See :meth:`QueueBook.consumers <runner.store.queues.QueueBook.consumers>`."""
        with self._wrapped():
            return self._queues.consumers(queue)

    # -- the workers' roster ------------------------------------------------------------------

    def workers(self) -> list[WorkerRecord]:
        """See :meth:`Roster.all <runner.store.roster.Roster.all>`."""
        with self._wrapped():
            return self._queues.roster.all()

    def forget_dead_workers(self, older_than: float = FORGET_AFTER) -> list[str]:
        """See :meth:`Roster.forget_dead <runner.store.roster.Roster.forget_dead>`."""
        with self._wrapped():
            return self._queues.roster.forget_dead(older_than)

    # -- run timers ---------------------------------------------------------------------------

    def set_timer(self, kind: str, run_id: str, at: float) -> None:
        """See :meth:`Timers.set <runner.store.timers.Timers.set>`."""
        with self._wrapped():
            self._timer(kind).set(run_id, at)

    def due_timers(self, kind: str, now: float, limit: int = 500) -> list[str]:
        """See :meth:`Timers.due <runner.store.timers.Timers.due>`."""
        with self._wrapped():
            return self._timer(kind).due(now, limit)

    def timer_at(self, kind: str, run_id: str) -> float | None:
        """See :meth:`Timers.when <runner.store.timers.Timers.when>`."""
        with self._wrapped():
            return self._timer(kind).when(run_id)

    def drop_timer(self, kind: str, run_id: str, now: float) -> bool:
        """See :meth:`Timers.done <runner.store.timers.Timers.done>`."""
        with self._wrapped():
            return self._timer(kind).done(run_id, now)

    # -- schedules ----------------------------------------------------------------------------

    def add_schedule(self, schedule: Schedule) -> None:
        """See :meth:`ScheduleBook.add <runner.store.schedules.ScheduleBook.add>`."""
        with self._wrapped():
            ScheduleBook(self).add(schedule)

    def schedule(self, name: str) -> Schedule:
        """See :meth:`ScheduleBook.get <runner.store.schedules.ScheduleBook.get>`."""
        with self._wrapped():
            return ScheduleBook(self).get(name)

    def schedules(self) -> list[Schedule]:
        """See :meth:`ScheduleBook.all <runner.store.schedules.ScheduleBook.all>`."""
        with self._wrapped():
            return ScheduleBook(self).all()

    def pause_schedule(self, name: str, paused: bool) -> Schedule:
        """See :meth:`ScheduleBook.set_paused <runner.store.schedules.ScheduleBook.set_paused>`."""
        with self._wrapped():
            return ScheduleBook(self).set_paused(name, paused)

    def remove_schedule(self, name: str) -> None:
        """See :meth:`ScheduleBook.remove <runner.store.schedules.ScheduleBook.remove>`."""
        with self._wrapped():
            ScheduleBook(self).remove(name)

    def next_tick(self, name: str) -> float | None:
        """See :meth:`ScheduleBook.next_tick <runner.store.schedules.ScheduleBook.next_tick>`."""
        with self._wrapped():
            return ScheduleBook(self).next_tick(name)

    def advance_schedule(self, name: str, tick: float) -> None:
        """See :meth:`ScheduleBook.advance <runner.store.schedules.ScheduleBook.advance>`."""
        with self._wrapped():
            ScheduleBook(self).advance(name, tick)


@contextmanager
def _unwrapped() -> Iterator[None]:
    yield
