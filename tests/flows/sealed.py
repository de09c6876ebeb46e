"""A flow whose every payload holds a marker, for the encryption tests on workers: its input
(``secret``), the trigger payload, each step's output and state change, its usage, and a
retry carrying the failed attempt's usage (``spent``) in its message."""

from __future__ import annotations

import os

import redis

from runner import Flow, FlowState, listen, record_usage, start

_client: redis.Redis | None = None


def _first_time(tag: str) -> bool:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"])
    return bool(_client.set(f"sealed-tests:{tag}", 1, nx=True, ex=600))


class Secrets(FlowState):
    tag: str = ""
    secret: str = ""
    notes: str = ""


class SecretFlow(Flow[Secrets]):
    """read (fails its first attempt after spending tokens; retried after ``3 s``, the
    retry's message sits in the broker meanwhile) -> write."""

    @start(retries=1, retry_backoff=3.0)
    def read(self) -> str:
        record_usage(prompt_tokens=30, completion_tokens=10)
        if _first_time(self.state.tag):
            raise RuntimeError("the first attempt fails")
        self.state.notes = f"notes on {self.state.secret}"
        return f"read {self.state.secret}"

    @listen(read)
    def write(self, text: str) -> str:
        return f"wrote {text}"
