"""Workers and queues in view, as an operator sees them: ``runner workers`` (a subprocess,
human and ``--json``), the console's Workers page in Chromium and ``GET /api/workers``,
and the console's ``/metrics`` gauges of each queue's depth and oldest message's age;
against two real workers (one consuming a second queue) and a queue with messages no
worker consumes, on Redis and on RabbitMQ."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from runner.distributed import broker
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime
from runner.store.models import RunStatus
from tests._dist_support import eventually, private_pool, runner_cli
from tests.conftest import WorkerPool
from tests.console_support import serving
from tests.flows.fleet_flows import DozeFlow, OvernightFlow

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
TOKEN = "fleet-t0ken"
AMQP = os.environ.get("RUNNER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def workers_json(env: dict[str, str]) -> dict[str, Any]:
    done = runner_cli(env, "workers", "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def scrape(url: str) -> dict[tuple[str, str], float]:
    """(sample name, queue label) -> value of the runner_queue_* samples of a /metrics."""
    response = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert response.status_code == 200, response.text
    return {
        (sample.name, sample.labels.get("queue", "")): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name.startswith("runner_queue_")
    }


class Fleet:
    """Two workers of one deployment, its producer runtime and its environment."""

    def __init__(self, pool: WorkerPool, rt: Runtime, env: dict[str, str]) -> None:
        self.pool, self.rt, self.env = pool, rt, env
        self.sent = 0.0
        """When the first run waiting on ``overnight`` was submitted."""
        queue = env["RUNNER_QUEUE"]
        self.default, self.gpu, self.overnight = queue, f"{queue}.gpu", f"{queue}.overnight"


@pytest.fixture(scope="module")
def fleet(worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A deployment with a prefork worker on the default queue and a threads worker on the
    default and ``gpu`` queues; three runs wait on ``overnight``, which neither consumes."""
    logdir = str(tmp_path_factory.mktemp("fleet"))
    with private_pool(worker_env, logdir) as (pool, rt, env):
        pool.start(concurrency=2)
        pool.env["RUNNER_WORKER_QUEUES"] = "default,gpu"
        pool.env["RUNNER_APP_VERSION"] = "fleet-2"  # the first runs its flows' hashes
        pool.start(concurrency=3, pool="threads")
        found = Fleet(pool, rt, env)
        found.sent = time.time()
        for _ in range(3):
            submit(OvernightFlow, {}, rt=rt)
        yield found


def test_runner_workers_shows_each_worker_and_each_queue_backlog(
    fleet: Fleet, tmp_path: Path
) -> None:
    first, second = (w.name for w in fleet.pool.workers)
    release = tmp_path / "release"
    napping = submit(DozeFlow, {"seconds": 120, "release": str(release)}, rt=fleet.rt)
    time.sleep(1.0)  # the overnight messages are a second old at least

    def busy() -> dict[str, Any] | None:
        found = workers_json(fleet.env)
        return found if sum(w["busy"] or 0 for w in found["workers"]) == 1 else None

    found = eventually(busy, timeout=20, interval=0.3)
    asked = time.time()
    assert found["broker"] == "redis"
    workers = {w["name"]: w for w in found["workers"]}
    assert set(workers) == {first, second}
    assert workers[first]["queues"] == [fleet.default]
    assert workers[second]["queues"] == [fleet.default, fleet.gpu]  # no version twin
    # The code versions each runs: RUNNER_APP_VERSION, else a hash of each flow's code.
    assert workers[second]["versions"] == ["fleet-2"]
    hashes = workers[first]["versions"]
    assert hashes and "fleet-2" not in hashes
    assert (workers[first]["pool"], workers[first]["concurrency"]) == ("prefork", 2)
    assert (workers[second]["pool"], workers[second]["concurrency"]) == ("threads", 3)
    running = [t for w in workers.values() for t in w["running"]]
    assert len(running) == 1 and running[0].startswith("DozeFlow.nap ")
    for worker in workers.values():
        assert worker["answered"] is True
        assert worker["celery_version"] == "5.7.0" and worker["runner_version"]
        # The roster is written every recovery interval (0.5 s here).
        assert 0 <= worker["heartbeat_age"] < 3
        assert abs(asked - worker["heartbeat_age"] - worker["last_heartbeat"]) < 5
        pids = {w.name: w.proc.pid for w in fleet.pool.workers if w.proc is not None}
        assert worker["pid"] == pids[worker["name"]]
    assert found["gone"] == []

    queues = {q["queue"]: q for q in found["queues"]}
    assert list(queues) == [fleet.default, fleet.gpu, fleet.overnight]  # default first
    assert queues[fleet.default] == {
        "queue": fleet.default,
        "name": "default",
        "depth": 0,
        "oldest_seconds": 0.0,
        "consumers": sorted([first, second]),
        "versions": [
            {
                "version": version,
                "queue": f"{fleet.default}@{version}",
                "depth": 0,
                "oldest_seconds": 0.0,
                "consumers": [second if version == "fleet-2" else first],
            }
            for version in sorted([*hashes, "fleet-2"])
        ],
    }
    # gpu's twins: the second worker's version consumed; the first's hashes known from its
    # flows' routes, consumed by none, yet not queues of their own.
    gpu_twins = {t["version"]: t["consumers"] for t in queues[fleet.gpu]["versions"]}
    assert gpu_twins == {"fleet-2": [second], **{h: [] for h in hashes}}
    assert queues[fleet.gpu]["name"] == "gpu" and queues[fleet.gpu]["consumers"] == [second]
    overnight = queues[fleet.overnight]
    assert (overnight["name"], overnight["depth"], overnight["consumers"]) == ("overnight", 3, [])
    # Its oldest message was sent when the fixture submitted the first run.
    assert 1.0 <= overnight["oldest_seconds"] <= asked - fleet.sent + 0.5

    # The same, for a person.
    shown = runner_cli(fleet.env, "workers")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    row = next(line for line in lines if line.startswith(second))
    assert "default, gpu" in row and "threads (3)" in row and "ago" in row
    assert "celery 5.7.0" in row and "fleet-2" in row
    overnight_row = next(line for line in lines if line.startswith("overnight"))
    assert fleet.overnight in overnight_row
    assert "3" in overnight_row.split() and "none: no live worker consumes it" in overnight_row
    release.touch()
    assert RunHandle(napping.run_id, fleet.rt).wait(timeout=30) is RunStatus.SUCCEEDED


def test_the_console_serves_the_queues_gauges_and_the_workers_api(fleet: Fleet) -> None:
    with serving(fleet.rt, token=TOKEN) as url:
        samples = scrape(f"{url}/metrics")
        api = httpx.get(
            f"{url}/api/workers", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
    assert samples[("runner_queue_depth", fleet.overnight)] == 3
    assert samples[("runner_queue_depth", fleet.default)] == 0
    assert samples[("runner_queue_oldest_seconds", fleet.default)] == 0
    age = samples[("runner_queue_oldest_seconds", fleet.overnight)]
    assert 0 < age <= time.time() - fleet.sent + 0.5
    assert api.status_code == 200, api.text
    body = api.json()
    assert {w["name"] for w in body["workers"]} == {w.name for w in fleet.pool.workers}
    assert {q["queue"]: q["depth"] for q in body["queues"]}[fleet.overnight] == 3


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent")
def test_the_workers_page_in_chromium(fleet: Fleet, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    first, second = (w.name for w in fleet.pool.workers)
    with serving(fleet.rt, token=TOKEN) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"]
        )
        try:
            tab = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            problems: list[str] = []
            tab.on("pageerror", lambda exc: problems.append(str(exc)))
            tab.set_default_timeout(10_000)
            tab.goto(f"{url}/login")
            tab.fill("input[name=token]", TOKEN)
            tab.click("button[type=submit]")
            tab.wait_for_url(f"{url}/")
            tab.click("header nav a:text-is('Workers')")
            tab.wait_for_url(f"{url}/workers")
            expect(tab).to_have_title("workers · runner console")
            row = tab.locator(f"tr[data-worker='{second}']")
            expect(row).to_contain_text("threads (3)")
            expect(row.locator(".queue[data-queue]")).to_have_text(["default", "gpu"])
            expect(tab.locator(f"tr[data-worker='{first}']")).to_contain_text("prefork (2)")
            expect(tab.locator(f"tr[data-worker='{first}'] .busy")).to_have_text("0/2")
            queue = tab.locator(f"tr[data-queue='{fleet.overnight}']")
            expect(queue.locator(".depth")).to_have_text("3")
            expect(queue.locator(".consumers")).to_have_text("none: no live worker consumes it")
            expect(queue.locator(".oldest")).to_have_text(re.compile(r"^\d+(\.\d+)?s$|^\dm"))
            # The tables refresh themselves: a step running now shows as a busy slot.
            release = tmp_path / "release"
            submit(DozeFlow, {"seconds": 120, "release": str(release)}, rt=fleet.rt)
            expect(tab.locator("tr[data-worker][data-busy='1']")).to_have_count(1, timeout=15_000)
            release.touch()
            # Nothing overflows sideways at 1280 px.
            width = tab.evaluate("document.documentElement.scrollWidth")
            assert width <= 1280
            assert problems == []
        finally:
            browser.close()


def test_a_killed_worker_is_gone_and_no_live_worker_is_one_line(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, _rt, env):
        pool.start(concurrency=1)
        pool.start(concurrency=1)
        killed, stopped = pool.workers
        eventually(lambda: len(workers_json(env)["workers"]) == 2, timeout=10)
        pool.kill(killed.proc)  # type: ignore[arg-type]
        # Its word lapses (3 recovery intervals, at least 2 s): listed as gone, not live.
        found = eventually(lambda: (f := workers_json(env))["gone"] and f, timeout=15, interval=0.5)
        assert [w["name"] for w in found["workers"]] == [stopped.name]
        assert [w["name"] for w in found["gone"]] == [killed.name]
        assert found["gone"][0]["heartbeat_age"] >= 2
        shown = runner_cli(env, "workers")
        assert f"gone: {killed.name} (last heartbeat" in shown.stdout

        stopped.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        stopped.proc.wait(timeout=20)  # type: ignore[union-attr]
        shown = runner_cli(env, "workers")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[0] == "no live worker (redis broker)"
        # A warm shutdown removes its record: it is not "gone", it left.
        assert stopped.name not in shown.stdout
        # (The roster itself lapses a few intervals after the last worker's write: the killed
        # one may be listed as gone or, on a slow machine, no longer at all.)
        found = workers_json(env)
        assert found["workers"] == []
        assert [w["name"] for w in found["gone"]] in ([killed.name], [])


def _rabbit_down() -> str | None:
    try:
        with Connection(AMQP, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=0)
    except Exception as exc:  # any failure to connect: no RabbitMQ to test against
        return f"no RabbitMQ at {AMQP}: {type(exc).__name__}: {exc}"
    return None


def test_on_rabbitmq_depth_is_the_broker_count_and_age_is_not_measured(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    down = _rabbit_down()
    if down:
        pytest.skip(down)
    with private_pool(worker_env, str(tmp_path), RUNNER_BROKER_URL=AMQP) as (pool, rt, env):
        queue = env["RUNNER_QUEUE"]
        try:
            pool.start(concurrency=1)
            for _ in range(2):
                submit(OvernightFlow, {}, rt=rt)
            found = eventually(
                lambda: (f := workers_json(env))["queues"][-1]["depth"] == 2 and f, timeout=15
            )
            assert found["broker"] == "amqp"
            assert [w["name"] for w in found["workers"]] == [pool.workers[0].name]
            queues = {q["queue"]: q for q in found["queues"]}
            assert queues[f"{queue}.overnight"]["oldest_seconds"] is None
            assert queues[f"{queue}.overnight"]["consumers"] == []
            assert queues[queue]["depth"] == 0
            assert "not measured on RabbitMQ" in found["oldest_age"]
            with serving(rt, token=TOKEN) as url:
                samples = scrape(f"{url}/metrics")
            assert samples[("runner_queue_depth", f"{queue}.overnight")] == 2
            # No age is better than a made-up one: the gauge has no sample for the queue.
            assert ("runner_queue_oldest_seconds", f"{queue}.overnight") not in samples
            shown = runner_cli(env, "workers")
            assert "oldest: not measured on RabbitMQ" in shown.stdout
        finally:
            pool.discard()
            with Connection(AMQP) as conn:
                for name in (queue, f"{queue}.overnight"):
                    conn.default_channel.queue_delete(name)


def test_a_bad_timeout_is_one_line_and_exit_2(worker_env: dict[str, str]) -> None:
    done = runner_cli(worker_env, "workers", "--timeout", "0")
    assert done.returncode == 2
    assert done.stderr == "error: --timeout must be more than 0 seconds\n"
    assert done.stdout == ""


def test_a_worker_too_busy_to_answer_is_listed_from_its_heartbeat(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    # A solo pool runs the step in the worker's own thread: Celery's remote control cannot
    # answer until it ends, but the worker's heartbeat (a thread of its own) goes on.
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        pool.start(concurrency=1, pool="solo")
        [solo] = pool.workers
        release = tmp_path / "release"
        handle = submit(DozeFlow, {"seconds": 120, "release": str(release)}, rt=rt)
        # The worker took the message (prefetch 1: to run it), and is in the step.
        eventually(lambda: broker.queue_length(rt.app, env["RUNNER_QUEUE"]) == 0)
        time.sleep(1.0)
        found = workers_json(env)
        [worker] = found["workers"]
        assert worker["name"] == solo.name and worker["answered"] is False
        assert (worker["busy"], worker["pool"]) == (None, None)
        assert worker["queues"] == [env["RUNNER_QUEUE"]]  # from its own word in Redis
        assert worker["heartbeat_age"] < 3
        shown = runner_cli(env, "workers", "--timeout", "0.5")
        row = next(line for line in shown.stdout.splitlines() if line.startswith(solo.name))
        assert "no answer" in row and "default" in row
        release.touch()
        assert handle.wait(timeout=30) is RunStatus.SUCCEEDED
        # Idle again, it answers.
        [worker] = workers_json(env)["workers"]
        assert (worker["answered"], worker["pool"], worker["busy"]) == (True, "solo", 0)
