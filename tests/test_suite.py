"""The suite's own set-up: a Redis database per xdist worker, the tiers ``make check`` and
``make test`` select, and the guard that keeps the fast tier free of processes."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import redis

from tests import conftest

ROOT = Path(__file__).resolve().parent.parent


def test_each_xdist_worker_has_a_database_of_its_own_and_none_is_db_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RUNNER_TEST_DB", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert conftest.session_db() == 11  # plain pytest
    found = []
    for worker in ("gw0", "gw1", "gw2", "gw3", "gw4"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        found.append(conftest.session_db())
    assert found == [11, 12, 13, 14, 15]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")  # Redis has databases 0-15
    with pytest.raises(pytest.exit.Exception, match="would use Redis DB 16"):
        conftest.session_db()


def test_this_session_uses_its_workers_database(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.connection_pool.connection_kwargs["db"] == conftest.session_db() != 0
    finally:
        client.close()


def test_make_check_leaves_out_the_markers_the_guard_lets_start_processes() -> None:
    makefile = (ROOT / "Makefile").read_text()
    (marks,) = re.findall(r"^CHECK_MARKS := (.*)$", makefile, re.M)
    assert marks == " and ".join(f"not {m}" for m in conftest.OUT_OF_CHECK)
    registered = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    names = {line.split(":")[0] for line in registered["ini_options"]["markers"]}
    assert set(conftest.OUT_OF_CHECK) <= names


@pytest.mark.processes
def test_the_venvs_are_installed_with_the_extras_pyproject_defines() -> None:
    # A dry run of both installs (the dev venv, the benchmarks' extra): each names whole
    # extras that exist (a comma inside make's $(call ...) once split `.[dev,bench]` in two).
    shown = subprocess.run(
        ["make", "-n", "-B", ".venv/.installed.stamp", ".venv/.bench.stamp"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = re.findall(r"uv pip install .*? -e '\.\[([^\]]*)\]'", shown)
    assert installed == ["dev", "dev,bench"], shown
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"dev", "bench"} <= set(extras)


def test_a_fast_tier_test_that_starts_a_process_fails_and_says_how_to_mark_it(
    request: pytest.FixtureRequest,
) -> None:
    assert not any(request.node.get_closest_marker(m) for m in conftest.OUT_OF_CHECK)
    with pytest.raises(RuntimeError, match="is not marked `processes`"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    with conftest.processes_allowed():  # what the session's own Redis start-up uses
        assert subprocess.run([sys.executable, "-c", "pass"], check=False).returncode == 0


@pytest.mark.processes
def test_a_test_marked_processes_may_start_one() -> None:
    assert subprocess.run([sys.executable, "-c", "pass"], check=False).returncode == 0


def test_the_session_workers_mark_their_tests(request: pytest.FixtureRequest) -> None:
    # Every selected test that uses them (through rt or cli too), in this session.
    items = request.session.items
    using = [i for i in items if "worker_pool" in getattr(i, "fixturenames", ())]
    assert all(i.get_closest_marker("workers") for i in using)


@pytest.mark.processes
def test_children_of_a_suite_started_ignoring_sigint_stop_on_it() -> None:
    """A child of the suite stops on SIGINT whatever the shell that ran the suite ignored:
    a pytest started with SIGINT ignored (as `make test &` without job control does) hands
    its children SIGINT's default."""
    child = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    code = (
        "import subprocess, sys\n"
        "import tests.conftest\n"
        f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True,"
        " text=True).stdout.strip())\n"
    )
    ignoring = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert ignoring.stdout.strip() == "False", ignoring.stderr
