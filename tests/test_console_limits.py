"""The console's Limits page and API, and a waiting step on a run's page."""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from runner.distributed import limits
from runner.distributed.client import submit
from tests._dist_support import eventually
from tests.console_support import serving
from tests.flows.flow_control import RatedFlow, RoutedFlow

CHROMIUM = "/usr/bin/chromium"


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
        # Use is read within the current window (of the five it allows), never the whole
        # count of turns reserved (in_use: the seven held back count against the rate until
        # their turn, so it is at least what started). A busy machine starting the console
        # late sees fewer of the five in this second, so the page is read for the same figure.
        used = use["used"]
        assert (use["of"], use["period"]) == (5, 1.0) and 0 <= used <= 5
        assert use["use"] == f"{used} of 5 in this second"
        assert use["in_use"] >= used
        assert {held[-1]} <= {w["run"] for w in use["waiting"]} <= set(held)
        page = http.get("/limits")
        assert page.status_code == 200
        assert "RatedFlow.call" in page.text and held[-1] in page.text
        assert re.search(r"[0-5] of 5 in this second", page.text)


def test_the_limits_page_fits_1280_pixels_and_says_limits_in_its_tab(rt: Any) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (Debian's chromium: `apt-get install chromium`)")
    # A keyed limit's long name and a dozen steps waiting on it: what made the page too wide.
    runs = [f"wide-{uuid.uuid4().hex}" for _ in range(14)]
    held = [run for run in runs if _admit(rt, run) is not None]
    assert len(held) >= 9
    with serving(rt) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"]
        )
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.goto(f"{url}/limits")
        assert tab.title() == "Limits · runner console"
        row = tab.locator("tr[data-limit='RatedFlow.call']")
        expect(row.locator("td.use")).to_have_text(re.compile(r"^[0-5] of 5 in this second$"))
        width = tab.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, width
        browser.close()


def test_a_run_page_says_what_its_waiting_step_waits_for(rt: Any) -> None:
    run = submit(RoutedFlow, {"group": "console"}, rt=rt)  # no worker here consumes gpu
    eventually(lambda: "prepare#1" in rt.coord.read(run.run_id).completed, timeout=20)
    with serving(rt) as url, httpx.Client(base_url=url) as http:
        detail = http.get(f"/api/runs/{run.run_id}").json()
        assert "queue gpu" in detail["waiting"]["embed#1"]
        page = http.get(f"/runs/{run.run_id}")
        assert "embed#1 waits for queue gpu" in page.text
