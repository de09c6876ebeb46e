"""``queue=`` on a method: its steps go to the deployment's queue of that name, run only on
workers that consume it (``RUNNER_WORKER_QUEUES``), and wait, visibly, while none does."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.distributed import broker, routing
from runner.distributed.client import RunHandle, submit
from runner.store.models import RunStatus
from tests._dist_support import eventually, private_pool, recovery_passes
from tests.conftest import capture_events
from tests.flows.flow_control import RoutedFlow

pytestmark = pytest.mark.slow


def test_a_gpu_step_waits_for_a_gpu_worker_and_runs_only_there(
    worker_env: dict[str, str], tmp_path: str
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        gpu = routing.queue_name(rt.settings, "gpu")
        assert gpu == f"{env['RUNNER_QUEUE']}.gpu"
        pool.start()  # consumes the default queue only
        with capture_events(rt.app) as events:  # what Flower reads
            run = submit(RoutedFlow, {"group": "g"}, rt=rt)
            eventually(lambda: [e for e in events if e.get("queue", "").endswith(".gpu")])
        sent = {e["name"]: e["queue"] for e in events if e["type"] == "task-sent"}
        assert sent == {"RoutedFlow.prepare": env["RUNNER_QUEUE"], "RoutedFlow.embed": gpu}
        eventually(lambda: "prepare#1" in rt.coord.read(run.run_id).completed, timeout=20)
        assert routing.unconsumed(rt.store, rt.settings, "gpu")
        assert not routing.unconsumed(rt.store, rt.settings, None)
        # Nobody consumes gpu: the step stays queued there, the run keeps running, past a
        # lease without a commit and the recovery passes after it.
        quiet_since = rt.coord.read(run.run_id).created_at
        eventually(lambda: time.time() > quiet_since + rt.settings.lease_seconds, timeout=10)
        recovery_passes(rt, 2)
        assert RunHandle(run.run_id, rt).status() is RunStatus.RUNNING
        assert broker.queue_length(rt.app, gpu) == 1
        # ... and says so: `runner status` and `runner steps` name the queue it waits for.
        shown = CliRunner().invoke(app, ["status", run.run_id], env=env)
        assert shown.exit_code == 0, shown.output
        assert f"embed#1 waits for queue gpu ({gpu}): no live worker consumes it" in shown.output
        steps = CliRunner().invoke(app, ["steps", run.run_id, "--json"], env=env)
        rows = {row["step"]: row for row in json.loads(steps.output)}
        assert rows["embed#1"]["outcome"] == "waiting"
        assert "queue gpu" in rows["embed#1"]["waits_for"]

        pool.env["RUNNER_WORKER_QUEUES"] = "gpu"
        pool.start()
        gpu_worker = pool.workers[-1].name
        assert RunHandle(run.run_id, rt).wait(timeout=30) is RunStatus.SUCCEEDED
        state = rt.coord.read(run.run_id).state
        assert state["embedded_on"] == gpu_worker
        assert state["prepared_on"] == pool.workers[0].name
        assert not routing.unconsumed(rt.store, rt.settings, "gpu")
        steps = CliRunner().invoke(app, ["steps", run.run_id, "--json"], env=env)
        assert [row["outcome"] for row in json.loads(steps.output)] == ["done", "done"]
