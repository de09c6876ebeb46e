"""Two deployments (two key prefixes) on one Redis at once never take each other's steps.

Each deployment's queue is derived from its prefix (``runner.<prefix>``), and each step
message names its deployment: with the default queues a worker never even sees the other's
steps, and with one queue shared by (mis)configuration a worker that receives a step of the
other deployment hands it back instead of dropping it. Either way both deployments' runs
finish, every step run by one of their own workers (checkpoints record the worker's name).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.linear import LinearFlow
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests._dist_support import history, runtime_for
from tests.conftest import WorkerPool

RUNS = 3
"""Runs submitted to each deployment."""


@contextlib.contextmanager
def deployment(
    worker_env: dict[str, str], logdir: Path, **overrides: str
) -> Iterator[tuple[WorkerPool, Runtime, dict[str, str]]]:
    """Workers and a producer of a deployment of its own prefix (queue: its default)."""
    env = {k: v for k, v in worker_env.items() if k != "RUNNER_QUEUE"}
    env.update(RUNNER_PREFIX=f"td-{uuid.uuid4().hex[:8]}", **overrides)
    logdir.mkdir(parents=True, exist_ok=True)
    pool = WorkerPool(env, str(logdir))
    rt = runtime_for(env)
    try:
        yield pool, rt, env
    finally:
        pool.discard()
        rt.app.close()
        rt.store.close()


def names(pool: WorkerPool) -> set[str]:
    return {worker.name for worker in pool.workers}


def run_both(
    a: tuple[WorkerPool, Runtime], b: tuple[WorkerPool, Runtime]
) -> dict[str, list[RunHandle]]:
    """Submit to both deployments at once, wait for every run; handles by prefix."""
    handles: dict[str, list[RunHandle]] = {}
    for _pool, rt in (a, b):
        handles[rt.settings.prefix] = [submit(LinearFlow, {}, rt=rt) for _ in range(RUNS)]
    for pool, rt in (a, b):
        for handle in handles[rt.settings.prefix]:
            assert handle.wait(timeout=90) is RunStatus.SUCCEEDED, _logs(pool)[-3000:]
    return handles


def assert_own_workers(pool: WorkerPool, rt: Runtime, run_ids: list[str]) -> None:
    own = names(pool)
    for run_id in run_ids:
        steps = [c for c in history(rt, run_id) if c.event == "method_execution_finished"]
        assert len(steps) == len(LinearFlow.graph().methods)
        assert {c.worker for c in steps} <= own, (run_id, {c.worker for c in steps}, own)
        assert rt.store.latest(run_id).state["counter"] == 20


def _logs(pool: WorkerPool) -> str:
    return "\n".join(Path(w.log).read_text(errors="replace") for w in pool.workers if w.log)


def test_each_deployment_has_the_queue_of_its_prefix_unless_one_is_set() -> None:
    assert RunnerSettings(prefix="alpha").queue == "runner.alpha"
    assert RunnerSettings(prefix="beta").queue == "runner.beta"
    assert RunnerSettings(prefix="alpha", queue="shared").queue == "shared"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_deployments_on_one_redis_run_at_once_each_on_its_own_workers(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with (
        deployment(worker_env, tmp_path / "a") as (pool_a, rt_a, _),
        deployment(worker_env, tmp_path / "b") as (pool_b, rt_b, _),
    ):
        assert rt_a.settings.queue != rt_b.settings.queue
        pool_a.start()
        pool_b.start()
        handles = run_both((pool_a, rt_a), (pool_b, rt_b))
        assert_own_workers(pool_a, rt_a, [h.run_id for h in handles[rt_a.settings.prefix]])
        assert_own_workers(pool_b, rt_b, [h.run_id for h in handles[rt_b.settings.prefix]])
        for pool in (pool_a, pool_b):
            assert "belongs to deployment" not in _logs(pool)  # nothing even reached it


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_hands_back_a_step_of_another_deployment_sharing_its_queue(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    shared = f"shared-{uuid.uuid4().hex[:8]}"
    with (
        deployment(worker_env, tmp_path / "a", RUNNER_QUEUE=shared) as (pool_a, rt_a, _),
        deployment(worker_env, tmp_path / "b", RUNNER_QUEUE=shared) as (pool_b, rt_b, _),
    ):
        pool_a.start()
        pool_b.start()
        handles = run_both((pool_a, rt_a), (pool_b, rt_b))
        assert_own_workers(pool_a, rt_a, [h.run_id for h in handles[rt_a.settings.prefix]])
        assert_own_workers(pool_b, rt_b, [h.run_id for h in handles[rt_b.settings.prefix]])
        # One queue, two deployments' workers: some steps reached the wrong one, which said so.
        logs = _logs(pool_a) + _logs(pool_b)
        handed = [line for line in logs.splitlines() if "belongs to deployment" in line]
        assert handed and all("ERROR" in line for line in handed), handed[:5]
