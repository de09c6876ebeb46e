"""Coordination records beside the checkpoints: dispatch markers and step leases.

* A **dispatch marker** (``HSETNX`` in the run's ``dispatched`` hash) makes every
  ready activation sent to the broker once, however often the commit that made it
  ready is redelivered.
* A **lease** (a score in the run's ``leases`` zset, its owner's attempt token in
  ``owners``) says an attempt is running a step; a heartbeat renews it. The
  recovery pass re-dispatches in-flight activations whose lease expired, so a
  worker killed with SIGKILL never strands a run (no reliance on the broker's
  visibility timeout).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from runner.store import scripts
from runner.store.redis import RedisProvider


class Coordinator:
    """Markers and leases of runs in one Redis store."""

    def __init__(self, store: RedisProvider, lease_seconds: float) -> None:
        self.store = store
        self.keys = store.keys
        self.lease_seconds = lease_seconds
        client = store.client
        self._claim = client.register_script(scripts.CLAIM)
        self._release = client.register_script(scripts.RELEASE)

    def mark_dispatched(self, run_id: str, keys: list[str], now: float | None = None) -> list[bool]:
        """Mark activations dispatched; ``True`` for each that was not already."""
        stamp = repr(time.time() if now is None else now)
        name = self.keys.dispatched(run_id)

        def write() -> list[bool]:
            pipe = self.store.client.pipeline(transaction=False)
            for key in keys:
                pipe.hsetnx(name, key, stamp)
            return [bool(flag) for flag in pipe.execute()]

        return self.store._guard(write)

    def redispatch_stamp(self, run_id: str, key: str) -> None:
        """Record that ``key`` was dispatched again now."""
        self.store._guard(
            lambda: self.store.client.hset(self.keys.dispatched(run_id), key, repr(time.time()))
        )

    def forget_dispatched(self, run_id: str, keys: list[str]) -> None:
        """Drop markers so a resume can send these activations again."""
        if keys:
            self.store._guard(
                lambda: self.store.client.hdel(self.keys.dispatched(run_id), *keys)
            )

    def dispatched(self, run_id: str) -> dict[str, float]:
        """Activation -> when it was last dispatched."""
        raw = self.store._guard(lambda: self.store.client.hgetall(self.keys.dispatched(run_id)))
        return {k.decode(): float(v) for k, v in raw.items()}

    def leases(self, run_id: str) -> dict[str, float]:
        """Activation -> lease expiry."""
        raw = self.store._guard(
            lambda: self.store.client.zrange(self.keys.leases(run_id), 0, -1, withscores=True)
        )
        return {k.decode(): float(v) for k, v in raw}

    def claim(self, run_id: str, key: str, token: str) -> bool:
        """Take or renew the lease of ``key``; ``False`` if another live attempt holds it."""
        now = time.time()
        keys = [self.keys.leases(run_id), self.keys.owners(run_id)]
        args = [key, token, repr(now + self.lease_seconds), repr(now)]
        return bool(self.store._guard(lambda: self._claim(keys=keys, args=args)))

    def release(self, run_id: str, key: str, token: str) -> None:
        """Drop the lease if ``token`` still holds it."""
        keys = [self.keys.leases(run_id), self.keys.owners(run_id)]
        self.store._guard(lambda: self._release(keys=keys, args=[key, token]))

    @contextmanager
    def heartbeat(self, run_id: str, key: str, token: str) -> Iterator[None]:
        """Hold the lease of ``key`` while the block runs, renewing it in the background."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.lease_seconds / 3):
                try:
                    if not self.claim(run_id, key, token):
                        return
                except Exception:  # a missed beat is retried; the lease may lapse
                    continue

        thread = threading.Thread(target=beat, name=f"lease:{key}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=1)

    def active_runs(self) -> list[str]:
        """Ids of runs whose status is running."""
        raw = self.store._guard(lambda: self.store.client.zrange(self.keys.active, 0, -1))
        return [r.decode() for r in raw]

    def try_lock(self, ttl: float) -> bool:
        """Take the recovery lock for ``ttl`` seconds; ``False`` if another holds it."""
        ms = max(1, int(ttl * 1000))
        return bool(
            self.store._guard(
                lambda: self.store.client.set(self.keys.recover_lock, "1", nx=True, px=ms)
            )
        )
