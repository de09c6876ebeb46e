"""Flows only the flow-control benchmark's workers import (``RUNNER_FLOW_MODULES``)."""

from __future__ import annotations

import os
import time

import redis

from runner import Flow, FlowState, start

RATE = "10/s"
"""The rate limit the benchmark measures against."""


class Batch(FlowState):
    """Which batch a run belongs to (its starts are noted under it)."""

    batch: str = ""


_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"])
    return _client


def starts_key(batch: str) -> str:
    """The list of start times of ``batch``'s limited steps."""
    return f"bench-limits:{batch}:starts"


class LimitedFlow(Flow[Batch]):
    """One step limited to :data:`RATE` across the deployment."""

    @start(rate_limit=RATE)
    def call(self) -> None:
        _redis().rpush(starts_key(self.state.batch), time.time())


class FreeFlow(Flow[Batch]):
    """One unlimited step."""

    @start()
    def ping(self) -> str:
        return "pong"
