"""Encryption at rest and the archive as one feature: with ``RUNNER_ENCRYPTION_KEYS`` set, a run
archived to SQLite, a JSON directory or PostgreSQL is kept there sealed by the same codec as in
Redis (payloads sealed; ids, statuses, times and step names clear), read back with the key by
``show|steps|diff|checkpoints --location``, ``restore`` and ``fork --location``, and refused in
one line naming the key (exit 1) without it or with a wrong one. A run archived clear still
reads. The file stores used in process (``CheckpointConfig(location=...)``) seal too. And
``runs --json`` and ``status`` say when a run expires.

Real Redis and a real PostgreSQL (see ``tests/test_archive.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import CheckpointConfig
from runner.distributed.engine import Runtime
from runner.distributed.retention import close_archives, collect
from runner.errors import EncryptionKeyError
from runner.store.archive import open_archive, whole_history
from runner.store.codec import Codec, parse_keys
from runner.store.jsondir import JsonProvider
from runner.store.models import RunStatus
from tests.flows.retained import Report
from tests.retention_support import cli, deployment, kickoff, policy
from tests.test_archive import pg_database  # noqa: F401 (a fixture)
from tests.test_encryption import K1, K1_WRONG, K2, raw_dump

SECRETS = (b"lorem ipsum", b"LOREM IPSUM", b"the reviewer is away")
"""What the runs of :class:`Report` hold that only the key may show: its state's two fields
and the error a failed run ends with."""
CLEAR = ("review", "failed", "RuntimeError", "method_execution_failed")
"""What stays readable: the step, status, error type and event."""


@pytest.fixture
def sealed(redis_url: str, prefix: str) -> Iterator[Runtime]:
    """A deployment of this test's own with encryption on (key ``k1``), no workers."""
    with deployment(redis_url, prefix, encryption_keys=K1) as rt:
        yield rt


@pytest.fixture
def clear(redis_url: str, prefix: str) -> Iterator[Runtime]:
    """The same deployment before encryption was turned on."""
    with deployment(redis_url, prefix) as rt:
        yield rt


@pytest.fixture(params=["sqlite", "jsondir", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The archive: a SQLite file, a JSON directory, a PostgreSQL database."""
    if request.param == "postgres":
        yield request.getfixturevalue("pg_database")
        return
    archive = tmp_path / "archive"
    archive.mkdir()
    yield str(archive / "runs.db") if request.param == "sqlite" else f"{archive}/runs/"
    close_archives()


def archive_now(rt: Runtime, where: str) -> list[str]:
    """One retention pass that archives and expires every finished run; the runs archived."""
    done = collect(rt.store, policy(rt, "succeeded=0s,failed=0s", archive=where))
    assert done.expired == done.archived
    return done.archived


def raw_archive(where: str) -> bytes:
    """All the archive holds, as it keeps it: every file's bytes (a SQLite file with its
    write-ahead log), or every row of the PostgreSQL tables."""
    close_archives()  # SQLite: the log is folded into the file, or read beside it
    if where.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(where) as db:
            rows = db.execute("SELECT id, run_id, seq, data FROM runner_checkpoints").fetchall()
            rows += db.execute(
                "SELECT run_id, status, updated_at, info FROM runner_runs"
            ).fetchall()
        return repr(rows).encode()
    root = Path(where).parent if where.endswith(".db") else Path(where)
    return b"\n".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def one_error_line(done: Any, says: str) -> None:
    assert done.returncode == 1, (done.args, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
    assert not any(secret.decode() in done.stdout + done.stderr for secret in SECRETS)


def test_a_sealed_run_is_archived_sealed_read_with_the_key_and_restored(
    sealed: Runtime, where: str, redis_client: Any
) -> None:
    failed = kickoff(sealed, fail=True)
    before = whole_history(sealed.store, failed)
    assert archive_now(sealed, where) == [failed]
    assert sealed.store.run(failed) is None

    raw = raw_archive(where)
    for secret in SECRETS:
        assert secret not in raw, secret
    for text in (failed, before[-1].id, *CLEAR):
        assert text.encode() in raw, text
    assert b"enc:k1:" in raw

    # Read with the key: whole, as it was in Redis.
    codec = Codec(parse_keys(K1))
    archive = open_archive(where, codec)
    try:
        copy = whole_history(archive, failed)
        assert [c.model_dump(exclude={"seq"}) for c in copy] == [
            c.model_dump(exclude={"seq"}) for c in before
        ]
        info = archive.run(failed)
        assert info is not None and info.error == "RuntimeError: the reviewer is away"
    finally:
        archive.close()

    first, last = before[0].id, before[-1].id
    keyed = {"RUNNER_ENCRYPTION_KEYS": K1}
    shown = cli(sealed, "show", failed, "--location", where, **keyed)
    assert shown.returncode == 0, shown.stderr
    assert "the reviewer is away" in shown.stdout
    for args in (["steps", failed], ["diff", first, last], ["checkpoints", failed]):
        done = cli(sealed, *args, "--location", where, **keyed)
        assert done.returncode == 0, (args, done.stderr)

    # Without the key, or with a wrong one (or only another): one line naming it, exit 1,
    # and nothing restored.
    commands = (
        ["show", failed, "--location", where],
        ["steps", failed, "--location", where],
        ["diff", first, last, "--location", where],
        ["checkpoints", failed, "--location", where],
        ["restore", failed, "--location", where],
        ["fork", last, "--location", where],
    )
    for keys, says in (
        (None, "is encrypted with key 'k1', which this process does not have"),
        (K1_WRONG, "does not open with encryption key 'k1'"),
        (K2, "is encrypted with key 'k1', which this process does not have"),
    ):
        env = {"RUNNER_ENCRYPTION_KEYS": keys} if keys else {}
        for command in commands:
            one_error_line(cli(sealed, *command, **env), says)
    assert sealed.store.run(failed) is None

    # Restored with the key: back in Redis (sealed there), resumed where it failed.
    restored = cli(sealed, "restore", failed, "--location", where, **keyed)
    assert restored.returncode == 0, restored.stderr
    assert [c.id for c in whole_history(sealed.store, failed)] == [c.id for c in before]
    dump = raw_dump(redis_client, sealed.settings.prefix)
    assert not any(secret in dump for secret in SECRETS)
    again = Report(checkpoint=CheckpointConfig(provider=sealed.store, on_events=["*"]))
    again.kickoff(
        inputs={"fail": False},
        from_checkpoint=CheckpointConfig(provider=sealed.store, restore_from=last),
    )
    assert sealed.store.run(failed).status is RunStatus.SUCCEEDED  # type: ignore[union-attr]
    assert again.state.draft.startswith("LOREM IPSUM")


def test_rekey_location_reseals_an_archive_to_the_first_key(sealed: Runtime, where: str) -> None:
    runs = {kickoff(sealed, fail=True), kickoff(sealed)}
    assert set(archive_now(sealed, where)) == runs
    codec = Codec(parse_keys(K1))
    archive = open_archive(where, codec)
    try:
        before = {run: whole_history(archive, run) for run in runs}
    finally:
        archive.close()
    close_archives()

    rotating = {"RUNNER_ENCRYPTION_KEYS": f"{K2},{K1}"}
    part = cli(sealed, "rekey", "--location", where, "--batch", "1", "--batches", "1", **rotating)
    assert part.returncode == 0 and "stopped before the end" in part.stdout, part.stderr
    done = cli(sealed, "rekey", "--location", where, "--json", **rotating)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"key_id": "k2", "location": where, "runs": 2, "done": True}

    raw = raw_archive(where)
    assert b"enc:k1:" not in raw and b"enc:k2:" in raw
    assert not any(secret in raw for secret in SECRETS)
    archive = open_archive(where, Codec(parse_keys(K2)))  # the old key is no longer needed
    try:
        assert {run: whole_history(archive, run) for run in runs} == before
    finally:
        archive.close()
    for run in runs:
        shown = cli(sealed, "show", run, "--location", where, RUNNER_ENCRYPTION_KEYS=K2)
        assert shown.returncode == 0, shown.stderr
    no_key = cli(sealed, "rekey", "--location", where)
    assert no_key.returncode == 1 and "RUNNER_ENCRYPTION_KEYS" in no_key.stderr


def test_a_run_archived_before_encryption_still_reads_and_restores(
    clear: Runtime, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    where = str(tmp_path / "runs.db")
    old = kickoff(clear, fail=True)
    assert archive_now(clear, where) == [old]
    assert b"the reviewer is away" in raw_archive(where)  # archived clear

    with deployment(redis_url, prefix, encryption_keys=K1) as sealed:
        new = kickoff(sealed, fail=True)
        assert archive_now(sealed, where) == [new]
        keyed = {"RUNNER_ENCRYPTION_KEYS": K1}
        for run in (old, new):
            shown = cli(sealed, "show", run, "--location", where, **keyed)
            assert shown.returncode == 0 and "the reviewer is away" in shown.stdout, shown.stderr
        restored = cli(sealed, "restore", old, "--location", where, **keyed)
        assert restored.returncode == 0, restored.stderr
        info = sealed.store.run(old)
        assert info is not None and info.error == "RuntimeError: the reviewer is away"
        # The clear one needs no key; the sealed one does.
        assert cli(sealed, "steps", old, "--location", where).returncode == 0
        one_error_line(
            cli(sealed, "steps", new, "--location", where),
            "is encrypted with key 'k1', which this process does not have",
        )


def test_a_checkpoint_directory_used_in_process_seals_with_the_keys_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = tmp_path / "checkpoints"
    monkeypatch.setenv("RUNNER_ENCRYPTION_KEYS", K1)
    flow = Report(checkpoint=CheckpointConfig(location=str(where), on_events=["*"]))
    flow.kickoff()
    run = str(flow.state.id)
    raw = b"\n".join(p.read_bytes() for p in where.rglob("*") if p.is_file())
    assert b"lorem ipsum" not in raw and b"enc:k1:" in raw and run.encode() in raw
    # Every checkpoint file is still JSON, the newest one last by name (CrewAI's way).
    newest = sorted(where.rglob("*.json"))[-1]
    assert json.loads(newest.read_bytes())["status"] == "succeeded"

    latest = JsonProvider(where).latest(run)
    assert latest is not None and latest.state["outline"].startswith("lorem ipsum")
    monkeypatch.delenv("RUNNER_ENCRYPTION_KEYS")
    with pytest.raises(EncryptionKeyError, match="encrypted with key 'k1'"):
        JsonProvider(where).latest(run)


def test_runs_json_and_status_say_when_a_run_expires(clear: Runtime) -> None:
    kept = kickoff(clear)
    failed = kickoff(clear, fail=True)
    paused = kickoff(clear, pause=True)
    pinned = kickoff(clear)
    assert cli(clear, "pin", pinned).returncode == 0
    undecided = {
        entry["run_id"]: entry for entry in json.loads(cli(clear, "runs", "--json").stdout)
    }
    assert undecided[kept]["expires"] == "next pass" and undecided[kept]["expires_at"] is None

    collect(clear.store, policy(clear, "succeeded=1h"))
    listed = cli(clear, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    found = {entry["run_id"]: entry for entry in json.loads(listed.stdout)}
    ended = clear.store.run(kept).updated_at  # type: ignore[union-attr]
    assert found[kept]["expires_at"] == pytest.approx(ended + 3600, abs=1)
    assert found[kept]["expires"].endswith("+00:00")
    assert (found[failed]["expires"], found[failed]["expires_at"]) == ("never", None)
    assert (found[paused]["expires"], found[paused]["expires_at"]) == ("not finished", None)
    assert (found[pinned]["expires"], found[pinned]["expires_at"]) == ("pinned", None)
    flat = json.loads(cli(clear, "runs", "--json", "--all").stdout)
    assert {e["run_id"]: e["expires"] for e in flat} == {r: found[r]["expires"] for r in found}

    status = json.loads(cli(clear, "status", kept, "--json").stdout)
    assert status["expires_at"] == found[kept]["expires_at"]
    assert status["expires"] == found[kept]["expires"]
    human = cli(clear, "status", kept).stdout
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["expires_at"]))
    line = next(row for row in human.splitlines() if row.startswith("expires"))
    assert at in line, line
    assert "pinned" in cli(clear, "status", pinned).stdout
    assert "not finished" in cli(clear, "status", paused).stdout
