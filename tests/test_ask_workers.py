"""``self.ask`` on workers: an unanswered question pauses the run durably (the state so far
kept, no worker holding it), each answer sends the method again from its start with the
answers so far replayed (nothing before it runs again), and a question's timeout is a
deadline in the store after which the run goes on with ``None`` though nobody answers."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from runner import CheckpointConfig
from runner.distributed import control
from runner.distributed.client import RunHandle
from runner.errors import RunFailed, RunStateError
from runner.store.models import RunStatus
from runner.store.timers import ANSWERS, Timers
from tests import cli_support
from tests._dist_support import private_pool, recovery_passes
from tests.flows.asking import (
    DeadlineFlow,
    DeskInterviewFlow,
    InterviewFlow,
    LockedFlow,
    PanelFlow,
)
from tests.flows.dist import executions
from tests.test_cli import Cli


def asked(handle: RunHandle, message: str, timeout: float = 20) -> Any:
    """The run's checkpoint once it is paused on ``message``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = handle.latest()
        waits = latest.meta.human.awaiting
        if latest.status is RunStatus.PAUSED and waits is not None and waits.message == message:
            return latest
        time.sleep(0.05)
    raise AssertionError(f"run {handle.run_id} did not ask {message!r}: {handle.latest().event}")


def next_pause(handle: RunHandle, timeout: float = 20) -> Any:
    """The run's checkpoint once it is paused on a question (after an answer: the next), or
    once it ended. A question put while another step still runs is not a pause yet: the run
    is running, with that question waiting, until the other step settles."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = handle.latest()
        paused = latest.status is RunStatus.PAUSED and latest.meta.human.awaiting is not None
        if latest.status.finished or paused:
            return latest
        time.sleep(0.05)
    raise AssertionError(f"run {handle.run_id} did not pause: {handle.latest().event}")


def recorded(handle: RunHandle) -> dict[str, list[Any]]:
    """Each activation's answers as the run's history recorded them (an activation's
    answers go with its commit, so the latest checkpoint of a finished run has none)."""
    found: dict[str, list[Any]] = {}
    for ckpt in reversed(handle.rt.store.history(handle.run_id, limit=200)):  # oldest first
        found.update(ckpt.meta.human.answers)
    return found


def answered(handle: RunHandle, activation: str, timeout: float = 20) -> None:
    """Wait until ``activation`` of the run has an answer recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if recorded(handle).get(activation):
            return
        time.sleep(0.05)
    raise AssertionError(f"run {handle.run_id} got no answer: {handle.latest().event}")


def test_each_question_pauses_the_run_and_its_answer_goes_on_where_it_stopped(
    rt: Any, redis_client: redis.Redis, worker_env: dict[str, str]
) -> None:
    handle = InterviewFlow.submit({}, rt=rt)
    first = asked(handle, "your name?")
    waits = first.meta.human.awaiting
    assert (waits.kind, waits.activation, waits.method) == ("ask", "interview#1", "interview")
    assert waits.metadata == {"channel": "#ops"} and waits.deadline is None
    assert first.state["stage"] == "asked for a name"  # the state so far, kept while it waits
    assert rt.coord.leases(handle.run_id) == {}  # no worker holds the step while it waits

    cli = Cli(dict(worker_env))
    assert "your name?" in cli.ok("status", handle.run_id).stdout
    handle.resume(feedback="Ana", by="lead")  # RunHandle.resume(feedback=) answers a question
    second = asked(handle, "favourite colour, Ana?")
    assert (second.state["name"], second.state["stage"]) == ("Ana", "asked for a colour")
    assert second.meta.human.awaiting.activation == "interview#1"

    cli.ok("resume", handle.run_id, "--feedback", "teal", "--by", "ana")  # and the CLI
    assert handle.result(timeout=30) == "ANA LIKES TEAL"
    assert executions(redis_client, handle.run_id, "greet") == 1  # earlier steps never again
    assert executions(redis_client, handle.run_id, "interview") == 3  # once per question + end
    assert executions(redis_client, handle.run_id, "close") == 1
    given = recorded(handle)["interview#1"]
    assert [(a.text, a.by, a.awaited.message) for a in given] == [
        ("Ana", "lead", "your name?"),
        ("teal", "ana", "favourite colour, Ana?"),
    ]


def test_a_question_nobody_answers_in_time_goes_on_with_none(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = DeadlineFlow.submit({"timeout": 1.0}, rt=rt)
    paused = asked(handle, "proceed?")
    deadline = paused.meta.human.awaiting.deadline
    assert deadline is not None
    assert abs(deadline - (paused.meta.human.awaiting.asked_at + 1.0)) < 0.01
    assert Timers(rt.store, ANSWERS).when(handle.run_id) == deadline  # kept in the store

    answered(handle, "question#1")  # by nobody
    assert handle.result(timeout=20) == "no answer"
    (given,) = recorded(handle)["question#1"]
    assert given.text is None and given.by is None
    assert given.at >= deadline
    assert executions(redis_client, handle.run_id, "question") == 2
    assert Timers(rt.store, ANSWERS).when(handle.run_id) is None  # dealt with, dropped


def test_status_shows_when_an_unanswered_question_goes_on_with_none(
    rt: Any, worker_env: dict[str, str]
) -> None:
    handle = DeadlineFlow.submit({"timeout": 600.0}, rt=rt)
    deadline = asked(handle, "proceed?").meta.human.awaiting.deadline
    shown = cli_support.run("status", handle.run_id, env={**worker_env, "COLUMNS": "120"})
    assert shown.returncode == 0, shown.stderr
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(deadline))
    line = re.escape(at) + r" \(in 9m \d\ds\): then it goes on with None"
    assert re.search(r"timeout\s+" + line, shown.stdout), shown.stdout
    control.answer(handle.run_id, "yes", by="ana", rt=rt)
    assert handle.result(timeout=20) == "yes"


def test_a_question_answered_before_its_deadline_is_not_answered_again(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = DeadlineFlow.submit({"timeout": 1.5}, rt=rt)
    deadline = asked(handle, "proceed?").meta.human.awaiting.deadline
    control.answer(handle.run_id, "yes", by="ana", rt=rt)
    assert handle.result(timeout=20) == "yes"
    time.sleep(max(deadline - time.time(), 0))
    recovery_passes(rt, 2)  # the deadline and a recovery pass go by
    (given,) = recorded(handle)["question#1"]
    assert (given.text, given.by) == ("yes", "ana")
    assert handle.status() is RunStatus.SUCCEEDED
    assert executions(redis_client, handle.run_id, "question") == 2
    assert Timers(rt.store, ANSWERS).when(handle.run_id) is None


def test_a_provider_the_flow_names_answers_on_workers_too_and_nothing_pauses(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = DeskInterviewFlow.submit({}, rt=rt)
    assert handle.result(timeout=30) == "BO LIKES RED"
    assert executions(redis_client, handle.run_id, "interview") == 1
    history = rt.store.history(handle.run_id, limit=50)
    assert RunStatus.PAUSED not in {c.status for c in history}
    assert recorded(handle) == {}


def test_a_question_whose_metadata_has_no_json_form_fails_its_step_saying_so(rt: Any) -> None:
    handle = LockedFlow.submit({}, rt=rt)
    with pytest.raises(RunFailed):
        handle.result(timeout=30)
    error = handle.latest().error
    assert error is not None and error.type == "NotSerializable"
    assert error.message.startswith(
        "the metadata of ask_with_a_lock's ask is not JSON-serializable: "
    )


def test_parallel_questions_are_each_asked_and_answered_in_turn_and_the_join_runs_once(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = PanelFlow.submit({}, rt=rt)
    asked_of = set()
    while (latest := next_pause(handle)).status is RunStatus.PAUSED:
        asked_of.add(latest.meta.human.awaiting.metadata["user"])
        try:
            control.answer(handle.run_id, "yes", rt=rt)
        except RunStateError:
            # The run moved on between our read and the answer (the other question parked
            # meanwhile): as the error says, read the question again and answer that.
            continue
    assert asked_of == {"alice", "bob"}  # one question at a time, none lost
    assert handle.result(timeout=30) == "both answered"
    answers = recorded(handle)
    assert {k: [a.text for a in v] for k, v in answers.items()} == {
        "ask_alice#1": ["yes"],
        "ask_bob#1": ["yes"],
    }
    assert executions(redis_client, handle.run_id, "report") == 1


@pytest.mark.slow
def test_a_question_outlives_every_worker_and_its_timeout_is_kept_while_none_is_up(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _):
        first = pool.start(concurrency=1)
        handle = RunHandle(DeadlineFlow.submit({"timeout": 1.0}, rt=rt).run_id, rt)
        deadline = asked(handle, "proceed?").meta.human.awaiting.deadline
        pool.kill(first)  # no worker is up when the deadline passes
        time.sleep(max(deadline - time.time(), 0) + 0.2)  # past it, no worker up
        assert handle.status() is RunStatus.PAUSED and not recorded(handle)
        pool.start(concurrency=1)  # the first recovery pass of the new worker answers
        answered(handle, "question#1")
        assert handle.result(timeout=30) == "no answer"
        assert executions(redis_client, handle.run_id, "question") == 2


class Clerk:
    """An input provider in this process: answers every question it is given, and notes it."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.asked: list[str] = []

    def request_input(self, message: str, flow: Any, metadata: Any = None) -> str:
        self.asked.append(message)
        return self.answer


@pytest.mark.slow
def test_a_run_answered_on_workers_goes_on_in_process_replaying_its_answers(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _):
        worker = pool.start(concurrency=1)
        handle = RunHandle(InterviewFlow.submit({}, rt=rt).run_id, rt)
        asked(handle, "your name?")
        pool.kill(worker)  # the answer's message waits in the queue; this process goes on
        control.answer(handle.run_id, "Ana", rt=rt)
        # Its answered step is queued for the workers, so the run is theirs (running): a
        # resume anywhere is refused until it is cancelled, and then it goes on here.
        handle.cancel()
        clerk = Clerk("teal")
        flow = InterviewFlow(input_provider=clerk)
        config = CheckpointConfig(provider=rt.store, restore_from=handle.run_id)
        assert flow.kickoff(from_checkpoint=config) == "ANA LIKES TEAL"
        assert clerk.asked == ["favourite colour, Ana?"]  # the first question was answered
        assert [e["response"] for e in flow._input_history] == ["Ana", "teal"]
        assert executions(redis_client, handle.run_id, "greet") == 1
        assert executions(redis_client, handle.run_id, "interview") == 2
