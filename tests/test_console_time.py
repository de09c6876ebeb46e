"""The console's Schedules page and API, and a run page's delayed start, durable sleep and
deadline."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from runner.distributed.client import submit
from runner.store.schedules import ScheduleBook, make_schedule
from tests.console_support import serving
from tests.flows.timing import GreetFlow, NapFlow, SlowFlow
from tests.test_sleep import asleep_checkpoint

GREET = "tests.flows.timing:GreetFlow"


def test_the_schedules_page_and_api_list_each_schedule(rt: Any) -> None:
    book = ScheduleBook(rt.store)
    name = f"page-{uuid.uuid4().hex[:6]}"
    book.add(make_schedule(name, GREET, {"customer": "xi"}, cron="0 3 * * *"))
    try:
        with serving(rt) as url, httpx.Client(base_url=url) as http:
            (shown,) = [
                s for s in http.get("/api/schedules").json()["schedules"] if s["name"] == name
            ]
            assert shown["when"] == "cron 0 3 * * *" and shown["inputs"] == {"customer": "xi"}
            page = http.get("/schedules")
            assert page.status_code == 200
            assert name in page.text and "cron 0 3 * * *" in page.text
            assert 'href="/schedules"' in http.get("/").text
    finally:
        book.remove(name)


def test_a_run_page_shows_a_delayed_start_a_durable_sleep_and_a_deadline(rt: Any) -> None:
    later = submit(GreetFlow, {"customer": "yu"}, countdown=60, rt=rt)
    napping = submit(NapFlow, {"seconds": 30}, rt=rt)
    late = submit(SlowFlow, {"seconds": 3}, deadline=1, rt=rt)
    asleep_checkpoint(napping)
    assert late.wait(timeout=10).value == "cancelled"
    with serving(rt) as url, httpx.Client(base_url=url) as http:
        detail = http.get(f"/api/runs/{later.run_id}").json()
        assert detail["scheduled_until"] > time.time() + 30
        assert "scheduled" in http.get(f"/runs/{later.run_id}").text
        detail = http.get(f"/api/runs/{napping.run_id}").json()
        assert detail["sleeping"]["nap#1"].startswith("sleeping until")
        assert "nap#1 sleeping until" in http.get(f"/runs/{napping.run_id}").text
        detail = http.get(f"/api/runs/{late.run_id}").json()
        assert detail["cancel_reason"].startswith("its deadline passed")
        assert "its deadline passed" in http.get(f"/runs/{late.run_id}").text
    later.cancel()
    napping.cancel()
