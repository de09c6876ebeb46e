"""Flows only the benchmark's workers import (``RUNNER_FLOW_MODULES``)."""

from __future__ import annotations

from runner import Flow, FlowState, listen, start


class FiveState(FlowState):
    """A counter every method increments."""

    counter: int = 0


class FiveStepFlow(Flow[FiveState]):
    """one -> two -> three -> four -> five: the throughput benchmark's run."""

    @start()
    def one(self) -> int:
        self.state.counter += 1
        return 1

    @listen(one)
    def two(self) -> int:
        self.state.counter += 1
        return 2

    @listen(two)
    def three(self) -> int:
        self.state.counter += 1
        return 3

    @listen(three)
    def four(self) -> int:
        self.state.counter += 1
        return 4

    @listen(four)
    def five(self) -> int:
        self.state.counter += 1
        return 5
