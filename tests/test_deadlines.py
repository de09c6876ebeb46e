"""Run deadlines: ``submit(deadline=)`` and a flow's ``run_deadline`` cancel a run that has not
finished, on workers or, when none was running, by any recovery pass."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from runner.distributed.app import make_app
from runner.distributed.engine import Runtime
from runner.distributed.recovery import recover
from runner.errors import InvalidInputs
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests._dist_support import eventually, leases_lapsed, recovery_passes
from tests.flows.dist import executions
from tests.flows.timing import GreetFlow, HastyFlow, SlowFlow
from tests.test_cli import Cli, cli  # noqa: F401  (fixture)


def test_a_deadline_cancels_a_run_stuck_in_a_slow_step(
    rt: Any,
    redis_client: redis.Redis,
    cli: Cli,  # noqa: F811
) -> None:
    submitted = time.time()
    handle = SlowFlow.submit({"seconds": 5}, deadline=1.5)
    assert handle.wait(timeout=10) is RunStatus.CANCELLED
    assert time.time() - submitted < 4.5  # well before the slow step ends
    latest = handle.latest()
    assert latest.meta.cancel_reason is not None
    assert latest.meta.cancel_reason.startswith("its deadline passed")
    status = json.loads(cli.ok("status", handle.run_id, "--json").stdout)
    assert status["status"] == "cancelled"
    assert status["cancel_reason"].startswith("its deadline passed")
    assert "its deadline passed" in cli.ok("status", handle.run_id).stdout
    # The slow step was stopped (its lease goes with it, or would outlive the 5 s step); the
    # run stays cancelled and nothing after it runs.
    leases_lapsed(rt, handle.run_id)
    assert handle.status() is RunStatus.CANCELLED
    assert executions(redis_client, handle.run_id, "report") == 0


def test_a_flows_own_run_deadline_applies_and_a_run_that_finishes_in_time_is_kept(
    rt: Any,
) -> None:
    late = HastyFlow.submit({"seconds": 4})
    assert late.wait(timeout=10) is RunStatus.CANCELLED
    assert late.latest().meta.deadline is not None
    quick = GreetFlow.submit({"customer": "lu"}, deadline=2)
    due = time.time() + 2
    assert quick.result(timeout=10) == len("hello lu")
    eventually(lambda: time.time() > due, timeout=5)
    recovery_passes(rt, 2)  # passes after the deadline leave the finished run alone
    assert quick.status() is RunStatus.SUCCEEDED


@pytest.fixture
def idle_rt(worker_env: dict[str, str]) -> Iterator[Runtime]:
    """A runtime on a prefix and queue no worker serves."""
    own = uuid.uuid4().hex[:8]
    settings = RunnerSettings(
        redis_url=worker_env["RUNNER_REDIS_URL"],
        prefix=f"idle-{own}",
        queue=f"idle-{own}",
        flow_modules=worker_env["RUNNER_FLOW_MODULES"].split(","),
        lease_seconds=2,
    )
    runtime = Runtime.create(make_app(settings), settings)
    yield runtime
    runtime.app.close()
    runtime.store.close()


def test_recovery_cancels_a_run_whose_deadline_passed_while_no_worker_ran(
    idle_rt: Runtime,
) -> None:
    from runner.distributed.client import submit

    handle = submit(SlowFlow, {"seconds": 1}, deadline=0.5, rt=idle_rt)
    assert handle.status() is RunStatus.RUNNING
    time.sleep(0.7)
    recover(idle_rt, force=True)  # the first pass of a worker coming back
    assert handle.status() is RunStatus.CANCELLED
    assert handle.latest().meta.cancel_reason is not None


def test_a_deadline_that_is_not_positive_is_refused(rt: Any) -> None:
    with pytest.raises(InvalidInputs, match="deadline must be a positive number"):
        GreetFlow.submit({}, deadline=0)
