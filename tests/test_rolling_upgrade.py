"""Rolling upgrades never fail a step, on real workers: workers of two versions side by side
with runs in flight, the old ones stopped mid-stream (none failed, lost or run twice); a step
its worker cannot run (a method it lacks) or may not (a run pinned to another version) is
handed to a worker of the version that can, and waits visibly while none is live."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.distributed.app import make_app
from runner.distributed.processes import WorkerProcess
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests._dist_support import eventually
from tests.flows.dist import executions
from tests.test_deploy_workers import Deploy

SUBMIT = """
import json, sys
from runner.distributed import client
runs = [client.submit("deploy_flows:RollingFlow") for _ in range(int(sys.argv[1]))]
print(json.dumps([run.run_id for run in runs]))
"""


@pytest.fixture
def deploy(redis_url: str, tmp_path: Path) -> Iterator[Deploy]:
    made = Deploy(redis_url, tmp_path)
    yield made
    made.close()


def submit_many(deploy: Deploy, version: str, count: int) -> list[str]:
    """``count`` runs of ``RollingFlow`` submitted by a producer of ``version``."""
    done = deploy.python(version, SUBMIT, str(count))
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def settled(deploy: Deploy, runs: list[str], timeout: float) -> dict[str, RunStatus]:
    deadline = time.monotonic() + timeout
    while True:
        found = {r: latest.status for r in runs if (latest := deploy.store.latest(r))}
        if all(s.finished for s in found.values()) and len(found) == len(runs):
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.slow
def test_a_rolling_deploy_with_30_runs_in_flight_fails_loses_and_repeats_nothing(
    deploy: Deploy, redis_client: redis.Redis
) -> None:
    old = deploy.worker("v1")
    deploy.worker("v2")
    runs = submit_many(deploy, "v1", 15) + submit_many(deploy, "v2", 15)
    # Mid-stream: some runs finished, others in flight; the old version leaves (warm).
    deadline = time.monotonic() + 60
    while sum(deploy.store.latest(r).status is RunStatus.SUCCEEDED for r in runs) < 5:
        assert time.monotonic() < deadline, "no run finished"
        time.sleep(0.1)
    old.stop()

    statuses = settled(deploy, runs, timeout=120)
    assert statuses == dict.fromkeys(runs, RunStatus.SUCCEEDED)  # none failed, none lost
    for run_id in runs:
        counts = {m: executions(redis_client, run_id, m) for m in ("a", "b", "c", "extra")}
        assert counts["a"] == counts["b"] == counts["c"] == 1, (run_id, counts)  # none twice
        assert counts["extra"] <= 1, (run_id, counts)
        latest = deploy.store.latest(run_id)
        assert latest is not None
        # A run whose b committed on v2 ran v2's extra too, wherever its message went first.
        b_on_v2 = latest.record.outputs.get("b") == "b on v2"
        assert counts["extra"] == (1 if b_on_v2 else 0), (run_id, counts, latest.record.outputs)


@pytest.mark.processes
def test_a_pinned_run_waits_for_a_worker_of_its_version_then_finishes_there(
    deploy: Deploy, redis_client: redis.Redis
) -> None:
    deploy.env["RUNNER_VERSION_POLICY"] = "pinned"
    v2_worker = deploy.worker("v2")
    queue = deploy.env["RUNNER_QUEUE"]
    # On Redis a worker does not fetch from its empty version twin (one BRPOP list per
    # priority less on every fetch): it consumes its queue alone until a step is handed there.
    assert consumed(deploy, v2_worker) == [queue]
    (run_id,) = submit_many(deploy, "v1", 1)

    deadline = time.monotonic() + 30
    while True:
        shown = deploy.cli("v2", "status", run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        if status["waiting"]:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.3)
    assert status["status"] == "running"
    assert status["waiting"] == {"a#1": "waiting for a worker of version v1"}
    text = deploy.cli("v2", "status", run_id).stdout
    assert "waiting for a worker of version v1" in text
    assert executions(redis_client, run_id, "a") == 0  # the v2 worker never ran it

    # runner workers: the v2 worker's code version beside its queue, the queue's twins
    # listed under it (not as queues nobody consumes).
    fleet = workers_json(deploy, "v2")
    ((v2,),) = [[w["name"] for w in fleet["workers"]]]
    assert [(w["queues"], w["versions"]) for w in fleet["workers"]] == [([queue], ["v2"])]
    assert [q["queue"] for q in fleet["queues"]] == [queue]
    twins = [(t["version"], t["queue"], t["consumers"]) for t in fleet["queues"][0]["versions"]]
    assert twins == [("v2", f"{queue}@v2", [v2])]
    shown = deploy.cli("v2", "workers")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.startswith(v2))
    assert "default" in row.split() and "v2" in row.split()
    assert "none: no live worker consumes it" not in shown.stdout

    v1_worker = deploy.worker("v1")
    done = deploy.wait(run_id, RunStatus.SUCCEEDED)
    assert done.record.outputs == {"a": "a on v1", "b": "b on v1", "c": "c on v1"}
    assert {m: executions(redis_client, run_id, m) for m in "abc"} == dict.fromkeys("abc", 1)
    # The v1 worker took the handed step from its twin, which it leaves again once empty.
    assert v1_worker.log is not None
    assert f"Started consuming from {queue}@v1" in v1_worker.log.read_text()
    eventually(lambda: consumed(deploy, v1_worker) == [queue], timeout=15)
    fleet = workers_json(deploy, "v1")
    assert sorted(w["versions"] for w in fleet["workers"]) == [["v1"], ["v2"]]
    by_version = {w["versions"][0]: w["name"] for w in fleet["workers"]}
    assert [q["queue"] for q in fleet["queues"]] == [queue]
    twins = [(t["version"], t["depth"], t["consumers"]) for t in fleet["queues"][0]["versions"]]
    assert twins == [("v1", 0, [by_version["v1"]]), ("v2", 0, [by_version["v2"]])]


def consumed(deploy: Deploy, worker: WorkerProcess) -> list[str]:
    """The queues ``worker`` consumes now, as Celery's remote control reports them."""
    app = make_app(
        RunnerSettings(
            redis_url=deploy.env["RUNNER_REDIS_URL"],
            prefix=deploy.env["RUNNER_PREFIX"],
            queue=deploy.env["RUNNER_QUEUE"],
        )
    )
    try:
        replies = app.control.inspect([worker.name], timeout=5).active_queues() or {}
    finally:
        app.close()
    return sorted(q["name"] for q in replies.get(worker.name, []))


def workers_json(deploy: Deploy, version: str) -> dict[str, Any]:
    """``runner workers --json`` as a process of ``version``."""
    done = deploy.cli(version, "workers", "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found
