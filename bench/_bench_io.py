"""The flows of ``bench/threads.py`` (its flow workers import this module,
``RUNNER_FLOW_MODULES``): three 1-second I/O-bound steps per run. A sleep stands for the wait
on a model or an API: it holds a slot and no CPU, which is what a thread pool is for. The raw
Celery baseline's task is in :mod:`bench._bench_io_tasks`."""

from __future__ import annotations

import asyncio
import time

from runner import Flow, FlowState, listen, start

WAIT = 1.0
"""Seconds each step waits."""


class IOFlow(Flow[FlowState]):
    """fetch -> summarize -> store, each a blocking 1-second wait."""

    @start()
    def fetch(self) -> None:
        time.sleep(WAIT)

    @listen(fetch)
    def summarize(self) -> None:
        time.sleep(WAIT)

    @listen(summarize)
    def store(self) -> None:
        time.sleep(WAIT)


class AsyncIOFlow(Flow[FlowState]):
    """The same three waits as ``async def`` methods (``await asyncio.sleep``)."""

    @start()
    async def fetch(self) -> None:
        await asyncio.sleep(WAIT)

    @listen(fetch)
    async def summarize(self) -> None:
        await asyncio.sleep(WAIT)

    @listen(summarize)
    async def store(self) -> None:
        await asyncio.sleep(WAIT)
