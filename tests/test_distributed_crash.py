"""A worker killed with SIGKILL mid-step does not lose the run, nor commit the step twice.

Each test has workers of its own (own prefix and queue), so killing them leaves the session
worker alone. Neither relies on the broker's visibility timeout (an hour by default).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from runner.distributed.client import submit
from runner.distributed.processes import children
from tests._dist_support import eventually, finished, paused, private_pool
from tests.flows import dist
from tests.flows.dist import DistSleeper, executions
from tests.flows.reviews import HeldTwinReviewFlow

pytestmark = pytest.mark.slow

TRAIL = ["first", "nap", "last"]


def _nap_pid(redis_client: redis.Redis, run_id: str) -> int:
    raw = eventually(lambda: redis_client.get(dist.key(run_id, "nap-pid")), timeout=30)
    return int(raw)


def _pids(redis_client: redis.Redis, run_id: str, method: str) -> list[int]:
    return [int(p) for p in redis_client.lrange(dist.key(run_id, "pids", method), 0, -1)]


def test_whole_worker_killed_mid_step_is_recovered_by_lease_expiry(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _):
        worker = pool.start()
        handle = submit(DistSleeper, rt=rt)
        run = handle.run_id
        dead = _nap_pid(redis_client, run)
        assert dead in children(worker.pid)
        pool.kill(worker)  # parent and pool children, mid-`nap`
        killed_at = time.monotonic()
        assert rt.coord.leases(run)  # the dead attempt's lease is still there

        pool.start()  # a fresh worker: its recovery pass finds the expired lease
        assert handle.result(timeout=30) == TRAIL
        assert time.monotonic() - killed_at < 30  # not the visibility timeout (3600 s)

        assert executions(redis_client, run, "nap") == 2
        nap_pids = _pids(redis_client, run, "nap")
        assert nap_pids[0] == dead and nap_pids[1] != dead
        commits = finished(rt, run, "nap")
        assert len(commits) == 1
        assert commits[0].attempt is not None and not commits[0].attempt.endswith(f":{dead}")
        assert executions(redis_client, run, "first") == executions(redis_client, run, "last") == 1
        assert rt.coord.leases(run) == {}


def test_killed_pool_child_is_redelivered_and_taken_over(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    # No recovery pass and a long lease: only the redelivered message can finish the run.
    overrides = {"RUNNER_RECOVERY_INTERVAL": "3600", "RUNNER_LEASE_SECONDS": "60"}
    with private_pool(worker_env, str(tmp_path), **overrides) as (pool, rt, _):
        worker = pool.start()
        handle = submit(DistSleeper, rt=rt)
        run = handle.run_id
        child = _nap_pid(redis_client, run)
        assert child in children(worker.pid)
        killed_at = time.monotonic()
        os.kill(child, signal.SIGKILL)

        assert handle.result(timeout=30) == TRAIL
        assert time.monotonic() - killed_at < 20  # long before the 60 s lease expired
        assert worker.poll() is None  # the worker itself lived on
        assert executions(redis_client, run, "nap") == 2
        assert _pids(redis_client, run, "nap")[0] == child
        assert len(finished(rt, run, "nap")) == 1
        assert rt.coord.leases(run) == {}


def test_a_step_an_answer_carried_on_is_recovered_in_its_own_epoch_when_its_worker_dies(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    """``right`` still runs when ``left``'s review is answered, so the answer carries it on
    (its attempt of epoch 0 commits into epoch 1). Its worker then dies: recovery finds its
    lapsed lease under epoch 0's key and sends it again in that epoch, and the run ends."""
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _):
        worker = pool.start()
        handle = HeldTwinReviewFlow.submit({"topic": "kelp"}, rt=rt)
        run = handle.run_id
        assert paused(handle).meta.human.awaiting.method == "left"  # type: ignore[union-attr]
        assert executions(redis_client, run, "right") == 1  # held at its gate
        assert handle.resume(feedback="fine left").latest().meta.carried == {"right#1": 0}
        pool.kill(worker)  # right's attempt dies with it
        redis_client.set(dist.key(run, "gate", "right"), 1)

        pool.start()  # its recovery pass finds right's lapsed lease
        asked = eventually(
            lambda: (a := handle.latest().meta.human.awaiting) and a.method == "right" and a,
            timeout=30,
        )
        assert asked.output == "right on kelp"
        handle.resume(feedback="fine right")
        assert handle.result(timeout=30) == "joined"
        ran = [executions(redis_client, run, m) for m in ("begin", "left", "right", "join")]
        assert ran == [1, 1, 2, 1]  # right again only because its attempt died
