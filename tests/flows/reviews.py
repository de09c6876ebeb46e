"""A four-step flow with a ``@human_feedback`` review in the middle; the test workers import
this module (allow-list). Each method counts its executions (:func:`tests.flows.dist.executed`).
"""

from __future__ import annotations

from runner import Flow, FlowState, and_, human_feedback, listen, start

from .dist import barrier, executed, wait_gate


def editor(prompt: str) -> str:
    """The LLM that collapses a review: "ship it" approves, anything else rejects."""
    return "approved" if "ship it" in prompt else "rejected"


class Article(FlowState):
    topic: str = ""
    notes: str = ""
    draft: str = ""
    verdict: str = ""
    heard: str = ""


class ArticleFlow(Flow[Article]):
    """research -> write -> review (a person reviews the draft) -> publish | shelve."""

    @start()
    def research(self) -> str:
        executed(self.state.id, "research")
        self.state.notes = f"notes on {self.state.topic}"
        return self.state.notes

    @listen(research)
    def write(self, notes: str) -> str:
        executed(self.state.id, "write")
        self.state.draft = f"draft from {notes}"
        return self.state.draft

    @listen(write)
    @human_feedback(
        message="Publish this draft?",
        emit=["approved", "rejected"],
        llm=editor,
        metadata={"channel": "#editors"},
    )
    def review(self, draft: str) -> dict[str, str]:
        executed(self.state.id, "review")
        self.state.verdict = "in review"  # committed with the pause
        return {"title": self.state.topic, "body": draft}

    @listen("approved")
    def publish(self, article: dict[str, str]) -> str:
        executed(self.state.id, "publish")
        self.state.verdict = "published"
        heard = self.last_human_feedback  # the review, on whichever worker this runs
        self.state.heard = f"{heard.feedback} -> {heard.outcome}" if heard else "nothing"
        return f"published {article['title']}"

    @listen("rejected")
    def shelve(self) -> str:
        executed(self.state.id, "shelve")
        self.state.verdict = "shelved"
        return "shelved"


class Notes(FlowState):
    topic: str = ""


class NotesFlow(Flow[Notes]):
    """outline (reviewed, no emit) -> expand, which receives the review's result."""

    @start()
    @human_feedback(message="Any notes on the outline?")
    def outline(self) -> str:
        executed(self.state.id, "outline")
        return f"outline of {self.state.topic}"

    @listen(outline)
    def expand(self, review: object) -> str:
        executed(self.state.id, "expand")
        feedback = getattr(review, "feedback", None)
        return f"expanded {getattr(review, 'output', None)} with {feedback!r}"


class Twins(FlowState):
    topic: str = ""


class TwinReviewFlow(Flow[Twins]):
    """start -> (left, right: both reviewed, in parallel) -> join, after both."""

    @start()
    def begin(self) -> str:
        executed(self.state.id, "begin")
        return self.state.topic

    @listen(begin)
    @human_feedback(message="Left draft ok?")
    def left(self, topic: str) -> str:
        executed(self.state.id, "left")
        return f"left on {topic}"

    @listen(begin)
    @human_feedback(message="Right draft ok?")
    def right(self, topic: str) -> str:
        executed(self.state.id, "right")
        return f"right on {topic}"

    @listen(and_(left, right))
    def join(self) -> str:
        executed(self.state.id, "join")
        return "joined"


class HeldTwinReviewFlow(TwinReviewFlow):
    """As TwinReviewFlow, but ``left`` and ``right`` both start before ``left`` pauses, and
    ``right`` runs on until a test opens its gate ``right``: still running when ``left``'s
    review pauses the run, and when that review is answered."""

    @listen("begin")
    @human_feedback(message="Left draft ok?")
    def left(self, topic: str) -> str:
        executed(self.state.id, "left")
        barrier(self.state.id, "started", 2)
        return f"left on {topic}"

    @listen("begin")
    @human_feedback(message="Right draft ok?")
    def right(self, topic: str) -> str:
        executed(self.state.id, "right")
        barrier(self.state.id, "started", 2)
        wait_gate(self.state.id, "right")
        return f"right on {topic}"


class Approval(Twins):
    approved: bool = False


class HeldTwinPauseFlow(Flow[Approval]):
    """begin -> (left: pauses the run until resumed with ``approved``; right: runs until a
    test opens its gate ``right``) -> join, after both. Both start before left pauses."""

    @start()
    def begin(self) -> str:
        executed(self.state.id, "begin")
        return self.state.topic

    @listen(begin)
    def left(self, topic: str) -> str:
        executed(self.state.id, "left")
        barrier(self.state.id, "started", 2)
        if not self.state.approved:
            self.pause("approve left?")
        return f"left on {topic}"

    @listen(begin)
    def right(self, topic: str) -> str:
        executed(self.state.id, "right")
        barrier(self.state.id, "started", 2)
        wait_gate(self.state.id, "right")
        return f"right on {topic}"

    @listen(and_(left, right))
    def join(self) -> str:
        executed(self.state.id, "join")
        return "joined"
