"""When finished runs leave Redis: the two retention indexes and their scripts.

A run that ends (``succeeded``, ``failed``, ``cancelled``) joins ``P:[{S}:]ended``, scored by
its end, in the commit that ends it (:data:`~runner.store.scripts.COMMIT`); a commit that
resumes it takes it out. The retention pass (:mod:`runner.distributed.retention`) reads the
oldest undecided runs in bounded batches, works out when each expires from the deployment's
and its flow's policy (:mod:`runner.store.policy`), and moves it to ``P:[{S}:]expires``,
scored by that time (``inf``: kept). Once due, the pass copies the run to the archive (if
one is set) and deletes it with :data:`~runner.store.scripts.EXPIRE_RUN`, which deletes only
a run that is still finished, unpinned, and at the sequence number the archive holds.

Each script touches one run's keys and its own shard's index entries (one Cluster slot);
each call handles one run, so no call blocks Redis for longer than one run's delete.
A pin (``pinned`` on the run's metadata hash) keeps a run out of both indexes.

A mixin of :class:`~runner.store.redis.RedisProvider`, like
:class:`~runner.store.deployment.DeploymentRecords`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from typing import Any, NamedTuple, Protocol, runtime_checkable

from . import scripts
from .base import DeploymentStore
from .keys import Keys
from .policy import EXPIRING

EXPIRE_OUTCOMES = ("gone", "early", "changed", "live", "undecided")
"""What :meth:`RetentionRecords.expire_run` may answer (see :data:`scripts.EXPIRE_RUN`)."""


class Expiry(NamedTuple):
    """Where a run stands with retention."""

    pinned: bool = False
    """Kept for ever by ``runner pin``."""
    ended_at: float | None = None
    """When it ended, if its expiry is not decided yet (the next pass decides)."""
    expires_at: float | None = None
    """When it expires (``inf``: kept), once decided; ``None`` while undecided or running."""


@runtime_checkable
class RetainingStore(DeploymentStore, Protocol):
    """A deployment store that expires finished runs (what the retention pass asks)."""

    def ended_runs(self, limit: int) -> list[tuple[str, float]]:
        """Up to ``limit`` finished runs whose expiry is undecided, ``(id, end time)``,
        the earliest ended first."""
        ...

    def decide_expiry(self, run_id: str, ended_at: float, expires_at: float) -> int:
        """Record when ``run_id`` (read as ended at ``ended_at``) expires: 1 done, 2 it is
        pinned (kept), 0 it changed since it was read (left for the next pass)."""
        ...

    def due_runs(self, now: float, limit: int) -> list[tuple[str, float]]:
        """Up to ``limit`` runs whose expiry is not after ``now``, ``(id, expiry)``."""
        ...

    def expire_run(self, run_id: str, now: float, archived_seq: int | None) -> str:
        """Delete ``run_id`` if it is due, still finished and unpinned, and (with
        ``archived_seq``) still at that sequence number; one of :data:`EXPIRE_OUTCOMES`."""
        ...

    def pin_run(self, run_id: str, pinned: bool) -> bool:
        """Keep ``run_id`` for ever, or (``pinned=False``) let retention apply again;
        ``False`` if there is no such run."""
        ...

    def expiries(self, run_ids: Sequence[str]) -> dict[str, Expiry]:
        """Where each of ``run_ids`` stands with retention (one round trip)."""
        ...


class RetentionRecords:
    """The retention indexes of the deployment in ``client`` (see the module docstring)."""

    client: Any
    keys: Keys

    def _wrapped(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the provider's: Redis errors as the runner's

    @cached_property
    def _retention_scripts(self) -> dict[str, Any]:
        return {
            name: self.client.register_script(getattr(scripts, name))
            for name in ("DECIDE_EXPIRY", "EXPIRE_RUN", "PIN_RUN")
        }

    def ended_runs(self, limit: int) -> list[tuple[str, float]]:
        """See :meth:`RetainingStore.ended_runs`: the oldest ``limit`` of every shard, merged."""
        with self._wrapped():
            pipe = self.client.pipeline(transaction=False)
            for key in self.keys.all_ended():
                pipe.zrange(key, 0, limit - 1, withscores=True)
            shards = pipe.execute()
        merged = heapq.merge(*shards, key=lambda pair: pair[1])
        return [(raw.decode(), float(at)) for raw, at in list(merged)[:limit]]

    def decide_expiry(self, run_id: str, ended_at: float, expires_at: float) -> int:
        """See :meth:`RetainingStore.decide_expiry`."""
        k = self.keys
        keys = [k.ended_of(run_id), k.expires_of(run_id), k.meta(run_id)]
        at = "inf" if math.isinf(expires_at) else repr(expires_at)
        with self._wrapped():
            return int(self._retention_scripts["DECIDE_EXPIRY"](keys, [run_id, repr(ended_at), at]))

    def due_runs(self, now: float, limit: int) -> list[tuple[str, float]]:
        """See :meth:`RetainingStore.due_runs`: the earliest due of every shard, merged."""
        with self._wrapped():
            pipe = self.client.pipeline(transaction=False)
            for key in self.keys.all_expires():
                pipe.zrangebyscore(key, "-inf", now, start=0, num=limit, withscores=True)
            shards = pipe.execute()
        merged = heapq.merge(*shards, key=lambda pair: pair[1])
        return [(raw.decode(), float(at)) for raw, at in list(merged)[:limit]]

    def expire_run(self, run_id: str, now: float, archived_seq: int | None) -> str:
        """See :meth:`RetainingStore.expire_run` (:data:`scripts.EXPIRE_RUN`)."""
        k = self.keys
        keys = k.of_run_deleted(run_id)
        seq = "" if archived_seq is None else str(archived_seq)
        with self._wrapped():
            found = self._retention_scripts["EXPIRE_RUN"](keys, [run_id, repr(now), seq])
        return str(found.decode() if isinstance(found, bytes) else found)

    def pin_run(self, run_id: str, pinned: bool) -> bool:
        """See :meth:`RetainingStore.pin_run`."""
        k = self.keys
        keys = [k.meta(run_id), k.ended_of(run_id), k.expires_of(run_id)]
        with self._wrapped():
            return bool(self._retention_scripts["PIN_RUN"](keys, [run_id, "1" if pinned else "0"]))

    def index_ended(self, run_ids: Sequence[str]) -> int:
        """Add those of ``run_ids`` that ended, unpinned and in neither index (they ended
        before this release kept one), to the undecided index at their last update; how
        many. A run resumed meanwhile is dropped again by the pass (its script checks)."""
        k = self.keys
        with self._wrapped():
            pipe = self.client.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.hmget(k.meta(run_id), ["status", "updated_at", "pinned"])
                pipe.zscore(k.ended_of(run_id), run_id)
                pipe.zscore(k.expires_of(run_id), run_id)
            found = pipe.execute()
            added = 0
            pipe = self.client.pipeline(transaction=False)
            for i, run_id in enumerate(run_ids):
                (status, updated, pinned), ended, expires = found[3 * i : 3 * i + 3]
                known = pinned is not None or ended is not None or expires is not None
                if status and status.decode() in EXPIRING and updated and not known:
                    pipe.zadd(k.ended_of(run_id), {run_id: float(updated)}, nx=True)
                    added += 1
            pipe.execute()
        return added

    def expiries(self, run_ids: Sequence[str]) -> dict[str, Expiry]:
        """See :meth:`RetainingStore.expiries`."""
        k = self.keys
        with self._wrapped():
            pipe = self.client.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.hget(k.meta(run_id), "pinned")
                pipe.zscore(k.ended_of(run_id), run_id)
                pipe.zscore(k.expires_of(run_id), run_id)
            found = pipe.execute()
        out = {}
        for i, run_id in enumerate(run_ids):
            pinned, ended, expires = found[3 * i : 3 * i + 3]
            out[run_id] = Expiry(
                pinned=pinned is not None,
                ended_at=None if ended is None else float(ended),
                expires_at=None if expires is None or ended is not None else float(expires),
            )
        return out
