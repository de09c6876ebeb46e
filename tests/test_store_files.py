"""What only the file-backed providers (SQLite, JSON directory) have to get right."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from runner import ids
from runner.errors import CommitConflict, CorruptCheckpoint, StoreUnavailable
from runner.store.jsondir import JsonProvider
from runner.store.models import Checkpoint
from runner.store.sqlite import SqliteProvider


def ckpt(run_id: str, **fields: object) -> Checkpoint:
    return Checkpoint(run_id=run_id, event="method_finished", **fields)


def test_sqlite_that_cannot_be_opened_raises_store_unavailable_naming_the_path(tmp_path):
    path = tmp_path / "missing-dir" / "store.db"
    with pytest.raises(StoreUnavailable) as err:
        SqliteProvider(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_json_directory_that_cannot_be_made_raises_store_unavailable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable) as err:
        JsonProvider(blocker / "store")
    assert str(blocker / "store") in str(err.value)


def test_sqlite_undecodable_checkpoint_raises_corrupt_checkpoint_naming_it(tmp_path):
    store = SqliteProvider(tmp_path / "s.db")
    try:
        made = store.commit(ckpt(ids.run_id()))
        with contextlib.closing(sqlite3.connect(store.path)) as db, db:
            db.execute("UPDATE checkpoints SET data = '{\"run_id\": 1' WHERE id = ?", (made.id,))
        with pytest.raises(CorruptCheckpoint) as err:
            store.get(made.id)
        assert made.id in str(err.value)
    finally:
        store.close()


def test_json_undecodable_checkpoint_raises_corrupt_checkpoint_naming_it(tmp_path):
    store = JsonProvider(tmp_path / "j")
    made = store.commit(ckpt(ids.run_id()))
    (path,) = (tmp_path / "j").glob(f"*_{made.id}.json")
    path.write_text("{not json")
    with pytest.raises(CorruptCheckpoint) as err:
        store.latest(made.run_id)
    assert made.id in str(err.value)


def test_json_files_are_one_per_checkpoint_named_by_time_and_id(tmp_path):
    store = JsonProvider(tmp_path / "j")
    run = "odd/run id.."
    made = [store.commit(ckpt(run)) for _ in range(2)]

    files = sorted((tmp_path / "j").rglob("*.json"))

    assert [JsonProvider.extract_id(p) for p in files] == [c.id for c in made]
    assert [p.parent for p in files] == [tmp_path / "j"] * 2
    assert (tmp_path / "j" / "index.runs").is_file()
    assert not list((tmp_path / "j").rglob(".tmp-*"))


def test_json_commit_ignores_a_checkpoint_file_left_by_a_crashed_commit(tmp_path):
    store = JsonProvider(tmp_path / "j")
    run = ids.run_id()
    store.commit(ckpt(run))
    (tmp_path / "j" / f"29990101T000000000_{ids.checkpoint_id()}.json").write_text("{}")

    assert [c.seq for c in store.history(run)] == [1]
    assert store.commit(ckpt(run)).seq == 2
    assert [c.seq for c in store.history(run)] == [2, 1]


@pytest.mark.parametrize("kind", ["sqlite", "jsondir"])
def test_fork_into_an_existing_run_raises_commit_conflict(tmp_path, kind):
    store = SqliteProvider(tmp_path / "s.db") if kind == "sqlite" else JsonProvider(tmp_path)
    try:
        a, b = store.commit(ckpt(ids.run_id())), store.commit(ckpt(ids.run_id()))
        with pytest.raises(CommitConflict):
            store.fork(a.id, new_run_id=b.run_id)
        assert len(store.history(b.run_id)) == 1
        assert store.prune(a.run_id, 1) == []
    finally:
        store.close()


def test_sqlite_store_is_shared_by_processes_through_the_file(tmp_path):
    first, second = SqliteProvider(tmp_path / "s.db"), SqliteProvider(tmp_path / "s.db")
    try:
        run = ids.run_id()
        first.commit(ckpt(run))
        assert second.commit(ckpt(run)).seq == 2
        assert first.run(run).seq == 2  # type: ignore[union-attr]
    finally:
        first.close()
        second.close()


def test_closed_sqlite_store_raises_store_unavailable(tmp_path: Path):
    store = SqliteProvider(tmp_path / "s.db")
    store.close()
    with pytest.raises(StoreUnavailable):
        store.latest("x")
