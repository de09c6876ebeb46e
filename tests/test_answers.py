"""A run that waits for a person's answer (the engine's primitive under ``ask`` and
``@human_feedback``): on workers it pauses durably with the question and the state so far,
no worker waiting; ``control.answer`` records the answer, who gave it, and sends the step
again; nothing before it runs again, and a plain resume or a wrong answer is refused."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from runner.distributed import control
from runner.errors import InvalidInputs, RunStateError
from tests._dist_support import paused
from tests.flows.answers import SignOffFlow
from tests.flows.dist import executions


def test_a_run_waits_for_an_answer_then_goes_on_where_it_stopped(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = SignOffFlow.submit({"topic": "otters"}, rt=rt)
    latest = paused(handle)
    awaiting = latest.meta.human.awaiting
    assert awaiting is not None
    assert (awaiting.kind, awaiting.activation, awaiting.method) == ("ask", "approve#1", "approve")
    assert awaiting.message == "approve 'draft on otters'?"
    assert latest.state["verdict"] == "pending"  # the state so far is kept while it waits
    assert latest.meta.human.pause_reason == awaiting.message

    with pytest.raises(RunStateError, match="awaits an answer at approve"):
        control.resume(handle.run_id, rt=rt)
    with pytest.raises(InvalidInputs, match="its outcomes: yes, no"):
        control.answer(handle.run_id, None, outcome="maybe", rt=rt)
    assert handle.latest().id == latest.id  # refusals store nothing

    with pytest.raises(RunStateError, match=r"now awaits approve .*, not publish"):
        control.answer(handle.run_id, "yes", step="publish", rt=rt)  # read another question
    assert handle.latest().id == latest.id  # refusals store nothing

    control.answer(handle.run_id, "looks good", by="ana", outcome="yes", step="approve#1", rt=rt)
    assert handle.result(timeout=30) == "published (yes by ana)"
    assert executions(redis_client, handle.run_id, "write") == 1
    assert executions(redis_client, handle.run_id, "approve") == 2
    assert executions(redis_client, handle.run_id, "publish") == 1
    history = rt.store.history(handle.run_id, limit=50)
    (answered,) = [c for c in history if c.meta.human.answers]
    (given,) = answered.meta.human.answers["approve#1"]  # the checkpoint that resumed with it
    assert (given.text, given.outcome, given.by) == ("looks good", "yes", "ana")
    assert given.awaited.message == awaiting.message
    # The step's answers went with its commit: later checkpoints do not carry them.
    assert handle.latest().meta.human.answers == {} and handle.latest().meta.human.awaiting is None

    with pytest.raises(RunStateError, match="awaits no answer"):
        control.answer(handle.run_id, "late", rt=rt)


def test_in_process_the_same_step_pauses_with_its_question() -> None:
    flow = SignOffFlow()
    outcome = flow.kickoff({"topic": "owls"})
    assert getattr(outcome, "reason", None) == "approve 'draft on owls'?"
    assert flow.state.verdict == "pending"


def test_the_cli_and_the_api_refuse_an_answer_to_a_question_the_run_no_longer_asks(
    rt: Any, worker_env: dict[str, str]
) -> None:
    from tests.test_cli import Cli

    handle = SignOffFlow.submit({"topic": "moles"}, rt=rt)
    latest = paused(handle)
    cli = Cli(worker_env)
    done = cli("resume", handle.run_id, "--feedback", "fine", "--step", "write")
    assert done.exit_code == 1
    assert done.stderr.strip().splitlines() == [
        f"error: run {handle.run_id} now awaits approve (\"approve 'draft on moles'?\"), "
        "not write: read the question again before answering"
    ]
    assert handle.latest().id == latest.id
    cli.ok("resume", handle.run_id, "--outcome", "no", "--step", "approve", "--by", "bo")
    assert handle.result(timeout=30) == "published (no by bo)"
    # The run's history says who answered what, where it resumed with the answer.
    listed = cli("checkpoints", handle.run_id, env={"COLUMNS": "200"})
    (line,) = [row for row in listed.stdout.splitlines() if "answered" in row]
    assert "approve answered by bo: -> no" in line and "resumed" in line
