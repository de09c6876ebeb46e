"""A flow for the full-store tests: its first step waits (holding its run running) until the
test opens its gate, then the next step commits a state of about 50 KB."""

from __future__ import annotations

import time

import redis

from runner import Flow, FlowState, listen, start
from runner.settings import get_settings


def gate_key(tag: str) -> str:
    """The flag that lets :class:`WaitingFlow`'s ``wait`` step end."""
    return f"full-test:{tag}:gate"


class Waiting(FlowState):
    tag: str = ""
    notes: str = ""


class WaitingFlow(Flow[Waiting]):
    """wait (until the gate opens, at most 60 s) -> write (50 KB of notes)."""

    @start()
    def wait(self) -> str:
        client = redis.Redis.from_url(str(get_settings().redis_url))
        try:
            deadline = time.monotonic() + 60
            while not client.exists(gate_key(self.state.tag)) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            client.close()
        return "opened"

    @listen(wait)
    def write(self) -> str:
        self.state.notes = "n" * 50_000
        return "written"
