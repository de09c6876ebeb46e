"""Version 2 of the deployed flows (see ``tests/deploys/__init__.py``): patched methods, a
state field added with a default, a type changed with a ``@state_upgrade`` and one without."""

from __future__ import annotations

import time
from typing import Any

from runner import Flow, FlowState, human_feedback, listen, router, start, state_upgrade


def editor(prompt: str) -> str:
    return "approved" if "ship it" in prompt else "rejected"


class Article(FlowState):
    topic: str = ""
    draft: str = ""
    published: str = ""
    lang: str = "en"  # new, with a default


class ReviewFlow(Flow[Article]):
    """write (reviewed by a person) -> publish, which now publishes with a tone."""

    @start()
    @human_feedback(message="Publish it?", emit=["approved", "rejected"], llm=editor)
    def write(self) -> str:
        toned = self.patched("tone")  # the paused run passed here on v1: never re-run
        self.state.draft = f"{'toned ' if toned else ''}draft on {self.state.topic}"
        return self.state.draft

    @listen("approved")
    def publish(self) -> str:
        # Reached first on this code: the new branch.
        self.state.published = f"toned ({self.state.lang})" if self.patched("tone") else "plain"
        return self.state.published


class Order(FlowState):
    count: list[int] = []  # was an int
    log: list[str] = []


class AskFlow(Flow[Order]):
    """confirm (asks a person) -> done; patched before and after its question."""

    @state_upgrade("v1")
    def count_as_list(old: dict[str, Any]) -> dict[str, Any]:
        return {**old, "count": [old.get("count", 0)]}

    @start()
    def confirm(self) -> str:
        before = self.patched("check-stock")  # v1 passed here without it: False
        answer = self.ask("sure?")
        after = self.patched("log-answer")  # past the pause point: True
        self.state.log = [*self.state.log, f"before={before}", f"after={after}"]
        return str(answer)

    @listen(confirm)
    def done(self) -> str:
        return "done"


class Strict(FlowState):
    total: dict[str, int] = {}  # was an int; no @state_upgrade


class StrictFlow(Flow[Strict]):
    @start()
    def confirm(self) -> str:
        return str(self.ask("sure?"))


class Leg(FlowState):
    legs: int = 0
    lang: str = "en"


class RollingFlow(Flow[Leg]):
    """a -> b -> (c, extra): version 2 adds ``extra``, a step version 1 has no task for."""

    @start()
    def a(self) -> str:
        return step(self, "a")

    @listen(a)
    def b(self) -> str:
        return step(self, "b")

    @listen(b)
    def c(self) -> str:
        return step(self, "c")

    @listen(b)
    def extra(self) -> str:
        return step(self, "extra")


def step(flow: Flow[Leg], name: str) -> str:
    from tests.flows.dist import executed

    executed(flow.state.id, name)
    time.sleep(0.15)
    flow.state.legs += 1
    return f"{name} on v2"


class RenameFlow(Flow[FlowState]):
    @start()
    def a(self) -> str:
        return "a"

    @listen(a)
    def new_step(self) -> str:
        return str(self.ask("go on?"))


class RouteFlow(Flow[FlowState]):
    @start()
    def gate(self) -> str:
        return "gate"

    @router(gate)
    def decide(self) -> str:
        return "again"

    @listen("again")
    def redo(self) -> str:
        return str(self.ask("again?"))
