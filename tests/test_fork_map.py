"""Moving a run on purpose: ``runner fork RUN --map old_method=new_method`` continues a run
whose method was renamed, from its latest checkpoint, on the new code (real workers)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runner.distributed.app import make_app
from runner.distributed.engine import Runtime
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests.console_support import serving
from tests.deploys import V2
from tests.test_deploy_workers import Deploy

TOKEN = "fork-map-t0ken"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def deploy(redis_url: str, tmp_path: Path) -> Iterator[Deploy]:
    made = Deploy(redis_url, tmp_path)
    yield made
    made.close()


@pytest.mark.processes
def test_fork_map_continues_a_run_whose_method_was_renamed_on_the_new_code(
    deploy: Deploy,
) -> None:
    old = deploy.worker("v1")
    run_id = deploy.submit("v1", "RenameFlow")
    deploy.wait(run_id, RunStatus.PAUSED)  # at old_step's question
    old.stop()
    deploy.worker("v2")  # v2 renamed old_step to new_step

    refused = deploy.cli("v2", "fork", run_id)
    assert refused.returncode != 0 and "old_step" in refused.stderr

    bad = deploy.cli("v2", "fork", run_id, "--map", "old_step=nope")
    assert bad.returncode == 2 and "no method nope" in bad.stderr

    forked = deploy.cli("v2", "fork", run_id, "--map", "old_step=new_step", "--json")
    assert forked.returncode == 0, forked.stderr
    new_run = json.loads(forked.stdout)["run_id"]
    paused = deploy.wait(new_run, RunStatus.PAUSED)
    assert (
        paused.meta.human.awaiting is not None and paused.meta.human.awaiting.method == "new_step"
    )
    assert paused.completed == ["a#1"]  # a is not run again
    assert paused.meta.versions.pinned == "v2" and paused.version == "v2"

    answered = deploy.cli("v2", "resume", new_run, "--feedback", "yes")
    assert answered.returncode == 0, answered.stderr
    done = deploy.wait(new_run, RunStatus.SUCCEEDED)
    assert done.record.outputs == {"a": "a", "new_step": "yes"}
    source = deploy.store.latest(run_id)
    assert source is not None and source.status is RunStatus.PAUSED  # the source is untouched


@pytest.mark.processes
def test_the_api_forks_with_a_map_too(deploy: Deploy, monkeypatch: pytest.MonkeyPatch) -> None:
    old = deploy.worker("v1")
    run_id = deploy.submit("v1", "RenameFlow")
    deploy.wait(run_id, RunStatus.PAUSED)
    old.stop()
    deploy.worker("v2")
    monkeypatch.syspath_prepend(str(V2))  # the console runs the new code
    monkeypatch.delitem(sys.modules, "deploy_flows", raising=False)
    settings = RunnerSettings(
        redis_url=deploy.env["RUNNER_REDIS_URL"],
        prefix=deploy.env["RUNNER_PREFIX"],
        queue=deploy.env["RUNNER_QUEUE"],
        app_version="v2",
    )
    rt = Runtime.create(make_app(settings), settings)
    try:
        with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url, headers=BEARER) as http:
            made = http.post(f"/api/checkpoints/{run_id}/fork", json={"map": {"nope": "x"}})
            assert made.status_code in (400, 422), made.text
            made = http.post(
                f"/api/checkpoints/{run_id}/fork", json={"map": {"old_step": "new_step"}}
            )
            assert made.status_code == 201, made.text
            new_run = made.json()["run_id"]
    finally:
        rt.close()
    paused = deploy.wait(new_run, RunStatus.PAUSED)
    assert (
        paused.meta.human.awaiting is not None and paused.meta.human.awaiting.method == "new_step"
    )
