"""compose.yaml describes the deployment and parses with docker-compose (no engine needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="docker-compose not installed"
)


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker-compose", "-f", "compose.yaml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@needs_compose
def test_compose_file_parses_and_has_every_service() -> None:
    assert _compose("config", "-q").returncode == 0
    services = set(_compose("config", "--services").stdout.split())
    assert {"redis", "worker", "flower", "producer"} <= services


@needs_compose
def test_compose_redis_keeps_an_append_only_file_and_workers_share_it() -> None:
    text = _compose("config").stdout
    assert "--appendonly" in text
    assert "RUNNER_REDIS_URL: redis://redis:6379/0" in text
    assert "replicas: 2" in text
