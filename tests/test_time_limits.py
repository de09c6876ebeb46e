"""Celery's hard ``time_limit`` and the runner's soft limit each end an attempt as a retry
or a failure of the step, never an endless re-send.

Both flows allow one retry; after the second attempt overruns, the run fails with the
limit's error, and no further attempt starts however long we watch (three recovery
passes after the lease would have lapsed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from runner.distributed.client import submit
from runner.distributed.engine import Runtime
from runner.store.models import Checkpoint, RunStatus
from tests._dist_support import leases_lapsed, private_pool
from tests.flows.reliability import OverrunsHard, OverrunsSoft, executions

pytestmark = pytest.mark.slow


def _failed_step(rt: Runtime, run_id: str) -> Checkpoint:
    return next(
        c for c in rt.store.history(run_id, limit=100) if c.event == "method_execution_failed"
    )


def test_a_step_killed_at_the_hard_time_limit_is_retried_then_fails_the_run(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _):
        pool.start()
        handle = submit(OverrunsHard, rt=rt)
        # Two attempts, each killed at 0.5 * 1.5 + 5 s.
        assert handle.wait(timeout=60) is RunStatus.FAILED
        failed = _failed_step(rt, handle.run_id)
        assert failed.error is not None and failed.error.type == "TimeLimitExceeded"
        assert failed.error.attempts == 2
        leases_lapsed(rt, handle.run_id, passes=3)
        assert len(executions(redis_client, handle.run_id, "stubborn")) == 2
        assert rt.coord.leases(handle.run_id) == {}
        assert handle.run_id not in rt.coord.active_runs()


def test_a_step_over_its_soft_time_limit_is_retried_then_fails_the_run(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _):
        pool.start()
        handle = submit(OverrunsSoft, rt=rt)
        assert handle.wait(timeout=30) is RunStatus.FAILED
        failed = _failed_step(rt, handle.run_id)
        assert failed.error is not None and failed.error.type == "SoftTimeLimitExceeded"
        assert failed.error.attempts == 2
        leases_lapsed(rt, handle.run_id, passes=3)
        assert len(executions(redis_client, handle.run_id, "slow")) == 2
        assert handle.run_id not in rt.coord.active_runs()
