"""``@human_feedback`` on real workers: a step whose output a person must review pauses the run
durably (the output under review and the method's state changes in the paused checkpoint, no
worker waiting); the answer routes to the label's listener; neither an earlier step nor the
reviewed method runs again."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from runner.cli import app
from runner.distributed import answers, control
from runner.errors import InvalidInputs, RunStateError
from runner.store.models import RunStatus
from tests._dist_support import eventually, paused
from tests.console_support import serving
from tests.flows.dist import executions, key
from tests.flows.reviews import (
    ArticleFlow,
    HeldTwinPauseFlow,
    HeldTwinReviewFlow,
    NotesFlow,
    TwinReviewFlow,
)


def ran(r: redis.Redis, run_id: str, *methods: str) -> list[int]:
    return [executions(r, run_id, m) for m in methods]


STEPS = ("research", "write", "review", "publish", "shelve")


def test_a_review_in_the_middle_pauses_and_the_answer_routes_without_rerunning_anything(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = ArticleFlow.submit({"topic": "otters"}, rt=rt)
    latest = paused(handle)
    waiting = latest.meta.human.awaiting
    assert waiting is not None
    assert (waiting.kind, waiting.method, waiting.activation) == ("feedback", "review", "review#1")
    assert waiting.output == {"title": "otters", "body": "draft from notes on otters"}
    assert (waiting.message, waiting.emit) == ("Publish this draft?", ["approved", "rejected"])
    assert waiting.metadata == {"channel": "#editors"}
    assert latest.state["verdict"] == "in review"  # the method's changes, kept with the pause
    assert ran(redis_client, handle.run_id, *STEPS) == [1, 1, 1, 0, 0]

    with pytest.raises(InvalidInputs, match="its outcomes: approved, rejected"):
        control.answer(handle.run_id, "", outcome="maybe", rt=rt)
    control.answer(handle.run_id, "ship it, lovely", by="ana", rt=rt)
    assert handle.result(timeout=30) == "published otters"
    assert ran(redis_client, handle.run_id, *STEPS) == [1, 1, 1, 1, 0]
    final = handle.latest()
    assert final.state["verdict"] == "published"
    assert final.state["heard"] == "ship it, lovely -> approved"  # self.last_human_feedback
    (kept,) = final.meta.human.feedback
    assert (kept["output"], kept["outcome"], kept["method_name"]) == (
        waiting.output,
        "approved",
        "review",
    )
    assert final.record.outputs["review"] == waiting.output  # the method's output, not the label
    assert final.record.routes["review"] == "approved"
    answered = [c for c in rt.store.history(handle.run_id, limit=100) if c.meta.human.answers]
    (given,) = answered[-1].meta.human.answers["review#1"]
    assert (given.text, given.by, given.awaited.method) == ("ship it, lovely", "ana", "review")
    with pytest.raises(RunStateError, match="awaits no answer"):
        control.answer(handle.run_id, "late", rt=rt)


def test_an_outcome_chosen_directly_routes_to_its_listener(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = ArticleFlow.submit({"topic": "eels"}, rt=rt)
    paused(handle)
    control.answer(handle.run_id, "", outcome="rejected", by="bo", rt=rt)
    assert handle.result(timeout=30) == "shelved"
    assert ran(redis_client, handle.run_id, *STEPS) == [1, 1, 1, 0, 1]


def test_a_review_without_emit_hands_its_result_to_the_listener_on_another_worker(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = NotesFlow.submit({"topic": "seals"}, rt=rt)
    assert paused(handle).meta.human.awaiting.output == "outline of seals"  # type: ignore[union-attr]
    control.answer(handle.run_id, "more detail", rt=rt)
    assert handle.result(timeout=30) == "expanded outline of seals with 'more detail'"
    assert ran(redis_client, handle.run_id, "outline", "expand") == [1, 1]


def test_two_reviews_paused_in_parallel_are_asked_in_turn_and_neither_method_runs_twice(
    rt: Any, redis_client: redis.Redis
) -> None:
    handle = TwinReviewFlow.submit({"topic": "kelp"}, rt=rt)
    first = paused(handle).meta.human.awaiting
    assert first is not None
    # The run has one question at a time, and the first stays asked: when both reviewed
    # methods ran before the first pause, the other review waits with it
    # (meta.human.reviews) and is asked next. The other method may be committing its review
    # while the answer is given: the answer is planned again on that commit, not refused.
    handle.resume(feedback=f"fine {first.method}")
    deadline, second = time.monotonic() + 30, None
    while second is None or second.method == first.method:
        assert time.monotonic() < deadline, "the other review was never asked"
        latest = handle.latest()
        second = latest.meta.human.awaiting if latest.status is RunStatus.PAUSED else None
        time.sleep(0.05)
    assert second.output == f"{second.method} on kelp"
    handle.resume(feedback=f"fine {second.method}")
    assert handle.result(timeout=30) == "joined"
    assert ran(redis_client, handle.run_id, "begin", "left", "right", "join") == [1, 1, 1, 1]


def test_a_parallel_review_committed_while_the_answer_is_planned_keeps_the_question_asked(
    rt: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``left``'s review pauses the run while ``right`` runs. As ``left``'s answer is being
    planned, ``right`` pauses for its own review: the run still asks ``left``'s question, so
    the answer is planned again on that commit and given to ``left`` (not refused, not given
    to ``right``); ``right``'s attempt has ended with its commit (no lease left to carry it),
    so the answer sends it again, and its review is asked next. Neither method runs twice."""
    handle = HeldTwinReviewFlow.submit({"topic": "kelp"}, rt=rt)
    asked = paused(handle).meta.human.awaiting
    assert asked is not None and asked.method == "left"
    plan_running, raced = answers.running_steps, []

    def right_pauses_meanwhile(rt_: Any, latest: Any) -> frozenset[str]:
        found = plan_running(rt_, latest)
        if not raced:  # the first plan: right's review commits after it read the run
            raced.append(found)
            redis_client.set(key(handle.run_id, "gate", "right"), 1)
            eventually(lambda: "right#1" in handle.latest().meta.human.reviews)
        return found

    monkeypatch.setattr(answers, "running_steps", right_pauses_meanwhile)
    handle.resume(feedback="fine left")
    assert "right#1" in raced[0]  # the first plan saw right running
    history = rt.store.history(handle.run_id, limit=50)
    opened = next(c for c in history if c.meta.human.answers)
    # right's review, committed before the answer (it asks its own later, in the answer's
    # epoch, maybe already by now)
    (parked,) = [
        c for c in history if (c.event, c.step) == ("flow_paused", "right") and c.seq < opened.seq
    ]
    assert parked.meta.human.awaiting == asked  # the first question stays asked
    assert list(opened.meta.human.answers) == ["left#1"]
    assert opened.meta.carried == {} and sorted(opened.meta.ready) == ["left#1", "right#1"]

    def asking_right() -> Any:
        latest = handle.latest()
        waiting = latest.meta.human.awaiting if latest.status is RunStatus.PAUSED else None
        return waiting if waiting is not None and waiting.method == "right" else None

    assert eventually(asking_right, 30).output == "right on kelp"
    handle.resume(feedback="fine right")
    assert handle.result(timeout=30) == "joined"
    assert ran(redis_client, handle.run_id, "begin", "left", "right", "join") == [1, 1, 1, 1]


def test_a_review_answered_while_a_parallel_reviewed_step_still_runs_does_not_run_it_again(
    rt: Any, redis_client: redis.Redis
) -> None:
    """``left``'s review pauses the run while ``right`` still runs (it waits on a gate). The
    answer sends ``left`` again, not ``right``: its running attempt goes on, commits its own
    review into the answered run, and is asked next."""
    handle = HeldTwinReviewFlow.submit({"topic": "kelp"}, rt=rt)
    first = paused(handle).meta.human.awaiting
    assert first is not None and first.method == "left"
    assert ran(redis_client, handle.run_id, "right") == [1]  # running, held by its gate
    answered = handle.resume(feedback="fine left").latest()
    assert answered.meta.carried == {"right#1": 0}  # its attempt of epoch 0 goes on
    redis_client.set(key(handle.run_id, "gate", "right"), 1)
    deadline = time.monotonic() + 30
    while (latest := handle.latest()).meta.human.awaiting is None or (
        latest.meta.human.awaiting.method != "right"
    ):
        assert time.monotonic() < deadline, f"right's review was never asked ({latest.status})"
        time.sleep(0.05)
    assert latest.meta.human.awaiting.output == "right on kelp"
    handle.resume(feedback="fine right")
    assert handle.result(timeout=30) == "joined"
    assert ran(redis_client, handle.run_id, "begin", "left", "right", "join") == [1, 1, 1, 1]


def test_a_paused_run_resumed_while_a_parallel_step_still_runs_does_not_run_it_again(
    rt: Any, redis_client: redis.Redis
) -> None:
    """The same for ``self.pause``: a resume of the paused run (its latest checkpoint) sends
    ``left`` again, which re-runs by design, and lets ``right``'s running attempt go on."""
    handle = HeldTwinPauseFlow.submit({"topic": "kelp"}, rt=rt)
    assert paused(handle).meta.human.pause_reason == "approve left?"
    assert ran(redis_client, handle.run_id, "right") == [1]  # running, held by its gate
    resumed = control.resume(handle.run_id, inputs={"approved": True}, rt=rt).latest()
    assert resumed.meta.carried == {"right#1": 0}
    redis_client.set(key(handle.run_id, "gate", "right"), 1)
    assert handle.result(timeout=30) == "joined"
    assert ran(redis_client, handle.run_id, "begin", "left", "right", "join") == [1, 2, 1, 1]


# --- every way of answering: Python, the CLI, the API ----------------------------------------


def test_run_handle_resume_gives_the_feedback(rt: Any, redis_client: redis.Redis) -> None:
    handle = ArticleFlow.submit({"topic": "crabs"}, rt=rt)
    paused(handle)
    assert handle.resume(feedback="too thin", by="dee") is handle
    assert handle.result(timeout=30) == "shelved"
    assert ran(redis_client, handle.run_id, *STEPS) == [1, 1, 1, 0, 1]
    with pytest.raises(RunStateError, match="awaits no answer"):
        handle.resume(feedback="again")


def test_runner_resume_feedback_answers_from_the_shell(
    rt: Any, worker_env: dict[str, str], redis_client: redis.Redis
) -> None:
    def cli(*args: str) -> Any:
        return CliRunner().invoke(app, list(args), env=worker_env)

    handle = ArticleFlow.submit({"topic": "newts"}, rt=rt)
    latest = paused(handle)
    shown = cli("status", handle.run_id)
    assert "a review at review: Publish this draft?" in shown.stdout
    assert "draft from notes on newts" in shown.stdout and "approved, rejected" in shown.stdout
    assert f"runner resume {handle.run_id} --feedback TEXT" in shown.stdout
    status = json.loads(cli("status", handle.run_id, "--json").stdout)
    assert status["awaiting"]["output"]["body"] == "draft from notes on newts"
    refused = [
        cli("resume", handle.run_id, "--outcome", "maybe"),
        cli("resume", handle.run_id, "--feedback", "x", "--from", latest.id),
        cli("resume", handle.run_id, "--by", "ana"),
        cli("resume", handle.run_id),  # a plain resume would run the reviewed method again
    ]
    for result in refused:
        assert result.exit_code != 0
        said = result.stderr.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("error:"), said
    assert "its outcomes: approved, rejected" in refused[0].stderr
    assert "--feedback TEXT" in refused[3].stderr
    assert handle.latest().id == latest.id  # refusals store nothing

    done = cli("resume", handle.run_id, "--feedback", "ship it", "--by", "cleo", "--wait")
    assert done.exit_code == 0, (done.stdout, done.stderr)
    assert "published newts" in done.stdout
    assert ran(redis_client, handle.run_id, *STEPS) == [1, 1, 1, 1, 0]
    kept = [
        a
        for c in rt.store.history(handle.run_id, limit=100)
        for a in c.meta.human.answers.get("review#1", [])
    ]
    assert {(a.text, a.by) for a in kept} == {("ship it", "cleo")}


def test_the_api_shows_the_review_and_takes_the_answer(rt: Any, redis_client: redis.Redis) -> None:
    handle = ArticleFlow.submit({"topic": "voles"}, rt=rt)
    paused(handle)
    token = "feedback-t0ken"
    with (
        serving(rt, token=token) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http,
    ):
        run = http.get(f"/api/runs/{handle.run_id}").json()
        assert run["awaiting"]["output"] == {"title": "voles", "body": "draft from notes on voles"}
        assert (run["awaiting"]["message"], run["awaiting"]["emit"]) == (
            "Publish this draft?",
            ["approved", "rejected"],
        )
        bad = http.post(f"/api/runs/{handle.run_id}/feedback", json={"outcome": "maybe"})
        assert bad.status_code == 422 and "its outcomes" in bad.json()["error"]["message"]
        missing = http.post("/api/runs/no-such-run/feedback", json={"feedback": "x"})
        assert missing.status_code == 404
        given = http.post(
            f"/api/runs/{handle.run_id}/feedback", json={"outcome": "approved", "by": "eve"}
        )
        assert given.status_code == 202, given.text
        assert handle.result(timeout=30) == "published voles"
        again = http.post(f"/api/runs/{handle.run_id}/feedback", json={"feedback": "late"})
        assert again.status_code == 409 and "awaits no answer" in again.json()["error"]["message"]
        timeline = http.get(f"/api/runs/{handle.run_id}").json()["timeline"]
        answered = [row["answer"] for row in timeline if row["answer"]]
        assert answered == [{"text": "", "outcome": "approved", "by": "eve", "method": "review"}]
    assert ran(redis_client, handle.run_id, *STEPS) == [1, 1, 1, 1, 0]
