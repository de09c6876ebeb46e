"""Run deadlines: ``submit(deadline=)`` and a flow's ``run_deadline`` cancel a run that has not
finished, on workers or, when none was running, by any recovery pass."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from runner.distributed.app import make_app
from runner.distributed.engine import Runtime
from runner.distributed.recovery import recover
from runner.errors import InvalidInputs
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests._dist_support import eventually, leases_lapsed, recovery_passes, runner_cli
from tests.console_support import serving
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
    assert late.latest().meta.scheduling.deadline is not None
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


def test_submit_wait_status_and_the_console_say_a_run_was_cancelled_because_its_deadline_passed(
    rt: Any, worker_env: dict[str, str]
) -> None:
    args = ["submit", "tests.flows.timing:SlowFlow", "--input", "seconds=5", "--deadline", "1.5"]
    waited = runner_cli(worker_env, *args, "--wait")
    assert waited.returncode == 1, (waited.stdout, waited.stderr)
    run_id = waited.stdout.split()[0]
    line = f"error: run {run_id} was cancelled: its deadline passed ("
    assert line in waited.stderr, waited.stderr
    as_json = runner_cli(worker_env, *args, "--wait", "--json")
    assert as_json.returncode == 1, (as_json.stdout, as_json.stderr)
    told = json.loads(as_json.stdout)
    assert told["status"] == "cancelled"
    assert told["cancel_reason"].startswith("its deadline passed (")
    shown = runner_cli(worker_env, "status", run_id)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"cancelled\s+its deadline passed \(", shown.stdout), shown.stdout
    shown = runner_cli(worker_env, "status", run_id, "--json")
    assert json.loads(shown.stdout)["cancel_reason"].startswith("its deadline passed (")
    with serving(rt) as url, httpx.Client(base_url=url) as http:
        detail = http.get(f"/api/runs/{run_id}").json()
        assert detail["cancel_reason"].startswith("its deadline passed (")
        assert "its deadline passed (" in http.get(f"/runs/{run_id}").text
