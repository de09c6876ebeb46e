"""A ``RUNNER_*`` value the settings reject is one line naming the variable, in every process
that reads the settings: the CLI (exit 2, bad input) and a worker (which then does not start)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # the CLI and a worker in subprocesses

ROOT = Path(__file__).resolve().parent.parent


def run(argv: list[str], redis_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        env={**os.environ, "RUNNER_REDIS_URL": redis_url, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_names_the_bad_setting_in_one_line(redis_url: str) -> None:
    done = run(["-m", "runner", "runs"], redis_url, RUNNER_LOG_FORMAT="xml")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: bad setting RUNNER_LOG_FORMAT: Input should be 'text' or 'json'"
    ]
    assert "Traceback" not in done.stderr


def test_a_worker_with_a_bad_setting_says_so_in_one_line_and_does_not_start(
    redis_url: str,
) -> None:
    done = run(
        ["-m", "celery", "-A", "runner.worker", "worker", "-c", "1"],
        redis_url,
        RUNNER_MAX_CHECKPOINTS="many",
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines == [lines[0]] and lines[0].startswith("error: bad setting RUNNER_MAX_CHECKPOINTS")
