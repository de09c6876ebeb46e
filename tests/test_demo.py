"""``make demo`` runs green on a machine with nothing configured, and leaves nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    kids = [int(p) for p in out.stdout.split()]
    return kids + [g for k in kids for g in _descendants(k)]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_survives_a_worker_kill_without_redoing_finished_tasks(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["DEMO_FLOWER_PORT"] = str(_free_port())
    env["PYTHONPATH"] = str(ROOT)  # run from a folder of its own: its ./.runner goes there
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.demo"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    assert "started an embedded Redis" in out
    assert "SIGKILL worker 1" in out
    assert ": succeeded" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("stage") and "_" in line]
    assert len(rows) == 12, out  # four stages of three crew tasks
    assert all(row[-1] == "1" for row in rows), out  # every task committed exactly once
    calls = sorted(int(row[-2]) for row in rows)
    assert calls[:11] == [1] * 11, out  # only the task the kill interrupted ran again
    assert calls[11] in (1, 2), out
    assert _descendants(proc.pid) == []
