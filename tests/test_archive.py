"""Archive before expiry: a finished run is copied whole to ``RUNNER_ARCHIVE`` (a SQLite file,
a JSON directory, a PostgreSQL database) before Redis drops it; ``runner show|steps|diff
--location`` read it there, ``runner restore`` brings it back (resume and fork work after),
and a crash between the archive write and the delete leaves it in both, never in neither.

Real Redis and a real PostgreSQL (``RUNNER_TEST_POSTGRES_URL``, default the server on
127.0.0.1:5432; a database of each test's own, dropped after it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import CheckpointConfig
from runner.distributed.engine import Runtime
from runner.distributed.retention import PAUSE_FILE, close_archives, collect
from runner.store.archive import archive_run, open_archive, whole_history
from runner.store.models import RunStatus
from tests import cli_support
from tests.flows.retained import Report
from tests.retention_support import cli, deployment, kickoff, policy

PG = os.environ.get("RUNNER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432")
KINDS = ("sqlite", "jsondir", "postgres")


@pytest.fixture
def deploy(redis_url: str, prefix: str) -> Iterator[Runtime]:
    """A deployment of this test's own, with no workers."""
    with deployment(redis_url, prefix) as rt:
        yield rt


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A PostgreSQL database of this test's own (dropped after it); its URL."""
    psycopg = pytest.importorskip("psycopg", reason="the archive extra (psycopg) is missing")
    try:
        admin = psycopg.connect(f"{PG}/postgres", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {PG} (.ci/run starts one): {exc}")
    name = f"runner_t_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{PG}/{name}"
        finally:
            close_archives()
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=KINDS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where the archive is: a SQLite file, a JSON directory, a PostgreSQL URL."""
    if request.param == "postgres":
        yield request.getfixturevalue("pg_database")
        return
    yield str(tmp_path / "archive.db") if request.param == "sqlite" else f"{tmp_path}/archive/"
    close_archives()


def archived(rt: Runtime, where: str, retention: str = "succeeded=0s,failed=0s") -> Any:
    """One pass with the archive at ``where``."""
    return collect(rt.store, policy(rt, retention, archive=where))


def test_a_run_goes_to_the_archive_whole_and_comes_back(deploy: Runtime, location: str) -> None:
    failed = kickoff(deploy, fail=True)
    before = whole_history(deploy.store, failed)
    done = archived(deploy, location)
    assert done.archived == [failed] and done.expired == [failed]
    assert deploy.store.run(failed) is None

    store = open_archive(location)
    try:
        copy = whole_history(store, failed)
        assert [(c.id, c.seq, c.state) for c in copy] == [(c.id, c.seq, c.state) for c in before]
        assert store.run(failed).status is RunStatus.FAILED
    finally:
        store.close()

    first, last = before[0].id, before[-1].id
    for args in (["show", failed], ["steps", failed], ["diff", first, last]):
        shown = cli(deploy, *args, "--location", location)
        assert shown.returncode == 0, (args, shown.stderr)
    assert "RuntimeError" in cli(deploy, "show", failed, "--location", location).stdout
    assert "review" in cli(deploy, "steps", failed, "--location", location).stdout

    restored = cli(deploy, "restore", failed, RUNNER_ARCHIVE=location)
    assert restored.returncode == 0, restored.stderr
    assert [c.id for c in whole_history(deploy.store, failed)] == [c.id for c in before]

    # Resumed where it failed: the failed step runs again, the others do not.
    again = Report(checkpoint=CheckpointConfig(provider=deploy.store, on_events=["*"]))
    again.kickoff(
        inputs={"fail": False},
        from_checkpoint=CheckpointConfig(provider=deploy.store, restore_from=last),
    )
    assert deploy.store.run(failed).status is RunStatus.SUCCEEDED
    # Forked (CrewAI's restore_from_state_id): a new run from its state.
    fork = Report(checkpoint=CheckpointConfig(provider=deploy.store, on_events=["*"]))
    fork.kickoff(restore_from_state_id=failed)
    assert fork.state.id != failed and fork.state.outline == before[-1].state["outline"]
    assert deploy.store.run(str(fork.state.id)).status is RunStatus.SUCCEEDED


def test_restore_refuses_a_run_already_in_redis(deploy: Runtime, tmp_path: Path) -> None:
    where = str(tmp_path / "archive.db")
    run = kickoff(deploy)
    archived(deploy, where)
    assert cli(deploy, "restore", run, "--location", where).returncode == 0
    twice = cli(deploy, "restore", run, "--location", where)
    assert twice.returncode == 1 and "already" in twice.stderr
    missing = cli(deploy, "restore", "no-such-run", "--location", where)
    assert missing.returncode == 2 and missing.stderr.startswith("error:")


@pytest.mark.processes
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_crash_between_archive_and_delete_leaves_the_run_in_both(
    deploy: Runtime, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = request.getfixturevalue("pg_database") if kind == "postgres" else str(tmp_path / "a.db")
    run = kickoff(deploy)
    checkpoints = len(whole_history(deploy.store, run))
    marker = tmp_path / "archived"
    env = {
        **os.environ,
        "RUNNER_REDIS_URL": str(deploy.store.url),
        "RUNNER_PREFIX": deploy.settings.prefix,
        "RUNNER_RETENTION": "succeeded=0s",
        "RUNNER_ARCHIVE": where,
        PAUSE_FILE: str(marker),
    }
    archiver = subprocess.Popen(
        [sys.executable, "-m", "runner", "gc"],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 30
        while not marker.exists() and time.time() < deadline and archiver.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), "the archiver reached the point between archive and delete"
    finally:
        archiver.send_signal(signal.SIGKILL)
        archiver.wait(10)

    store = open_archive(where)
    try:
        assert store.run(run) is not None, "archived"
        assert deploy.store.run(run) is not None, "and still in Redis"
        done = cli(deploy, "gc", RUNNER_RETENTION="succeeded=0s", RUNNER_ARCHIVE=where)
        assert done.returncode == 0, done.stderr
        assert deploy.store.run(run) is None, "deleted by the next pass"
        assert [info.run_id for info in store.runs()] == [run], "one copy"
        assert len(whole_history(store, run)) == checkpoints
    finally:
        store.close()


def test_an_unreachable_archive_deletes_nothing(deploy: Runtime) -> None:
    run = kickoff(deploy)
    done = archived(deploy, "postgresql://postgres@127.0.0.1:1/nowhere")
    assert done.expired == [] and deploy.store.run(run) is not None


def test_fork_location_restores_the_archived_run_and_forks_it_on_workers(
    rt: Any, worker_env: dict[str, str], tmp_path: Path
) -> None:
    where = str(tmp_path / "archive.db")
    failed = kickoff(rt, fail=True)
    last = rt.store.latest(failed)
    archive = open_archive(where)
    try:
        assert archive_run(rt.store, archive, failed) == last.seq
    finally:
        archive.close()
    assert rt.store.delete_run(failed) and rt.store.run(failed) is None  # only archived now

    changed = ["--set", "fail=false", "--wait"]
    forked = cli_support.run("fork", last.id, "--location", where, *changed, env=worker_env)
    assert forked.returncode == 0, forked.stderr
    assert f"run {failed} restored" in forked.stderr
    assert rt.store.run(failed) is not None  # the source is back in Redis
    new = next(info for info in rt.store.runs(limit=50) if info.parent_run_id == failed)
    assert new.status is RunStatus.SUCCEEDED


def test_a_lost_archive_connection_is_opened_again_by_the_next_pass(
    deploy: Runtime, pg_database: str
) -> None:
    import psycopg

    first = kickoff(deploy)
    assert archived(deploy, pg_database).expired == [first]
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(  # as a restart of the server would
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (pg_database.rsplit("/", 1)[1],),
        )
    second = kickoff(deploy)
    assert archived(deploy, pg_database).expired == []  # the write failed: kept in Redis
    assert deploy.store.run(second) is not None
    assert archived(deploy, pg_database).expired == [second]
    store = open_archive(pg_database)
    try:
        assert {info.run_id for info in store.runs()} == {first, second}
    finally:
        store.close()
