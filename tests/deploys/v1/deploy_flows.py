"""Version 1 of the deployed flows (see ``tests/deploys/__init__.py``)."""

from __future__ import annotations

import time

from runner import Flow, FlowState, human_feedback, listen, router, start


def editor(prompt: str) -> str:
    return "approved" if "ship it" in prompt else "rejected"


class Article(FlowState):
    topic: str = ""
    draft: str = ""
    published: str = ""


class ReviewFlow(Flow[Article]):
    """write (reviewed by a person) -> publish."""

    @start()
    @human_feedback(message="Publish it?", emit=["approved", "rejected"], llm=editor)
    def write(self) -> str:
        self.state.draft = f"draft on {self.state.topic}"
        return self.state.draft

    @listen("approved")
    def publish(self) -> str:
        self.state.published = "plain"
        return self.state.published


class Order(FlowState):
    count: int = 0
    log: list[str] = []


class AskFlow(Flow[Order]):
    """confirm (asks a person) -> done."""

    @start()
    def confirm(self) -> str:
        self.state.count = 1
        answer = self.ask("sure?")
        self.state.log = [*self.state.log, f"answer={answer}"]
        return str(answer)

    @listen(confirm)
    def done(self) -> str:
        return "done"


class Strict(FlowState):
    total: int = 0


class StrictFlow(Flow[Strict]):
    """ask -> done; version 2 changes the state's type with no upgrade."""

    @start()
    def confirm(self) -> str:
        self.state.total = 3
        return str(self.ask("sure?"))


class Leg(FlowState):
    legs: int = 0


class RollingFlow(Flow[Leg]):
    """a -> b -> c, each a short step that counts its executions."""

    @start()
    def a(self) -> str:
        return step(self, "a")

    @listen(a)
    def b(self) -> str:
        return step(self, "b")

    @listen(b)
    def c(self) -> str:
        return step(self, "c")


def step(flow: Flow[Leg], name: str) -> str:
    from tests.flows.dist import executed

    executed(flow.state.id, name)
    time.sleep(0.15)
    flow.state.legs += 1
    return f"{name} on v1"


class RenameFlow(Flow[FlowState]):
    """a -> old_step, which waits for a person; version 2 renames it."""

    @start()
    def a(self) -> str:
        return "a"

    @listen(a)
    def old_step(self) -> str:
        return str(self.ask("go on?"))


class RouteFlow(Flow[FlowState]):
    """gate -> decide (a router) -"retry"-> redo, which waits; version 2 routes "again"."""

    @start()
    def gate(self) -> str:
        return "gate"

    @router(gate)
    def decide(self) -> str:
        return "retry"

    @listen("retry")
    def redo(self) -> str:
        return str(self.ask("again?"))
