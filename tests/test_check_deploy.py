"""``runner check-deploy MODULE...`` before a deploy: against runs paused on version 1, the
version 2 code is checked for a renamed method, a changed router and a state it cannot read;
exit 1 with a table naming each run, and nothing in the store changes."""

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


@pytest.mark.processes
def test_check_deploy_names_the_runs_the_new_code_cannot_continue_and_changes_nothing(
    deploy: Deploy,
) -> None:
    deploy.worker("v1")
    runs = {
        flow: deploy.submit("v1", flow)
        for flow in ("RenameFlow", "RouteFlow", "StrictFlow", "AskFlow", "ReviewFlow")
    }
    for run_id in runs.values():
        deploy.wait(run_id, RunStatus.PAUSED)
    before = {r: [c.id for c in deploy.store.history(r)] for r in runs.values()}

    same = deploy.cli("v1", "check-deploy", "deploy_flows")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "every waiting run can go on" in same.stdout

    checked = deploy.cli("v2", "check-deploy", "deploy_flows", "--json")
    assert checked.returncode == 1, checked.stderr
    found = {f["run_id"]: f for f in json.loads(checked.stdout)}
    assert set(found) == {runs["RenameFlow"], runs["RouteFlow"], runs["StrictFlow"]}
    assert "old_step" in " ".join(found[runs["RenameFlow"]]["problems"])
    route = " ".join(found[runs["RouteFlow"]]["problems"])
    assert "redo" in route and "'retry'" in route
    strict = " ".join(found[runs["StrictFlow"]]["problems"])
    assert "total" in strict and runs["StrictFlow"] in strict
    assert all(f["version"] == "v1" and f["status"] == "paused" for f in found.values())

    table = deploy.cli("v2", "check-deploy", "deploy_flows")
    assert table.returncode == 1
    assert "3 run(s) the new code cannot continue" in table.stdout
    # It reads only.
    assert {r: [c.id for c in deploy.store.history(r)] for r in runs.values()} == before
