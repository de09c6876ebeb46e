"""A cancel (``runner cancel``, or a run's deadline) stops the attempts in flight: the pool
process running the step is gone within seconds, nothing after it runs, no commit follows
the cancel, and ``runner resume`` runs the stopped step again. An attempt the stop did not
reach ends its method and commits nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.distributed import control
from runner.distributed.app import make_app
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime, task_id
from runner.store.models import FLOW_CANCELLED, RunStatus
from tests._dist_support import events_of, eventually, history, leases_lapsed, private_pool
from tests.conftest import WorkerPool
from tests.flows.dist import executions, key
from tests.flows.timing import SlowFlow
from tests.test_cli import Cli, cli  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


def _crawling(r: redis.Redis, run_id: str) -> int:
    """The pid of the pool process running the run's slow step, once it started."""
    eventually(lambda: executions(r, run_id, "crawl") == 1)
    pid = int(r.lrange(key(run_id, "pids", "crawl"), 0, 0)[0])
    assert _alive(pid)
    return pid


def _stopped_and_resumable(rt: Runtime, r: redis.Redis, handle: RunHandle, pid: int) -> None:
    """The attempt's process is gone, the cancel is the run's last commit, nothing after the
    slow step ran, and a resume runs it again and finishes."""
    stopped_at = time.monotonic()
    eventually(lambda: not _alive(pid), timeout=5)
    print(f"the pool process {pid} was gone {time.monotonic() - stopped_at:.2f}s after the cancel")
    leases_lapsed(rt, handle.run_id)  # recovery passes after its lease: they leave it stopped
    latest = handle.latest()
    assert latest.status is RunStatus.CANCELLED
    assert latest.event == FLOW_CANCELLED
    assert history(rt, handle.run_id)[-1].id == latest.id  # no commit after the cancel
    assert latest.in_flight == ["crawl#1"]  # the stopped step was not completed
    assert executions(r, handle.run_id, "crawl") == 1  # not delivered again
    assert executions(r, handle.run_id, "report") == 0
    resumed = control.resume(handle.run_id, inputs={"seconds": 0.2}, rt=rt)
    assert resumed.result(timeout=20) == "crawled"
    assert executions(r, handle.run_id, "crawl") == 2
    assert executions(r, handle.run_id, "report") == 1


def test_runner_cancel_stops_the_running_step_and_resume_runs_it_again(
    rt: Runtime,
    redis_client: redis.Redis,
    worker_pool: WorkerPool,
    task_events: list[dict[str, Any]],
    cli: Cli,  # noqa: F811
) -> None:
    handle = SlowFlow.submit({"seconds": 60})
    pid = _crawling(redis_client, handle.run_id)
    pool = worker_pool.workers[0]
    assert pid in pool.children()
    out = json.loads(cli.ok("cancel", handle.run_id, "--json").stdout)
    assert out["status"] == "cancelled"
    _stopped_and_resumable(rt, redis_client, handle, pid)
    assert handle.latest().meta.cancel_reason is None  # cancelled by hand
    # Flower sees the attempt revoked (terminated), not failed.
    revoked = [
        e
        for e in events_of(task_events, task_id(handle.run_id, 0, "crawl#1"))
        if e["type"] == "task-revoked"
    ]
    assert revoked and revoked[0]["terminated"]
    # Celery replaced the pool process it killed.
    eventually(lambda: len(pool.children()) == pool.concurrency and pid not in pool.children())


def test_a_deadline_stops_the_running_step_and_resume_runs_it_again(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    handle = SlowFlow.submit({"seconds": 60}, deadline=2)
    pid = _crawling(redis_client, handle.run_id)
    assert handle.wait(timeout=10) is RunStatus.CANCELLED
    reason = handle.latest().meta.cancel_reason
    assert reason is not None and reason.startswith("its deadline passed")
    _stopped_and_resumable(rt, redis_client, handle, pid)


def test_a_step_the_stop_does_not_reach_ends_and_commits_nothing(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    # A producer whose control messages reach no worker: as a thread-pool worker (which
    # cannot terminate a job) or a worker the broadcast missed, the step runs to its end.
    deaf = make_app(rt.settings)
    deaf.conf.control_exchange = f"{deaf.conf.control_exchange}.nobody"
    elsewhere = Runtime.create(deaf, rt.settings)
    try:
        handle = SlowFlow.submit({"seconds": 2})
        pid = _crawling(redis_client, handle.run_id)
        cancelled = RunHandle(handle.run_id, elsewhere).cancel()
        leases_lapsed(rt, handle.run_id)  # the step's method ended, its lease with it
        assert _alive(pid)  # the pool process was not stopped ...
        latest = handle.latest()
        assert latest.id == cancelled.id  # ... and its attempt committed nothing
        assert latest.in_flight == ["crawl#1"]
        assert executions(redis_client, handle.run_id, "report") == 0
        assert control.resume(handle.run_id, rt=rt).result(timeout=20) == "crawled"
        assert executions(redis_client, handle.run_id, "crawl") == 2
    finally:
        deaf.close()
        elsewhere.store.close()


def test_on_a_thread_pool_the_step_ends_its_method_and_commits_nothing(
    worker_env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    # A thread pool cannot terminate a job (Celery's threads pool has no terminate_job).
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start(pool="threads", concurrency=4)
        handle = submit(SlowFlow, {"seconds": 3}, rt=rt)
        eventually(lambda: executions(redis_client, handle.run_id, "crawl") == 1)
        cancelled = handle.cancel()
        eventually(lambda: "cancelled while it ran" in _log(tmp_path), timeout=10)
        latest = handle.latest()
        assert latest.id == cancelled.id
        assert latest.in_flight == ["crawl#1"]
        assert executions(redis_client, handle.run_id, "report") == 0
        assert "does not implement kill_job" in _log(tmp_path)  # Celery says it could not
        resumed = control.resume(handle.run_id, inputs={"seconds": 0.1}, rt=rt)
        assert resumed.result(timeout=20) == "crawled"
        assert executions(redis_client, handle.run_id, "crawl") == 2


def _log(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.glob("worker-*.log"))
