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
from tests._dist_support import eventually, finished, private_pool
from tests.flows import dist
from tests.flows.dist import DistSleeper, executions

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
