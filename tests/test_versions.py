"""A run knows its code version: each checkpoint records the version that wrote it
(``RUNNER_APP_VERSION``, else a hash of the flow's graph and state schema), shown by
``runner status``, ``runner runs --version`` and the console's run page and API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from runner import CheckpointConfig, Flow, FlowState, listen, start
from runner.cli import app
from runner.distributed.app import make_app
from runner.distributed.engine import Runtime
from runner.flow import versions
from runner.settings import RunnerSettings, get_settings, reset_settings
from runner.store.redis import RedisProvider
from tests.console_support import serving


class Note(FlowState):
    text: str = ""


class Noted(Flow[Note]):
    @start()
    def write(self) -> str:
        self.state.text = "hello"
        return "written"

    @listen(write)
    def read(self) -> str:
        return self.state.text


class NoteV2(FlowState):
    text: str = ""
    lang: str = "en"


class NotedWithLang(Flow[NoteV2]):
    @start()
    def write(self) -> str:
        return "written"

    @listen(write)
    def read(self) -> str:
        return self.state.text


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    made = RedisProvider(redis_url, prefix=prefix)
    yield made
    made.close()


@pytest.fixture
def env(redis_url: str, prefix: str) -> dict[str, str]:
    return {"RUNNER_REDIS_URL": redis_url, "RUNNER_PREFIX": prefix}


def cli_json(env: dict[str, str], *args: str) -> Any:
    result = CliRunner().invoke(app, [*args, "--json"], env=env)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_the_default_version_changes_with_the_graph_and_the_state_schema_only() -> None:
    ours = versions.code_hash(Noted.graph())
    assert ours == versions.code_hash(Noted.graph())
    assert len(ours) == 12
    # Another state model (a field more), same wiring: another version.
    assert Noted.graph().fingerprint == NotedWithLang.graph().fingerprint
    assert versions.code_hash(NotedWithLang.graph()) != ours


def test_every_checkpoint_records_the_version_that_wrote_it(store: RedisProvider) -> None:
    flow = Noted(checkpoint=CheckpointConfig(provider=store))
    flow.kickoff()
    history = store.history(flow.state.id)
    assert history
    assert {c.version for c in history} == {versions.code_hash(Noted.graph())}


def test_runner_app_version_names_the_version(
    store: RedisProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNNER_APP_VERSION", "2026.11.28-a")
    reset_settings()
    flow = Noted(checkpoint=CheckpointConfig(provider=store))
    flow.kickoff()
    assert {c.version for c in store.history(flow.state.id)} == {"2026.11.28-a"}


def test_status_runs_and_the_console_api_show_the_version(
    store: RedisProvider, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNNER_APP_VERSION", "v1")
    old = Noted(checkpoint=CheckpointConfig(provider=store))
    old.kickoff()
    monkeypatch.setenv("RUNNER_APP_VERSION", "v2")
    new = Noted(checkpoint=CheckpointConfig(provider=store))
    new.kickoff()

    shown = cli_json(env, "status", old.state.id)
    assert shown["version"] == "v1"
    assert shown["fingerprint"] == Noted.graph().fingerprint
    listed = cli_json(env, "runs", "--version", "v2")
    assert [r["run_id"] for r in listed] == [new.state.id]
    assert listed[0]["version"] == "v2"
    text = CliRunner().invoke(app, ["status", old.state.id], env=env).stdout
    assert "version" in text and "v1" in text

    with console(env) as http:
        assert http.get(f"/api/runs/{new.state.id}").json()["version"] == "v2"
        assert ">v2<" in http.get(f"/runs/{new.state.id}").text


@contextmanager
def console(env: dict[str, str]) -> Iterator[httpx.Client]:
    """The console (read-only) on ``env``'s store, and a client of it."""
    settings = RunnerSettings(redis_url=env["RUNNER_REDIS_URL"], prefix=env["RUNNER_PREFIX"])
    rt = Runtime.create(make_app(settings), settings)
    try:
        with serving(rt) as url, httpx.Client(base_url=url) as http:
            yield http
    finally:
        rt.close()


def test_settings_follow_the_runner_variables_whatever_their_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # get_settings is cached on the RUNNER_ variables (a worker asks for it every step):
    # a change of one, spelled in any case as pydantic-settings reads them, is seen at once;
    # other variables are not part of the key.
    monkeypatch.setenv("RUNNER_APP_VERSION", "v1")
    first = get_settings()
    assert first.app_version == "v1" and get_settings() is first
    monkeypatch.setenv("NOT_RUNNERS_OWN", "x")
    assert get_settings() is first
    monkeypatch.delenv("RUNNER_APP_VERSION")
    monkeypatch.setenv("runner_app_version", "v2")
    assert get_settings().app_version == "v2"
    monkeypatch.setenv("runner_app_version", "v3")
    assert get_settings().app_version == "v3"
