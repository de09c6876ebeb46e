"""One run, one result: ``kickoff()``, ``RunHandle.result()``, ``runner submit --wait
--json``, ``runner status --json`` and the console's API give the same value for the same
run (:mod:`runner.flow.results` decides it), for runs that end with a plain step, a router,
a step a person reviewed and a crew run as a child; made in process or on the workers.

The CLI runs with the workers' environment (in this process: :mod:`tests.cli_support`); the
console is served on the workers' runtime. A reviewed step's result is a
``HumanFeedbackResult`` in Python (as ``kickoff`` has always returned it) and that result as
JSON on the CLI and the API.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest
from pydantic_core import to_jsonable_python

from runner import CheckpointConfig
from runner.distributed.client import RunHandle
from runner.flow.human_feedback import HumanFeedbackResult
from tests import cli_support
from tests.console_support import serving
from tests.flows.results import CrewEnd, PlainEnd, ReviewedEnd, RouterEnd

FLOWS = [PlainEnd, RouterEnd, ReviewedEnd, CrewEnd]


def runner_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    """``runner ARGS --json`` with the workers' environment; its JSON."""
    done = cli_support.run(*args, "--json", env=env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def console_result(rt: Any, run_id: str) -> Any:
    """The ``result`` the console's API gives for the run."""
    with serving(rt) as url:
        body = httpx.get(f"{url}/api/runs/{run_id}", timeout=10).json()
    assert body["run"]["status"] == "succeeded", body
    return body["result"]


def timeless(value: Any) -> Any:
    """``value`` with a review's answer time left out (two runs are answered at two times)."""
    if isinstance(value, HumanFeedbackResult):
        return replace(value, timestamp=None)
    return value


@pytest.mark.parametrize("flow_cls", FLOWS, ids=lambda c: c.__name__)
def test_a_run_kicked_off_in_process_shows_what_kickoff_returned_everywhere(
    flow_cls: Any, rt: Any, worker_env: dict[str, str]
) -> None:
    flow = flow_cls(checkpoint=CheckpointConfig(provider=rt.store))
    returned = flow.kickoff()
    run_id = flow.flow_id

    assert RunHandle(run_id, rt).result(timeout=5) == returned
    as_json = to_jsonable_python(returned)
    assert runner_json(worker_env, "status", run_id)["result"] == as_json
    assert console_result(rt, run_id) == as_json
    again = flow_cls.from_checkpoint(CheckpointConfig(provider=rt.store, restore_from=run_id))
    assert again.kickoff() == returned  # nothing left to run: the run's result, as CrewAI's


@pytest.mark.parametrize("flow_cls", FLOWS, ids=lambda c: c.__name__)
def test_a_run_on_the_workers_has_the_result_kickoff_gives_in_process(
    flow_cls: Any, rt: Any, worker_env: dict[str, str]
) -> None:
    submitted = runner_json(worker_env, "submit", flow_cls.flow_path(), "--wait")
    run_id = submitted["run_id"]
    assert submitted["status"] == "succeeded", submitted

    value = RunHandle(run_id, rt).result(timeout=5)

    assert to_jsonable_python(value) == submitted["result"]
    assert runner_json(worker_env, "status", run_id)["result"] == submitted["result"]
    assert console_result(rt, run_id) == submitted["result"]
    restored = flow_cls.from_checkpoint(CheckpointConfig(provider=rt.store, restore_from=run_id))
    assert restored.kickoff() == value
    assert timeless(flow_cls().kickoff()) == timeless(value)


def test_a_reviewed_last_step_gives_its_review_on_workers_as_in_process(
    rt: Any, worker_env: dict[str, str]
) -> None:
    submitted = runner_json(worker_env, "submit", ReviewedEnd.flow_path(), "--wait")

    value = RunHandle(submitted["run_id"], rt).result(timeout=5)

    assert isinstance(value, HumanFeedbackResult)
    assert (value.feedback, value.method_name) == ("fine: bees", "write")
    assert value.output == {"title": "bees", "body": "notes on bees"}
    assert isinstance(ReviewedEnd().kickoff(), HumanFeedbackResult)
