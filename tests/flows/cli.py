"""Flows the CLI tests run on the test workers.

Each step counts its executions in Redis under ``cli-test:<tag>:runs:<step>`` (``tag``
is a state field each test picks), so a test can tell which steps ran and how often.
"""

from __future__ import annotations

import time

import redis

from runner import Flow, FlowState, listen, start
from runner.settings import get_settings


def _redis() -> redis.Redis:
    url = get_settings().redis_url
    assert url, "the test workers run with RUNNER_REDIS_URL set"
    return redis.Redis.from_url(url)


def count_key(tag: str, step: str) -> str:
    """Where step ``step`` of runs tagged ``tag`` counts its executions."""
    return f"cli-test:{tag}:runs:{step}"


def gate_key(tag: str) -> str:
    """The flag :class:`GatedFlow`'s ``check`` step needs (set it to let the step pass)."""
    return f"cli-test:{tag}:gate"


def _ran(tag: str, step: str) -> None:
    client = _redis()
    try:
        client.incr(count_key(tag, step))
    finally:
        client.close()


class GateState(FlowState):
    """A tag for the counters, and a number the ``check`` step adds."""

    tag: str = ""
    x: int = 0


class GatedFlow(Flow[GateState]):
    """fetch -> check (fails while the tag's gate flag is unset) -> report."""

    @start()
    def fetch(self) -> int:
        _ran(self.state.tag, "fetch")
        return 1

    @listen(fetch)
    def check(self, fetched: int) -> int:
        _ran(self.state.tag, "check")
        client = _redis()
        try:
            if not client.exists(gate_key(self.state.tag)):
                raise RuntimeError("gate closed")
        finally:
            client.close()
        return fetched + self.state.x

    @listen(check)
    def report(self, total: int) -> str:
        _ran(self.state.tag, "report")
        time.sleep(0.2)  # long enough for `runner watch` to see the run running
        return f"total={total}"


class ApprovalState(FlowState):
    """A tag for the counters, and the human's approval."""

    tag: str = ""
    approved: bool = False


class ApprovalFlow(Flow[ApprovalState]):
    """draft -> approve (pauses until ``approved``) -> publish."""

    @start()
    def draft(self) -> str:
        _ran(self.state.tag, "draft")
        return "draft"

    @listen(draft)
    def approve(self, text: str) -> str:
        _ran(self.state.tag, "approve")
        if not self.state.approved:
            self.pause("need approval")
        return f"{text} approved"

    @listen(approve)
    def publish(self, text: str) -> str:
        _ran(self.state.tag, "publish")
        return f"{text} published"
