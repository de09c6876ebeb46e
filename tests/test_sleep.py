"""Durable sleep: ``self.sleep``/``self.asleep`` in a step holds no worker, survives every
worker being killed, and the step goes on after its wake-up on whichever worker is alive."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.distributed.client import RunHandle
from runner.store.models import RunStatus
from tests._dist_support import private_pool
from tests.flows.dist import executions
from tests.flows.timing import AsyncNapFlow, GreetFlow, NapFlow
from tests.test_cli import Cli


def asleep_checkpoint(handle: RunHandle, timeout: float = 15) -> Any:
    """The run's checkpoint of its step falling asleep, once committed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = handle.latest()
        if latest.event == "step_sleeping":
            return latest
        time.sleep(0.05)
    raise AssertionError(f"run {handle.run_id} did not fall asleep: {handle.latest().event}")


@pytest.mark.slow
def test_a_sleeping_run_holds_no_worker_and_wakes_after_every_worker_was_killed(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        first = pool.start(concurrency=1)
        handle = RunHandle(NapFlow.submit({"seconds": 5}, rt=rt).run_id, rt)
        asleep = asleep_checkpoint(handle)
        (wake_at,) = asleep.meta.replay.sleeps["nap#1"]
        assert asleep.state["before"] == 1  # the state so far, committed with the sleep
        # The one worker (one process) is free: another run goes through meanwhile.
        other = GreetFlow.submit({"customer": "wes"}, rt=rt)
        assert other.result(timeout=wake_at - time.time()) == len("hello wes")
        assert executions(redis_client, handle.run_id, "woke") == 0
        cli = Cli(env)
        assert "sleeping until" in cli.ok("status", handle.run_id).stdout
        (row,) = [r for r in cli.json("steps", handle.run_id) if r["step"] == "nap#1"]
        assert row["waits_for"].startswith("sleeping until")
        pool.kill(first)  # every worker is down when the wake-up time comes
        time.sleep(max(wake_at - time.time(), 0) + 0.2)  # past it, no worker up
        assert handle.status() is RunStatus.RUNNING
        assert executions(redis_client, handle.run_id, "woke") == 0
        pool.start(concurrency=1)
        assert handle.result(timeout=30) == "rested after 1"
        assert executions(redis_client, handle.run_id, "woke") == 1
        assert executions(redis_client, handle.run_id, "nap") == 2  # restarted after the sleep
        assert executions(redis_client, handle.run_id, "after") == 1
        woke = [c for c in rt.store.history(handle.run_id, limit=50) if c.step == "nap"]
        assert min(c.created_at for c in woke if c.event == "method_execution_finished") >= (
            wake_at
        )


def test_an_async_step_sleeps_twice_on_workers_and_each_part_runs_once(
    rt: Any, redis_client: redis.Redis
) -> None:
    began = time.time()
    handle = AsyncNapFlow.submit({"seconds": 1})
    assert handle.result(timeout=30) == "rested twice"
    assert time.time() - began >= 2
    assert executions(redis_client, handle.run_id, "half") == 2  # before the second sleep
    assert executions(redis_client, handle.run_id, "woke") == 1
    history = rt.store.history(handle.run_id, limit=50)
    assert max(len(c.meta.replay.sleeps.get("nap#1", [])) for c in history) == 2
    assert handle.latest().meta.replay.sleeps == {}  # a step's sleeps go with its commit


def test_in_process_a_sleep_simply_sleeps() -> None:
    began = time.monotonic()
    assert NapFlow().kickoff({"seconds": 0.3}) == "rested after 1"
    assert time.monotonic() - began >= 0.3


def test_a_negative_sleep_fails_the_step() -> None:
    with pytest.raises(ValueError, match="sleep takes seconds >= 0"):
        NapFlow().kickoff({"seconds": -1})


def test_a_sleeping_run_cancelled_and_resumed_before_its_wake_up_wakes_then(
    rt: Any, redis_client: redis.Redis
) -> None:
    from runner.distributed.control import resume

    handle = NapFlow.submit({"seconds": 4})
    (wake_at,) = asleep_checkpoint(handle).meta.replay.sleeps["nap#1"]
    handle.cancel()
    resumed = resume(handle.run_id)
    assert resumed.result(timeout=30) == "rested after 1"
    assert executions(redis_client, handle.run_id, "woke") == 1
    done = [
        c
        for c in rt.store.history(handle.run_id, limit=50)
        if c.event == "method_execution_finished"
    ]
    assert min(c.created_at for c in done) >= wake_at
