"""A flow that waits for a person's answer through the engine's own primitive
(:class:`runner.errors.AwaitInput` and the step's recorded answers), below ``ask`` and
``@human_feedback``; the test workers import this module (allow-list)."""

from __future__ import annotations

from runner import Flow, FlowState, listen, start
from runner.errors import AwaitInput
from runner.flow.context import step_context
from runner.store.models import Awaiting

from .dist import executed


class Draft(FlowState):
    topic: str = ""
    draft: str = ""
    verdict: str = ""


class SignOffFlow(Flow[Draft]):
    """write -> approve (waits for a person) -> publish."""

    @start()
    def write(self) -> str:
        executed(self.state.id, "write")
        self.state.draft = f"draft on {self.state.topic}"
        return self.state.draft

    @listen(write)
    def approve(self, draft: str) -> str:
        executed(self.state.id, "approve")
        self.state.verdict = "pending"  # kept in the paused checkpoint
        ctx = step_context()
        assert ctx is not None
        answers = ctx.answers
        if not answers.recorded:
            raise AwaitInput(
                Awaiting(kind="ask", message=f"approve {draft!r}?", emit=["yes", "no"])
            )
        given = answers.recorded[-1]
        self.state.verdict = given.outcome or given.text or "none"
        return f"{self.state.verdict} by {given.by}"

    @listen(approve)
    def publish(self, verdict: str) -> str:
        executed(self.state.id, "publish")
        return f"published ({verdict})"
