"""Bulk actions against real Redis and real workers: ``runner resume|cancel|pin --where`` and
``--ids -`` (a dry run first, ``--yes`` acts, a summary), ``runner runs``' limit and "more"
line, ``POST /api/runs/bulk``, and the console's runs page (filters, count, paging, a
selection resumed) in a real headless Chromium.

Runs are :class:`tests.console_flows.GateFlow` runs: each fails while its gate file is
absent, and a resume finishes it once the test opens the gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runner.distributed import client
from runner.distributed.engine import Runtime
from runner.store.models import RunStatus
from tests import cli_support
from tests._dist_support import eventually
from tests.console_support import console_deployment, serving, snapshot

TOKEN = "bulk-t0ken"
CHROMIUM = "/usr/bin/chromium"

pytestmark = [pytest.mark.workers, pytest.mark.processes]


@pytest.fixture(scope="module")
def deployment(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Runtime, dict[str, str]]]:
    with console_deployment(worker_env, str(tmp_path_factory.mktemp("bulk"))) as found:
        yield found


@pytest.fixture
def rt(deployment: tuple[Runtime, dict[str, str]]) -> Runtime:
    return deployment[0]


@pytest.fixture
def tag() -> str:
    """A word in the ids of this test's runs only (``id~TAG`` selects them)."""
    return f"b{uuid.uuid4().hex[:8]}"


def gated(rt: Runtime, gates: Path, tag: str, n: int, *, open_: bool = False) -> list[str]:
    """``n`` GateFlow runs named ``TAG-i``, each stopped: failed at ``through`` (its gate
    closed), or succeeded (``open_``)."""
    run_ids = []
    for i in range(n):
        gate = gates / f"{tag}-{i}-{'open' if open_ else 'shut'}"
        if open_:
            gate.touch()
        handle = client.submit(
            "tests.console_flows:GateFlow",
            {"gate": str(gate)},
            id=f"{tag}-{'ok' if open_ else 'no'}{i}",
            rt=rt,
        )
        want = RunStatus.SUCCEEDED if open_ else RunStatus.FAILED
        assert handle.wait(timeout=20) is want
        run_ids.append(handle.run_id)
    return run_ids


def open_gates(rt: Runtime, run_ids: list[str]) -> None:
    for run_id in run_ids:
        latest = rt.store.latest(run_id)
        assert latest is not None
        Path(latest.state["gate"]).touch()


def cli(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``runner ARGS`` on the deployment (in this process: :mod:`tests.cli_support`)."""
    return cli_support.run(*args, env={**env, "COLUMNS": "200"}, stdin=stdin)


def statuses(rt: Runtime, run_ids: list[str]) -> dict[str, str]:
    return {r: info.status.value for r in run_ids if (info := rt.store.run(r)) is not None}


def test_resume_where_is_a_dry_run_until_yes_then_resumes_each_failed_run_once(
    deployment: tuple[Runtime, dict[str, str]], tag: str, tmp_path: Path
) -> None:
    rt, env = deployment
    failed = gated(rt, tmp_path, tag, 3)
    done = gated(rt, tmp_path, tag, 1, open_=True)

    # A bad selection: one line, exit 2, nothing done.
    before = snapshot(rt)
    bad = cli(env, "resume", "--where", f"flow=GateFlow state=failed id~{tag}")
    assert bad.returncode == 2, bad
    assert bad.stderr.strip().splitlines() == [
        "error: bad selection term 'state=failed': unknown key 'state'"
    ]
    assert cli(env, "resume", "RUN", "--where", "status=failed").returncode == 2

    # The dry run lists the failed runs and changes nothing.
    where = f"flow=GateFlow status=failed since=1h id~{tag}"
    dry = cli(env, "resume", "--where", where)
    assert dry.returncode == 0, dry
    assert "dry run: resume would act on 3 run(s)" in dry.stdout
    assert all(run_id in dry.stdout for run_id in failed)
    assert done[0] not in dry.stdout
    assert snapshot(rt) == before

    # --yes resumes each (through control.resume); once their gates are open they succeed.
    open_gates(rt, failed)
    acted = cli(env, "resume", "--where", where, "--yes")
    assert acted.returncode == 0, acted
    assert "resume: 3 acted, 0 skipped, 0 failed (of 3)" in acted.stdout
    for run_id in failed:
        assert client.RunHandle(run_id, rt).wait(timeout=20) is RunStatus.SUCCEEDED
        steps = [
            c.step
            for c in rt.store.history(run_id, limit=100)
            if c.event == "method_execution_finished"
        ]
        assert steps.count("prepare") == 1  # completed steps were not run again

    # --ids - from stdin: finished runs cannot be cancelled: skipped, each with the reason.
    every = failed + done
    typed = [run_id[:-1] if run_id.endswith("ok0") else run_id for run_id in every]  # a prefix
    cancel = cli(env, "cancel", "--ids", "-", "--yes", stdin="\n".join(typed) + "\n")
    assert cancel.returncode == 0, cancel
    assert "cancel: 0 acted, 4 skipped, 0 failed (of 4)" in cancel.stdout
    assert cancel.stdout.count("is already succeeded") == 4
    assert set(statuses(rt, every).values()) == {"succeeded"}

    # An unknown id among --ids: exit 2 before anything is done.
    unknown = cli(env, "pin", "--ids", f"{failed[0]},nope-{tag}", "--yes")
    assert unknown.returncode == 2 and f"no run nope-{tag}" in unknown.stderr
    assert not rt.store.expiries([failed[0]])[failed[0]].pinned  # type: ignore[attr-defined]


def test_runs_says_how_many_more_match_and_takes_the_same_where(
    deployment: tuple[Runtime, dict[str, str]], tag: str, tmp_path: Path
) -> None:
    rt, env = deployment
    failed = gated(rt, tmp_path, tag, 2)
    gated(rt, tmp_path, tag, 1, open_=True)

    some = cli(env, "runs", "--where", f"id~{tag}", "--limit", "2")
    assert some.returncode == 0, some
    assert some.stdout.rstrip().splitlines()[-1] == "… 1 more (use --limit or --all)"
    every = cli(env, "runs", "--where", f"id~{tag}", "--all")
    assert "more" not in every.stdout
    only_failed = cli(env, "runs", "--where", f"id~{tag} status=failed", "--json")
    assert sorted(r["run_id"] for r in json.loads(only_failed.stdout)) == sorted(failed)

    # A fork of each: the failed runs forked into new runs that record their parent; the
    # succeeded one has nothing left to run, so its fork would change nothing: skipped.
    forked = cli(env, "fork", "--where", f"id~{tag}", "--yes", "--json")
    assert forked.returncode == 0, forked
    outcomes = {o["run_id"]: o for o in json.loads(forked.stdout)["outcomes"]}
    assert {r for r, o in outcomes.items() if o["outcome"] == "acted"} == set(failed)
    skipped = [o for o in outcomes.values() if o["outcome"] == "skipped"]
    assert len(skipped) == 1 and "would change nothing" in skipped[0]["reason"]
    for run_id in failed:
        child = rt.store.run(outcomes[run_id]["result"])
        assert child is not None and child.parent_run_id == run_id

    twice = cli(env, "runs", "--status", "failed", "--where", "status=paused")
    assert twice.returncode == 2 and "--status also in --where" in twice.stderr


def test_the_api_answers_a_dry_run_acts_on_ids_and_refuses_a_bad_selection(
    deployment: tuple[Runtime, dict[str, str]], tag: str, tmp_path: Path
) -> None:
    rt, _env = deployment
    failed = gated(rt, tmp_path, tag, 2)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url, headers=auth) as http:
        before = snapshot(rt)
        dry = http.post(
            "/api/runs/bulk", json={"action": "resume", "where": f"status=failed id~{tag}"}
        )
        assert dry.status_code == 200, dry.text
        body = dry.json()
        assert (body["dry_run"], body["count"], body["acted"]) == (True, 2, 0)
        assert sorted(r["run_id"] for r in body["runs"]) == sorted(failed)
        assert snapshot(rt) == before

        bad = http.post("/api/runs/bulk", json={"action": "resume", "where": "since=yesterday"})
        assert bad.status_code == 422
        assert bad.json()["error"]["type"] == "BadSelection"
        assert "since=yesterday" in bad.json()["error"]["message"]
        assert (
            http.post("/api/runs/bulk", json={"action": "delete", "ids": failed}).status_code == 422
        )
        assert http.post("/api/runs/bulk", json={"action": "pin", "where": ""}).status_code == 422
        assert http.get("/api/runs", params={"where": "id=x"}).status_code == 422
        assert http.get("/", params={"since": "soon"}).status_code == 422  # the page's filter
        assert snapshot(rt) == before

        pinned = http.post(
            "/api/runs/bulk", json={"action": "pin", "ids": failed, "dry_run": False}
        )
        assert pinned.json()["acted"] == 2
        assert all(e.pinned for e in rt.store.expiries(failed).values())  # type: ignore[attr-defined]

        listed = http.get("/api/runs", params={"where": f"id~{tag}", "limit": 1}).json()
        assert (listed["total"], listed["more"], len(listed["runs"])) == (2, 1, 1)
        assert listed["runs"][0]["run_id"].startswith(listed["runs"][0]["short"])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent")
def test_the_runs_page_filters_pages_and_resumes_a_selection_of_failed_runs(
    rt: Runtime, tag: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    failed = gated(rt, tmp_path, tag, 3)
    done = gated(rt, tmp_path, tag, 1, open_=True)
    open_gates(rt, failed)
    with serving(rt, token=TOKEN) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless"])
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
        tab = context.new_page()
        problems: list[str] = []
        tab.on("pageerror", lambda exc: problems.append(str(exc)))
        tab.set_default_timeout(10_000)
        tab.goto(f"{url}/login")
        tab.fill("input[name=token]", TOKEN)
        tab.click("button[type=submit]")
        tab.wait_for_url(f"{url}/")

        # Text in the id, two a page: a count and paging that keeps the filter.
        tab.goto(f"{url}/?q={tag}&limit=2")
        expect(tab.locator("#runs-count")).to_have_text("1-2 of 4")
        tab.click("#next-page")
        expect(tab.locator("#runs-count")).to_have_text("3-4 of 4")
        assert f"q={tag}" in tab.url
        expect(tab.locator("#next-page")).to_have_count(0)

        # The full id on hover and in the clipboard; the short form is a unique prefix.
        link = tab.locator(f"tr.run[data-run='{failed[0]}'] a").first
        expect(link).to_have_attribute("title", failed[0])
        assert failed[0].startswith(link.inner_text())
        tab.locator(f"tr.run[data-run='{failed[0]}'] button.copy").click()
        expect(tab.locator(f"tr.run[data-run='{failed[0]}'] button.copy")).to_have_text("copied")
        assert tab.evaluate("navigator.clipboard.readText()") == failed[0]

        # Only failed ones: back to the first page, 3 of them.
        tab.select_option("select[name=status]", "failed")
        expect(tab.locator("#runs-count")).to_have_text("1-2 of 3")
        assert "offset=0" in tab.url and f"q={tag}" in tab.url
        expect(tab.locator(f"tr.run[data-run='{done[0]}']")).to_have_count(0)

        # Select all on the page and resume them: the confirm names the count.
        tab.check("#select-page")
        expect(tab.locator("#bulk-count")).to_have_text("2 selected")
        asked: list[str] = []
        tab.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
        tab.click("#bulk-resume")
        expect(tab.locator("#flash .bulk-summary")).to_have_attribute("data-acted", "2")
        assert asked == ["resume 2 selected run(s)?"]
        eventually(lambda: sum(s == "succeeded" for s in statuses(rt, failed).values()) == 2)
        left = [r for r, s in statuses(rt, failed).items() if s == "failed"]
        assert len(left) == 1  # the one on the next page was not selected

        # The list follows: one failed run left.
        expect(tab.locator("#runs-count")).to_have_text("1-1 of 1", timeout=15_000)
        expect(tab.locator(f"tr.run[data-run='{left[0]}']")).to_have_count(1)
        context.close()
        browser.close()
        assert problems == []
