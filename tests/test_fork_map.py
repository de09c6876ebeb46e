"""Moving a run on purpose: ``runner fork RUN --map old_method=new_method`` continues a run
whose method was renamed, from its latest checkpoint, on the new code (real workers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.store.models import RunStatus
from tests.test_deploy_workers import Deploy


@pytest.fixture
def deploy(redis_url: str, tmp_path: Path) -> Iterator[Deploy]:
    made = Deploy(redis_url, tmp_path)
    yield made
    made.close()


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
    assert paused.meta.awaiting is not None and paused.meta.awaiting.method == "new_step"
    assert paused.completed == ["a#1"]  # a is not run again
    assert paused.meta.pinned == "v2" and paused.version == "v2"

    answered = deploy.cli("v2", "resume", new_run, "--feedback", "yes")
    assert answered.returncode == 0, answered.stderr
    done = deploy.wait(new_run, RunStatus.SUCCEEDED)
    assert done.record.outputs == {"a": "a", "new_step": "yes"}
    source = deploy.store.latest(run_id)
    assert source is not None and source.status is RunStatus.PAUSED  # the source is untouched
