"""A run's priority where people look (``runner status``, the console's run page and
``GET /api/runs/{id}``), schedules that take one (``runner schedule add --priority``; each
tick's run goes with it on a real worker), and a crew task's ``priority=``.

The CLI runs as a subprocess and the console over HTTP; the runs, ticks and crew tasks run on
the session's test worker.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import pytest

from runner.distributed import broker
from runner.distributed.client import submit
from runner.store.models import RunStatus
from runner.store.schedules import ScheduleBook
from tests._dist_support import eventually, runner_cli
from tests.console_support import serving
from tests.flows.flow_control import notes
from tests.flows.priorities import PacedFlow
from tests.flows.priority_crews import triage_crew
from tests.flows.timing import GreetFlow


def ok(env: dict[str, str], *args: str) -> str:
    done = runner_cli(env, *args)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def test_status_and_the_console_show_a_runs_priority_and_nothing_for_a_run_without_one(
    rt: Any, worker_env: dict[str, str]
) -> None:
    # 0, the lowest, is a priority too (a view that tests it for truth would hide it).
    lowest = submit(GreetFlow, {"customer": "ada"}, priority=0, rt=rt)
    high = submit(GreetFlow, {"customer": "bo"}, priority=9, rt=rt)
    plain = submit(GreetFlow, {"customer": "cy"}, rt=rt)
    for handle in (lowest, high, plain):
        assert handle.wait(timeout=30) is RunStatus.SUCCEEDED

    shown = ok(worker_env, "status", lowest.run_id)
    assert re.search(r"^\s*priority\s+0 \(0 lowest, 9 highest\)\s*$", shown, re.M), shown
    assert re.search(
        r"^\s*priority\s+9 \(0 lowest, 9 highest\)", ok(worker_env, "status", high.run_id), re.M
    )
    assert "priority" not in ok(worker_env, "status", plain.run_id)
    assert '"priority": 0' in ok(worker_env, "status", lowest.run_id, "--json")
    assert '"priority": null' in ok(worker_env, "status", plain.run_id, "--json")

    with serving(rt) as url, httpx.Client(base_url=url) as http:
        assert http.get(f"/api/runs/{lowest.run_id}").json()["priority"] == 0
        assert http.get(f"/api/runs/{high.run_id}").json()["priority"] == 9
        assert http.get(f"/api/runs/{plain.run_id}").json()["priority"] is None
        page = http.get(f"/runs/{lowest.run_id}").text
        assert "<dt>priority</dt>" in page
        assert '<dd class="priority">0 (0 lowest, 9 highest)</dd>' in page
        assert "<dt>priority</dt>" not in http.get(f"/runs/{plain.run_id}").text


def test_a_schedules_ticks_start_runs_of_its_priority_on_a_worker(
    rt: Any, worker_env: dict[str, str]
) -> None:
    name = f"prio-{uuid.uuid4().hex[:6]}"
    group = uuid.uuid4().hex[:8]
    ok(
        worker_env,
        *("schedule", "add", name, PacedFlow.flow_path(), "--every", "1s"),
        *("-i", f"group={group}", "--priority", "8"),
    )
    try:
        # The worker's recovery pass fires the ticks; each run's step notes its message's.
        (first, *_) = eventually(lambda: notes(group, "paced"), timeout=20)
    finally:
        ok(worker_env, "schedule", "pause", name)
    run_id = str(first["run"])
    assert run_id.startswith(f"{name}-")
    latest = rt.store.latest(run_id)
    assert latest is not None and latest.meta.scheduling.priority == 8
    assert broker.wire_priority(rt.app, int(str(first["priority"]))) == 8
    assert re.search(r"^\s*priority\s+8 ", ok(worker_env, "status", run_id), re.M)

    (listed,) = [
        s for s in json.loads(ok(worker_env, "schedule", "list", "--json")) if s["name"] == name
    ]
    assert listed["priority"] == 8
    row = next(line for line in ok(worker_env, "schedule", "list").splitlines() if name in line)
    assert re.search(r"\bno\W+8\W+paused\b", row), row  # catch-up, priority, state
    with serving(rt) as url, httpx.Client(base_url=url) as http:
        (api,) = [s for s in http.get("/api/schedules").json()["schedules"] if s["name"] == name]
        assert api["priority"] == 8
        assert re.search(r"<td>no</td><td>8</td>", http.get("/schedules").text)
    ok(worker_env, "schedule", "remove", name)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10", "--priority=10: must be an int from 0 (the lowest) to 9 (the highest)"),
        ("-1", "--priority=-1: must be an int from 0 (the lowest) to 9 (the highest)"),
        ("high", "Invalid value for '--priority'"),
    ],
)
def test_a_bad_schedule_priority_is_refused_in_one_line_and_stores_nothing(
    rt: Any, worker_env: dict[str, str], value: str, message: str
) -> None:
    name = f"bad-{uuid.uuid4().hex[:6]}"
    done = runner_cli(
        worker_env,
        *("schedule", "add", name, GreetFlow.flow_path(), "--every", "5s", "--priority", value),
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert message in done.stderr
    assert all(s.name != name for s in ScheduleBook(rt.store).all())


def test_a_crew_tasks_priority_goes_with_its_step_unless_its_run_has_one(rt: Any) -> None:
    own, given = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    runs = [
        triage_crew.submit({"group": own}, rt=rt),
        triage_crew.submit({"group": given}, priority=2, rt=rt),
    ]
    for handle in runs:
        assert handle.wait(timeout=30) is RunStatus.SUCCEEDED

    def priorities(group: str) -> dict[str, int]:
        found = notes(group, "tasks")
        return {
            str(n["task"]): broker.wire_priority(rt.app, int(str(n["priority"]))) for n in found
        }

    # The task's 7, the default 5 for the task without one; the run's 2 for both.
    assert priorities(own) == {"triage": 7, "reply": 5}
    assert priorities(given) == {"triage": 2, "reply": 2}
