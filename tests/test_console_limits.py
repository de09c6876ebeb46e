"""The console's Limits page and API, and a waiting step on a run's page."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from runner.distributed import limits
from runner.distributed.client import submit
from tests._dist_support import eventually
from tests.console_support import serving
from tests.flows.flow_control import RatedFlow, RoutedFlow


def _admit(rt: Any, run: str) -> limits.Waiting | None:
    spec = RatedFlow.graph().methods["call"]
    with limits.admission(
        rt.store, rt.settings, RatedFlow, spec, {}, f"{run}|call#1", run
    ) as waiting:
        return waiting


def test_the_limits_page_and_api_show_use_and_waiting_steps(rt: Any) -> None:
    runs = [f"r{uuid.uuid4().hex[:6]}" for _ in range(12)]
    held = [run for run in runs if _admit(rt, run) is not None]
    assert held == runs[5:]  # 5/s: a burst of five, then one every 0.2 s
    # A waiting step is listed until 2 s after its turn (waiting.RECENT): the last one held
    # (its turn 1.4 s away) still is when the console has started, however busy the machine.
    with serving(rt) as url, httpx.Client(base_url=url) as http:
        found = http.get("/api/limits").json()["limits"]
        (use,) = [u for u in found if u["name"] == "RatedFlow.call"]
        assert (use["kind"], use["spec"]) == ("rate", "5/s")
        assert {held[-1]} <= {w["run"] for w in use["waiting"]} <= set(held)
        page = http.get("/limits")
        assert page.status_code == 200
        assert "RatedFlow.call" in page.text and held[-1] in page.text


def test_a_run_page_says_what_its_waiting_step_waits_for(rt: Any) -> None:
    run = submit(RoutedFlow, {"group": "console"}, rt=rt)  # no worker here consumes gpu
    eventually(lambda: "prepare#1" in rt.coord.read(run.run_id).completed, timeout=20)
    with serving(rt) as url, httpx.Client(base_url=url) as http:
        detail = http.get(f"/api/runs/{run.run_id}").json()
        assert "queue gpu" in detail["waiting"]["embed#1"]
        page = http.get(f"/runs/{run.run_id}")
        assert "embed#1 waits for queue gpu" in page.text
