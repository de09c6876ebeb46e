"""Flows of the production-Redis tests (TLS, ACL users, Sentinel failover).

They touch nothing but their own state: their Redis is a private server the test started
(behind TLS, ACLs or a Sentinel group), so a side channel on the shared test Redis would
not be the same server.
"""

from __future__ import annotations

import time
from typing import Annotated

from runner import Flow, FlowState, and_, append, listen, start


class SplitState(FlowState):
    """Three branches append to ``items``; ``pause`` slows each step (seconds)."""

    items: Annotated[list[str], append] = []
    pause: float = 0.0


class ProdSplit(Flow[SplitState]):
    """root -> a, b, c in parallel -> join: five commits, three of them concurrent."""

    @start()
    def root(self) -> None:
        time.sleep(self.state.pause)

    @listen(root)
    def a(self) -> None:
        time.sleep(self.state.pause)
        self.state.items.append("a")

    @listen(root)
    def b(self) -> None:
        time.sleep(self.state.pause)
        self.state.items.append("b")

    @listen(root)
    def c(self) -> None:
        time.sleep(self.state.pause)
        self.state.items.append("c")

    @listen(and_(a, b, c))
    def join(self) -> list[str]:
        time.sleep(self.state.pause)
        return sorted(self.state.items)


class GateState(FlowState):
    """``open`` lets ``gate`` pass; a run started closed fails there and is resumed open."""

    open: bool = False
    trail: Annotated[list[str], append] = []


class ProdGated(Flow[GateState]):
    """first -> gate (fails while closed) -> last."""

    @start()
    def first(self) -> None:
        self.state.trail.append("first")

    @listen(first)
    def gate(self) -> None:
        if not self.state.open:
            raise RuntimeError("the gate is closed")
        self.state.trail.append("gate")

    @listen(gate)
    def last(self) -> list[str]:
        self.state.trail.append("last")
        return list(self.state.trail)
