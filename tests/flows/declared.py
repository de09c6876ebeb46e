"""Code the declared flows of tests/test_declared*.py name (``tests.flows.declared:...``).

The test workers import this module (their allow-list), so a declared flow's code
references resolve there. ``count_item`` counts each item's executions in Redis under
``decl-test:<tag>:item:<item>`` and sleeps ``pause`` seconds, so a test can kill a worker
mid-fan-out and tell which items ran how often. ``CountingSearch`` is a tool (``call: tool``)
that counts its calls the same way.
"""

from __future__ import annotations

import time

import redis

from runner import BaseTool
from runner.flow.llm import register_llm
from runner.settings import get_settings


def strip(text: str) -> str:
    """``text`` without surrounding blanks."""
    return text.strip()


def count_key(tag: str, item: object) -> str:
    """Where item ``item`` of runs tagged ``tag`` counts its executions."""
    return f"decl-test:{tag}:item:{item}"


def _count(tag: str, item: object) -> None:
    url = get_settings().redis_url
    assert url, "the test workers run with RUNNER_REDIS_URL set"
    client = redis.Redis.from_url(url)
    try:
        client.incr(count_key(tag, item))
    finally:
        client.close()


def count_item(item: object, tag: str, pause: float = 0.0) -> str:
    """Count one execution of ``item``, wait ``pause`` seconds, return ``done-<item>``."""
    _count(tag, item)
    time.sleep(pause)
    return f"done-{item}"


class CountingSearch(BaseTool):
    """A search tool with typed arguments: counts its calls under ``count_key(tag, query)``
    and returns ``limit`` made-up hits (a dict: the step's output is JSON)."""

    name: str = "counting_search"
    description: str = "Counts its calls and returns made-up hits."

    def _run(self, query: str, tag: str, limit: int = 2) -> dict[str, object]:
        _count(tag, query)
        return {"query": query, "hits": [f"{query} #{i}" for i in range(1, limit + 1)]}


ECHO = "test/echo-notes"
"""An LLM name the workers register (a declared crew's agents name it)."""


def _notes(prompt: str) -> str:
    return "notes on " + prompt.split("Research ", 1)[-1].split("\n", 1)[0]


register_llm(ECHO, _notes)
