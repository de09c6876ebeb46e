"""Chaos: workers SIGKILLed at random while 20 runs go; nothing is lost or done twice.

Two workers (prefork, 2 processes each) on a prefix and queue of their own run 20 runs of
``DistChaos`` (begin -> 3 parallel -> ``and_`` join -> final; every step records its
effect through an ``append`` reducer and counts its executions in Redis). A thread
SIGKILLs a random worker process, a pool child or a whole worker's parent, every 1-3 s,
and starts a new worker in place of a dead parent. Every run must succeed with every
step's effect in its state once, one commit per activation, and nothing left in flight.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

from runner.distributed.client import submit
from runner.distributed.processes import children
from runner.store.models import RunStatus
from tests._dist_support import finished, private_pool
from tests.conftest import WorkerPool
from tests.flows.dist import DistChaos, executions

pytestmark = pytest.mark.chaos

RUNS = 20
METHODS = ("begin", "p1", "p2", "p3", "join", "final")
BUDGET = 75.0
"""Seconds all runs get to finish."""


class Killer(threading.Thread):
    """SIGKILLs a random process of ``workers`` every 1-3 s; replaces dead workers."""

    def __init__(self, pool: WorkerPool, workers: list[subprocess.Popen[bytes]], seed: int):
        super().__init__(name="chaos-killer", daemon=True)
        self.pool, self.workers, self.rng = pool, workers, random.Random(seed)
        self.stop = threading.Event()
        self.kills: list[str] = []
        self.orphans: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(1.0, 3.0)):
                self.kill_one()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def kill_one(self) -> None:
        i = self.rng.randrange(len(self.workers))
        parent = self.workers[i]
        pool = children(parent.pid)
        victim = self.rng.choice([parent.pid, *pool])
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        if victim == parent.pid:
            # Its pool children are left running their step (zombie attempts) until
            # they notice; the test kills them at the end.
            self.orphans += pool
            parent.wait(timeout=10)
            self.kills.append("worker")
            self.workers[i] = self.pool.start()
        else:
            self.kills.append("child")


def test_runs_survive_random_worker_kills(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    seed = random.randrange(1 << 30)
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _):
        workers = [pool.start(), pool.start()]
        handles = [submit(DistChaos, rt=rt) for _ in range(RUNS)]
        killer = Killer(pool, workers, seed)
        killer.start()
        deadline = time.monotonic() + BUDGET
        try:
            statuses = [h.wait(timeout=max(deadline - time.monotonic(), 0.1)) for h in handles]
        finally:
            killer.stop.set()
            killer.join(timeout=30)
            for pid in killer.orphans:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        context = f"seed={seed} kills={killer.kills} logs={tmp_path}"
        assert killer.error is None, context
        assert len(killer.kills) >= 3, context
        assert statuses == [RunStatus.SUCCEEDED] * RUNS, context

        reruns = 0
        for handle in handles:
            run, latest = handle.run_id, handle.latest()
            # Every step's effect is in the final state exactly once.
            assert sorted(latest.state["effects"]) == sorted(METHODS), context
            # One commit per activation.
            commits = finished(rt, run)
            activations = [c.activation for c in commits]
            assert sorted(activations) == sorted(f"{m}#1" for m in METHODS), context
            assert sorted(latest.completed) == sorted(activations), context
            # Steps may have *run* more than once (killed mid-step), never committed twice.
            counts = [executions(redis_client, run, m) for m in METHODS]
            assert min(counts) >= 1, context
            reruns += sum(counts) - len(METHODS)
            # Nothing left in flight.
            assert latest.in_flight == [], context
            assert rt.coord.leases(run) == {}, context
            assert redis_client.hlen(rt.store.keys.owners(run)) == 0, context
        assert not set(rt.coord.active_runs()) & {h.run_id for h in handles}, context
        print(f"chaos: {context} re-executed steps={reruns}")
