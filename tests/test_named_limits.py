"""Named limits shared by methods of different flows, per-key limits, and their errors:
admitted through the real Redis script (no worker needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from runner import Flow, FlowState, set_limit, start
from runner.cli import app
from runner.distributed import limits
from runner.errors import DefinitionError
from runner.settings import RunnerSettings
from runner.store.redis import RedisProvider


class Tenant(FlowState):
    tenant: str = ""


class Summarize(Flow[Tenant]):
    @start(limits=["openai"])
    def ask(self) -> None:
        """Calls the provider."""


class Classify(Flow[Tenant]):
    @start(limits=["openai"])
    def ask(self) -> None:
        """Calls the provider too."""


class Translate(Flow[Tenant]):
    @start(limits=["openai"], limit_key=lambda state: state.tenant)
    def ask(self) -> None:
        """Calls the provider, per tenant."""


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    provider = RedisProvider(redis_url, prefix=prefix)
    yield provider
    provider.close()


def _admit(store: RedisProvider, flow: type, tenant: str, n: int) -> limits.Waiting | None:
    spec = flow.graph().methods["ask"]  # type: ignore[attr-defined]
    settings = RunnerSettings(prefix=store.keys.prefix, limits="openai=9/h")
    with limits.admission(
        store, settings, flow, spec, {"tenant": tenant}, f"r{n}|ask#1", f"t{n}"
    ) as waiting:
        return waiting


def test_a_named_limit_is_shared_across_flows_and_set_limit_overrides_the_setting(
    store: RedisProvider,
) -> None:
    set_limit("openai", "2/s", store=store)
    assert _admit(store, Summarize, "", 1) is None
    assert _admit(store, Summarize, "", 2) is None
    held = _admit(store, Summarize, "", 3)
    assert held is not None and held.limit == "openai" and 0 < held.seconds <= 0.5
    # Another flow's method counts against the same limit.
    other = _admit(store, Classify, "", 4)
    assert other is not None and other.limit == "openai"


def test_limit_key_gives_each_key_a_limit_of_its_own(store: RedisProvider) -> None:
    set_limit("openai", "1/s", store=store)
    assert _admit(store, Translate, "acme", 1) is None
    assert _admit(store, Translate, "globex", 2) is None
    held = _admit(store, Translate, "acme", 3)
    assert held is not None and held.limit == "openai[acme]"


def test_runner_limits_lists_use_and_waiting_steps(store: RedisProvider, redis_url: str) -> None:
    set_limit("openai", "1/m", store=store)
    assert _admit(store, Summarize, "", 1) is None
    assert _admit(store, Summarize, "", 2) is not None
    shown = CliRunner().invoke(
        app,
        ["limits", "--json"],
        env={"RUNNER_REDIS_URL": redis_url, "RUNNER_PREFIX": store.keys.prefix},
    )
    assert shown.exit_code == 0, shown.output
    (use,) = json.loads(shown.output)
    # One start, and the turn the waiting step reserved.
    assert (use["name"], use["kind"], use["spec"], use["in_use"]) == ("openai", "rate", "1/m", 2)
    assert use["use"] == "1 of 1 in this minute"  # the reserved turn has not started
    assert [(w["run"], w["step"]) for w in use["waiting"]] == [("r2", "ask#1")]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rate_limit": "5/d"}, "rate_limit='5/d': must be a count per second, minute or hour"),
        ({"rate_limit": "0/s"}, "rate_limit='0/s'"),
        ({"concurrency": 0}, "concurrency=0: must be an int >= 1"),
        ({"queue": "g p u"}, "queue='g p u': must be a name"),
        ({"burst": 3}, "burst= needs a rate_limit="),
        ({"limits": "openai"}, "limits= takes a list of names"),
    ],
)
def test_bad_flow_control_options_are_refused_where_they_are_written(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(DefinitionError, match=message.replace("(", r"\(").replace("[", r"\[")):
        start(**options)  # type: ignore[arg-type]


def test_a_bad_rate_in_set_limit_is_refused(store: RedisProvider) -> None:
    with pytest.raises(DefinitionError, match="limit openai"):
        set_limit("openai", "lots", store=store)
    assert store.client.hlen(store.keys.rates()) == 0


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("RUNNER_LIMITS", "openai=lots", "error: RUNNER_LIMITS openai='lots': must be a count"),
        ("RUNNER_WORKER_QUEUES", "gpu,no way", "error: RUNNER_WORKER_QUEUES='no way': must be"),
    ],
)
@pytest.mark.processes
def test_a_worker_refuses_a_bad_limit_or_queue_setting_in_one_line(
    worker_env: dict[str, str], variable: str, value: str, message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "runner.worker", "worker", "-l", "warning"],
        env={**os.environ, **worker_env, variable: value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(message), done.stderr
