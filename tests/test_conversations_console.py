"""A conversational run in the console: ``POST /api/runs/{id}/turns`` (token auth, 4xx JSON
errors) and the run page's chat panel in a real headless Chromium, five turns with every
worker killed between them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from runner.distributed.client import RunHandle
from tests._dist_support import private_pool
from tests.console_support import serving
from tests.flows.conversations import Chat, NotAChat

CHROMIUM = "/usr/bin/chromium"
TOKEN = "chat-t0ken"

pytestmark = pytest.mark.workers


def test_the_turns_api_takes_a_turn_and_refuses_with_json_errors(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start(concurrency=1)
        chat = Chat.submit({"user_message": "hello"}, rt=rt)
        assert chat.result(timeout=60) == "#1: hello"
        plain = NotAChat.submit({}, rt=rt)
        plain.result(timeout=60)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url, timeout=90) as http:
            refused = http.post(f"/api/runs/{chat.run_id}/turns", json={"message": "hi"})
            assert refused.status_code == 401
            took = http.post(
                f"/api/runs/{chat.run_id}/turns", json={"message": "and now"}, headers=auth
            )
            assert took.status_code == 200, took.text
            body = took.json()
            assert body["reply"] == "#2: and now" and body["status"] == "succeeded"
            assert [m["content"] for m in body["messages"]] == [
                "hello",
                "#1: hello",
                "and now",
                "#2: and now",
            ]
            cases = [
                (plain.run_id, {"message": "hi"}, 422, "NotAChat is not one"),
                ("no-such-run", {"message": "hi"}, 404, "no run no-such-run"),
                (chat.run_id, {"message": "  "}, 422, "empty"),
                (chat.run_id, {"text": "hi"}, 422, ""),
            ]
            for run_id, payload, status, says in cases:
                answer = http.post(f"/api/runs/{run_id}/turns", json=payload, headers=auth)
                assert answer.status_code == status, (payload, answer.text)
                assert says in answer.json()["error"]["message"]


@pytest.fixture
def chromium() -> Iterator[object]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"]
        )
        yield browser
        browser.close()


def _say(tab: Page, text: str, reply: str) -> None:
    tab.fill("#chat-message", text)
    tab.click("#chat-send")
    # The page reloads with the turn's reply once the run answered it.
    expect(tab.locator("#chat-messages li.chat-assistant").last).to_contain_text(
        reply, timeout=60_000
    )


def test_five_turns_in_the_run_pages_chat_panel_across_worker_restarts(
    worker_env: dict[str, str], tmp_path: Path, chromium: object
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        worker = pool.start(concurrency=1)
        handle = Chat.submit({"user_message": "hello"}, rt=rt)
        assert handle.result(timeout=60) == "#1: hello"
        with serving(rt, token=TOKEN) as url:
            context = chromium.new_context()  # type: ignore[attr-defined]
            tab = context.new_page()
            problems: list[str] = []
            tab.on("pageerror", lambda exc: problems.append(str(exc)))
            tab.set_default_timeout(15_000)
            tab.goto(f"{url}/login")
            tab.fill("input[name=token]", TOKEN)
            tab.click("button[type=submit]")
            tab.wait_for_url(f"{url}/")
            tab.goto(f"{url}/runs/{handle.run_id}")
            expect(tab.locator("#chat-messages li")).to_have_count(2)
            for n, text in enumerate(["how are you", "tell me more", "why", "bye then"], start=2):
                pool.kill(worker)
                worker = pool.start(concurrency=1)
                _say(tab, text, f"#{n}: {text}")
            items = tab.locator("#chat-messages li")
            expect(items).to_have_count(10)
            expect(items.nth(8)).to_contain_text("bye then")
            context.close()
            assert problems == [], problems
        said = RunHandle(handle.run_id, rt).messages()
        assert said[-1]["content"] == "#5: bye then" and len(said) == 10
