"""One per-process services object and its one at-fork hook (runner.distributed.services):
a child forked while the parent's background threads hold their locks works, with threads
of its own (a Celery pool child is such a fork of the worker's main process).

Each test forks this process (``os.fork``); the child runs a body under a watchdog and
reports by its exit status: 0 it worked, 1 it failed (its traceback on stderr), 3 it hung.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from runner import ids
from runner.distributed import broker, handoff, limits
from runner.distributed.coord import Coordinator, attempt_token
from runner.distributed.services import services
from runner.store.models import Checkpoint
from runner.store.redis import RedisProvider

HUNG = 3
LEASE = 0.9
"""Seconds of a lease here: renewed every 0.3 s by the heartbeat thread."""


def forked(body: Callable[[], None], timeout: float = 20.0) -> int:
    """Run ``body`` in a forked child; its exit status (:data:`HUNG` if it did not end)."""
    with warnings.catch_warnings():
        # Python warns that forking a threaded process may deadlock the child: the case here.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            threading.Timer(timeout, os._exit, (HUNG,)).start()
            body()
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    deadline = time.monotonic() + timeout + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return HUNG


@contextmanager
def held(*locks: Any) -> Iterator[None]:
    """Each of ``locks`` held by a thread of this process (as a background thread holds
    its lock for a moment) for the block: a child forked meanwhile inherits them held."""
    taken, release = threading.Barrier(len(locks) + 1), threading.Event()

    def hold(lock: Any) -> None:
        with lock:
            taken.wait()
            release.wait()

    threads = [threading.Thread(target=hold, args=(lock,), daemon=True) for lock in locks]
    for thread in threads:
        thread.start()
    taken.wait(timeout=10)
    try:
        yield
    finally:
        release.set()
        for thread in threads:
            thread.join(timeout=10)


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    provider = RedisProvider(redis_url, prefix=prefix)
    yield provider
    provider.close()


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.is_alive()}


def test_a_child_forked_while_each_background_thread_holds_its_lock_works(
    store: RedisProvider,
) -> None:
    coord = Coordinator(store, LEASE)
    run = ids.run_id()
    store.commit(Checkpoint(run_id=run, event="flow_started"))
    # Each background thread of the process is running, as in a busy worker.
    token = attempt_token()
    assert coord.begin_attempt(run, "a#1", token).outcome.value == "ok"
    handoff.hold(coord, run, ["b#1"])
    handoff.let_go(coord, run, ["b#1"])
    assert handoff.flush(5.0)
    gate = limits.gate_of(store, LEASE)
    slot = limits.Limits((), (("fork-test", 2),))
    assert gate.admit(slot, "parent", f"{run}|a#1") is None
    with coord.heartbeat(run, "a#1", token):
        assert {"lease-heartbeat", "let-go", "limit-slots"} <= _threads()
    forks = services().forks
    pool = store.client.connection_pool

    def child() -> None:
        assert services().forks == forks + 1
        assert not {"lease-heartbeat", "let-go", "limit-slots"} & _threads()  # not inherited
        # The store: a commit (a fresh id, the bases lock, a pool of its own).
        later = store.commit(Checkpoint(run_id=run, event="method_finished", state={"n": 1}))
        assert store.latest(run) == later
        assert store.client.connection_pool is not pool
        # A step's lease, renewed by a heartbeat thread of the child's own past its length.
        mine = attempt_token()
        assert coord.begin_attempt(run, "c#1", mine).outcome.value == "ok"
        with coord.heartbeat(run, "c#1", mine):
            time.sleep(LEASE * 1.5)
            assert coord.leases(run)["c#1"] > time.time()
        # A sender's lease, dropped by a let-go thread of the child's own.
        handoff.hold(coord, run, ["d#1"])
        assert "d#1" in coord.leases(run)
        handoff.let_go(coord, run, ["d#1"])
        assert handoff.flush(5.0)
        assert "d#1" not in coord.leases(run)
        # A concurrency slot: the child's own gate (the parent's slots are not its own).
        own = limits.gate_of(store, LEASE)
        assert own is not gate
        assert own.admit(slot, "child", f"{run}|c#1") is None
        own.release(slot, "child")
        # The broker checks: a verdict taken under their lock.
        assert broker.checks.ready("fork-test", lambda: None)
        assert {"lease-heartbeat", "let-go", "limit-slots"} <= _threads()

    with held(
        coord._beats.lock,
        handoff.releases().cond,
        gate._lock,
        store._bases_lock,
        pool._fork_lock,
        broker.checks.lock,
        ids._lock,
    ):
        status = forked(child)
    gate.release(slot, "parent")
    assert status == 0, "the child hung" if status == HUNG else "the child failed"
    # The parent goes on as before: its threads and pool are its own still.
    assert store.latest(run) is not None
    assert store.client.connection_pool is pool


def test_a_forked_child_makes_ids_and_a_sender_token_of_its_own() -> None:
    now_ms = int(time.time() * 1000) + 60_000
    ids.checkpoint_id(now_ms)
    sender = handoff.sender_token()
    read, write = os.pipe()

    def child() -> None:
        os.write(write, f"{ids.checkpoint_id(now_ms)} {handoff.sender_token()}".encode())

    status = forked(child)
    os.close(write)
    with os.fdopen(read) as got:
        child_id, child_sender = got.read().split()
    assert status == 0
    # Without its own random tail the child would make the parent's next id in that ms.
    assert child_id != ids.checkpoint_id(now_ms)
    assert child_sender != sender == handoff.sender_token()
