"""Flows of the console tests (their workers import this module: see ``console_support``)."""

from __future__ import annotations

import os

from runner import Flow, FlowState, listen, start


class ReviewState(FlowState):
    """A topic, the longest draft ``check`` accepts, and what the steps wrote."""

    topic: str = "durable flows"
    limit: int = 10
    draft: str = ""
    verdict: str = ""


class ReviewFlow(Flow[ReviewState]):
    """outline -> write -> check (fails while the draft is over ``limit``) -> publish."""

    @start()
    def outline(self) -> str:
        return f"outline of {self.state.topic}"

    @listen(outline)
    def write(self, outline: str) -> str:
        self.state.draft = f"{outline}: first draft"
        return self.state.draft

    @listen(write)
    def check(self, draft: str) -> str:
        if len(draft) > self.state.limit:
            raise ValueError(f"draft {draft!r} is over the limit of {self.state.limit} chars")
        self.state.verdict = "accepted"
        return self.state.verdict

    @listen(check)
    def publish(self, verdict: str) -> str:
        return f"published ({verdict})"


class GateState(FlowState):
    """The file whose existence opens the gate (absent: ``through`` fails)."""

    gate: str = ""


class GateFlow(Flow[GateState]):
    """prepare -> through (fails while the ``gate`` file is absent) -> done: a failed run
    that a resume finishes once the gate is opened (the bulk-action tests)."""

    @start()
    def prepare(self) -> str:
        return "prepared"

    @listen(prepare)
    def through(self, _prepared: str) -> str:
        if not os.path.exists(self.state.gate):
            raise RuntimeError(f"gate {self.state.gate} is closed")
        return "through"

    @listen(through)
    def done(self, _through: str) -> str:
        return "done"
