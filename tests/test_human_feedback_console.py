"""A review on the console, in a real headless Chromium: a run paused at a ``@human_feedback``
step shows the output under review, the message, a feedback box and one button per ``emit``
label; a button or the typed feedback sends the answer, the run goes on along the label, the
page follows it, and the timeline says who answered what."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from playwright.sync_api import Browser, Page, expect, sync_playwright

from runner.distributed.client import RunHandle
from runner.store.models import RunStatus
from tests.console_support import serving
from tests.flows.dist import executions
from tests.flows.reviews import ArticleFlow

CHROMIUM = "/usr/bin/chromium"
TOKEN = "review-t0ken"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is absent (Debian's chromium: `apt-get install chromium`)",
    ),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, rt: Any) -> Iterator[tuple[Page, str]]:
    """A logged-in page of a console started with a token, and the console's URL."""
    # The console's user (RUNNER_UI_USER) is who its answers are recorded by.
    ana = rt.settings.model_copy(update={"ui_user": "ana"})
    with serving(rt, token=TOKEN, settings=ana) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        tab = context.new_page()
        problems: list[str] = []
        tab.on("pageerror", lambda exc: problems.append(str(exc)))
        tab.on(
            "console",
            lambda msg: (
                problems.append(msg.text) if "Content Security Policy" in msg.text else None
            ),
        )
        tab.set_default_timeout(10_000)
        tab.goto(f"{url}/login")
        tab.fill("input[name=token]", TOKEN)
        tab.click("button[type=submit]")
        tab.wait_for_url(f"{url}/")
        yield tab, url
        context.close()
        assert problems == [], problems


def paused_article(rt: Any, topic: str) -> RunHandle:
    handle = ArticleFlow.submit({"topic": topic}, rt=rt)
    deadline = time.monotonic() + 30
    while handle.status() is not RunStatus.PAUSED:
        assert time.monotonic() < deadline, "the run did not pause for its review"
        time.sleep(0.05)
    return handle


def test_a_label_button_answers_the_review_and_the_page_follows_the_run(
    page: tuple[Page, str], rt: Any, redis_client: redis.Redis
) -> None:
    tab, url = page
    handle = paused_article(rt, "puffins")
    tab.goto(f"{url}/runs/{handle.run_id}")
    review = tab.locator("#awaiting")
    expect(tab.locator("#run-status")).to_have_text("paused")
    expect(review.locator("h2")).to_contain_text("review")
    expect(review.locator(".awaiting-message")).to_have_text("Publish this draft?")
    expect(review.locator("#under-review")).to_contain_text("draft from notes on puffins")
    expect(review.locator("textarea[name=feedback]")).to_be_visible()
    labels = review.locator("button.outcome")
    expect(labels).to_have_count(2)
    expect(labels.nth(0)).to_have_text("approved")
    expect(labels.nth(1)).to_have_text("rejected")

    review.locator("button[data-outcome='rejected']").click()
    expect(tab.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
    expect(tab.locator("#awaiting")).to_have_count(0)
    expect(tab.locator("#result")).to_contain_text("shelved")
    expect(tab.locator(".timeline .answer")).to_contain_text("review answered by ana: rejected")
    counts = [executions(redis_client, handle.run_id, m) for m in ("research", "write", "review")]
    assert counts == [1, 1, 1]  # nothing before the answer ran again
    assert executions(redis_client, handle.run_id, "shelve") == 1


def test_typed_feedback_is_collapsed_to_a_label_by_the_flows_llm(
    page: tuple[Page, str], rt: Any, redis_client: redis.Redis
) -> None:
    tab, url = page
    handle = paused_article(rt, "terns")
    tab.goto(f"{url}/runs/{handle.run_id}")
    tab.locator("#feedback-text").fill("ship it, it reads well")
    tab.locator("button.feedback-submit").click()
    expect(tab.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
    expect(tab.locator("#result")).to_contain_text("published terns")
    expect(tab.locator(".timeline .answer")).to_contain_text("ship it, it reads well")
    assert executions(redis_client, handle.run_id, "review") == 1
    assert executions(redis_client, handle.run_id, "publish") == 1
