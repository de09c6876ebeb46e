"""A step in flight that runs nowhere (its queue has no live consumer; likewise a limit, a
worker of a version, a sleep) is shown as ``waiting``, with what for, by every view: ``runner
status``, ``runner steps``, the API's ``methods[].state`` and the console's graph and legend
(one decision: ``runner.views.step_states``)."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from runner.distributed.app import make_app
from runner.distributed.client import submit
from runner.distributed.engine import Runtime
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests import cli_support
from tests.console_support import serving
from tests.flows.flow_control import GpuFlow

CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.processes  # the CLI in a subprocess, Chromium


@pytest.fixture
def idle(worker_env: dict[str, str]) -> Iterator[tuple[Runtime, dict[str, str]]]:
    """A runtime on a prefix and queue no worker serves, and the CLI's environment for it."""
    own = uuid.uuid4().hex[:8]
    env = {**worker_env, "RUNNER_PREFIX": f"idle-{own}", "RUNNER_QUEUE": f"idle-{own}"}
    settings = RunnerSettings(
        redis_url=env["RUNNER_REDIS_URL"],
        prefix=env["RUNNER_PREFIX"],
        queue=env["RUNNER_QUEUE"],
        flow_modules=env["RUNNER_FLOW_MODULES"].split(","),
    )
    runtime = Runtime.create(make_app(settings), settings)
    yield runtime, env
    runtime.app.close()
    runtime.store.close()


def _runner(env: dict[str, str], *args: str) -> str:
    done = cli_support.run(*args, env={**env, "COLUMNS": "200"})
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def test_a_step_whose_queue_nobody_consumes_is_shown_waiting_everywhere(
    idle: tuple[Runtime, dict[str, str]],
) -> None:
    rt, env = idle
    run = submit(GpuFlow, {"group": "shown"}, rt=rt)
    assert run.status() is RunStatus.RUNNING
    queue = f"{env['RUNNER_QUEUE']}.gpu"
    why = f"queue gpu ({queue}): no live worker consumes it"

    shown = _runner(env, "status", run.run_id)
    assert re.search(rf"^\s*waiting\s+embed#1 waits for {re.escape(why)}", shown, re.M), shown
    assert not re.search(r"^\s*running\s", shown, re.M), shown  # no step runs
    (row,) = json.loads(_runner(env, "steps", run.run_id, "--json"))
    assert (row["step"], row["outcome"], row["waits_for"]) == ("embed#1", "waiting", why)

    with serving(rt) as url, httpx.Client(base_url=url) as http:
        detail = http.get(f"/api/runs/{run.run_id}").json()
        methods = {m["name"]: m for m in detail["methods"]}
        assert methods["embed"]["state"] == "waiting"
        assert methods["embed"]["waits_for"] == f"embed#1 waits for {why}"
        assert methods["report"]["state"] == "pending"
        assert re.search(r"^\s+class \S+ waiting$", detail["mermaid"], re.M), detail["mermaid"]
        assert "waiting" in [entry["state"] for entry in detail["legend"]]
        if not os.path.exists(CHROMIUM):
            pytest.skip(f"{CHROMIUM} is absent: the graph is checked as text only")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"]
            )
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            tab.goto(f"{url}/runs/{run.run_id}")
            node = tab.locator(".graph-svg g.node.waiting")
            expect(node).to_have_count(1)
            expect(node).to_contain_text("embed")
            expect(tab.locator(".graph-svg g.node.running")).to_have_count(0)
            swatch = tab.locator(".legend li[data-state=waiting]")
            expect(swatch).to_be_visible()
            expect(swatch).to_have_text("waiting")
            expect(tab.locator("tr.method[data-method=embed] .state")).to_have_text("waiting")
            browser.close()
