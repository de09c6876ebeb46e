"""The engine's coordination beside the checkpoints: attempts, leases, markers, stop notices.

The records live in the store (:class:`~runner.store.base.CoordinatedStore`); this module
adds what belongs to a worker process:

* **attempt tokens** that say where an attempt runs, so a redelivered step can take over
  at once from a pool child that was killed (:func:`holder_is_dead`);
* **one heartbeat thread per process** renewing every lease the process's running steps
  hold, so a slow step keeps its lease and a dead one loses it within ``lease_seconds``;
* the lease length, so callers never pass it around.

A **dispatch marker** (one per activation key) makes every ready activation sent to the
broker once, however often the commit that made it ready is redelivered; its value is when
it was (last) sent, or when a retry is due. A **lease** says an attempt is running a step:
:meth:`Coordinator.begin_attempt` reads the run's latest checkpoint and takes it in one round trip,
the store's commit drops it atomically with the step's checkpoint, and the recovery pass
re-dispatches in-flight activations whose lease expired, so a worker killed with SIGKILL
never strands a run. A **stop notice** wakes
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
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from runner.errors import StoreError
from runner.store.base import BeginOutcome, Begun, CoordinatedStore, Coordination, StopNotices
from runner.store.models import Checkpoint, RunStatus

from . import outage
from .services import services

log = logging.getLogger("runner.worker")

OK, HELD, DONE = BeginOutcome.OK, BeginOutcome.HELD, BeginOutcome.DONE
"""Outcomes of :meth:`Coordinator.begin_attempt`: lease taken, held by a live attempt, step
committed."""
RECOVER_LOCK = "recover"
"""Name of the lock of the periodic recovery pass."""


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
    return _zombie(int(pid))


def _zombie(pid: int) -> bool:
    # A killed pool child stays a zombie until its worker reaps it: dead all the same.
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


class Coordinator:
    """Leases and markers of runs in a coordinated store, with a lease length and heartbeats."""

    def __init__(self, store: CoordinatedStore, lease_seconds: float) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self._beats = _Heartbeats(self)

    # -- reading a run and taking a step's lease: one round trip ---------------------------

    def begin_attempt(self, run_id: str, key: str, token: str) -> Begun:
        """The run's latest checkpoint and whether ``token`` now holds ``key``'s lease.

        The outcome is :data:`OK` (lease taken or renewed), :data:`HELD` (a live
        attempt holds it), :data:`DONE` (``key`` is committed; no lease taken) or
        :attr:`~runner.store.base.BeginOutcome.NO_RUN`.
        """
        return self.store.begin_attempt(run_id, key, token, self.lease_seconds)

    def claim(self, run_id: str, keys: Sequence[str], token: str) -> list[BeginOutcome]:
        """Take ``keys``' leases for ``token`` by :meth:`begin_attempt`'s rule, without reading the
        run (soft leases, :mod:`runner.distributed.handoff`): one round trip."""
        return self.store.claim(run_id, keys, token, self.lease_seconds) if keys else []

    def read(self, run_id: str) -> Checkpoint | None:
        """The run's latest checkpoint in one round trip."""
        return self.store.latest(run_id)

    # -- dispatch markers ------------------------------------------------------------------

    def mark_dispatched(
        self, run_id: str, keys: Sequence[str], now: float | None = None
    ) -> list[bool]:
        """Mark activations dispatched; ``True`` for each that was not already."""
        return self.store.mark_dispatched(run_id, keys, now)

    def redispatch_stamp(self, run_id: str, key: str, at: float | None = None) -> None:
        """Record that ``key`` was dispatched again now (or is due at ``at``, a retry)."""
        self.store.stamp(run_id, key, at)

    def dispatched(self, run_id: str) -> dict[str, float]:
        """Activation -> when it was last dispatched."""
        return self.store.markers(run_id)

    def coordination(self, run_id: str) -> Coordination:
        """The run's leases and markers, in one round trip."""
        return self.store.coordination(run_id)

    # -- leases ----------------------------------------------------------------------------

    def leases(self, run_id: str) -> dict[str, float]:
        """Activation -> lease expiry."""
        return self.store.leases(run_id)

    def take_over(self, run_id: str, key: str, dead: str, token: str) -> bool:
        """Move ``key``'s lease from the dead attempt ``dead`` to ``token``."""
        return self.store.take_over(run_id, key, dead, token, self.lease_seconds)

    def renew(self, run_id: str, key: str, token: str) -> bool:
        """Extend the lease ``token`` holds; ``False`` if it is gone or another's."""
        return self.store.renew(run_id, key, token, self.lease_seconds)

    def release(self, run_id: str, key: str, token: str) -> None:
        """Drop the lease if ``token`` still holds it."""
        self.store.release(run_id, key, token)

    def release_all(self, held: Sequence[tuple[str, str, str]]) -> None:
        """Drop each ``(run id, key, token)`` lease its token still holds, together."""
        if held:
            self.store.release_all(held)

    @contextmanager
    def heartbeat(self, run_id: str, key: str, token: str) -> Iterator[None]:
        """Keep renewing the lease ``token`` holds on ``key`` while the block runs."""
        self._beats.add(run_id, key, token)
        try:
            yield
        finally:
            self._beats.remove(run_id, key)

    # -- tellers: a run's last events after its other steps' events -----------------------

    @contextmanager
    def telling(self, run_id: str, token: str, wanted: bool) -> Iterator[Callable[[], None]]:
        """Order the events of the commit that ends a run (its step's, then the run's
        closing event) after every other committed step's events.

        An attempt tells its step's events after its commit, and that commit may already have
        sent the step that ends the run, in another process. So the block (commit, then tell)
        runs under ``token``'s word, given before the commit and dropped after: a commit that
        ends the run comes after it and sees it. The block calls what this yields before it
        tells the events of a commit that ended the run: that waits until no other attempt's
        word is good (a teller that died lapses after a lease). Nothing, not a round trip, when
        ``wanted`` is false (nobody listens in this process).
        """
        if not wanted:
            yield _at_once
            return
        self.store.add_teller(run_id, token, time.time() + self.lease_seconds)
        try:
            yield lambda: self._others_told(run_id, token)
        finally:
            try:
                self.store.drop_teller(run_id, token)
            except StoreError as exc:  # its word lapses after a lease
                log.warning("run %s: could not drop this attempt's teller mark: %s", run_id, exc)

    def _others_told(self, run_id: str, token: str) -> None:
        deadline = time.monotonic() + self.lease_seconds
        while time.monotonic() < deadline:
            if not [t for t in self.store.tellers(run_id, time.time()) if t != token]:
                return
            time.sleep(0.01)

    # -- runs ------------------------------------------------------------------------------

    def active_runs(self) -> list[str]:
        """Ids of runs whose status is running."""
        return self.store.active_runs()

    def runs_to_check(self, now: float, also: Collection[str] = ()) -> list[str]:
        """Running runs that may have a step nobody answers for at ``now``: one with a lease
        expired, or with no commit for a whole lease (a step never sent shows only then),
        and the running ones of ``also``."""
        return self.store.runs_to_check(now - self.lease_seconds, now, also)

    def notify_stopped(self, run_id: str, status: str) -> None:
        """Tell waiters that the run stopped running (its new ``status``)."""
        self.store.notify_stopped(run_id, RunStatus(status))

    def watch_stopped(self, run_id: str) -> AbstractContextManager[StopNotices]:
        """A subscription to the run's stop notices (``next(timeout)``) while the block runs."""
        return self.store.stop_notices(run_id)

    def try_lock(self, ttl: float) -> bool:
        """Take the recovery lock for ``ttl`` seconds; ``False`` if another holds it."""
        return self.store.try_lock(RECOVER_LOCK, ttl)


def _at_once() -> None:
    """Nothing to wait for (see :meth:`Coordinator.telling`)."""


class _Heartbeats:
    """One thread per process renewing every lease the process's running steps hold.

    Started on first use (and again in a forked pool child, where the parent's thread does
    not exist: :meth:`after_fork`), so a step pays no thread start; a lease is renewed
    every third of its length, so a short step finishes on the lease
    :meth:`Coordinator.begin_attempt` took.
    """

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.held: dict[tuple[str, str], str] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        services().adopt(self)

    def after_fork(self) -> None:
        """In a forked child: no thread yet, a fresh lock, none of the parent's leases."""
        self.lock, self.thread = threading.Lock(), None
        self.held = {}

    def add(self, run_id: str, key: str, token: str) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._loop, name="lease-heartbeat", daemon=True
                )
                self.thread.start()
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
                except Exception as exc:  # the next beat retries; the lease may lapse meanwhile
                    if not outage.report(exc):  # a lost connection is said once, per worker
                        log.warning("lease renewal of %s %s failed", run_id, key, exc_info=True)
