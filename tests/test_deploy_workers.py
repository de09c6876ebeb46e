"""A deploy while runs wait, on real workers: runs paused on version 1 (a review, a question)
are answered after version 1's worker made way for version 2's, whose code patched the
methods and changed the state model. ``patched`` decides by where each run passed, the state
is read through the new model (a default, a ``@state_upgrade``), and a state version 2 cannot
read is refused in one line, leaving the run as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.distributed.app import make_app
from runner.distributed.processes import WorkerProcess
from runner.settings import RunnerSettings
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider
from tests.deploys import V1, V2

ROOT = Path(__file__).resolve().parent.parent


class Deploy:
    """One deployment (prefix, queue) whose workers and CLI run version 1 or 2 of
    ``deploy_flows``."""

    def __init__(self, redis_url: str, logdir: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.env = {
            "RUNNER_REDIS_URL": redis_url,
            "RUNNER_PREFIX": f"td-{tag}",
            "RUNNER_QUEUE": f"tdq-{tag}",
            "RUNNER_FLOW_MODULES": "deploy_flows",
            "RUNNER_LEASE_SECONDS": "2",
            "RUNNER_RECOVERY_INTERVAL": "0.5",
        }
        self.logdir = logdir
        self.store = RedisProvider(redis_url, prefix=self.env["RUNNER_PREFIX"])
        self.workers: list[WorkerProcess] = []

    def of(self, version: str, **more: str) -> dict[str, str]:
        """The environment of a process running ``version`` (``v1`` or ``v2``)."""
        code = V1 if version == "v1" else V2
        path = os.pathsep.join([str(code), str(ROOT)])
        return {**self.env, "RUNNER_APP_VERSION": version, "PYTHONPATH": path, **more}

    def worker(self, version: str, **more: str) -> WorkerProcess:
        """Start a worker of ``version`` and wait until it answers."""
        env = self.of(version, **more)
        log = self.logdir / f"worker-{version}-{len(self.workers)}.log"
        worker = WorkerProcess(env, concurrency=2, log=log, stop_timeout=10, loglevel="info")
        self.workers.append(worker)
        settings = RunnerSettings(
            redis_url=env["RUNNER_REDIS_URL"],
            prefix=env["RUNNER_PREFIX"],
            queue=env["RUNNER_QUEUE"],
        )
        app = make_app(settings)
        try:
            worker.start(app)
        finally:
            app.close()
        return worker

    def cli(self, version: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``runner ARGS...`` as a process of ``version`` (an operator's shell after the deploy)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        return subprocess.run(
            [sys.executable, "-m", "runner", *args],
            env={**env, **self.of(version)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def python(self, version: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``python -c CODE ARGS...`` as a process of ``version`` (a producer of that deploy)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            env={**env, **self.of(version)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def submit(self, version: str, flow: str, *inputs: str) -> str:
        args = ["submit", f"deploy_flows:{flow}", "--json"]
        for pair in inputs:
            args += ["--input", pair]
        done = self.cli(version, *args)
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout)["run_id"])

    def wait(self, run_id: str, *statuses: RunStatus, timeout: float = 60) -> Checkpoint:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            latest = self.store.latest(run_id)
            if latest is not None and latest.status in statuses:
                return latest
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} not {statuses} after {timeout}s: {latest!r}")

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.store.close()


@pytest.fixture
def deploy(redis_url: str, tmp_path: Path) -> Iterator[Deploy]:
    made = Deploy(redis_url, tmp_path)
    yield made
    made.close()


@pytest.mark.processes
def test_runs_paused_on_v1_go_on_on_v2_with_patches_and_state_as_the_new_code_reads_it(
    deploy: Deploy,
) -> None:
    old = deploy.worker("v1")
    reviewed = deploy.submit("v1", "ReviewFlow", "topic=otters")
    asked = deploy.submit("v1", "AskFlow")
    strict = deploy.submit("v1", "StrictFlow")
    for run_id in (reviewed, asked, strict):
        paused = deploy.wait(run_id, RunStatus.PAUSED)
        assert paused.version == "v1"

    old.stop()  # the deploy: version 1 leaves, version 2 comes
    deploy.worker("v2")

    # A state v2 cannot read (a changed type, no upgrade): one line, the run as it was.
    before = [c.id for c in deploy.store.history(strict)]
    refused = deploy.cli("v2", "resume", strict, "--feedback", "yes")
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert f"run {strict}" in lines[0] and "total" in lines[0] and "v1" in lines[0]
    assert [c.id for c in deploy.store.history(strict)] == before

    for run_id, answer in ((reviewed, "ship it"), (asked, "yes")):
        done = deploy.cli("v2", "resume", run_id, "--feedback", answer)
        assert done.returncode == 0, done.stderr

    review = deploy.wait(reviewed, RunStatus.SUCCEEDED)
    # The review's method ran on v1 and never again: its draft has no tone. The step after
    # the review was reached first on v2: patched. The new field took its default.
    assert review.state["draft"] == "draft on otters"
    assert review.state["published"] == "toned (en)"
    assert review.version == "v2"

    ask = deploy.wait(asked, RunStatus.SUCCEEDED)
    # Before the question (passed on v1 without the patch): False; after it: True.
    assert ask.state["log"] == ["before=False", "after=True"]
    assert ask.state["count"] == [1]  # mapped by @state_upgrade("v1"), once
    assert ask.meta.versions.upgrades == ["v1 -> v2"]
    versions_written = [c.version for c in deploy.store.history(asked)]
    assert "v1" in versions_written and versions_written[0] == "v2"  # newest first


@pytest.mark.processes
def test_a_patch_decided_at_a_pause_is_recorded_and_decided_alike_on_the_next_run(
    deploy: Any,
) -> None:
    """The patch decisions of a step that paused are in its checkpoint (``meta.replay.patches``)."""
    deploy.worker("v2")
    asked = deploy.submit("v2", "AskFlow")
    paused = deploy.wait(asked, RunStatus.PAUSED)
    (activation,) = paused.meta.replay.patches
    # Reached first on v2: the patch before the question is True, and so recorded.
    assert paused.meta.replay.patches[activation] == {"check-stock": True}
    assert deploy.cli("v2", "resume", asked, "--feedback", "ok").returncode == 0
    done = deploy.wait(asked, RunStatus.SUCCEEDED)
    assert done.state["log"] == ["before=True", "after=True"]
    assert done.meta.replay.patches == {}  # the notes went with the activation's commit
