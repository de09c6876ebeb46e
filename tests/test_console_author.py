"""Who acts through the console is recorded by name: a basic-auth login's user name, else
``RUNNER_UI_USER``, with every answer (a question's, a review's) and cancel it sends."""

from __future__ import annotations

import html
import os
import re
import time
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from runner.store.models import RunStatus
from tests._dist_support import paused
from tests.console_support import serving
from tests.flows.asking import DeadlineFlow
from tests.flows.timing import SlowFlow

CHROMIUM = "/usr/bin/chromium"
TOKEN = "author-t0ken"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def _answered_by(http: httpx.Client, run_id: str) -> list[tuple[str, str]]:
    timeline = http.get(f"/api/runs/{run_id}").json()["timeline"]
    return [(row["answer"]["text"], row["answer"]["by"]) for row in timeline if row["answer"]]


def test_answers_and_cancels_sent_through_the_console_record_its_user(rt: Any) -> None:
    settings = rt.settings.model_copy(update={"ui_user": "ana"})
    with (
        serving(rt, token=TOKEN, settings=settings) as url,
        httpx.Client(base_url=url, headers=BEARER) as http,
    ):
        by_api = DeadlineFlow.submit({"timeout": 600.0}, rt=rt)
        paused(by_api)
        sent = http.post(f"/api/runs/{by_api.run_id}/feedback", json={"feedback": "yes"})
        assert sent.status_code == 202, sent.text
        assert by_api.result(timeout=20) == "yes"
        assert _answered_by(http, by_api.run_id) == [("yes", "ana")]

        by_page = DeadlineFlow.submit({"timeout": 600.0}, rt=rt)
        paused(by_page)
        sent = http.post(f"/runs/{by_page.run_id}/feedback", data={"feedback": "go"})
        assert sent.status_code in (204, 303), sent.text  # the run page's answer box
        assert by_page.result(timeout=20) == "go"
        assert _answered_by(http, by_page.run_id) == [("go", "ana")]

        # A basic-auth login names its user: that name comes first.
        slow = SlowFlow.submit({"seconds": 5}, rt=rt)
        with httpx.Client(base_url=url, auth=("bo", TOKEN)) as bo:
            page = bo.get(f"/runs/{slow.run_id}").text
            csrf = re.search(r'"X-CSRF-Token": "([^"]+)"', html.unescape(page))
            assert csrf is not None, page[:500]
            headers = {"X-CSRF-Token": csrf.group(1)}  # a browser's request carries it
            sent = bo.post(f"/api/runs/{slow.run_id}/cancel", headers=headers)
        assert sent.status_code == 200, sent.text
        assert slow.wait(timeout=10) is RunStatus.CANCELLED
        detail = http.get(f"/api/runs/{slow.run_id}").json()
        assert detail["cancel_reason"] == "cancelled by bo in the console"
        assert "cancelled by bo in the console" in http.get(f"/runs/{slow.run_id}").text


def test_a_browser_logged_in_with_a_name_answers_a_question_as_that_name(rt: Any) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (Debian's chromium: `apt-get install chromium`)")
    settings = rt.settings.model_copy(update={"ui_user": "ana"})
    asking = DeadlineFlow.submit({"timeout": 600.0}, rt=rt)
    deadline = paused(asking).meta.human.awaiting.deadline
    with serving(rt, token=TOKEN, settings=settings) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"]
        )
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.set_default_timeout(10_000)
        tab.goto(f"{url}/login")
        expect(tab.locator("form.login")).to_contain_text("default ana")
        tab.fill("input[name=token]", TOKEN)
        tab.fill("input[name=user]", "cleo")
        tab.click("form.login button[type=submit]")
        tab.wait_for_url(f"{url}/")
        tab.goto(f"{url}/runs/{asking.run_id}")
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(deadline))
        expect(tab.locator("#awaiting .ask-timeout")).to_have_text(
            f"Unanswered at {at}, it goes on with None."
        )
        tab.locator("#feedback-text").fill("sure")
        tab.locator("button.feedback-submit").click()
        expect(tab.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
        browser.close()
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url, headers=BEARER) as http:
        assert _answered_by(http, asking.run_id) == [("sure", "cleo")]
