"""Schedules: ``runner schedule`` and ``ScheduleBook``, fired by the workers' recovery pass,
exactly once per tick however many workers (or threads) fire them."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from runner.cli import app
from runner.distributed.client import RunHandle, submit
from runner.distributed.recovery import recover
from runner.distributed.schedules import fire_due
from runner.errors import InvalidInputs, RunStateError
from runner.store.schedules import ScheduleBook, make_schedule, run_id_of
from tests._dist_support import eventually, private_pool, recovery_passes
from tests.flows.dist import executions
from tests.flows.timing import GreetFlow
from tests.test_cli import Cli, cli  # noqa: F401  (fixture)
from tests.test_deadlines import idle_rt  # noqa: F401  (fixture)

GREET = "tests.flows.timing:GreetFlow"


def ticks_of(rt: Any, name: str) -> list[float]:
    """The ticks of the runs schedule ``name`` started, in order."""
    ids = [info.run_id for info in rt.store.runs(limit=10_000)]
    stamps = sorted(i.removeprefix(f"{name}-") for i in ids if i.startswith(f"{name}-"))
    return [datetime.strptime(s, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp() for s in stamps]


@pytest.mark.slow
def test_a_schedule_every_2s_fired_by_three_workers_makes_one_run_per_tick(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        pool.start_many(3, concurrency=1)
        name = f"every2-{uuid.uuid4().hex[:6]}"
        cli = Cli(env)
        cli.ok("schedule", "add", name, GREET, "--every", "2s", "--input", "customer=sam")
        eventually(lambda: len(ticks_of(rt, name)) >= 4, timeout=30)
        cli.ok("schedule", "pause", name)
        recovery_passes(rt, 2)  # a pass that read the schedule before the pause has ended
        ticks = ticks_of(rt, name)
        assert len(ticks) >= 4, ticks
        assert [b - a for a, b in itertools.pairwise(ticks)] == [2.0] * (len(ticks) - 1)
        for tick in ticks:
            run_id = run_id_of(name, tick)
            assert RunHandle(run_id, rt).result(timeout=20) == len("hello sam")
            assert executions(redis_client, run_id, "greet") == 1
        # Paused: no more runs, though the next tick is due and passes went by since.
        due = ticks[-1] + 2
        eventually(lambda: time.time() > due, timeout=10)
        recovery_passes(rt, 2)
        assert ticks_of(rt, name) == ticks


def test_many_firers_at_once_and_a_firer_that_died_before_recording_make_one_run_per_tick(
    idle_rt: Any,  # noqa: F811
) -> None:
    book = ScheduleBook(idle_rt.store)
    name = f"race-{uuid.uuid4().hex[:6]}"
    book.add(make_schedule(name, GREET, {"customer": "tom"}, every=1, catch_up=True))
    first = book.next_tick(name)
    assert first is not None
    now = first + 2.5  # three ticks due: first, first + 1, first + 2
    gate = threading.Barrier(8)
    fired: list[list[str]] = []

    def firer() -> None:
        gate.wait()
        fired.append(fire_due(idle_rt, now))

    threads = [threading.Thread(target=firer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [run_id_of(name, first + k) for k in range(3)]
    assert expected in fired and all(set(got) <= set(expected) for got in fired)
    book.advance(name, first)  # a firer that died before recording its ticks
    assert fire_due(idle_rt, now) == expected  # fires them again ...
    assert ticks_of(idle_rt, name) == [first, first + 1, first + 2]  # ... making no new run
    for run_id in expected:
        created = idle_rt.store.history(run_id, limit=100)
        assert len(created) == 1  # the create-only commit, once
        assert created[0].state["customer"] == "tom"
    assert book.next_tick(name) == first + 3


def test_without_catch_up_only_the_latest_missed_tick_fires(idle_rt: Any) -> None:  # noqa: F811
    book = ScheduleBook(idle_rt.store)
    name = f"skip-{uuid.uuid4().hex[:6]}"
    book.add(make_schedule(name, GREET, {"customer": "uma"}, every=1))
    first = book.next_tick(name)
    assert first is not None
    assert fire_due(idle_rt, first + 4.5) == [run_id_of(name, first + 4)]
    assert book.next_tick(name) == first + 5
    assert ticks_of(idle_rt, name) == [first + 4]
    book.set_paused(name, True)
    assert fire_due(idle_rt, first + 9.5) == []


def test_cli_lists_pauses_resumes_and_removes_a_cron_schedule(cli: Cli) -> None:  # noqa: F811
    name = f"nightly-{uuid.uuid4().hex[:6]}"
    added = cli.ok("schedule", "add", name, GREET, "--cron", "0 3 * * *", "-i", "customer=vi")
    assert f"added schedule {name} (cron 0 3 * * *)" in added.stdout
    (shown,) = [s for s in cli.json("schedule", "list") if s["name"] == name]
    tick = datetime.fromtimestamp(shown["next_tick"], UTC)
    assert (tick.hour, tick.minute, tick.second) == (3, 0, 0)
    assert shown["inputs"] == {"customer": "vi"} and shown["paused"] is False
    assert name in cli.ok("schedule", "list").stdout
    cli.ok("schedule", "pause", name)
    assert [s["paused"] for s in cli.json("schedule", "list") if s["name"] == name] == [True]
    cli.ok("schedule", "resume", name)
    assert [s["paused"] for s in cli.json("schedule", "list") if s["name"] == name] == [False]
    cli.ok("schedule", "remove", name)
    assert all(s["name"] != name for s in cli.json("schedule", "list"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "x1", GREET, "--cron", "61 * * * *"], "--cron '61 * * * *'"),
        (["add", "x2", GREET], "give a schedule --cron or --every"),
        (["add", "x3", GREET, "--every", "0.5"], "at least 1 second"),
        (["add", "bad name", GREET, "--every", "5s"], "schedule name 'bad name'"),
        (["add", "x4", GREET, "--every", "5s", "-i", "nope=1"], "no field(s) nope"),
        (
            ["add", "x5", "tests.test_allow_list:StrayFlow", "--every", "5s"],
            "tests.test_allow_list:StrayFlow is not in the workers' allow-list",
        ),
        (["pause", "no-such-schedule"], "no schedule no-such-schedule"),
        (["remove", "no-such-schedule"], "no schedule no-such-schedule"),
    ],
)
def test_bad_schedules_are_refused_with_one_line_and_store_nothing(
    cli: Cli,  # noqa: F811
    args: list[str],
    message: str,
) -> None:
    before = cli.json("schedule", "list")
    result = cli("schedule", *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
    assert message in result.stderr
    assert cli.json("schedule", "list") == before


def test_a_schedule_name_is_taken_once(idle_rt: Any) -> None:  # noqa: F811
    book = ScheduleBook(idle_rt.store)
    name = f"once-{uuid.uuid4().hex[:6]}"
    book.add(make_schedule(name, GREET, every=60))
    with pytest.raises(RunStateError, match=f"schedule {name} exists"):
        book.add(make_schedule(name, GREET, every=30))
    book.remove(name)
    with pytest.raises(InvalidInputs, match=f"no schedule {name}"):
        book.remove(name)


def test_schedule_help_lists_its_commands() -> None:
    shown = CliRunner().invoke(app, ["schedule", "--help"]).stdout
    assert all(word in shown for word in ("add", "list", "pause", "resume", "remove"))


def test_an_unreadable_schedule_stops_neither_the_others_nor_the_recovery_pass(
    idle_rt: Any,  # noqa: F811
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    idle_rt.flows[GreetFlow.flow_name()] = GreetFlow  # as a worker registers it
    redis_client.hset(idle_rt.store.keys.schedules(), "broken", "{not json")
    handle = submit(GREET, {"customer": "zoe"}, countdown=0.3, rt=idle_rt)
    time.sleep(0.5)
    book = ScheduleBook(idle_rt.store)
    book.add(make_schedule("fine", GREET, {"customer": "zoe"}, every=1))
    book.advance("fine", float(int(time.time()) - 1))  # a tick due a second ago
    assert recover(idle_rt, force=True) == {handle.run_id: ["greet#1"]}
    assert [s.name for s in book.all()] == ["fine"]
    assert ticks_of(idle_rt, "fine")  # the readable schedule fired
    assert "schedule broken cannot be read" in caplog.text
