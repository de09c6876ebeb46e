"""Workers ride through a Redis restart mid-run: every run finishes, each once, runs go on
within seconds of Redis answering again, and each worker logs one WARNING for the lost
connection, one INFO when it is back, and no traceback.

Redis here is a server of the test's own (AOF, fsync always; the checkpoints and the
broker's queue survive the restart), stopped for 3 s (and 7 s) while 20 runs of a fan-out
+ join + router flow are in flight (two workers of ten pool processes each: every run can
take a step at once, so the wait measured is the restart's, not the queue's), at the
default lease and recovery settings. How soon runs go on is read from the store: each open
run's first checkpoint built after Redis answered again.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from runner.distributed.client import RunHandle, submit
from runner.distributed.processes import WorkerProcess
from runner.store.models import RunStatus
from tests._dist_support import eventually
from tests.chaos_support import RedisServer, runtime_on, start_workers
from tests.flows.reliability import ChaosRouted, expected_effects

pytestmark = [pytest.mark.slow, pytest.mark.processes]

RUNS = 20
OUTAGES = [3.0, 7.0]
"""Seconds Redis is down: issue 33's 3 s, and 7 s, past Celery's default second reconnect
try (2 s, then 6 s after the loss: the next came at 12 s)."""
GOES_ON_WITHIN = 5.0
"""Seconds from Redis answering again to each open run's next commit (issue 33: 14-18 s)."""


def _log(worker: WorkerProcess) -> str:
    return worker.log.read_text(errors="replace") if worker.log else ""


def _next_commit_delays(handles: list[RunHandle], open_runs: set[str], up_at: float) -> dict:
    """For each run open when Redis stopped: seconds from ``up_at`` to its first checkpoint
    built after it. A run whose last checkpoint was built during the outage (its commit
    retried through it and landed after) had nothing left to wait for and is left out."""
    delays = {}
    for handle in handles:
        if handle.run_id not in open_runs:
            continue
        built = sorted(c.created_at for c in handle.rt.store.history(handle.run_id, limit=1000))
        after = [t for t in built if t >= up_at]
        if after:
            delays[handle.run_id] = after[0] - up_at
    return delays


@pytest.mark.parametrize("outage", OUTAGES)
def test_workers_ride_through_a_redis_restart_quietly(tmp_path: Path, outage: float) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    with RedisServer(tmp_path / "redis") as server:
        env = {
            "RUNNER_REDIS_URL": server.url,
            "RUNNER_PREFIX": f"rr-{uuid.uuid4().hex[:8]}",
            "RUNNER_QUEUE": f"rr-{uuid.uuid4().hex[:8]}",
            "RUNNER_FLOW_MODULES": "tests.flows.reliability",
        }
        rt = runtime_on(env)
        workers = start_workers(2, env, logs, rt, loglevel="info", concurrency=10)
        try:
            handles = [submit(ChaosRouted, {"n": i}, rt=rt) for i in range(RUNS)]
            # Steps ran on both workers: the restart comes mid-flight.
            eventually(lambda: len({h.latest().worker for h in handles} - {None}) >= 2)
            open_runs = {h.run_id for h in handles if not h.status().finished}
            server.restart(pause=outage)
            up_at = server.answered_at
            print(f"Redis down {up_at - server.stopped_at:.2f}s, {len(open_runs)} runs open")
            statuses = [h.wait(timeout=120) for h in handles]
            effects = [sorted(h.latest().state["effects"]) for h in handles]
            commits = {
                h.run_id: Counter(
                    c.activation
                    for c in rt.store.history(h.run_id, limit=1000)
                    if c.event == "method_execution_finished"
                )
                for h in handles
            }
            delays = _next_commit_delays(handles, open_runs, up_at)
            # Every worker has talked to Redis again since (its recovery pass said so).
            eventually(lambda: all("is back after" in _log(w) for w in workers), timeout=30)
        finally:
            for worker in workers:
                worker.stop()
            rt.app.close()
            rt.store.close()
    slowest = max(delays.values(), default=0.0)
    print(f"next commit after Redis answered: {len(delays)} runs, slowest {slowest:.2f}s")
    assert statuses == [RunStatus.SUCCEEDED] * RUNS
    assert effects == [expected_effects(i) for i in range(RUNS)]
    twice = {run: [a for a, k in c.items() if k > 1] for run, c in commits.items()}
    assert {run: acts for run, acts in twice.items() if acts} == {}
    assert open_runs and delays  # the restart did come mid-flight
    assert slowest <= GOES_ON_WITHIN, sorted(delays.values())

    for worker in workers:
        assert worker.log is not None
        text = worker.log.read_text()
        lost = re.findall(r"WARNING/MainProcess\] lost the connection to Redis", text)
        back = re.findall(r"INFO/MainProcess\] connection to Redis at .* is back after", text)
        other = [
            line
            for line in text.splitlines()
            if ("WARNING" in line or "ERROR" in line)
            and re.search(r"connect|Connection", line)
            and "lost the connection to Redis" not in line
        ]
        assert len(lost) == 1, text
        assert len(back) == 1, text
        assert other == [], other
        reconnected = text[text.index("lost the connection to Redis") :]
        assert "Connected to" not in reconnected  # Celery's own "back" is left to our INFO
        assert "Warning" not in reconnected  # nor Celery 5's notice about Celery 6
        assert "Traceback" not in text, text
        assert "ConnectionRefusedError" not in text, text
