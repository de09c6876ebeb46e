"""Workers ride through a Redis restart mid-run: every run finishes, and each worker logs
one WARNING for the lost connection, one INFO when it is back, and no traceback.

Redis here is a server of the test's own (AOF, fsync always; the checkpoints and the
broker's queue survive the restart), restarted while 20 runs of a fan-out + join + router
flow are in flight, at the default lease and recovery settings.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from runner.distributed.client import submit
from runner.distributed.processes import WorkerProcess
from runner.store.models import RunStatus
from tests._dist_support import eventually
from tests.chaos_support import RedisServer, runtime_on, start_workers
from tests.flows.reliability import ChaosRouted, expected_effects

pytestmark = pytest.mark.slow

RUNS = 20


def _log(worker: WorkerProcess) -> str:
    return worker.log.read_text(errors="replace") if worker.log else ""


def test_workers_ride_through_a_redis_restart_quietly(tmp_path: Path) -> None:
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
        workers = start_workers(2, env, logs, rt, loglevel="info")
        try:
            handles = [submit(ChaosRouted, {"n": i}, rt=rt) for i in range(RUNS)]
            # Steps ran on both workers: the restart comes mid-flight.
            eventually(lambda: len({h.latest().worker for h in handles} - {None}) >= 2)
            down = server.restart(pause=2.0)
            print(f"Redis was down {down:.2f}s")
            statuses = [h.wait(timeout=120) for h in handles]
            effects = [sorted(h.latest().state["effects"]) for h in handles]
            # Every worker has talked to Redis again since (its recovery pass said so).
            eventually(lambda: all("is back after" in _log(w) for w in workers), timeout=30)
        finally:
            for worker in workers:
                worker.stop()
            rt.app.close()
            rt.store.close()
    assert statuses == [RunStatus.SUCCEEDED] * RUNS
    assert effects == [expected_effects(i) for i in range(RUNS)]

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
