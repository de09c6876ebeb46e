"""A looping flow with parallel branches, an ``and_`` join and ``or_`` waves, whose
checkpoints written by the code before records were bounded are a test fixture
(``tests/fixtures/checkpoints_v1.json``, see ``tests/test_flat_record.py``)."""

from __future__ import annotations

from runner import Flow, FlowState, and_, listen, or_, router, start


class LoopState(FlowState):
    counter: int = 0
    right_runs: int = 0
    fail_at: int = -1
    """``right``'s run (1, 2, ...) that raises; -1: none."""
    rounds: int = 4


class LoopFlow(Flow[LoopState]):
    """begin, then rounds of ``left`` and ``right`` in parallel, joined, and a router."""

    @start()
    def begin(self) -> int:
        return 0

    @listen(or_(begin, "again"), max_calls=1000)
    def left(self) -> int:
        self.state.counter += 1
        return self.state.counter

    @listen(or_(begin, "again"), retries=0, max_calls=1000)
    def right(self) -> str:
        self.state.right_runs += 1
        if self.state.right_runs == self.state.fail_at:
            raise RuntimeError("right fails once")
        return f"r{self.state.right_runs}"

    @listen(and_(left, right), max_calls=1000)
    def join(self, value: int) -> int:
        return self.state.counter

    @router(join, max_calls=1000)
    def check(self) -> str:
        return "again" if self.state.counter < self.state.rounds else "done"

    @listen("done")
    def finish(self) -> int:
        return self.state.counter * 10
