"""compose.yaml and the image, ready for an operator; checked with docker-compose (no engine).

``docker-compose config`` resolves the file (anchors, merges, variables) into plain YAML with
one key a line, which these tests read as text.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # docker-compose in a subprocess

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {
    "REDIS_PASSWORD": "0123abcd",
    "FLOWER_BASIC_AUTH": "admin:s3cret",
    "RUNNER_UI_TOKEN": "t0ken",
}

needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="docker-compose not installed"
)


def _compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # A clean environment (plus the secrets given): the developer's shell must not fill them.
    base = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        ["docker-compose", "--project-directory", str(ROOT), "-f", "compose.yaml", *args],
        cwd=ROOT,
        env={**base, **(env if env is not None else SECRETS)},
        capture_output=True,
        text=True,
        check=False,
    )


def _services(text: str) -> dict[str, str]:
    """Service name -> its block of the resolved YAML."""
    body = ("\n" + text).split("\nservices:\n", 1)[1].split("\nvolumes:\n", 1)[0]
    blocks = re.split(r"^  (\w[\w-]*):\n", "\n" + body, flags=re.M)[1:]
    return dict(zip(blocks[::2], blocks[1::2], strict=True))


@pytest.fixture(scope="module")
def services() -> dict[str, str]:
    result = _compose("config")
    assert result.returncode == 0, result.stderr
    return _services(result.stdout)


@needs_compose
def test_compose_file_parses_and_has_every_service(services: dict[str, str]) -> None:
    assert _compose("config", "-q").returncode == 0
    assert {"redis", "worker", "flower", "ui", "producer"} <= set(services)


@needs_compose
def test_compose_refuses_to_start_without_its_secrets() -> None:
    for missing in SECRETS:
        result = _compose("config", "-q", env={k: v for k, v in SECRETS.items() if k != missing})
        assert result.returncode != 0
        assert missing in result.stderr


@needs_compose
def test_redis_is_not_published_and_needs_the_password(services: dict[str, str]) -> None:
    redis = services["redis"]
    assert "ports:" not in redis
    assert "--requirepass" in redis and "--appendonly yes" in redis
    assert f"REDIS_PASSWORD: {SECRETS['REDIS_PASSWORD']}" in redis
    for name in ("worker", "flower", "ui", "producer"):
        url = f"RUNNER_REDIS_URL: redis://:{SECRETS['REDIS_PASSWORD']}@redis:6379/0"
        assert url in services[name], name


@needs_compose
def test_flower_is_behind_basic_auth(services: dict[str, str]) -> None:
    flower = services["flower"]
    assert f"FLOWER_BASIC_AUTH: {SECRETS['FLOWER_BASIC_AUTH']}" in flower
    assert "FLOWER_UNAUTHENTICATED_API" not in flower


@needs_compose
def test_the_console_needs_its_token(services: dict[str, str]) -> None:
    assert f"RUNNER_UI_TOKEN: {SECRETS['RUNNER_UI_TOKEN']}" in services["ui"]


@needs_compose
def test_redis_worker_flower_and_ui_have_healthchecks(services: dict[str, str]) -> None:
    for name in ("redis", "worker", "flower", "ui"):
        assert "healthcheck:" in services[name], name
    assert "ping" in services["redis"]
    assert "inspect ping" in services["worker"]
    assert "/healthcheck" in services["flower"]


@needs_compose
def test_every_service_on_the_image_can_build_it(services: dict[str, str]) -> None:
    on_image = [name for name, block in services.items() if "image: runner:latest" in block]
    assert set(on_image) == {"worker", "flower", "producer", "ui", "worker-ha"}
    for name in on_image:
        assert "build:" in services[name], name
    assert "replicas: 2" in services["worker"]


def test_the_image_runs_as_a_user_and_its_context_leaves_local_state_out() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".runner", ".env"} <= ignored
