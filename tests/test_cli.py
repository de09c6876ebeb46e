"""The ``runner`` CLI used as a user would: real Redis, real subprocess workers.

Commands run through typer's ``CliRunner`` with the workers' ``RUNNER_*`` environment, so
each invocation builds its runtime from the settings exactly as the console script does.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from runner.cli import app
from runner.flow import transition as tr
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider
from tests.flows.cli import GatedFlow, count_key, gate_key

GATED = "tests.flows.cli:GatedFlow"
APPROVAL = "tests.flows.cli:ApprovalFlow"


@dataclass
class Cli:
    """Runs ``runner ARGS...`` in this process with the workers' environment."""

    env: dict[str, str]

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Any:
        return CliRunner().invoke(app, list(args), env={**self.env, **(env or {})})

    def ok(self, *args: str) -> Any:
        result = self(*args)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json").stdout)


@pytest.fixture
def cli(rt: Any, worker_env: dict[str, str]) -> Cli:
    """The CLI, pointed at the test workers' Redis, prefix and queue."""
    return Cli(dict(worker_env))


@pytest.fixture
def tag(redis_client: redis.Redis) -> Any:
    """A fresh tag for the step counters of the test flows; its keys are removed after."""
    value = f"t{uuid.uuid4().hex[:8]}"  # a letter first: `tag=...` must not parse as a number
    yield value
    keys = list(redis_client.scan_iter(f"cli-test:{value}:*"))
    if keys:
        redis_client.delete(*keys)


def counts(client: redis.Redis, tag: str, *steps: str) -> dict[str, int]:
    """How often each step of runs tagged ``tag`` executed."""
    return {step: int(client.get(count_key(tag, step)) or 0) for step in steps}


def history_ids(rt: Any, run_id: str) -> list[str]:
    return [c.id for c in rt.store.history(run_id, limit=1000)]


# --- submit, status, watch, runs --------------------------------------------------------------


def test_submit_wait_prints_the_run_id_then_the_result(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str, tmp_path: Path
) -> None:
    redis_client.set(gate_key(tag), 1)
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"tag": tag, "x": 5}))
    result = cli.ok("submit", GATED, "--inputs-file", str(inputs), "--input", "x=2", "--wait")
    run_id, outcome = result.stdout.splitlines()
    assert outcome == "succeeded: total=3"
    assert rt.store.run(run_id).status is RunStatus.SUCCEEDED
    assert rt.store.latest(run_id).state["x"] == 2
    assert counts(redis_client, tag, "fetch", "check", "report") == {
        "fetch": 1,
        "check": 1,
        "report": 1,
    }


def test_submit_takes_crewais_trigger_payload_and_resume_gives_it_again(cli: Cli, rt: Any) -> None:
    payload = "crewai_trigger_payload=" + json.dumps({"ticket": 9})
    failed = cli("submit", "tests.flows.dist:Triggered", "--input", payload, "--wait")
    assert failed.exit_code == 1  # the flow's first attempt fails
    run_id = failed.stdout.split()[0]
    resumed = cli.ok("resume", run_id, "--wait").stdout
    assert "succeeded: ticket 9, payload here too: True" in resumed
    assert rt.store.latest(run_id).state["seen"] == {"payload": {"ticket": 9}}


def test_submit_returns_at_once_and_watch_follows_the_run_to_its_end(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str
) -> None:
    redis_client.set(gate_key(tag), 1)
    submitted = cli.json("submit", GATED, "--input", f"tag={tag}")
    run_id = submitted["run_id"]
    assert submitted["status"] == "running"
    watched = cli.ok("watch", run_id, "--interval", "0.05", "--timeout", "30")
    assert "3/3" in watched.stdout
    assert "succeeded" in watched.stdout
    assert rt.store.run(run_id).status is RunStatus.SUCCEEDED


def test_status_runs_checkpoints_and_show_describe_a_finished_run(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str
) -> None:
    redis_client.set(gate_key(tag), 1)
    run_id = cli.ok("submit", GATED, "--input", f"tag={tag}", "--wait").stdout.split()[0]

    status = cli.json("status", run_id)
    assert status["status"] == "succeeded"
    assert status["flow"] == GATED
    assert status["completed"] == ["fetch#1", "check#1", "report#1"]
    assert status["in_flight"] == [] and status["lineage"] is None
    table = cli.ok("status", run_id).stdout
    assert run_id in table and "succeeded" in table and GATED in table

    listed = cli.json("runs", "--flow", "GatedFlow", "--status", "succeeded", "--limit", "50")
    assert run_id in [info["run_id"] for info in listed]
    assert {info["status"] for info in listed} == {"succeeded"}
    assert run_id[:8] in cli.ok("runs", "--limit", "50").stdout  # its unique prefix
    assert cli.json("runs", "--flow", "NoSuchFlow") == []

    history = cli.json("checkpoints", run_id)
    assert [c["seq"] for c in history] == sorted((c["seq"] for c in history), reverse=True)
    assert [c["id"] for c in history] == history_ids(rt, run_id)
    assert history[0]["status"] == "succeeded"
    assert len(cli.json("checkpoints", run_id, "--limit", "2")) == 2
    assert "finished" in cli.ok("checkpoints", run_id).stdout  # method_execution_finished

    latest = rt.store.latest(run_id)
    assert cli.json("show", latest.id) == latest.model_dump(mode="json")
    shown = cli.ok("show", latest.id).stdout
    assert "state" in shown and tag in shown and "total=1" in shown


def test_graph_prints_the_flow_as_mermaid(cli: Cli) -> None:
    assert cli.ok("graph", GATED).stdout == GatedFlow.graph().to_mermaid()


# --- failure, resume, fork, pause, cancel ---------------------------------------------------


def test_resume_after_fixing_a_failed_step_runs_only_the_steps_not_completed(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str
) -> None:
    failed = cli("submit", GATED, "--input", f"tag={tag}", "--wait")
    assert failed.exit_code == 1, failed.stderr
    run_id = failed.stdout.strip()
    assert failed.stderr.strip() == (
        f"error: run {run_id} failed at check: RuntimeError: gate closed"
    )
    status = cli.ok("status", run_id).stdout
    assert "failed" in status and "RuntimeError: gate closed" in status
    failure = rt.store.latest(run_id)
    shown = cli.ok("show", failure.id).stdout
    assert "Traceback" in shown and "gate closed" in shown
    assert cli("watch", run_id).exit_code == 1

    redis_client.set(gate_key(tag), 1)
    resumed = cli.ok("resume", run_id, "--wait", "--timeout", "30")
    assert resumed.stdout.splitlines() == [run_id, "succeeded: total=1"]
    assert counts(redis_client, tag, "fetch", "check", "report") == {
        "fetch": 1,
        "check": 2,
        "report": 1,
    }
    events = [c["event"] for c in cli.json("checkpoints", run_id)]
    assert "flow_resumed" in events and "method_execution_failed" in events


def test_fork_with_set_and_rerun_makes_a_new_run_whose_status_shows_its_lineage(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str
) -> None:
    redis_client.set(gate_key(tag), 1)
    source = cli.ok("submit", GATED, "--input", f"tag={tag}", "--wait").stdout.split()[0]
    ckpt = rt.store.latest(source).id
    before = history_ids(rt, source)

    forked = cli.ok("fork", ckpt, "--set", "x=1", "--rerun", "check", "--branch", "exp", "--wait")
    new_run, outcome = forked.stdout.splitlines()
    assert outcome == "succeeded: total=2"
    assert new_run != source
    assert counts(redis_client, tag, "fetch", "check", "report") == {
        "fetch": 1,
        "check": 2,
        "report": 2,
    }
    assert history_ids(rt, source) == before  # the source run is untouched

    status = cli.json("status", new_run)
    assert (status["parent_run_id"], status["parent_checkpoint_id"]) == (source, ckpt)
    assert status["branch"] == "exp"
    shown = cli.ok("status", new_run).stdout
    assert f"forked from run {source} at checkpoint {ckpt} (branch exp)" in shown

    diff = cli.json("diff", ckpt, new_run)
    assert diff["state"]["changed"] == {"id": [source, new_run], "x": [0, 1]}
    assert diff["completed"] == {
        "only_a": ["check#1", "report#1"],
        "only_b": ["check#2", "report#2"],
    }
    assert "x" in cli.ok("diff", ckpt, new_run).stdout


def test_fork_of_a_run_id_takes_its_latest_checkpoint_and_a_given_run_id(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str
) -> None:
    redis_client.set(gate_key(tag), 1)
    source = cli.ok("submit", GATED, "--input", f"tag={tag}", "--wait").stdout.split()[0]
    new_id = f"fork-{uuid.uuid4().hex[:8]}"
    forked = cli.json("fork", source, "--run-id", new_id, "--rerun", "report", "--wait")
    assert forked["run_id"] == new_id and forked["status"] == "succeeded"
    assert forked["result"] == "total=1"
    assert rt.store.run(new_id).parent_run_id == source


def test_a_paused_run_resumes_with_input(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str
) -> None:
    paused = cli.ok("submit", APPROVAL, "--input", f"tag={tag}", "--wait")
    run_id, outcome = paused.stdout.splitlines()
    assert outcome == "paused at approve: need approval"
    status = cli.json("status", run_id)
    assert status["status"] == "paused" and status["pause_reason"] == "need approval"
    assert "need approval" in cli.ok("status", run_id).stdout

    resumed = cli.ok("resume", run_id, "--input", "approved=true", "--wait")
    assert resumed.stdout.splitlines() == [run_id, "succeeded: draft approved published"]
    assert rt.store.latest(run_id).state["approved"] is True
    assert counts(redis_client, tag, "draft", "approve", "publish") == {
        "draft": 1,
        "approve": 2,
        "publish": 1,
    }


def test_cancel_stops_a_run_and_resume_continues_it(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str
) -> None:
    run_id = cli.ok("submit", APPROVAL, "--input", f"tag={tag}", "--wait").stdout.split()[0]
    cancelled = cli.ok("cancel", run_id)
    assert cancelled.stdout.startswith(f"cancelled {run_id}")
    assert rt.store.run(run_id).status is RunStatus.CANCELLED
    assert cli("watch", run_id).exit_code == 1  # a cancelled run's outcome is a failure

    resumed = cli.json("resume", run_id, "--input", "approved=true", "--wait")
    assert resumed["status"] == "succeeded"
    assert resumed["result"] == "draft approved published"


# --- recover, prune -------------------------------------------------------------------------


@pytest.fixture
def lone_prefix(redis_url: str, redis_client: redis.Redis, worker_env: dict[str, str]) -> Any:
    """A key prefix and queue no worker serves (so a test controls every write); cleaned up."""
    prefix, queue = f"t-{uuid.uuid4().hex[:8]}", f"tq-{uuid.uuid4().hex[:8]}"
    store = RedisProvider(redis_url, prefix=prefix)
    yield store, {"RUNNER_PREFIX": prefix, "RUNNER_QUEUE": queue}
    for info in store.runs(limit=1000):
        store.delete_run(info.run_id)
    store.close()
    redis_client.delete(queue)


def test_runs_reads_a_page_of_runs_together_and_a_corrupt_one_still_lists(
    cli: Cli, lone_prefix: Any
) -> None:
    store, env = lone_prefix
    made = [store.commit(Checkpoint(run_id=str(uuid.uuid4()), event="step")) for _ in range(3)]
    newest_first = [ckpt.run_id for ckpt in reversed(made)]
    listed = cli("runs", "--json", env=env)
    assert [row["run_id"] for row in json.loads(listed.stdout)] == newest_first
    # A snapshot overwritten with bytes that are not a checkpoint: the page's read fails,
    # and each run is read on its own.
    broken = made[1]
    store.client.hset(store.keys.snapshots(broken.run_id), broken.id, b"\x00 not a checkpoint")
    listed = cli("runs", "--json", env=env)
    assert listed.exit_code == 0, listed.stderr
    assert [row["run_id"] for row in json.loads(listed.stdout)] == newest_first


def test_upgrade_converts_snapshots_an_earlier_version_stored(cli: Cli, lone_prefix: Any) -> None:
    store, env = lone_prefix
    run_id = str(uuid.uuid4())
    made = [store.commit(Checkpoint(run_id=run_id, event="step", state={"n": i})) for i in (1, 2)]
    snaps = store.keys.snapshots(run_id)
    for ckpt in made:  # as an earlier version wrote them: one string key per snapshot
        old = store.keys.run(run_id, f"ckpt:{ckpt.id}")
        store.client.set(old, store.client.hget(snaps, ckpt.id))
    store.client.delete(snaps)

    first, again = cli("upgrade", env=env), cli("upgrade", "--json", env=env)
    assert (first.exit_code, again.exit_code) == (0, 0), first.stderr + again.stderr
    assert first.stdout.strip() == "moved 2 checkpoint(s) to this version's layout"
    assert json.loads(again.stdout) == {"moved": 0}
    assert store.latest(run_id) == made[-1]


def test_recover_redispatches_the_steps_of_a_run_never_started(cli: Cli, lone_prefix: Any) -> None:
    store, env = lone_prefix
    run_id = str(uuid.uuid4())
    first = tr.start(GatedFlow.graph(), run_id, {"id": run_id}, flow=GATED, name="GatedFlow")
    store.commit(first.checkpoint)  # committed, but its start task was never sent
    lost = str(uuid.uuid4())
    gone = tr.start(GatedFlow.graph(), lost, {"id": lost}, flow="no_such_pkg:Flow", name="Gone")
    store.commit(gone.checkpoint)  # a run whose flow does not import here

    time.sleep(0.3)  # longer than the lease: nobody will send it now
    result = cli("recover", "--json", env={**env, "RUNNER_LEASE_SECONDS": "0.2"})
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {run_id: ["fetch#1"]}
    assert result.stderr.startswith(f"warning: run {lost} not recovered: cannot import")
    again = cli("recover", env={**env, "RUNNER_LEASE_SECONDS": "60"})  # just sent
    assert again.exit_code == 0 and again.stdout.strip() == "nothing to recover"


def _commit_many(store: RedisProvider, run_id: str, n: int) -> None:
    for i in range(n):
        store.commit(Checkpoint(run_id=run_id, event=f"e{i}", status=RunStatus.SUCCEEDED))


def test_prune_keeps_the_newest_checkpoints_of_old_runs(cli: Cli, lone_prefix: Any) -> None:
    store, env = lone_prefix
    _commit_many(store, "old-run", 4)
    time.sleep(1.1)
    _commit_many(store, "new-run", 4)

    dry = cli("prune", "--keep", "1", "--older-than", "1s", "--dry-run", "--json", env=env)
    assert dry.exit_code == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["dry_run"] is True and list(planned["pruned"]) == ["old-run"]
    assert len(store.history("old-run")) == 4  # a dry run deletes nothing

    done = cli("prune", "--keep", "1", "--older-than", "1s", env=env)
    assert done.exit_code == 0, done.stderr
    assert "deleted 3 checkpoint(s) of 1 run(s)" in done.stdout
    assert [c.event for c in store.history("old-run")] == ["e3"]
    assert len(store.history("new-run")) == 4  # updated within the last second: left whole

    one = cli("prune", "new-run", "--keep", "2", "--json", env=env)
    assert len(json.loads(one.stdout)["pruned"]["new-run"]) == 2
    assert [c.event for c in store.history("new-run")] == ["e3", "e2"]


def test_prune_of_a_run_spares_the_checkpoint_a_fork_started_from(
    cli: Cli, rt: Any, redis_client: redis.Redis, tag: str
) -> None:
    redis_client.set(gate_key(tag), 1)
    source = cli.ok("submit", GATED, "--input", f"tag={tag}", "--wait").stdout.split()[0]
    pinned = rt.store.history(source, limit=100)[2].id
    cli.ok("fork", pinned, "--wait")
    cli.ok("prune", source, "--keep", "1")
    assert history_ids(rt, source) == [rt.store.latest(source).id, pinned]


# --- crews ----------------------------------------------------------------------------------


@pytest.fixture
def crew_tag(redis_client: redis.Redis) -> Any:
    """A tag for the crew test flows' counters; removed after."""
    value = f"t{uuid.uuid4().hex[:8]}"  # a letter first: `tag=...` must not parse as a number
    yield value
    keys = list(redis_client.scan_iter(f"crew-tests:{value}:*"))
    if keys:
        redis_client.delete(*keys)


def test_a_crew_is_submitted_by_its_path_with_inputs(cli: Cli, crew_tag: str) -> None:
    done = cli.json(
        "submit", "tests.flows.crews:crew_a", "-i", "topic=bees", "-i", f"tag={crew_tag}", "-w"
    )
    assert done["status"] == "succeeded"
    assert "a3(a2(a1(bees)))" in json.dumps(done["result"])


def test_status_lists_child_runs_with_their_status(cli: Cli, lone_prefix: Any) -> None:
    store, env = lone_prefix
    store.commit(Checkpoint(run_id="child-1", event="e", status=RunStatus.SUCCEEDED))
    link = {"run_id": "child-1", "flow": "x:crew_a", "name": "crew_a", "waiting": False}
    meta = {"children": {"stage1#1": link, "stage2#1": {**link, "run_id": "child-2"}}}
    store.commit(Checkpoint(run_id="parent", event="e", meta=meta))
    store.commit(
        Checkpoint(
            run_id="child-1",
            event="e",
            status=RunStatus.SUCCEEDED,
            meta={"parent": {"run_id": "parent", "activation": "stage1#1"}},
        )
    )

    status = json.loads(cli("status", "parent", "--json", env=env).stdout)
    assert status["children"] == [
        {"activation": "stage1#1", "run_id": "child-1", "name": "crew_a", "status": "succeeded"},
        {"activation": "stage2#1", "run_id": "child-2", "name": "crew_a", "status": None},
    ]
    shown = cli("status", "parent", env=env).stdout
    assert "stage1#1: child-1 (crew_a, succeeded)" in shown
    assert "stage2#1: child-2 (crew_a, not found)" in shown
    child = cli("status", "child-1", env=env).stdout
    assert "parent run  parent (step stage1#1)" in child
