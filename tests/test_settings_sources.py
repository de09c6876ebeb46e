"""The settings read their sources as pydantic-settings' ``BaseSettings`` read them for the
runner (``env_prefix="RUNNER_"``, case-insensitive, flat fields; list fields not JSON-decoded):
keywords, then ``RUNNER_*`` variables, then the dotenv file named by ``RUNNER_ENV_FILE``. They
no longer import pydantic-settings (a cold CLI command's largest cost beyond its libraries):
these tests hold the two to the same values, pydantic-settings (a dev dependency) as the
reference, and check a configured dotenv file is still read."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import ConfigDict, create_model
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from runner.settings import RunnerSettings, _FromEnvironment, get_settings, reset_settings

ROOT = Path(__file__).resolve().parent.parent
FIELDS: dict[str, Any] = {name: (str | None, None) for name in RunnerSettings.model_fields}


def _raw_models() -> tuple[type[Any], type[Any]]:
    """A pydantic-settings twin and one of ours, every field a raw string: what each source
    handed the settings' validation. The list fields are NoDecode in the twin, as they were
    in the runner's BaseSettings (no other field of it is complex: nothing else is decoded)."""
    twin_fields = dict(FIELDS)
    for name in ("flow_modules", "worker_queues"):
        twin_fields[name] = (Annotated[Any, NoDecode], None)
    twin = create_model("Twin", __base__=BaseSettings, **twin_fields)
    twin.model_config = SettingsConfigDict(env_prefix="RUNNER_", extra="ignore")
    twin.model_rebuild(force=True)
    ours = create_model("Ours", __base__=_FromEnvironment, **FIELDS)
    ours.model_config = ConfigDict(extra="ignore", validate_default=True)
    ours.model_rebuild(force=True)
    return twin, ours


def _clear_runner_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("RUNNER_"):
            monkeypatch.delenv(key)


ENV_FILE = """\
# a comment
RUNNER_PREFIX=from-file
runner_queue=lower-case-name
RUNNER_LIMITS="openai=500/m, search=5/s"
RUNNER_APP_VERSION=${HOME_OF_TEST}/v1
RUNNER_UI_USER
RUNNER_RETENTION=
export RUNNER_ARCHIVE='/tmp/archive.db'
RUNNER_FLOW_MODULES=a.b, c.d
OTHER_THING=ignored
RUNNER_NOT_A_FIELD=ignored
"""

CASES: list[tuple[dict[str, str], str | None, dict[str, Any]]] = [
    ({}, None, {}),
    ({"RUNNER_PREFIX": "env", "runner_Queue": "q", "RUNNER_UI_PORT": ""}, None, {}),
    ({"RUNNER_FLOW_MODULES": '["a","b"]', "RUNNER_WORKER_QUEUES": "default, gpu"}, None, {}),
    ({"RUNNER_PREFIX": "env", "RUNNER_REDIS_URL": "redis://h/1"}, None, {"prefix": "kw"}),
    ({"RUNNER_REDIS_URL": "redis://h/1"}, None, {"redis_url": None}),
    ({}, "file", {}),
    ({"RUNNER_PREFIX": "env", "HOME_OF_TEST": "/home/t"}, "file", {}),
    ({"RUNNER_QUEUE": "env-q"}, "file", {"limits": "kw"}),
    ({"RUNNER_PREFIX": "env"}, "missing", {}),
]


@pytest.mark.parametrize(("env", "env_file", "kwargs"), CASES)
def test_the_sources_give_what_pydantic_settings_gave(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    env: dict[str, str],
    env_file: str | None,
    kwargs: dict[str, Any],
) -> None:
    _clear_runner_env(monkeypatch)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = None
    if env_file is not None:
        path = tmp_path / ("runner.env" if env_file == "file" else "nowhere.env")
        if env_file == "file":
            path.write_text(ENV_FILE)
    twin, ours = _raw_models()
    extra: dict[str, Any] = {"_env_file": str(path)} if path is not None else {}
    expected = twin(**extra, **kwargs).model_dump()
    assert ours(**extra, **kwargs).model_dump() == expected


def test_a_configured_env_file_is_read_and_variables_win(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _clear_runner_env(monkeypatch)
    env_file = tmp_path / "runner.env"
    env_file.write_text(
        "RUNNER_PREFIX=from-file\nRUNNER_MAX_CHECKPOINTS=7\nRUNNER_FLOW_MODULES=a.b, c\n"
    )
    monkeypatch.setenv("RUNNER_ENV_FILE", str(env_file))
    reset_settings()
    try:
        settings = get_settings()
        assert (settings.prefix, settings.max_checkpoints) == ("from-file", 7)
        assert settings.flow_modules == ["a.b", "c"]
        assert settings.queue == "runner.from-file"
        monkeypatch.setenv("RUNNER_PREFIX", "from-env")
        assert (get_settings().prefix, get_settings().max_checkpoints) == ("from-env", 7)
        # Without RUNNER_ENV_FILE, the file is not read.
        monkeypatch.delenv("RUNNER_ENV_FILE")
        assert (get_settings().prefix, get_settings().max_checkpoints) == ("from-env", 200)
    finally:
        reset_settings()


def test_a_bad_value_in_the_env_file_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from runner.errors import InvalidSettings

    _clear_runner_env(monkeypatch)
    env_file = tmp_path / "runner.env"
    env_file.write_text("RUNNER_UI_PORT=0\n")
    monkeypatch.setenv("RUNNER_ENV_FILE", str(env_file))
    reset_settings()
    try:
        with pytest.raises(InvalidSettings, match="bad setting RUNNER_UI_PORT"):
            get_settings()
    finally:
        reset_settings()


@pytest.mark.processes  # a fresh interpreter
def test_reading_the_settings_imports_neither_pydantic_settings_nor_dotenv(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "runner.env"
    env_file.write_text("RUNNER_PREFIX=p\n")
    probe = (
        "import sys; from runner.settings import get_settings; s = get_settings(); "
        "print(s.prefix, sorted(m for m in ('pydantic_settings', 'dotenv') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RUNNER_")}
    for extra, expected in (
        ({}, "runner []"),
        ({"RUNNER_ENV_FILE": str(env_file)}, "p ['dotenv']"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env={**env, **extra},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert done.stdout.strip() == expected
