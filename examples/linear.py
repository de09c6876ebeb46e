"""A 20-method linear flow whose methods do nothing (the benchmark's subject)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner import Flow, FlowState, listen, start


class CounterState(FlowState):
    """A counter every method increments."""

    counter: int = 0


def _step(i: int) -> Callable[..., Any]:
    def step(self: LinearFlow) -> int:
        self.state.counter += 1
        return i

    step.__name__ = f"step_{i:02d}"
    return step


class LinearFlow(Flow[CounterState]):
    """step_00 -> step_01 -> ... -> step_19."""

    step_00 = start()(_step(0))
    step_01 = listen(step_00)(_step(1))
    step_02 = listen(step_01)(_step(2))
    step_03 = listen(step_02)(_step(3))
    step_04 = listen(step_03)(_step(4))
    step_05 = listen(step_04)(_step(5))
    step_06 = listen(step_05)(_step(6))
    step_07 = listen(step_06)(_step(7))
    step_08 = listen(step_07)(_step(8))
    step_09 = listen(step_08)(_step(9))
    step_10 = listen(step_09)(_step(10))
    step_11 = listen(step_10)(_step(11))
    step_12 = listen(step_11)(_step(12))
    step_13 = listen(step_12)(_step(13))
    step_14 = listen(step_13)(_step(14))
    step_15 = listen(step_14)(_step(15))
    step_16 = listen(step_15)(_step(16))
    step_17 = listen(step_16)(_step(17))
    step_18 = listen(step_17)(_step(18))
    step_19 = listen(step_18)(_step(19))
