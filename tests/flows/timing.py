"""Flows of the time-and-identity tests (idempotent submits, delayed starts, deadlines,
durable sleeps); the test workers import this module (allow-list). Each method counts its
executions with :func:`tests.flows.dist.executed`."""

from __future__ import annotations

import time

from runner import Flow, FlowState, listen, start

from .dist import executed


class Order(FlowState):
    """An order to greet: who, and how long the slow step takes."""

    customer: str = ""
    seconds: float = 0.0


class GreetFlow(Flow[Order]):
    """Two steps: a greeting, then its length."""

    @start()
    def greet(self) -> str:
        executed(self.state.id, "greet")
        return f"hello {self.state.customer}"

    @listen(greet)
    def measure(self, greeting: str) -> int:
        executed(self.state.id, "measure")
        return len(greeting)


class SlowFlow(Flow[Order]):
    """A step that takes ``seconds``, then a report."""

    @start()
    def crawl(self) -> str:
        executed(self.state.id, "crawl")
        end = time.monotonic() + self.state.seconds
        while time.monotonic() < end:
            time.sleep(0.1)
        return "crawled"

    @listen(crawl)
    def report(self, crawled: str) -> str:
        executed(self.state.id, "report")
        return crawled


class HastyFlow(Flow[Order]):
    """A flow whose runs have a deadline of their own: 1.5 s."""

    run_deadline = 1.5

    @start()
    def dawdle(self) -> str:
        executed(self.state.id, "dawdle")
        end = time.monotonic() + self.state.seconds
        while time.monotonic() < end:
            time.sleep(0.1)
        return "late"


class Nap(FlowState):
    """How long to sleep, and a field the step sets before its sleep."""

    seconds: float = 5.0
    before: int = 0


class NapFlow(Flow[Nap]):
    """A step that sets a field, sleeps durably, then goes on; a step after it."""

    @start()
    def nap(self) -> str:
        executed(self.state.id, "nap")
        self.state.before = 1  # idempotent: the method runs again from here after the sleep
        self.sleep(self.state.seconds)
        executed(self.state.id, "woke")
        return "rested"

    @listen(nap)
    def after(self, rested: str) -> str:
        executed(self.state.id, "after")
        return f"{rested} after {self.state.before}"


class AsyncNapFlow(Flow[Nap]):
    """An async step that sleeps twice."""

    @start()
    async def nap(self) -> str:
        executed(self.state.id, "nap")
        await self.asleep(self.state.seconds)
        executed(self.state.id, "half")
        await self.asleep(self.state.seconds)
        executed(self.state.id, "woke")
        return "rested twice"
