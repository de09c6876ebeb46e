"""``runner checkpoints|show|diff|prune|resume --location``: the checkpoint commands over a
JSON directory or a SQLite file that runs made in process wrote, as over Redis (CrewAI's
``crewai checkpoint --location``). The CLI runs with no Redis configured: a store of files
needs none. The probe runs its commands in a process of its own, to see what they import.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner import CheckpointConfig, JsonProvider, RedisProvider, SqliteProvider
from runner.cli.refs import MIN_CHECKPOINT
from runner.store.base import CheckpointStore
from runner.views import short_ids
from tests import cli_support
from tests.location_flows import FAIL_ENV, LOG_ENV, ThreeStages

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import contextlib, io, json, sys
from runner.cli import main

found = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["runner", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
    loaded = [name for name in ("celery", "kombu") if name in sys.modules]
    found.append({"code": code, "out": out.getvalue(), "err": err.getvalue(), "loaded": loaded})
print("PROBE " + json.dumps(found))
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The flow's log and fail files (for this process and the CLI's), and the CLI's
    environment: no Redis URL, so any command that reached for Redis would fail."""
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "ran.log"))
    monkeypatch.setenv(FAIL_ENV, str(tmp_path / "fail"))
    cli = {k: v for k, v in os.environ.items() if k != "RUNNER_REDIS_URL"}
    return {**cli, "COLUMNS": "200"}


def ran(env: dict[str, str]) -> list[str]:
    """The methods that ran so far, in order, in any process."""
    log = Path(env[LOG_ENV])
    return log.read_text().split() if log.exists() else []


def location_config(kind: str, tmp_path: Path) -> tuple[CheckpointConfig, Path]:
    """Where a test's in-process runs write: a JSON directory or a SQLite file."""
    if kind == "json":
        where = tmp_path / "checkpoints"
        return CheckpointConfig(location=str(where)), where
    where = tmp_path / "checkpoints.db"
    return CheckpointConfig(location=str(where), provider=SqliteProvider), where


def open_store(kind: str, where: Path) -> CheckpointStore:
    return JsonProvider(where) if kind == "json" else SqliteProvider(where)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``runner ARGS`` with ``env`` as the whole environment (in this process:
    :mod:`tests.cli_support`)."""
    return cli_support.run(*args, env=cli_support.only(env))


def probe(env: dict[str, str], commands: list[list[str]]) -> list[dict[str, Any]]:
    """Run ``commands`` one after the other in one CLI process (as the console script
    does): each one's exit code, stdout, stderr and whether Celery or kombu was loaded."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, done.stderr
    found: list[dict[str, Any]] = json.loads(lines[-1].removeprefix("PROBE "))
    return found


@pytest.mark.processes
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_checkpoints_show_and_diff_read_a_run_made_in_process_without_redis(
    kind: str, tmp_path: Path, env: dict[str, str]
) -> None:
    config, where = location_config(kind, tmp_path)
    flow = ThreeStages(checkpoint=config)
    flow.kickoff(inputs={"topic": "tides"})
    store = open_store(kind, where)
    history = list(reversed(store.history(flow.flow_id, limit=100)))
    store.close()
    first, last = history[0], history[-1]
    shown_last = short_ids([c.id for c in history], MIN_CHECKPOINT)[last.id]  # as tables show it
    loc = ["--location", str(where)]

    listed, table, shown, diffed = probe(
        env,
        [
            ["checkpoints", flow.flow_id, "--json", *loc],
            ["checkpoints", flow.flow_id[:8], *loc],
            ["show", shown_last, "--json", *loc],
            ["diff", first.id, flow.flow_id, "--json", *loc],
        ],
    )

    assert [f["code"] for f in (listed, table, shown, diffed)] == [0, 0, 0, 0], [
        f["err"] for f in (listed, table, shown, diffed)
    ]
    assert [c["id"] for c in json.loads(listed["out"])] == [c.id for c in reversed(history)]
    assert all(c.id[:MIN_CHECKPOINT] in table["out"] for c in history)
    assert shown_last in table["out"]
    assert [line.split()[0] for line in table["out"].splitlines()[2:]] == [
        str(c.seq) for c in reversed(history)
    ]
    assert json.loads(shown["out"])["state"] == {
        "id": flow.flow_id,
        "topic": "tides",
        "drafts": ["notes on tides"],
        "checked": True,
    }
    found = json.loads(diffed["out"])
    assert (found["a"], found["b"]) == (first.id, last.id)
    assert set(found["state"]["changed"]) >= {"drafts", "checked"}
    # Reading a store of files imports no Celery, as reading Redis does not.
    assert [f["loaded"] for f in (listed, table, shown, diffed)] == [[], [], [], []]


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_resume_with_a_location_finishes_a_failed_run_here_without_rerunning_done_steps(
    kind: str, tmp_path: Path, env: dict[str, str]
) -> None:
    config, where = location_config(kind, tmp_path)
    Path(env[FAIL_ENV]).touch()
    flow = ThreeStages(checkpoint=config)
    with pytest.raises(RuntimeError, match="the source is offline"):
        flow.kickoff(inputs={"topic": "reefs"})
    assert ran(env) == ["gather", "check"]

    again = cli(env, "resume", flow.flow_id[:8], "--location", str(where))
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        f"error: run {flow.flow_id} failed at check: RuntimeError: the source is offline"
    ]
    assert ran(env) == ["gather", "check", "check"]

    Path(env[FAIL_ENV]).unlink()
    done = cli(env, "resume", flow.flow_id, "--location", str(where), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "run_id": flow.flow_id,
        "status": "succeeded",
        "step": "publish",
        "result": "published: checked notes on reefs",
        "error": None,
        "pause_reason": None,
        "cancel_reason": None,
    }
    assert ran(env) == ["gather", "check", "check", "check", "publish"]  # gather ran once
    store = open_store(kind, where)
    history = list(reversed(store.history(flow.flow_id, limit=100)))
    store.close()
    assert [c.event for c in history].count("flow_resumed") == 2  # on in the same store
    assert [c.step for c in history if c.event == "method_execution_finished"] == [
        "gather",
        "check",
        "publish",
    ]

    refused = cli(env, "resume", flow.flow_id, "--location", str(where))
    assert (refused.returncode, refused.stderr.strip()) == (
        1,
        f"error: run {flow.flow_id} already succeeded; fork it to run again",
    )


@pytest.mark.parametrize("kind", ["json", "sqlite", "redis"])
def test_prune_without_keep_keeps_the_configured_maximum(
    kind: str, tmp_path: Path, env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    if kind == "redis":
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("prefix")
        store: CheckpointStore = RedisProvider(url, prefix=prefix)
        config = CheckpointConfig(provider=store)
        where_args: list[str] = []
        env = {**env, "RUNNER_REDIS_URL": url, "RUNNER_PREFIX": prefix}
    else:
        config, where = location_config(kind, tmp_path)
        store = open_store(kind, where)
        where_args = ["--location", str(where)]
    runs = [ThreeStages(checkpoint=config) for _ in range(2)]
    for flow in runs:
        flow.kickoff()
    before = {f.flow_id: [c.id for c in store.history(f.flow_id, limit=100)] for f in runs}
    assert all(len(ids) == 4 for ids in before.values())  # flow_started, 3 methods

    pruned = cli({**env, "RUNNER_MAX_CHECKPOINTS": "2"}, "prune", "--json", *where_args)
    unset = cli({**env, "RUNNER_MAX_CHECKPOINTS": "0"}, "prune", *where_args)

    assert pruned.returncode == 0, pruned.stderr
    found = json.loads(pruned.stdout)
    assert found["keep"] == 2
    assert {run: sorted(ids) for run, ids in found["pruned"].items()} == {
        run: sorted(ids[2:]) for run, ids in before.items()
    }
    assert {f.flow_id: [c.id for c in store.history(f.flow_id)] for f in runs} == {
        run: ids[:2] for run, ids in before.items()
    }
    assert (unset.returncode, unset.stderr.strip()) == (
        2,
        "error: no --keep given, and RUNNER_MAX_CHECKPOINTS is 0 (keep every checkpoint): "
        "give --keep N",
    )
    store.close()


@pytest.mark.processes
def test_a_bad_location_is_one_error_line_and_exit_2_and_creates_nothing(
    tmp_path: Path, env: dict[str, str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    text = tmp_path / "notes.txt"
    text.write_text("not a store\n")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE checkpoints (id TEXT PRIMARY KEY, data TEXT)")
    missing = tmp_path / "missing"
    bad = {
        missing: f"error: --location {missing}: no such directory or file",
        empty: f"error: --location {empty} is not a checkpoint directory of this runner "
        "(no runs/ in it)",
        text: f"error: --location {text} is neither a checkpoint directory nor a SQLite file",
        other: f"error: --location {other} is a SQLite file without this runner's "
        "checkpoints (no runs table)",
    }
    commands = [
        ["checkpoints", "some-run"],
        ["show", "some-checkpoint"],
        ["diff", "a", "b"],
        ["prune", "--keep", "1"],
        ["resume", "some-run"],
    ]

    found = probe(env, [[*c, "--location", str(p)] for p in bad for c in commands])

    expected = [(2, "", message) for message in bad.values() for _ in commands]
    assert [(f["code"], f["out"], f["err"].strip()) for f in found] == expected
    assert list(empty.iterdir()) == [] and not missing.exists()
    with sqlite3.connect(other) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master")]
    assert tables == ["checkpoints", "sqlite_autoindex_checkpoints_1"]
