"""Flows the parity test runs through both executors (in process and on workers).

Attempts are counted in Redis under the run's ``tag`` so that a flow that fails its first
attempt does so once per run, whichever process runs it.
"""

from __future__ import annotations

import os
from typing import Annotated

import redis

from runner import Flow, FlowState, and_, append, listen, or_, router, start

_client: redis.Redis | None = None


def attempts(tag: str, step: str) -> int:
    """Count one more attempt of ``step`` in the run tagged ``tag``; the count so far."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"])
    return int(_client.hincrby(f"parity-tests:{tag}", step, 1))


class ParityState(FlowState):
    tag: str = ""
    trail: Annotated[list[str], append] = []
    count: int = 0
    approved: str = ""


class LinearParity(Flow[ParityState]):
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


class JoinParity(Flow[ParityState]):
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


class OrParity(Flow[ParityState]):
    @start()
    def first(self) -> str:
        return "a"

    @start()
    def second(self) -> str:
        return "b"

    @listen(or_(first, second))
    def either(self) -> str:
        self.state.count += 1
        return "either"


class LoopParity(Flow[ParityState]):
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


class RunawayParity(Flow[ParityState]):
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


class RetryParity(Flow[ParityState]):
    @start()
    def begin(self) -> str:
        return "go"

    @listen(begin, retries=2, retry_backoff=0.01)
    def flaky(self) -> str:
        if attempts(self.state.tag, "flaky") == 1:
            raise ConnectionError("first attempt fails")
        self.state.count = 1
        return "ok"


class ExhaustedParity(Flow[ParityState]):
    @start()
    def begin(self) -> str:
        return "go"

    @listen(begin, retries=1, retry_backoff=0.01)
    def broken(self) -> str:
        attempts(self.state.tag, "broken")
        raise ValueError("always fails")


class PauseParity(Flow[ParityState]):
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
