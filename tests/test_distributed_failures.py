"""Retries, exhausted retries, time limits, and cancel + resume on the workers."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from runner.distributed import control
from runner.distributed.engine import Runtime
from runner.errors import RunCancelled, RunFailed
from runner.store.models import RunStatus
from tests._dist_support import events_of, eventually, finished, history, recovery_passes
from tests.flows import dist
from tests.flows.dist import DistDoomed, DistFlaky, DistGated, DistSlow, executions


def test_failing_step_is_retried_until_it_succeeds(rt: Runtime, redis_client: redis.Redis) -> None:
    handle = DistFlaky.submit()
    assert handle.result(timeout=20) == "after 3 attempts"
    run = handle.run_id
    assert executions(redis_client, run, "flaky") == 3
    assert len(finished(rt, run, "flaky")) == 1
    assert not any(c.event == "method_execution_failed" for c in history(rt, run))


def test_exhausted_retries_fail_the_run_and_running_branches_still_commit(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    handle = DistDoomed.submit()
    assert handle.wait(timeout=20) is RunStatus.FAILED
    run = handle.run_id
    failure = next(c for c in history(rt, run) if c.event == "method_execution_failed")
    assert failure.step == "doomed"
    assert failure.status is RunStatus.FAILED
    assert failure.error is not None
    assert failure.error.type == "ValueError"
    assert failure.error.message == "boom 3"
    assert failure.error.attempts == 3
    assert "Traceback" in failure.error.traceback
    assert 'raise ValueError(f"boom {n}")' in failure.error.traceback
    assert executions(redis_client, run, "doomed") == 3
    with pytest.raises(RunFailed, match="ValueError: boom 3"):
        handle.result(timeout=1)

    # The sibling branch was running when the run failed: it finishes and commits.
    assert executions(redis_client, run, "sibling") == 1
    redis_client.set(dist.key(run, "gate", "sibling"), 1)
    eventually(lambda: finished(rt, run, "sibling"))
    latest = handle.latest()
    assert latest.state["sibling"] == "finished"
    assert latest.status is RunStatus.FAILED
    assert handle.status() is RunStatus.FAILED
    recovery_passes(rt, 3)  # nothing more is dispatched for a failed run
    assert executions(redis_client, run, "never") == 0
    assert rt.coord.leases(run) == {}


def test_a_failed_run_resumed_while_a_parallel_branch_still_runs_does_not_run_it_again(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    """``doomed`` fails the run while ``sibling`` still runs (it waits on its gate). The
    failure keeps ``sibling``'s live lease, so a resume of the failed run goes on from where
    it stands: ``sibling``'s attempt goes on and commits into the new epoch, its method run
    once."""
    handle = DistDoomed.submit()
    run = handle.run_id
    assert handle.wait(timeout=20) is RunStatus.FAILED
    assert executions(redis_client, run, "sibling") == 1 and not finished(rt, run, "sibling")
    assert set(rt.coord.leases(run)) == {"sibling#1"}  # the failing step's went with it
    again = control.resume(run, rt=rt)
    assert again.latest().meta.carried == {"sibling#1": 0}
    redis_client.set(dist.key(run, "gate", "sibling"), 1)
    eventually(lambda: finished(rt, run, "sibling"))
    assert again.wait(timeout=20) is RunStatus.FAILED  # doomed fails again
    assert executions(redis_client, run, "sibling") == 1
    assert len(finished(rt, run, "sibling")) == 1
    assert executions(redis_client, run, "doomed") == 6
    assert rt.coord.leases(run) == {}  # nothing runs now: the last failure kept none


def test_a_resume_from_an_older_checkpoint_reads_no_leases(
    rt: Runtime, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a resume that goes on from where the run stands carries the steps still running;
    one from an older checkpoint rewinds the run and spends no round trip on its leases."""
    handle = DistDoomed.submit()
    assert handle.wait(timeout=20) is RunStatus.FAILED
    redis_client.set(dist.key(handle.run_id, "gate", "sibling"), 1)
    eventually(lambda: finished(rt, handle.run_id, "sibling"))
    (setup,) = finished(rt, handle.run_id, "setup")
    read: list[str] = []

    def leases_read(rt: Runtime, latest: Any) -> set[str]:
        read.append(latest.id)
        return set()

    monkeypatch.setattr(control, "running_steps", leases_read)
    again = control.resume(handle.run_id, setup.id, rt=rt)
    assert read == []
    assert again.wait(timeout=20) is RunStatus.FAILED  # doomed fails again


def test_step_over_its_soft_time_limit_fails_the_run(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    began = time.monotonic()
    handle = DistSlow.submit()
    assert handle.wait(timeout=20) is RunStatus.FAILED
    assert time.monotonic() - began < 4.5  # well before the 5 s sleep would have ended
    error = handle.latest().error
    assert error is not None
    assert error.type == "SoftTimeLimitExceeded"
    assert error.attempts == 1
    assert handle.latest().state["done"] == ""
    assert executions(redis_client, handle.run_id, "slow") == 1


def test_cancel_stops_the_running_step_and_resume_reruns_only_it(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    handle = DistGated.submit()
    run = handle.run_id
    eventually(lambda: executions(redis_client, run, "two") == 1)
    cancelled = handle.cancel()
    assert cancelled.status is RunStatus.CANCELLED
    assert handle.wait(timeout=5) is RunStatus.CANCELLED
    with pytest.raises(RunCancelled):
        handle.result(timeout=1)

    # The running step was told to stop: opened now, its gate finds nobody; nothing commits.
    redis_client.set(dist.key(run, "gate", "two"), 1)
    recovery_passes(rt, 3)  # they leave a cancelled run alone
    assert handle.status() is RunStatus.CANCELLED
    assert handle.latest().id == cancelled.id
    assert not finished(rt, run, "two")
    assert executions(redis_client, run, "three") == 0
    assert "two#1" in handle.latest().in_flight

    resumed = control.resume(run, rt=rt)
    assert resumed.result(timeout=20) == ["one", "two", "three"]
    counts = {m: executions(redis_client, run, m) for m in ("one", "two", "three")}
    assert counts == {"one": 1, "two": 2, "three": 1}
    assert [c.step for c in finished(rt, run)] == ["one", "two", "three"]


def test_cancel_before_a_queued_step_starts_skips_it(
    rt: Runtime, redis_client: redis.Redis, task_events: list[dict[str, Any]]
) -> None:
    handle = DistGated.submit()
    run = handle.run_id
    eventually(lambda: executions(redis_client, run, "two") == 1)
    handle.cancel()
    # A late copy of the stopped step's message (as if redelivered) is skipped too.
    late = f"{run}:late-two"
    rt.app.send_task(
        "DistGated.two",
        kwargs={"run_id": run, "activation": "two#1", "epoch": 0},
        task_id=late,
    )
    done = eventually(
        lambda: [e for e in events_of(task_events, late) if e["type"] == "task-succeeded"]
    )
    assert "the run is cancelled" in done[0]["result"]
    assert executions(redis_client, run, "two") == 1
    assert executions(redis_client, run, "three") == 0
