"""The console in a real headless Chromium (Debian's ``chromium``, driven by Playwright),
against real Redis and real workers: from the runs list to a failed run, a fork with an
edited field and a re-run step, the fork finishing live, and the diff; a failed run
resumed from the control next to its error; a step's link to its task in a real Flower.

Set ``RUNNER_TEST_SCREENSHOT=<file.png>`` to save the finished fork's page (the
README's screenshot is taken this way).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from runner.distributed import client
from runner.distributed.engine import Runtime, task_id
from runner.store.models import RunStatus
from tests.console_support import console_deployment, failed_review, flower, serving, snapshot

CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-t0ken"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is absent (Debian's chromium: `apt-get install chromium`)",
    ),
]


@pytest.fixture(scope="module")
def deployment(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Runtime, dict[str, str]]]:
    """The console tests' workers: their runtime and their ``RUNNER_*`` environment."""
    with console_deployment(worker_env, str(tmp_path_factory.mktemp("console-ui"))) as found:
        yield found


@pytest.fixture(scope="module")
def rt(deployment: tuple[Runtime, dict[str, str]]) -> Runtime:
    return deployment[0]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--headless",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, rt: Runtime) -> Iterator[tuple[Page, str]]:
    """A logged-in page of a console started with a token, and the console's URL."""
    with serving(rt, token=TOKEN) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        tab = context.new_page()
        problems: list[str] = []
        tab.on("pageerror", lambda exc: problems.append(str(exc)))
        # A 422 answer to the invalid form is logged too: only CSP refusals count.
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
        assert problems == [], problems  # no script error, nothing the CSP refused


def test_fork_a_failed_run_with_an_edited_field_and_read_the_diff(
    page: tuple[Page, str], rt: Runtime
) -> None:
    tab, url = page
    failed = failed_review(rt, topic="browser")

    # The runs list shows the failed run; filtering by status keeps it.
    row = tab.locator(f"tr.run[data-run='{failed}']")
    expect(row).to_have_attribute("data-status", "failed")
    tab.select_option("select[name=status]", "failed")
    expect(tab.locator("tr.run[data-status='succeeded']")).to_have_count(0)
    row.locator("a").first.click()

    # The run page: failed at `check`, coloured so in the graph.
    tab.wait_for_url(f"{url}/runs/{failed}")
    expect(tab.locator("#run-status")).to_have_text("failed")
    expect(tab.locator("#error h2")).to_contain_text("check")
    expect(tab.locator("#error")).to_contain_text("over the limit of 10 chars")
    expect(tab.locator(".method[data-method='check']")).to_have_attribute("data-state", "failed")
    expect(tab.locator("[data-mermaid][data-rendered='ok'] svg")).to_be_visible()
    expect(tab.locator("svg g.node.failed")).to_contain_text("check")

    # Fork from the failure checkpoint: an invalid value shows its error, stores nothing.
    failure = tab.locator("tr.checkpoint[data-event='method_execution_failed']")
    failure.locator("button.fork-link").click()
    form = tab.locator("#fork-form")
    expect(form.locator("#f-limit")).to_have_value("10")
    before = snapshot(rt)
    form.locator("#f-limit").fill("lots")
    form.locator("#fork-submit").click()
    expect(form.locator("[data-field='limit'] .field-error")).to_contain_text("valid integer")
    expect(form.locator("#f-limit")).to_have_value("lots")
    assert snapshot(rt) == before

    # A valid value and a re-run of `write`: what that re-runs is shown before confirming.
    form.locator("#f-limit").fill("500")
    form.locator("input[name=rerun][value=write]").check()
    expect(form.locator("#rerun-preview")).to_contain_text("write, check, publish")
    form.locator("#fork-submit").click()

    # The fork's page follows it live until it succeeds on the workers.
    tab.wait_for_url(re.compile(rf"{re.escape(url)}/runs/(?!{failed})[^/]+$"))
    fork_id = tab.url.rpartition("/")[2]
    assert fork_id in snapshot(rt)
    expect(tab.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
    expect(tab.locator(".method[data-method='publish']")).to_have_attribute("data-state", "done")
    expect(tab.locator("#lineage .lineage-run.current")).to_contain_text(fork_id[:12])

    # The diff against the checkpoint it was forked from.
    tab.click("#diff-form button[type=submit]")
    limit = tab.locator("#diff-result tr[data-field='limit']")
    expect(limit).to_contain_text("10")
    expect(limit).to_contain_text("500")
    expect(tab.locator("#diff-result tr[data-field='verdict']")).to_contain_text("accepted")
    expect(tab.locator("#diff-result .only-b")).to_contain_text("publish#1")

    shot = os.environ.get("RUNNER_TEST_SCREENSHOT")
    if shot:
        Path(shot).parent.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=shot, full_page=True)


def test_resume_next_to_the_error_continues_the_failed_run(
    page: tuple[Page, str], rt: Runtime
) -> None:
    tab, url = page
    failed = failed_review(rt, topic="resume")
    tab.goto(f"{url}/runs/{failed}")
    error = tab.locator("#error")
    expect(error).to_contain_text("over the limit of 10 chars")
    error.locator("input[name=inputs]").fill('{"limit": 1000}')
    error.locator("button.resume-submit").click()

    # The same run continues at the failed step and finishes; the page follows it.
    expect(tab.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
    assert tab.url == f"{url}/runs/{failed}"
    expect(tab.locator("#error")).to_have_count(0)
    expect(tab.locator("#result")).to_contain_text("published (accepted)")
    expect(tab.locator("#inputs tr[data-input='limit']")).to_contain_text("10")
    expect(tab.locator(".method[data-method='outline']")).to_contain_text("1")  # not re-run


def test_a_steps_flower_link_opens_its_task_in_flower(
    browser: Browser, deployment: tuple[Runtime, dict[str, str]], tmp_path: Path
) -> None:
    rt, env = deployment
    # Flower learns tasks from the workers' events: it runs before the run starts.
    with flower(env, str(tmp_path)) as flower_url, serving(rt, flower_url=flower_url) as url:
        handle = client.submit(
            "tests.console_flows:ReviewFlow", {"topic": "flower", "limit": 500}, rt=rt
        )
        assert handle.wait(timeout=15) is RunStatus.SUCCEEDED
        write = task_id(handle.run_id, 0, "write#1")
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            tab = context.new_page()
            tab.set_default_timeout(10_000)
            tab.goto(f"{url}/runs/{handle.run_id}")
            row = tab.locator("tr.checkpoint[data-event='method_execution_finished']").filter(
                has_text="write#1"
            )
            row.get_by_title("this step's Celery task in Flower").click()
            tab.wait_for_url(f"{flower_url}/task/**")
            expect(tab.locator(".task-uuid-value")).to_contain_text(write)
            expect(tab.locator(".task-name-value")).to_contain_text("ReviewFlow.write")
            expect(tab.locator("body")).not_to_contain_text("Unknown task")
        finally:
            context.close()
