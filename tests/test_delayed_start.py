"""Delayed start: ``submit(countdown=/eta=)`` stores the run at once, scheduled, with nothing
in the broker; a worker's recovery pass starts it when due."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from runner.distributed import broker
from runner.errors import InvalidInputs
from runner.store.models import RunStatus
from tests.flows.dist import executions
from tests.flows.timing import GreetFlow
from tests.test_cli import Cli, cli  # noqa: F401  (fixture)

GREET = "tests.flows.timing:GreetFlow"


def queued(redis_client: redis.Redis, rt: Any) -> int:
    """Messages waiting in the workers' queue (the broker is the store's Redis)."""
    return broker.queue_length(rt.app, rt.settings.queue)


def test_a_delayed_run_is_stored_scheduled_and_starts_after_its_countdown(
    rt: Any, redis_client: redis.Redis
) -> None:
    before = time.time()
    handle = GreetFlow.submit({"customer": "ida"}, countdown=3)
    latest = handle.latest()
    assert handle.status() is RunStatus.RUNNING
    assert (
        latest.meta.scheduling.not_before is not None
        and latest.meta.scheduling.not_before >= before + 3
    )
    time.sleep(2)
    assert executions(redis_client, handle.run_id, "greet") == 0
    assert handle.result(timeout=20) == len("hello ida")
    started = min(c.created_at for c in handle.rt.store.history(handle.run_id) if c.step)
    assert started >= latest.meta.scheduling.not_before


def test_a_delayed_run_survives_losing_the_brokers_messages(
    rt: Any, redis_client: redis.Redis
) -> None:
    at = datetime.now(UTC) + timedelta(seconds=2)
    handle = GreetFlow.submit({"customer": "jo"}, eta=at)
    assert queued(redis_client, rt) == 0  # nothing of it waits in the broker
    redis_client.delete(rt.settings.queue)  # what a broker restart without persistence loses
    assert handle.result(timeout=20) == len("hello jo")
    assert executions(redis_client, handle.run_id, "greet") == 1


def test_runner_status_and_runs_show_a_delayed_run_as_scheduled(cli: Cli) -> None:  # noqa: F811
    run_id = f"later-{uuid.uuid4().hex[:8]}"
    cli.ok("submit", GREET, "--id", run_id, "--input", "customer=kim", "--countdown", "30")
    shown = cli.ok("status", run_id).stdout
    assert "scheduled, starts at" in shown
    data = json.loads(cli.ok("status", run_id, "--json").stdout)
    assert data["status"] == "running" and data["scheduled_until"] > time.time() + 20
    row = next(line for line in cli.ok("runs", "--all").stdout.splitlines() if run_id[:8] in line)
    assert "scheduled" in row.split() and "running" not in row.split()
    listed = {r["run_id"]: r for r in json.loads(cli.ok("runs", "--all", "--json").stdout)}
    assert listed[run_id]["scheduled_until"] == data["scheduled_until"]
    cli.ok("cancel", run_id)
    listed = {r["run_id"]: r for r in json.loads(cli.ok("runs", "--all", "--json").stdout)}
    assert listed[run_id]["scheduled_until"] is None  # cancelled: it will not start


def test_bad_start_times_are_refused_before_anything_is_stored(rt: Any, cli: Cli) -> None:  # noqa: F811
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidInputs, match="not both"):
        GreetFlow.submit({}, id=run_id, countdown=1, eta=time.time() + 5)
    with pytest.raises(InvalidInputs, match="no time zone"):
        GreetFlow.submit({}, id=run_id, eta=datetime.now() + timedelta(seconds=5))
    with pytest.raises(InvalidInputs, match="countdown must be"):
        GreetFlow.submit({}, id=run_id, countdown=-1)
    result = cli("submit", GREET, "--id", run_id, "--eta", "tomorrow")
    assert result.exit_code == 2 and result.stderr.startswith("error: --eta 'tomorrow'")
    assert rt.store.run(run_id) is None
