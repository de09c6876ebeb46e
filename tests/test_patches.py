"""Patches for changed logic (``self.patched`` / ``self.deprecate_patch``): a step re-running
code it passed before on code without the patch takes the old branch, anything reached first
on patched code the new one, and a decision once recorded stands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner import Flow, FlowState, SQLiteFlowPersistence, human_feedback, listen, start
from runner.flow.context import Answers, Patches, Sleeps, StepContext, running
from runner.flow.human_feedback import HumanFeedbackPending, PendingFeedbackContext
from runner.flow.orchestrator import Activation
from runner.store.models import Answer, Awaiting


class Plain(Flow[FlowState]):
    @start()
    def go(self) -> str:
        return "went"


def context(flow: Any, answers: int = 0, sleeps: int = 0, **recorded: bool) -> StepContext:
    awaited = Awaiting(kind="ask", message="sure?", activation="go#1", method="go")
    return StepContext(
        flow,
        Activation("go#1", "go", 1, None),
        answers=Answers([Answer(text="yes", awaited=awaited) for _ in range(answers)]),
        sleeps=Sleeps([0.0] * sleeps),
        patches=Patches(dict(recorded)),
    )


def test_outside_a_step_a_flow_takes_the_new_branch() -> None:
    assert Plain().patched("new-prompt") is True


def test_code_before_a_replayed_answer_takes_the_old_branch_code_after_it_the_new() -> None:
    flow = Plain()
    ctx = context(flow, answers=1)
    with running(ctx):
        assert flow.patched("before") is False
        ctx.answers.calls = 1  # the ask took its recorded answer: past the pause point
        assert flow.patched("after") is True
        assert flow.patched("before") is False  # asked again in the same attempt: the same
    assert ctx.patches.decided == {"before": False, "after": True}


def test_code_before_a_recorded_sleep_takes_the_old_branch() -> None:
    flow = Plain()
    with running(ctx := context(flow, sleeps=1)):
        assert flow.patched("p") is False
        ctx.sleeps.calls = 1
        assert flow.patched("q") is True


def test_a_recorded_decision_stands_and_a_fresh_step_takes_the_new_branch() -> None:
    flow = Plain()
    with running(context(flow, answers=1, p=True)):
        assert flow.patched("p") is True  # recorded by an earlier attempt on patched code
    with running(ctx := context(flow)):
        assert flow.patched("p") is True
        assert flow.deprecate_patch("gone") is True
    assert ctx.patches.decided == {"p": True, "gone": True}
    with pytest.raises(ValueError, match="change id"):
        flow.patched("")


# --- a review paused across a deploy, in process --------------------------------------------


class Later:
    def request_feedback(self, context: PendingFeedbackContext, flow: Any) -> str:
        raise HumanFeedbackPending(context)


def approve(prompt: str) -> str:
    return "approved"


class Article(FlowState):
    draft: str = ""
    published: str = ""


RAN: list[str] = []


class Before(Flow[Article]):
    @start()
    @human_feedback(message="ok?", emit=["approved", "rejected"], llm=approve, provider=Later())
    def write(self) -> str:
        RAN.append("write")
        self.state.draft = "draft"
        return self.state.draft

    @listen("approved")
    def publish(self) -> str:
        self.state.published = "plain"
        return self.state.published


class After(Flow[Article]):
    """The deploy: both methods patched."""

    @start()
    @human_feedback(message="ok?", emit=["approved", "rejected"], llm=approve, provider=Later())
    def write(self) -> str:
        RAN.append("write")
        self.state.draft = "toned draft" if self.patched("tone") else "draft"
        return self.state.draft

    @listen("approved")
    def publish(self) -> str:
        self.state.published = "toned" if self.patched("tone") else "plain"
        return self.state.published


def test_a_review_paused_across_a_deploy_takes_the_new_branch_after_it_in_process(
    tmp_path: Path,
) -> None:
    persistence = SQLiteFlowPersistence(tmp_path / "flows.db")
    RAN.clear()
    pending = Before(persistence=persistence).kickoff()
    assert isinstance(pending, HumanFeedbackPending)
    run_id = pending.context.flow_id

    resumed = After.from_pending(run_id, persistence)
    assert resumed.resume("ship it") == "toned"
    assert RAN == ["write"]  # the reviewed method ran once, on the old code
    assert resumed.state.draft == "draft" and resumed.state.published == "toned"
