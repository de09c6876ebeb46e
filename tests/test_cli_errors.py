"""Bad input to the ``runner`` CLI: one readable line, a non-zero exit, nothing stored changed.

Also runs the installed console script and ``python -m runner.cli`` as real subprocesses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from runner.cli import app
from runner.distributed.client import submit
from runner.store.models import RunStatus
from tests.flows.cli import GatedFlow, gate_key
from tests.test_cli import GATED, Cli, cli, tag  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
DOWN = "redis://:s3cret@127.0.0.1:1/0"  # nothing listens on port 1


def snapshot(rt: Any) -> dict[str, Any]:
    """Every run of the workers' prefix with its metadata and checkpoint ids."""
    return {
        info.run_id: (info.model_dump(), [c.id for c in rt.store.history(info.run_id, limit=1000)])
        for info in rt.store.runs(limit=100_000)
    }


@pytest.fixture
def done_run(rt: Any, redis_client: redis.Redis, tag: str) -> str:  # noqa: F811
    """A GatedFlow run that succeeded (x=0): its id."""
    redis_client.set(gate_key(tag), 1)
    handle = submit(GatedFlow, {"tag": tag}, rt=rt)
    assert handle.result(timeout=30) == "total=1"
    return handle.run_id


def assert_one_line_error(result: Any, code: int, *needles: str) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0]


BAD_INPUT = [
    (["status", "no-such-run"], "no run no-such-run"),
    (["watch", "no-such-run"], "no run no-such-run"),
    (["checkpoints", "no-such-run"], "no run no-such-run"),
    (["cancel", "no-such-run"], "no run no-such-run"),
    (["resume", "no-such-run"], "no run no-such-run"),
    (["prune", "no-such-run", "--keep", "1"], "no run no-such-run"),
    (["show", "no-such-ckpt"], "no-such-ckpt"),
    (["fork", "no-such-ckpt"], "no-such-ckpt"),
    (["diff", "{run}", "no-such-ckpt"], "no-such-ckpt"),
    (["resume", "{run}", "--from", "no-such-ckpt"], "no checkpoint no-such-ckpt"),
    (["fork", "{run}", "--rerun", "no_such_step"], "no_such_step"),
    (["fork", "{run}", "--set", "typo=1"], "typo"),
    (["fork", "{run}", "--set", "x"], "--set 'x' is not of the form key=value"),
    (["fork", "{run}", "--set", "x=not-a-number"], "x"),
    (["fork", "{run}", "--set", "x.y=1"], "cannot set x.y: x is not an object"),
    (["fork", "{run}", "--set", "typo.y=1"], "typo"),
    (["submit", GATED, "--input", "tag"], "--input 'tag' is not of the form key=value"),
    (["submit", GATED, "--input", "=1"], "is not of the form key=value"),
    (["submit", GATED, "--input", "x=[1]"], "x"),
    (["submit", GATED, "--input", "nope=1"], "nope"),
    (["submit", GATED, "--inputs-file", "/no/such/inputs.json"], "/no/such/inputs.json"),
    (["submit", "no_such_pkg.flows:Flow"], "cannot import no_such_pkg.flows"),
    (["submit", "tests.flows.cli:NoSuchFlow"], "tests.flows.cli:NoSuchFlow"),
    (["submit", "tests.flows.cli"], "pkg.mod:Class"),
    (["graph", "no_such_pkg.flows:Flow"], "cannot import no_such_pkg.flows"),
    (["prune", "--keep", "1", "--older-than", "soon"], "soon"),
    (["prune", "--keep", "0"], "--keep"),
    (["runs", "--status", "bogus"], "bogus"),
    (["status"], "Missing argument"),
    (["no-such-command"], "no-such-command"),
]


@pytest.mark.parametrize(("args", "needle"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    cli: Cli,  # noqa: F811
    rt: Any,
    done_run: str,
    args: list[str],
    needle: str,
) -> None:
    args = [a.replace("{run}", done_run) for a in args]
    before = snapshot(rt)
    result = cli(*args)
    assert_one_line_error(result, 2, needle)
    assert result.stdout == ""
    assert snapshot(rt) == before


def test_an_inputs_file_that_is_not_a_json_object_is_bad_input(
    cli: Cli,  # noqa: F811
    rt: Any,
    tmp_path: Path,
) -> None:
    before = snapshot(rt)
    for text, needle in (("{oops", "not valid JSON"), ("[1, 2]", "JSON object")):
        path = tmp_path / "inputs.json"
        path.write_text(text)
        assert_one_line_error(cli("submit", GATED, "--inputs-file", str(path)), 2, needle)
    assert snapshot(rt) == before


REFUSED = [
    (["resume", "{run}"], "already succeeded"),
    (["cancel", "{run}"], "already succeeded"),
    (["fork", "{run}", "--run-id", "{run}"], "already exists"),
]


@pytest.mark.parametrize(("args", "needle"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_refused_operation_is_one_line_exit_1_and_changes_nothing(
    cli: Cli,  # noqa: F811
    rt: Any,
    done_run: str,
    args: list[str],
    needle: str,
) -> None:
    args = [a.replace("{run}", done_run) for a in args]
    before = snapshot(rt)
    assert_one_line_error(cli(*args), 1, needle)
    assert snapshot(rt) == before


def test_resume_refuses_a_running_run_even_from_an_older_checkpoint(
    cli: Cli,  # noqa: F811
    rt: Any,
    tag: str,  # noqa: F811
) -> None:
    handle = submit("tests.flows.cli:ApprovalFlow", {"tag": tag}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.PAUSED
    first = rt.store.history(handle.run_id, limit=100)[-1].id
    rt.store.update_run(handle.run_id, status=RunStatus.RUNNING)  # as if still running
    try:
        assert_one_line_error(cli("resume", handle.run_id, "--from", first), 1, "is running")
    finally:
        rt.store.update_run(handle.run_id, status=RunStatus.PAUSED)


REDIS_DOWN = [
    ["submit", GATED],
    ["status", "{run}"],
    ["watch", "{run}"],
    ["runs"],
    ["checkpoints", "{run}"],
    ["show", "{run}"],
    ["diff", "{run}", "{run}"],
    ["resume", "{run}"],
    ["fork", "{run}"],
    ["cancel", "{run}"],
    ["recover"],
    ["prune", "--keep", "1"],
]


@pytest.mark.parametrize("args", REDIS_DOWN, ids=[a[0] for a in REDIS_DOWN])
def test_redis_down_is_one_line_with_the_password_masked(
    cli: Cli,  # noqa: F811
    rt: Any,
    done_run: str,
    args: list[str],
) -> None:
    args = [a.replace("{run}", done_run) for a in args]
    before = snapshot(rt)
    result = cli("--redis-url", DOWN, *args)
    assert_one_line_error(result, 1, "redis://:***@127.0.0.1:1/0")
    assert "s3cret" not in result.stderr
    assert snapshot(rt) == before


def test_a_flow_outside_the_allow_list_is_refused_before_anything_is_stored(
    cli: Cli,  # noqa: F811
    rt: Any,
) -> None:
    before = snapshot(rt)
    result = cli("submit", GATED, env={"RUNNER_FLOW_MODULES": "examples.linear"})
    assert_one_line_error(result, 2, "not in the workers' allow-list")
    assert snapshot(rt) == before


def test_redis_down_from_the_environment_too(cli: Cli) -> None:  # noqa: F811
    result = cli("runs", env={"RUNNER_REDIS_URL": DOWN})
    assert_one_line_error(result, 1, "does not answer")


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/abc", "redis://127.0.0.1:6379/1/2", "rediss://127.0.0.1:6379/x"],
)
def test_a_database_part_that_is_not_a_number_is_bad_input_not_database_0(
    cli: Cli,  # noqa: F811
    url: str,
) -> None:
    # redis-py would drop the part and read database 0 of whatever Redis answers.
    for result in (cli("runs", env={"RUNNER_REDIS_URL": url}), cli("--redis-url", url, "runs")):
        assert_one_line_error(result, 2, "is not a number")


def test_no_redis_url_is_an_error_not_a_private_embedded_redis(
    cli: Cli,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # no `runner dev` here or above
    result = CliRunner().invoke(app, ["runs"], env={**cli.env, "RUNNER_REDIS_URL": None})
    assert_one_line_error(result, 1, "no Redis to share", "runner dev", "RUNNER_REDIS_URL")


def test_a_bad_setting_is_one_line(cli: Cli) -> None:  # noqa: F811
    result = cli("runs", env={"RUNNER_LEASE_SECONDS": "soon"})
    assert_one_line_error(result, 2, "RUNNER_LEASE_SECONDS")


def test_debug_shows_the_traceback(cli: Cli) -> None:  # noqa: F811
    result = cli("--debug", "status", "no-such-run")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "RunNotFound" in result.stderr
    assert result.stderr.rstrip().endswith("error: no run no-such-run")


# --- as real processes ----------------------------------------------------------------------


def run_process(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_console_script_submits_and_waits(
    rt: Any,
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    tag: str,  # noqa: F811
) -> None:
    script = Path(sys.executable).with_name("runner")
    assert script.exists(), "pip install -e . installs the `runner` console script"
    redis_client.set(gate_key(tag), 1)
    argv = [str(script), "submit", GATED, "-i", f"tag={tag}", "-i", "x=4", "-w"]
    done = run_process(argv, worker_env)
    assert done.returncode == 0, done.stderr
    run_id, outcome = done.stdout.splitlines()
    assert outcome == "succeeded: total=5"
    assert rt.store.run(run_id).status is RunStatus.SUCCEEDED

    status = run_process([str(script), "status", run_id, "--json"], worker_env)
    assert status.returncode == 0 and '"status": "succeeded"' in status.stdout


def test_python_m_runner_cli_reports_errors_in_one_line(
    rt: Any, worker_env: dict[str, str]
) -> None:
    before = snapshot(rt)
    cases = [
        (["--redis-url", DOWN, "runs"], 1, "does not answer"),
        (["status", "no-such-run"], 2, "no run no-such-run"),
        (["submit", "no_such_pkg.flows:Flow"], 2, "cannot import"),
        (["submit", GATED, "--input", "broken"], 2, "key=value"),
    ]
    for args, code, needle in cases:
        done = run_process([sys.executable, "-m", "runner.cli", *args], worker_env)
        assert done.returncode == code, (args, done.stderr)
        assert done.stdout == ""
        assert len(done.stderr.splitlines()) == 1 and needle in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert snapshot(rt) == before


def test_python_m_runner_prints_a_graph_without_redis() -> None:
    done = run_process([sys.executable, "-m", "runner", "--redis-url", DOWN, "graph", GATED], {})
    assert done.returncode == 0, done.stderr
    assert done.stdout == GatedFlow.graph().to_mermaid()
