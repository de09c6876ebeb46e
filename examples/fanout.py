"""A fan-out flow: one start, ten parallel branches, one ``and_`` join.

Every branch appends to ``notes`` (an ``append`` reducer merges parallel
writes) and sets a field of its own; the join sees all ten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from runner import Flow, FlowState, and_, append, listen, start


class FanoutState(FlowState):
    """State of :class:`FanoutFlow`."""

    topic: str = "redis"
    notes: Annotated[list[str], append] = []
    b0: str = ""
    b1: str = ""
    b2: str = ""
    b3: str = ""
    b4: str = ""
    b5: str = ""
    b6: str = ""
    b7: str = ""
    b8: str = ""
    b9: str = ""
    summary: str = ""


def _branch(i: int) -> Callable[..., Any]:
    def branch(self: FanoutFlow) -> str:
        self.state.notes.append(f"note-{i}")
        setattr(self.state, f"b{i}", f"done-{i}")
        return f"b{i}"

    branch.__name__ = f"branch_{i}"
    return branch


class FanoutFlow(Flow[FanoutState]):
    """plan -> branch_0..branch_9 in parallel -> join."""

    @start()
    def plan(self) -> str:
        return self.state.topic

    branch_0 = listen(plan)(_branch(0))
    branch_1 = listen(plan)(_branch(1))
    branch_2 = listen(plan)(_branch(2))
    branch_3 = listen(plan)(_branch(3))
    branch_4 = listen(plan)(_branch(4))
    branch_5 = listen(plan)(_branch(5))
    branch_6 = listen(plan)(_branch(6))
    branch_7 = listen(plan)(_branch(7))
    branch_8 = listen(plan)(_branch(8))
    branch_9 = listen(plan)(_branch(9))

    @listen(
        and_(
            branch_0,
            branch_1,
            branch_2,
            branch_3,
            branch_4,
            branch_5,
            branch_6,
            branch_7,
            branch_8,
            branch_9,
        )
    )
    def join(self) -> str:
        self.state.summary = f"{len(self.state.notes)} notes"
        return self.state.summary
