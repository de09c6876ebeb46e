"""CrewAI's Checkpointing page, moved over by changing imports: crews restored and forked from
checkpoints (files, SQLite, Redis, and checkpoints written by workers), ``CheckpointConfig``'s
fields, and the providers' own face."""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from runner import CheckpointConfig, Crew, JsonProvider, SqliteProvider, Task
from runner.crew import TaskInput
from runner.store.base import CheckpointStore
from runner.store.models import RunStatus
from tests._flow_support import STORES, make_store
from tests.flows.crews import counts, crew_a

RUNS: Counter[str] = Counter()
"""Task name -> executions in the current test."""
FAIL: set[str] = set()
"""Tasks that fail when they run."""


def act(task: TaskInput) -> str:
    RUNS[task.name] += 1
    if task.name in FAIL:
        raise RuntimeError(f"planned failure of {task.name}")
    before = task.context[-1].raw if task.context else task.inputs["topic"]
    return f"{task.name}({before})"


def _crew(checkpoint: CheckpointConfig) -> Crew:
    tasks = [
        Task("Research {topic}", "notes", name="research", fn=act),
        Task("Write about {topic}", "a draft", name="write", fn=act),
        Task("Review the draft", "the final text", name="review", fn=act),
    ]
    return Crew(tasks=tasks, name="checkpointed_crew", checkpoint=checkpoint)


@pytest.fixture
def make_crew() -> Iterator[Any]:
    """Builds the module-level crew ``checkpointed`` (checkpoints name crews by import path)."""
    RUNS.clear()
    FAIL.clear()

    def build(checkpoint: CheckpointConfig) -> Crew:
        crew = globals()["checkpointed"] = _crew(checkpoint)
        return crew

    yield build
    globals().pop("checkpointed", None)
    FAIL.clear()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made = make_store(request.param, request, tmp_path)
    yield made
    made.close()


def _fail_at_write(crew: Crew) -> None:
    FAIL.add("write")
    with pytest.raises(RuntimeError, match="planned failure of write"):
        crew.kickoff(inputs={"topic": "bees"})
    FAIL.clear()
    assert dict(RUNS) == {"research": 1, "write": 1}


# --- resuming ----------------------------------------------------------------------------------


def test_kickoff_from_the_newest_checkpoint_file_skips_completed_tasks(make_crew, tmp_path):
    crew = make_crew(CheckpointConfig(location=str(tmp_path / "cp")))
    _fail_at_write(crew)

    newest = sorted((tmp_path / "cp").rglob("*.json"))[-1]
    out = crew.kickoff(from_checkpoint=CheckpointConfig(restore_from=str(newest)))

    assert out.raw == "review(write(research(bees)))"
    assert dict(RUNS) == {"research": 1, "write": 2, "review": 1}


def test_crew_from_checkpoint_takes_a_file_path(make_crew, tmp_path):
    crew = make_crew(CheckpointConfig(location=str(tmp_path / "cp")))
    _fail_at_write(crew)
    newest = sorted((tmp_path / "cp").rglob("*.json"))[-1]

    restored = Crew.from_checkpoint(str(newest))

    assert restored.kickoff().raw == "review(write(research(bees)))"
    assert dict(RUNS) == {"research": 1, "write": 2, "review": 1}
    assert crew._restore is None  # the module's crew is not changed by restoring a copy


def test_crew_from_checkpoint_takes_a_config_naming_a_run_in_a_store(make_crew, store):
    crew = make_crew(CheckpointConfig(provider=store))
    _fail_at_write(crew)
    (run,) = store.runs()
    assert run.status is RunStatus.FAILED

    restored = Crew.from_checkpoint(CheckpointConfig(provider=store, restore_from=run.run_id))

    assert restored.kickoff().raw == "review(write(research(bees)))"
    assert dict(RUNS) == {"research": 1, "write": 2, "review": 1}
    assert store.run(run.run_id).status is RunStatus.SUCCEEDED


def test_crew_fork_starts_a_new_branch_and_leaves_the_source_alone(make_crew, store):
    crew = make_crew(CheckpointConfig(provider=store))
    crew.kickoff(inputs={"topic": "bees"})
    (source,) = store.runs()
    after_research = next(
        c for c in store.history(source.run_id) if c.step == "research" and c.status == "running"
    )
    before = [c.id for c in store.history(source.run_id)]

    fork = Crew.fork(
        CheckpointConfig(provider=store, restore_from=after_research.id), branch="experiment-a"
    )
    out = fork.kickoff(inputs={"topic": "wasps"})

    assert out.raw == "review(write(research(bees)))"
    assert dict(RUNS) == {"research": 1, "write": 2, "review": 2}
    forked = next(r for r in store.runs() if r.run_id != source.run_id)
    assert forked.branch == "experiment-a" and forked.parent_checkpoint_id == after_research.id
    assert forked.status is RunStatus.SUCCEEDED
    assert store.latest(forked.run_id).state["inputs"]["topic"] == "wasps"
    assert [c.id for c in store.history(source.run_id)] == before


def test_crew_fork_without_a_branch_gets_a_unique_one(make_crew, tmp_path):
    crew = make_crew(CheckpointConfig(location=str(tmp_path)))
    crew.kickoff(inputs={"topic": "bees"})
    newest = sorted(tmp_path.rglob("*.json"))[-1]

    Crew.fork(str(newest)).kickoff()
    Crew.fork(str(newest)).kickoff()

    branches = [r.branch for r in JsonProvider(tmp_path).runs() if r.branch]
    assert len(branches) == 2 and len(set(branches)) == 2
    assert all(b.startswith("fork/") for b in branches)


# --- CheckpointConfig --------------------------------------------------------------------------


def test_directory_is_the_older_name_of_location(tmp_path):
    config = CheckpointConfig(directory=str(tmp_path))

    assert config.location == config.directory == str(tmp_path)
    with pytest.raises(ValidationError, match="not both"):
        CheckpointConfig(directory="a", location="b")


def test_trigger_all_and_trigger_events_read_on_events():
    assert not CheckpointConfig().trigger_all
    assert CheckpointConfig(on_events=["*"]).trigger_all
    events = ["task_completed", "crew_kickoff_completed"]
    assert CheckpointConfig(on_events=events).trigger_events == set(events)
    assert "task_completed" in CheckpointConfig().trigger_events


def test_only_crew_kickoff_completed_writes_one_checkpoint_at_the_end(make_crew, tmp_path):
    crew = make_crew(CheckpointConfig(location=str(tmp_path), on_events=["crew_kickoff_completed"]))

    crew.kickoff(inputs={"topic": "bees"})

    (only,) = tmp_path.rglob("*.json")
    assert json.loads(only.read_text())["status"] == "succeeded"


def test_providers_made_without_arguments_take_the_configs_location(make_crew, tmp_path):
    json_store = CheckpointConfig(location=str(tmp_path / "j"), provider=JsonProvider()).store()
    assert isinstance(json_store, JsonProvider) and json_store.directory == tmp_path / "j"

    db = tmp_path / "cp.db"
    crew = make_crew(CheckpointConfig(location=str(db), provider=SqliteProvider()))
    crew.kickoff(inputs={"topic": "bees"})

    on_disk = SqliteProvider(db)
    try:
        (run,) = on_disk.runs()
        assert run.status is RunStatus.SUCCEEDED
        restored = Crew.from_checkpoint(f"{db}#{run.latest}")
        assert restored.kickoff().raw == "review(write(research(bees)))"
        assert dict(RUNS) == {"research": 1, "write": 1, "review": 1}
    finally:
        on_disk.close()


# --- the providers' CrewAI face ----------------------------------------------------------------


def test_json_provider_checkpoint_writes_time_named_files_under_the_branch(tmp_path):
    provider = JsonProvider()

    first = provider.checkpoint('{"n": 1}', str(tmp_path), branch="main")
    first_id = provider.extract_id(first)
    second = provider.checkpoint('{"n": 2}', str(tmp_path), parent_id=first_id, branch="main")
    other = provider.checkpoint("{}", str(tmp_path), branch="fork/exp1")

    assert Path(first).parent == tmp_path / "main" and first.endswith("_p-none.json")
    assert second.endswith(f"_p-{first_id}.json")
    assert f"{os.sep}fork{os.sep}exp1{os.sep}" in other
    assert provider.from_checkpoint(second) == '{"n": 2}'
    assert provider.extract_id("/d/main/20260409T120000_abc12345_p-20260409T115900_def.json") == (
        "20260409T120000_abc12345"
    )
    with pytest.raises(ValueError, match="escapes checkpoint directory"):
        provider.checkpoint("{}", str(tmp_path), branch="../../etc")


def test_json_provider_prune_keeps_the_newest_files_of_one_branch(tmp_path):
    provider = JsonProvider()
    written = []
    for branch in ["main"] * 3 + ["fork/a"] * 2:
        written.append(provider.checkpoint("{}", str(tmp_path), branch=branch))
        time.sleep(0.01)  # distinct modification times

    assert provider.prune(str(tmp_path), max_keep=1, branch="main") == 2
    assert [p.name for p in (tmp_path / "main").iterdir()] == [Path(written[2]).name]
    assert len(list((tmp_path / "fork" / "a").iterdir())) == 2
    assert provider.prune(str(tmp_path), max_keep=0, branch="fork/a") == 2
    with pytest.raises(ValueError, match="escapes"):
        provider.prune(str(tmp_path), max_keep=1, branch="../x")


def test_sqlite_provider_checkpoint_records_parent_and_branch(tmp_path):
    provider = SqliteProvider()
    db = str(tmp_path / "cp.db")
    try:
        first = provider.checkpoint('{"n": 1}', db, branch="main")
        second = provider.checkpoint("{}", db, parent_id=provider.extract_id(first), branch="exp")
        for _ in range(2):
            provider.checkpoint("{}", db, branch="main")

        assert first.startswith(f"{db}#") and provider.extract_id("/p/db#abc123") == "abc123"
        assert provider.from_checkpoint(first) == '{"n": 1}'
        with sqlite3.connect(db) as conn:
            row = conn.execute(
                "SELECT parent_id, branch FROM blobs WHERE id = ?", (provider.extract_id(second),)
            ).fetchone()
        assert row == (provider.extract_id(first), "exp")
        assert provider.prune(db, max_keep=1, branch="main") == 2
        with sqlite3.connect(db) as conn:
            left = dict(conn.execute("SELECT branch, COUNT(*) FROM blobs GROUP BY branch"))
        assert left == {"main": 1, "exp": 1}
    finally:
        provider.close()


def test_store_prune_of_a_run_is_unchanged_beside_the_crewai_form(store):
    from runner.store.models import Checkpoint

    run = f"r-{uuid.uuid4().hex[:8]}"
    made = [store.commit(Checkpoint(run_id=run, event="e")) for _ in range(3)]

    assert store.prune(run, 1) == [made[0].id, made[1].id]
    assert [c.id for c in store.history(run)] == [made[2].id]


# --- checkpoints written by workers ------------------------------------------------------------


def _failed_on_workers(rt: Any) -> tuple[str, dict[str, str]]:
    inputs = {"topic": "ants", "tag": uuid.uuid4().hex, "fail_once": "a2"}
    handle = crew_a.submit(inputs, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.FAILED
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 1}
    return handle.run_id, inputs


def test_a_crew_failed_on_workers_resumes_in_process_from_its_checkpoint(rt):
    run_id, inputs = _failed_on_workers(rt)

    restored = Crew.from_checkpoint(CheckpointConfig(provider=rt.store, restore_from=run_id))
    out = restored.kickoff()

    assert out.raw == "a3(a2(a1(ants)))"
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 2, "a3": 1}
    assert rt.store.run(run_id).status is RunStatus.SUCCEEDED


def test_kickoff_from_a_worker_checkpoint_config_skips_completed_tasks(rt):
    run_id, inputs = _failed_on_workers(rt)
    failed = rt.store.latest(run_id)

    out = crew_a.kickoff(
        from_checkpoint=CheckpointConfig(provider=rt.store, restore_from=failed.id)
    )

    assert out.raw == "a3(a2(a1(ants)))"
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 2, "a3": 1}


def test_a_worker_checkpoint_forks_into_a_new_branch_in_process(rt):
    run_id, inputs = _failed_on_workers(rt)
    before = [c.id for c in rt.store.history(run_id)]

    out = Crew.fork(
        CheckpointConfig(provider=rt.store, restore_from=run_id), branch="retry-a2"
    ).kickoff()

    assert out.raw == "a3(a2(a1(ants)))"
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 2, "a3": 1}
    assert [c.id for c in rt.store.history(run_id)] == before
    assert rt.store.run(run_id).status is RunStatus.FAILED
