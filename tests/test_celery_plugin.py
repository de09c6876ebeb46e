"""The runner's Celery app under pytest-celery's in-process test worker.

pytest-celery's session worker (``celery_session_worker``: a real Celery worker in a thread
of this process, solo pool) serves where a subprocess is not needed: which tasks a flow
registers, the Celery state each step's task ends in, and retries. The fixture
``celery_session_app`` is overridden to be the runner's own app (:func:`make_app` plus
:func:`install`, as ``celery -A workers`` builds it) on a prefix and queue of its own.
Crash tests keep their subprocess workers (a thread cannot be SIGKILLed).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from runner.distributed.app import make_app
from runner.distributed.client import submit
from runner.distributed.engine import Runtime, task_id
from runner.distributed.worker import install
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests.flows.cli import GatedFlow, gate_key
from tests.flows.dist import DistEcho, DistFlaky, executions

MODULES = ["tests.flows.dist", "tests.flows.cli"]

# The worker runs in this process, under pytest's warnings-as-errors: Celery's Redis result
# backend (5.x) still calls redis-py's deprecated SETEX, which a subprocess worker only logs.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")


@pytest.fixture(scope="session")
def plugin_settings(redis_url: str) -> RunnerSettings:
    """A deployment of its own: prefix, and the queue derived from it."""
    return RunnerSettings(
        redis_url=redis_url,
        prefix=f"tc-{uuid.uuid4().hex[:8]}",
        flow_modules=MODULES,
        lease_seconds=2,
        recovery_interval=0.5,
        retry_backoff=0.05,
        task_results=True,  # the tests read each step's Celery state from the backend
    )


@pytest.fixture(scope="session")
def celery_session_app(plugin_settings: RunnerSettings) -> Iterator[Celery]:
    """pytest-celery's session app, replaced by the runner's app with the flows installed."""
    app = make_app(plugin_settings, main="workers")
    install(app, settings=plugin_settings)
    yield app
    app.close()


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    # No ping task round trip at start: the runner's app registers only its own tasks.
    return {"perform_ping_check": False, "shutdown_timeout": 30.0}


@pytest.fixture
def producer(
    celery_session_worker: Any, celery_session_app: Celery, plugin_settings: RunnerSettings
) -> Iterator[Runtime]:
    """A producer runtime on the session worker's app and deployment."""
    rt = Runtime.create(celery_session_app, plugin_settings)
    yield rt
    rt.store.close()


def step_result(rt: Runtime, run_id: str, activation: str) -> AsyncResult:
    return AsyncResult(task_id(run_id, 0, activation), app=rt.app)


def test_the_worker_registers_one_task_per_flow_method(
    celery_session_worker: Any, celery_session_app: Celery
) -> None:
    expected = {f"{flow.flow_name()}.{m}" for flow in (DistEcho, DistFlaky, GatedFlow)
                for m in flow.graph().methods}  # fmt: skip
    assert expected <= set(celery_session_app.tasks)
    replies: dict[str, Any] = {}
    for _ in range(5):  # a busy machine may answer the first broadcast late
        replies = celery_session_app.control.inspect(timeout=5).registered() or {}
        if replies:
            break
    assert len(replies) == 1, replies  # the in-process worker, and only it
    assert expected <= set(next(iter(replies.values())))


def test_a_committed_step_is_a_success_with_its_output(producer: Runtime) -> None:
    handle = submit(DistEcho, {"count": 21}, rt=producer)
    assert handle.result(timeout=30) == 42
    result = step_result(producer, handle.run_id, "shout#1")
    result.get(timeout=10)  # raises if the task did not succeed
    assert result.state == "SUCCESS"
    assert step_result(producer, handle.run_id, "hello#1").state == "SUCCESS"


def test_a_failing_step_is_a_failure_and_fails_its_run(
    producer: Runtime, redis_client: redis.Redis
) -> None:
    tag = f"t{uuid.uuid4().hex[:8]}"
    handle = submit(GatedFlow, {"tag": tag}, rt=producer)
    assert handle.wait(timeout=30) is RunStatus.FAILED
    result = step_result(producer, handle.run_id, "check#1")
    result.get(timeout=10, propagate=False)  # the run fails in the task, before its state
    assert result.state == "FAILURE"
    assert "gate closed" in str(result.result)
    assert step_result(producer, handle.run_id, "fetch#1").state == "SUCCESS"
    assert handle.latest().error is not None and handle.latest().error.message == "gate closed"
    redis_client.delete(gate_key(tag))


def test_a_flaky_step_is_retried_by_celery_until_it_succeeds(
    producer: Runtime, redis_client: redis.Redis
) -> None:
    handle = submit(DistFlaky, rt=producer)
    assert handle.result(timeout=30) == "after 3 attempts"
    assert executions(redis_client, handle.run_id, "flaky") == 3
    result = step_result(producer, handle.run_id, "flaky#1")
    result.get(timeout=10)
    assert result.state == "SUCCESS"
    committed = [c for c in handle.rt.store.history(handle.run_id) if c.step == "flaky"]
    assert [c.attempts for c in committed if c.event == "method_execution_finished"] == [3]
