"""A backlog is not a loss: steps queued longer than the lease are never re-sent nor run
twice, while a message that really was lost is still recovered (at the DEFAULT settings).

Recovery tells them apart by leases (:mod:`runner.distributed.handoff`): a step marked
sent with no lease is in the broker's queue; a step whose lease lapsed lost whoever
answered for it (a sender that died before sending, a worker that died holding it).
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis

from runner.distributed import broker, handoff
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime, first_checkpoint
from runner.distributed.processes import WorkerProcess
from runner.store.models import RunStatus
from tests._dist_support import eventually, finished, recovery_passes
from tests.chaos_support import (
    DEFAULT_INTERVAL,
    DEFAULT_LEASE,
    at_defaults,
    runtime_on,
    start_worker,
)
from tests.conftest import capture_events
from tests.flows.reliability import FailsOnce, Nap, executions

pytestmark = pytest.mark.slow

SLOTS = 2
STEPS = 10 * SLOTS
NAP = 3 * DEFAULT_LEASE * SLOTS / STEPS
"""Each step's length: the backlog drains in three leases."""


def _env(worker_env: dict[str, str]) -> dict[str, str]:
    env = at_defaults(worker_env)
    env["RUNNER_PREFIX"] = env["RUNNER_QUEUE"] = f"bl-{uuid.uuid4().hex[:8]}"
    return env


def _stop(rt: Runtime, workers: list[WorkerProcess]) -> None:
    for worker in workers:
        worker.stop()
    rt.close()


def test_a_backlog_three_leases_long_runs_every_step_once_from_one_message(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    env = _env(worker_env)
    rt = runtime_on(env)
    workers = [start_worker(env, tmp_path, rt, concurrency=SLOTS)]
    try:
        with capture_events(rt.app) as events:
            began = time.monotonic()
            handles = [submit(Nap, {"seconds": NAP}, rt=rt) for _ in range(STEPS)]
            statuses = [h.wait(timeout=120) for h in handles]
            waited = time.monotonic() - began
            recovery_passes(rt, 2)  # one more recovery pass after the last run
        print(f"{STEPS} steps on {SLOTS} slots drained in {waited:.1f}s")
        assert waited >= 2.5 * DEFAULT_LEASE  # the backlog really outlived the lease
        assert statuses == [RunStatus.SUCCEEDED] * STEPS
        for handle in handles:
            assert len(executions(redis_client, handle.run_id, "nap")) == 1
            assert len(finished(rt, handle.run_id, "nap")) == 1
        # One message per step: nothing was re-sent while it waited in the queue.
        sent = Counter(e["uuid"] for e in events if e.get("type") == "task-sent")
        assert len(sent) == STEPS and set(sent.values()) == {1}, sent
        started = Counter(e["uuid"] for e in events if e.get("type") == "task-started")
        assert set(started.values()) == {1}, started
        assert broker.queue_length(rt.app, env["RUNNER_QUEUE"]) == 0
    finally:
        _stop(rt, workers)


def test_a_step_whose_sender_died_before_sending_is_recovered(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    env = _env(worker_env)
    rt = runtime_on(env)
    workers = [start_worker(env, tmp_path, rt)]
    try:
        # Dispatch the way a sender does (hold, mark), then "die" before sending.
        first = first_checkpoint(Nap, {"seconds": 0.1})
        run = rt.store.commit(first.checkpoint, expected_seq=0).run_id
        handoff.hold(rt.coord, run, ["nap#1"])
        assert rt.coord.mark_dispatched(run, ["nap#1"]) == [True]
        died = time.monotonic()
        assert RunHandle(run, rt).wait(timeout=30) is RunStatus.SUCCEEDED
        assert time.monotonic() - died < DEFAULT_LEASE + DEFAULT_INTERVAL + 3
        assert len(executions(redis_client, run, "nap")) == 1
    finally:
        _stop(rt, workers)


def test_a_retry_held_by_a_worker_that_died_is_recovered(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    env = _env(worker_env)
    rt = runtime_on(env)
    holder = start_worker(env, tmp_path, rt, concurrency=1)
    workers = [holder]
    try:
        handle = submit(FailsOnce, rt=rt)
        run = handle.run_id
        eventually(lambda: executions(redis_client, run, "shaky"), timeout=30)
        # The retry (due in 20-40 s) now waits on the worker that received it.
        eventually(lambda: rt.coord.leases(run), timeout=10)
        time.sleep(0.5)
        holder.kill()
        killed = time.time()
        workers.append(start_worker(env, tmp_path, rt, concurrency=1))
        assert handle.result(timeout=60) == "execution 2"
        again = executions(redis_client, run, "shaky")[1]
        delay = again["t"] - killed
        print(f"the retry held by the dead worker ran after {delay:.1f}s")
        assert delay < 20  # before its countdown, long before the broker's visibility timeout
        assert len(finished(rt, run, "shaky")) == 1
        assert os.getpid() != again["pid"]
    finally:
        _stop(rt, workers)
