"""The console's live output: ``GET /api/runs/{id}/stream`` (Server-Sent Events, token auth,
``Last-Event-ID`` resume, 404) and the run page's panel in a real Chromium, filled while the
step still runs, on the test workers."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from playwright.sync_api import Browser, Page, expect, sync_playwright

from runner.distributed.client import submit
from runner.store.models import RunStatus
from tests.console_support import serving
from tests.flows.streams import Tokens, go_key, token

CHROMIUM = "/usr/bin/chromium"
TOKEN = "stream-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _release(redis_url: str, run_id: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(go_key(run_id), 1, ex=600)
    client.close()


def _events(response: httpx.Response, stop: int | None = None) -> list[dict[str, Any]]:
    """Parse SSE events (``id``, ``event``, ``data`` parsed) until the end (or ``stop``)."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if "data" in current:
                found.append(current)
                if current.get("event") == "end" or (stop is not None and len(found) == stop):
                    return found
            current = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(": ")
        current[name] = json.loads(value) if name == "data" else value
    return found


@pytest.fixture
def console(rt: Any) -> Iterator[str]:
    with serving(rt, token=TOKEN) as url:
        yield url


def test_the_sse_endpoint_streams_a_run_and_resumes_from_last_event_id(
    rt: Any, console: str
) -> None:
    handle = submit(Tokens, {"count": 120, "delay": 0.005}, rt=rt)
    url = f"{console}/api/runs/{handle.run_id}/stream"
    with httpx.Client(timeout=30) as http:
        with http.stream("GET", url, headers=AUTH) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            first = _events(response, stop=50)
        last = first[-1]["id"]
        with http.stream("GET", url, headers={**AUTH, "Last-Event-ID": last}) as response:
            rest = _events(response)
    ids = [e["id"] for e in first + rest[:-1]]
    assert len(ids) == len(set(ids)) == 121  # 120 tokens and one progress line, once each
    tokens = [e["data"]["content"] for e in first + rest if e["data"]["channel"] == "tokens"]
    assert tokens == [token(i) for i in range(120)]
    end = rest[-1]
    assert end["event"] == "end"
    assert (end["data"]["type"], end["data"]["data"]["result"]) == ("flow_finished", 120)


def test_the_sse_endpoint_needs_the_token_and_404s_an_unknown_run(rt: Any, console: str) -> None:
    handle = submit(Tokens, {"count": 3}, rt=rt)
    handle.wait(timeout=30)
    with httpx.Client(timeout=10) as http:
        refused = http.get(f"{console}/api/runs/{handle.run_id}/stream")
        assert refused.status_code == 401
        missing = http.get(f"{console}/api/runs/no-such-run/stream", headers=AUTH)
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "RunNotFound"
        channels = http.get(
            f"{console}/api/runs/{handle.run_id}/stream",
            params={"channels": "progress"},
            headers=AUTH,
        )
    assert [
        json.loads(line[6:])["type"]
        for line in channels.text.splitlines()
        if line.startswith("data: ")
    ] == ["flow_finished"]


def test_a_client_that_leaves_stops_its_reader(rt: Any, console: str, redis_url: str) -> None:
    def readers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "runner-sse"}

    others = readers()  # another test's browser page may still hold a stream open
    handle = submit(Tokens, {"count": 10, "hold": True}, rt=rt)
    url = f"{console}/api/runs/{handle.run_id}/stream"
    with httpx.Client(timeout=30) as http, http.stream("GET", url, headers=AUTH) as response:
        assert len(_events(response, stop=5)) == 5
        mine = readers() - others
        assert mine
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in mine):
        assert time.monotonic() < deadline, "the reader of a client that left goes on"
        time.sleep(0.1)
    assert handle.status() is RunStatus.RUNNING  # it stopped while the run still runs
    _release(redis_url, handle.run_id)
    assert handle.wait(timeout=30) is RunStatus.SUCCEEDED


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, console: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(str(exc)))
    tab.on(
        "console",
        lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    tab.set_default_timeout(20_000)
    tab.goto(f"{console}/login")
    tab.fill("input[name=token]", TOKEN)
    tab.click("button[type=submit]")
    tab.wait_for_url(f"{console}/")
    yield tab
    context.close()
    assert problems == [], problems


@pytest.mark.slow
def test_the_run_page_panel_fills_with_500_tokens_before_the_step_commits(
    rt: Any, console: str, page: Page, redis_url: str
) -> None:
    handle = submit(Tokens, {"count": 500, "delay": 0.002, "hold": True}, rt=rt)
    page.goto(f"{console}/runs/{handle.run_id}")
    text = page.locator(".stream-step[data-step='write#1'] pre.stream-text")
    expect(text).to_contain_text(token(499))
    assert handle.status() is RunStatus.RUNNING  # on screen before the step committed
    shown = text.text_content() or ""
    assert [t + " " for t in shown.split("\n")[0].split()] == [token(i) for i in range(100)]
    _release(redis_url, handle.run_id)
    panel = page.locator("#stream-panel")
    expect(panel).to_have_attribute("data-ended", "succeeded")
    expect(page.locator("#stream-status")).to_have_text("run succeeded")
    began = time.monotonic()
    assert handle.wait(timeout=30) is RunStatus.SUCCEEDED and time.monotonic() - began < 30


@pytest.mark.slow
def test_the_panel_shows_a_retried_steps_newest_attempt_only(
    rt: Any, console: str, page: Page
) -> None:
    handle = submit(Tokens, {"count": 30, "fail_first": True}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.SUCCEEDED
    page.goto(f"{console}/runs/{handle.run_id}")  # a replay: attempt 1's entries superseded
    box = page.locator(".stream-step[data-step='write#1']")
    expect(page.locator("#stream-panel")).to_have_attribute("data-ended", "succeeded")
    expect(box).to_have_attribute("data-attempt", "2")
    expect(box.locator(".stream-attempt")).to_have_text("attempt 2")
    expect(box.locator("pre.stream-text")).to_have_text("".join(token(i) for i in range(30)))
