"""Coordination records beside the checkpoints: dispatch markers, step leases, stop notices.

* A **dispatch marker** (``HSETNX`` in the run's ``dispatched`` hash) makes every
  ready activation sent to the broker once, however often the commit that made it
  ready is redelivered. Its value is when it was (last) sent, or when a retry is due.
* A **lease** (a score in the run's ``leases`` zset, its owner's attempt token in
  ``owners``) says an attempt is running a step. :meth:`Coordinator.begin` reads
  the run's latest checkpoint and takes the lease in one round trip; the store's
  commit drops it atomically with the step's checkpoint; one heartbeat thread per
  process renews every lease the process holds. The recovery pass re-dispatches
  in-flight activations whose lease expired, so a worker killed with SIGKILL never
  strands a run (no reliance on the broker's visibility timeout).
* A **stop notice** (``PUBLISH`` on the run's ``stopped`` channel) wakes
  :meth:`RunHandle.wait <runner.distributed.client.RunHandle.wait>` when a run stops
  running; waiters re-read the status, so a lost notice only delays them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from runner.store import scripts
from runner.store.models import Checkpoint
from runner.store.redis import RedisProvider, _decode

log = logging.getLogger("runner.worker")

OK, HELD, DONE = "ok", "held", "done"
"""Outcomes of :meth:`Coordinator.begin`: lease taken, held by a live attempt, step committed."""


def _node() -> str:
    # The host and its PID namespace: two containers may share a hostname, never a namespace.
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "?"
    return f"{socket.gethostname()}/{namespace}"


NODE = _node()
"""Where this process runs, as written into attempt tokens."""


def attempt_token() -> str:
    """A fresh attempt token that says where the attempt runs: ``<hex>@<node>:<pid>``."""
    return f"{uuid.uuid4().hex}@{NODE}:{os.getpid()}"


def holder_is_dead(token: str) -> bool:
    """Whether the attempt ``token`` ran on this node in a process that no longer exists.

    Lets a redelivered step take over at once from a pool child that was killed
    (an OOM kill, ``kill -9``) instead of waiting for its lease to expire. A holder on
    another node, or whose liveness cannot be told, counts as alive.
    """
    _, _, where = token.partition("@")
    node, _, pid = where.rpartition(":")
    if node != NODE or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


class Begun(NamedTuple):
    """What :meth:`Coordinator.begin` found."""

    latest: Checkpoint | None
    """The run's latest checkpoint (``None``: no such run)."""
    outcome: str
    """:data:`OK`, :data:`HELD`, :data:`DONE`, or ``"none"`` (no run)."""
    holder: str
    """The token of the attempt holding the lease, when :data:`HELD`."""


class Coordinator:
    """Markers and leases of runs in one Redis store."""

    def __init__(self, store: RedisProvider, lease_seconds: float) -> None:
        self.store = store
        self.keys = store.keys
        self.lease_seconds = lease_seconds
        client = store.client
        self._begin = client.register_script(scripts.BEGIN_STEP)
        self._claim = client.register_script(scripts.CLAIM)
        self._renew = client.register_script(scripts.RENEW)
        self._take_over = client.register_script(scripts.TAKE_OVER)
        self._release = client.register_script(scripts.RELEASE)
        self._beats = _Heartbeats(self)

    # -- reading a run and taking a step's lease: one round trip ---------------------------

    def begin(self, run_id: str, key: str, token: str) -> Begun:
        """The run's latest checkpoint and whether ``token`` now holds ``key``'s lease.

        The outcome is :data:`OK` (lease taken or renewed), :data:`HELD` (a live
        attempt holds it), :data:`DONE` (``key`` is committed; no lease taken) or
        ``"none"`` (no such run).
        """
        now = time.time()
        return self._read(run_id, [key, token, repr(now + self.lease_seconds), repr(now)])

    def read(self, run_id: str) -> Checkpoint | None:
        """The run's latest checkpoint in one round trip."""
        return self._read(run_id, ["", "", "0", "0"]).latest

    def _read(self, run_id: str, args: list[str]) -> Begun:
        k = self.keys
        keys = [k.history(run_id), k.attempts(run_id), k.leases(run_id), k.owners(run_id)]
        blob, outcome, *holder = self.store._guard(
            lambda: self._begin(keys=keys, args=[k.snapshot_prefix(run_id), *args])
        )
        latest = None if blob is None else _decode(blob, f"(latest of run {run_id})")
        return Begun(latest, outcome.decode(), holder[0].decode() if holder else "")

    # -- dispatch markers ------------------------------------------------------------------

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

    def redispatch_stamp(self, run_id: str, key: str, at: float | None = None) -> None:
        """Record that ``key`` was dispatched again now (or is due at ``at``, a retry)."""
        stamp = repr(time.time() if at is None else at)
        self.store._guard(lambda: self.store.client.hset(self.keys.dispatched(run_id), key, stamp))

    def forget_dispatched(self, run_id: str, keys: list[str]) -> None:
        """Drop markers so a resume can send these activations again."""
        if keys:
            self.store._guard(lambda: self.store.client.hdel(self.keys.dispatched(run_id), *keys))

    def dispatched(self, run_id: str) -> dict[str, float]:
        """Activation -> when it was last dispatched."""
        raw = self.store._guard(lambda: self.store.client.hgetall(self.keys.dispatched(run_id)))
        return {k.decode(): float(v) for k, v in raw.items()}

    def snapshot(self, run_id: str) -> tuple[dict[str, float], dict[str, float]]:
        """The run's leases (activation -> expiry) and markers, in one round trip."""

        def fetch() -> list[Any]:
            pipe = self.store.client.pipeline(transaction=False)
            pipe.zrange(self.keys.leases(run_id), 0, -1, withscores=True)
            pipe.hgetall(self.keys.dispatched(run_id))
            return pipe.execute()

        leases, sent = self.store._guard(fetch)
        return (
            {k.decode(): float(v) for k, v in leases},
            {k.decode(): float(v) for k, v in sent.items()},
        )

    # -- leases ----------------------------------------------------------------------------

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

    def take_over(self, run_id: str, key: str, dead: str, token: str) -> bool:
        """Move ``key``'s lease from the dead attempt ``dead`` to ``token``."""
        keys = [self.keys.leases(run_id), self.keys.owners(run_id)]
        args = [key, dead, token, repr(time.time() + self.lease_seconds)]
        return bool(self.store._guard(lambda: self._take_over(keys=keys, args=args)))

    def renew(self, run_id: str, key: str, token: str) -> bool:
        """Extend the lease ``token`` holds; ``False`` if it is gone or another's."""
        keys = [self.keys.leases(run_id), self.keys.owners(run_id)]
        args = [key, token, repr(time.time() + self.lease_seconds)]
        return bool(self.store._guard(lambda: self._renew(keys=keys, args=args)))

    def release(self, run_id: str, key: str, token: str) -> None:
        """Drop the lease if ``token`` still holds it."""
        keys = [self.keys.leases(run_id), self.keys.owners(run_id)]
        self.store._guard(lambda: self._release(keys=keys, args=[key, token]))

    @contextmanager
    def heartbeat(self, run_id: str, key: str, token: str) -> Iterator[None]:
        """Keep renewing the lease ``token`` holds on ``key`` while the block runs."""
        self._beats.add(run_id, key, token)
        try:
            yield
        finally:
            self._beats.remove(run_id, key)

    # -- runs ------------------------------------------------------------------------------

    def active_runs(self) -> list[str]:
        """Ids of runs whose status is running."""
        raw = self.store._guard(lambda: self.store.client.zrange(self.keys.active, 0, -1))
        return [r.decode() for r in raw]

    def notify_stopped(self, run_id: str, status: str) -> None:
        """Tell waiters that the run stopped running (its new ``status``)."""
        self.store._guard(lambda: self.store.client.publish(self.keys.stopped(run_id), status))

    @contextmanager
    def watch_stopped(self, run_id: str) -> Iterator[Any]:
        """A pub/sub subscribed to the run's stop notices (``get_message(timeout=...)``)."""
        pubsub = self.store.client.pubsub(ignore_subscribe_messages=True)
        try:
            self.store._guard(lambda: pubsub.subscribe(self.keys.stopped(run_id)))
            yield pubsub
        finally:
            pubsub.close()

    def try_lock(self, ttl: float) -> bool:
        """Take the recovery lock for ``ttl`` seconds; ``False`` if another holds it."""
        ms = max(1, int(ttl * 1000))
        return bool(
            self.store._guard(
                lambda: self.store.client.set(self.keys.recover_lock, "1", nx=True, px=ms)
            )
        )


class _Heartbeats:
    """One thread per process renewing every lease the process's running steps hold.

    Started lazily (and again in a forked pool child, where the parent's thread does
    not exist), so a step pays no thread start; a lease is renewed every third of
    its length, so a short step finishes on the lease :meth:`Coordinator.begin` took.
    """

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.held: dict[tuple[str, str], str] = {}
        self.lock = threading.Lock()
        self.pid = 0

    def add(self, run_id: str, key: str, token: str) -> None:
        with self.lock:
            if self.pid != os.getpid():  # first use, or a forked child: start our own thread
                self.pid = os.getpid()
                self.held.clear()
                threading.Thread(target=self._loop, name="lease-heartbeat", daemon=True).start()
            self.held[(run_id, key)] = token

    def remove(self, run_id: str, key: str, token: str | None = None) -> None:
        with self.lock:
            if token is None or self.held.get((run_id, key)) == token:
                self.held.pop((run_id, key), None)

    def _loop(self) -> None:
        while True:
            time.sleep(self.coord.lease_seconds / 3)
            with self.lock:
                held = list(self.held.items())
            for (run_id, key), token in held:
                try:
                    if not self.coord.renew(run_id, key, token):
                        self.remove(run_id, key, token)
                except Exception:  # the next beat retries; the lease may lapse meanwhile
                    log.warning("lease renewal of %s %s failed", run_id, key, exc_info=True)
