"""Flows the parity test runs through both executors (in process and on workers).

Attempts are counted in Redis under the run's ``tag`` so that a flow that fails its first
attempt does so once per run, whichever process runs it. Every flow here tells its events
to a recorder that keeps them in Redis by run, whichever process tells them
(:mod:`tests.flows._recording`).
"""

from __future__ import annotations

import time
from typing import Annotated

from runner import FlowEvent, FlowState, and_, append, listen, or_, router, start
from tests.flows._recording import Recorded, Recorder, after, attempts, meet


class ParityState(FlowState):
    tag: str = ""
    trail: Annotated[list[str], append] = []
    count: int = 0
    approved: str = ""


class LinearParity(Recorded[ParityState]):
    @start()
    def one(self) -> int:
        self.state.trail = [*self.state.trail, "one"]
        return 1

    @listen(one)
    def two(self, value: int) -> int:
        self.state.trail = [*self.state.trail, "two"]
        return value + 1

    @listen(two)
    def three(self, value: int) -> int:
        self.state.trail = [*self.state.trail, "three"]
        return value + 1


class JoinParity(Recorded[ParityState]):
    @start()
    def begin(self) -> str:
        return "go"

    @listen(begin)
    def left(self) -> str:
        self.state.trail = [*self.state.trail, "left"]
        return "l"

    @listen(begin)
    def right(self) -> str:
        self.state.trail = [*self.state.trail, "right"]
        return "r"

    @listen(and_(left, right))
    def join(self) -> str:
        self.state.count = len(self.state.trail)
        return "joined"


class _LateTeller(Recorder):
    """A recorder whose process tells ``left``'s end late (a busy process, a slow listener)."""

    def on_event(self, event: FlowEvent) -> None:
        if (event.type, event.method) == ("method_execution_finished", "left"):
            time.sleep(0.5)
        super().on_event(event)


class LateTellerJoin(JoinParity):
    """:class:`JoinParity` with both branches running at once, and ``left``'s end told half a
    second after its commit, when the commit that sends ``join`` may have landed."""

    recorder = _LateTeller

    @listen("begin")
    def left(self) -> str:
        meet(self.state.tag, "both-running", 2)
        return super().left()

    @listen("begin")
    def right(self) -> str:
        meet(self.state.tag, "both-running", 2)
        return super().right()


class OrParity(Recorded[ParityState]):
    """``either`` fires once, on ``first``; ``second`` ends after it (so the run's commit
    order is the same in both executors)."""

    @start()
    def first(self) -> str:
        return "a"

    @start()
    def second(self) -> str:
        after(self.state.tag, "either-ran")
        return "b"

    @listen(or_(first, second))
    def either(self) -> str:
        meet(self.state.tag, "either-ran", 1)
        self.state.count += 1
        return "either"


class LoopParity(Recorded[ParityState]):
    @start()
    def begin(self) -> None:
        self.state.count = 0

    @listen(or_("begin", "again"))
    def work(self) -> int:
        self.state.count += 1
        return self.state.count

    @router(work)
    def check(self) -> str:
        return "again" if self.state.count < 4 else "done"

    @listen("done")
    def finish(self) -> int:
        return self.state.count


class RunawayParity(Recorded[ParityState]):
    """Loops for ever; ``work`` may run 3 times, so the fourth time fails the run."""

    @start()
    def begin(self) -> None:
        self.state.count = 0

    @listen(or_("begin", "again"), max_calls=3)
    def work(self) -> int:
        self.state.count += 1
        return self.state.count

    @router(work)
    def check(self) -> str:
        return "again"


class RetryParity(Recorded[ParityState]):
    @start()
    def begin(self) -> str:
        return "go"

    @listen(begin, retries=2, retry_backoff=0.01)
    def flaky(self) -> str:
        if attempts(self.state.tag, "flaky") == 1:
            raise ConnectionError("first attempt fails")
        self.state.count = 1
        return "ok"


class ExhaustedParity(Recorded[ParityState]):
    @start()
    def begin(self) -> str:
        return "go"

    @listen(begin, retries=1, retry_backoff=0.01)
    def broken(self) -> str:
        attempts(self.state.tag, "broken")
        raise ValueError("always fails")


class PauseParity(Recorded[ParityState]):
    @start()
    def draft(self) -> str:
        return "draft"

    @listen(draft)
    def review(self, draft: str) -> str:
        if not self.state.approved:
            self.pause(f"approve {draft}?")
        return f"{draft} approved by {self.state.approved}"

    @listen(review)
    def publish(self, reviewed: str) -> str:
        return f"published: {reviewed}"


class TwoFailParity(Recorded[ParityState]):
    """Two parallel steps fail, both having started before either fails: one run failure."""

    @start()
    def begin(self) -> str:
        return "go"

    @listen(begin, retries=0)
    def left(self) -> str:
        meet(self.state.tag, "both-running", 2)
        raise ValueError("left fails")

    @listen(begin, retries=0)
    def right(self) -> str:
        meet(self.state.tag, "both-running", 2)
        raise KeyError("right fails")
