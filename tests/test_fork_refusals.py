"""A fork that would change nothing is refused, and a re-run of a step the flow does not
have lists the flow's steps: decided once, where forks are made
(:func:`runner.distributed.control.fork`), and given the same way by the CLI (one
``error:`` line, exit 2), the JSON API (422) and the console's fork form. Nothing is
stored when refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from runner.distributed.client import submit
from runner.store.models import RunStatus
from tests.console_support import serving
from tests.flows.cli import GatedFlow, gate_key
from tests.test_cli import Cli, cli, tag  # noqa: F401  (fixtures)
from tests.test_cli_errors import assert_one_line_error, snapshot

TOKEN = "fork-refusals-t0ken"
STEPS = "fetch, check, report"
"""GatedFlow's steps, as the errors list them."""


@pytest.fixture
def done_run(rt: Any, redis_client: redis.Redis, tag: str) -> str:  # noqa: F811
    """A GatedFlow run that succeeded (x=0, result total=1): its id."""
    redis_client.set(gate_key(tag), 1)
    handle = submit(GatedFlow, {"tag": tag}, rt=rt)
    assert handle.result(timeout=30) == "total=1"
    return handle.run_id


@pytest.fixture
def console(rt: Any) -> Iterator[httpx.Client]:
    """A console with a token on the test workers, called with the bearer header."""
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url, headers=bearer) as http:
        yield http


def test_the_cli_refuses_a_fork_of_a_finished_run_that_changes_nothing(
    cli: Cli,  # noqa: F811
    rt: Any,
    done_run: str,
    tag: str,  # noqa: F811
) -> None:
    before = snapshot(rt)
    # No edit at all; values equal to the checkpoint's (as the state model reads them);
    # a branch label alone.
    for edits in (
        [],
        ["--set", "x=0"],
        ["--set", f"tag={tag}", "--set", "x=0.0"],
        ["--branch", "b"],
    ):
        result = cli("fork", done_run, *edits)
        assert_one_line_error(
            result, 2, "this fork would change nothing", "--rerun STEP", STEPS, "(succeeded)"
        )
    assert snapshot(rt) == before


def test_the_cli_forks_a_finished_run_with_a_rerun_or_with_a_value_that_differs(
    cli: Cli,  # noqa: F811
    rt: Any,
    done_run: str,
) -> None:
    rerun = cli("fork", done_run, "--rerun", "check", "--set", "x=4", "--wait")
    assert rerun.exit_code == 0, rerun.stderr
    assert rerun.stdout.splitlines()[1] == "succeeded: total=5"
    assert rerun.stderr == ""

    # Allowed (the state is edited), but nothing runs in it: the CLI says so.
    edited = cli("fork", done_run, "--set", "x=7")
    assert edited.exit_code == 0, edited.stderr
    new_run = edited.stdout.strip()
    assert rt.store.run(new_run).status is RunStatus.SUCCEEDED
    assert rt.store.latest(new_run).state["x"] == 7
    assert edited.stderr.startswith(f"note: no step runs in {new_run}:")
    assert "add --rerun STEP" in edited.stderr


def test_the_cli_lists_the_flows_steps_for_a_rerun_of_an_unknown_step(
    cli: Cli,  # noqa: F811
    rt: Any,
    done_run: str,
) -> None:
    before = snapshot(rt)
    result = cli("fork", done_run, "--rerun", "nosuch", "--rerun", "report")
    assert_one_line_error(result, 2, f"GatedFlow has no step(s) nosuch; its steps: {STEPS}")
    assert snapshot(rt) == before


def test_the_api_refuses_the_same_forks_with_the_same_messages(
    rt: Any, console: httpx.Client, done_run: str
) -> None:
    before = snapshot(rt)
    nothing = console.post(f"/api/checkpoints/{done_run}/fork", json={"set": {"x": 0}})
    assert nothing.status_code == 422, nothing.text
    error = nothing.json()["error"]
    assert error["type"] == "ForkChangesNothing"
    assert error["message"].startswith("this fork would change nothing")
    assert error["steps"] == ["fetch", "check", "report"]

    unknown = console.post(f"/api/checkpoints/{done_run}/fork", json={"rerun": ["nosuch"]})
    assert unknown.status_code == 422, unknown.text
    error = unknown.json()["error"]
    assert error["type"] == "UnknownStep"
    assert error["message"] == f"GatedFlow has no step(s) nosuch; its steps: {STEPS}"
    preview = console.get(f"/api/checkpoints/{done_run}/rerun", params={"step": "nosuch"})
    assert preview.status_code == 422 and preview.json()["error"]["message"] == error["message"]
    assert snapshot(rt) == before


def test_the_console_form_shows_the_refusal_and_stores_nothing(
    rt: Any,
    console: httpx.Client,
    done_run: str,
    tag: str,  # noqa: F811
) -> None:
    before = snapshot(rt)
    htmx = {"HX-Request": "true"}
    unchanged = {"field.tag": tag, "field.x": "0"}
    form = console.post(f"/checkpoints/{done_run}/fork", data=unchanged, headers=htmx)
    assert form.status_code == 422
    assert 'id="fork-form"' in form.text
    assert "Nothing was stored: ForkChangesNothing: this fork would change nothing" in form.text

    crafted = {**unchanged, "rerun": "nosuch"}
    form = console.post(f"/checkpoints/{done_run}/fork", data=crafted, headers=htmx)
    assert form.status_code == 422 and 'id="fork-form"' in form.text
    assert f"GatedFlow has no step(s) nosuch; its steps: {STEPS}" in form.text
    assert snapshot(rt) == before
