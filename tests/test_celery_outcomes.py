"""Celery, Flower and ``celery events`` see each step's real outcome.

Events from real workers are folded by Celery's own event state machine (what Flower
runs), and the state of each step's task is asserted: SUCCESS for a committed step,
RETRY carrying the real error then SUCCESS, FAILURE carrying the original error for a
step that failed its run, DUPLICATE for a redelivered step that commits nothing, and
SUCCESS for the redelivered attempt that finishes a step whose pool child was killed.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.events.state import State

from runner.distributed.client import submit
from runner.distributed.engine import task_id
from runner.store.models import RunStatus
from tests._dist_support import eventually, private_pool
from tests.conftest import capture_events
from tests.flows import dist, parity
from tests.flows.dist import DistSleeper


def _states(events: list[dict[str, Any]]) -> State:
    state = State()
    for event in list(events):
        state.event(dict(event))
    return state


def _settled(events: list[dict[str, Any]], tid: str, final: str) -> Any:
    """The task ``tid`` as Flower sees it, once its state is ``final``."""

    def check() -> Any:
        task = _states(events).tasks.get(tid)
        return task if task is not None and task.state == final else None

    return eventually(check, timeout=30)


def test_a_committed_step_is_success_with_its_readable_arguments(
    rt: Any, task_events: list[dict[str, Any]]
) -> None:
    handle = submit(parity.LinearParity, {"tag": uuid.uuid4().hex}, rt=rt)
    handle.result(timeout=30)
    task = _settled(task_events, task_id(handle.run_id, 0, "two#1"), "SUCCESS")
    assert task.name == "LinearParity.two"
    assert task.kwargs == f"run={handle.run_id} step=two#1"


def test_a_retried_step_shows_retry_with_the_real_error_then_success(
    rt: Any, task_events: list[dict[str, Any]]
) -> None:
    handle = submit(parity.RetryParity, {"tag": uuid.uuid4().hex}, rt=rt)
    handle.result(timeout=30)
    tid = task_id(handle.run_id, 0, "flaky#1")

    # Attempt 1's task-retried comes from its worker's main process once the pool child has
    # already published attempt 2, so another worker's task-succeeded can arrive first; then
    # Celery's State (Flower's) keeps RETRY as the state, as it does for Celery's own retries.
    # Either way the task shows both when it was retried and when it succeeded.
    def retried_and_succeeded() -> bool:
        task = _states(task_events).tasks.get(tid)
        return task is not None and task.retried is not None and task.succeeded is not None

    eventually(retried_and_succeeded, timeout=30)
    retried = [e for e in task_events if e.get("uuid") == tid and e["type"] == "task-retried"]
    assert len(retried) == 1
    assert "ConnectionError" in retried[0]["exception"]
    assert "first attempt fails" in retried[0]["exception"]
    received = [
        e["kwargs"] for e in task_events if e.get("uuid") == tid and e["type"] == "task-received"
    ]
    assert f"run={handle.run_id} step=flaky#1 attempt=2" in received


def test_a_step_that_fails_its_run_is_failure_with_the_original_error(
    rt: Any, task_events: list[dict[str, Any]], worker_pool: Any
) -> None:
    handle = submit(parity.ExhaustedParity, {"tag": uuid.uuid4().hex}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.FAILED
    task = _settled(task_events, task_id(handle.run_id, 0, "broken#1"), "FAILURE")
    assert "StepFailed" in task.exception
    assert "ValueError: always fails" in task.exception
    assert "ValueError: always fails" in task.traceback  # the cause, with its traceback
    failure = handle.latest()
    assert failure.error is not None and failure.error.type == "ValueError"

    # The worker log has one ERROR line naming the run and step, with the traceback.
    def logged() -> list[str]:
        text = "".join(Path(p).read_text() for p in Path(worker_pool.logdir).glob("*.log"))
        return [block for block in text.split("\n[") if handle.run_id in block]

    lines = eventually(lambda: [b for b in logged() if "ERROR" in b.split("\n", 1)[0]])
    assert len(lines) == 1
    assert "broken#1" in lines[0] and "Traceback" in lines[0]
    assert "ValueError: always fails" in lines[0]


def test_a_loop_past_max_calls_fails_the_task_and_the_run(
    rt: Any, task_events: list[dict[str, Any]]
) -> None:
    handle = submit(parity.RunawayParity, {"tag": uuid.uuid4().hex}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.FAILED
    task = _settled(task_events, task_id(handle.run_id, 0, "check#3"), "FAILURE")
    assert "CycleLimitExceeded" in task.exception
    assert not rt.coord.leases(handle.run_id)


def test_a_redelivered_committed_step_is_a_duplicate_not_a_second_success(
    rt: Any, task_events: list[dict[str, Any]]
) -> None:
    handle = submit(parity.LinearParity, {"tag": uuid.uuid4().hex}, rt=rt)
    handle.result(timeout=30)
    seq = handle.latest().seq
    again = f"{task_id(handle.run_id, 0, 'one#1')}:redelivered"
    rt.app.send_task(
        "LinearParity.one",
        kwargs={"run_id": handle.run_id, "activation": "one#1", "epoch": 0},
        task_id=again,
    )
    task = _settled(task_events, again, "DUPLICATE")
    assert task.reason == "it was already committed"
    assert handle.latest().seq == seq


@pytest.mark.slow
def test_a_step_redelivered_after_its_pool_child_was_killed_succeeds_once(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    overrides = {"RUNNER_RECOVERY_INTERVAL": "3600", "RUNNER_LEASE_SECONDS": "60"}
    with private_pool(worker_env, str(tmp_path), **overrides) as (pool, rt, _):
        pool.start()
        with capture_events(rt.app) as events:
            handle = submit(DistSleeper, rt=rt)
            run = handle.run_id
            child = int(eventually(lambda: redis_client.get(dist.key(run, "nap-pid")), 30))
            os.kill(child, signal.SIGKILL)
            handle.result(timeout=30)
            tid = task_id(run, 0, "nap#1")
            _settled(events, tid, "SUCCESS")
            started = [e for e in events if e.get("uuid") == tid and e["type"] == "task-started"]
            assert len(started) == 2  # the killed attempt and the redelivered one
