"""Flows of the reliability tests (recovery, backlog, time limits, partitions, chaos).

Every method writes a trace of its executions to the Redis of ``RUNNER_REDIS_URL``
(:func:`trace`: method, pid, start and end times), so a test can tell when a step ran
again after a kill, and how often it ran, apart from how often it was committed. The
instrumentation's client retries for half a minute, so a Redis restart during a chaos
run never fails a step through the test's own bookkeeping.
"""

from __future__ import annotations

import json
import os
import random
import time
from functools import lru_cache
from typing import Annotated, Any

import redis
from celery import signals
from celery.exceptions import SoftTimeLimitExceeded
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from runner import Flow, FlowState, and_, append, listen, or_, router, start
from runner.ids import method_of

TRACE_RECEIPTS = "RELIABILITY_TRACE_RECEIPTS"
"""Set (to anything) in a worker's environment: its main process also traces each step
message it receives (``recv``, with its own pid), so the chaos driver can tell a kill that
took a step's re-sent message with it."""
BUSY = "reliability:busy"
"""Hash pid -> ``<run>|<method>`` of the steps running now (the chaos killer aims at them)."""


@lru_cache(maxsize=4)
def _client(pid: int) -> redis.Redis:
    # One client per process (prefork children fork after import), patient across restarts.
    return redis.Redis.from_url(
        os.environ["RUNNER_REDIS_URL"],
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 60),
        socket_timeout=10,
    )


def client() -> redis.Redis:
    """The instrumentation's client (``RUNNER_REDIS_URL``)."""
    return _client(os.getpid())


def trace_key(run_id: str) -> str:
    """The run's trace list: one JSON entry per execution start and end."""
    return f"reliability:{{{run_id}}}:trace"


class trace:
    """Record one execution of ``method`` of ``run_id``: its start, and its end if it ends."""

    def __init__(self, run_id: str, method: str) -> None:
        self.run_id, self.method, self.pid = run_id, method, os.getpid()

    def _push(self, kind: str) -> None:
        entry = {"m": self.method, "pid": self.pid, "t": time.time(), "e": kind}
        client().rpush(trace_key(self.run_id), json.dumps(entry))

    def __enter__(self) -> trace:
        self._push("start")
        client().hset(BUSY, str(self.pid), f"{self.run_id}|{self.method}")
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        client().hdel(BUSY, str(self.pid))
        if exc_type is None:
            self._push("end")


def _received(request: Any = None, **_: Any) -> None:
    kwargs = getattr(request, "kwargs", None) or {}
    run_id, activation = kwargs.get("run_id"), kwargs.get("activation")
    if run_id and activation:
        entry = {"m": method_of(str(activation)), "pid": os.getpid(), "t": time.time(), "e": "recv"}
        client().rpush(trace_key(str(run_id)), json.dumps(entry))


if os.environ.get(TRACE_RECEIPTS):
    signals.task_received.connect(_received, weak=False)


def executions(r: redis.Redis, run_id: str, method: str | None = None) -> list[dict[str, Any]]:
    """The recorded execution starts of the run (of ``method`` if given), oldest first."""
    entries = [json.loads(raw) for raw in r.lrange(trace_key(run_id), 0, -1)]
    return [e for e in entries if e["e"] == "start" and (method is None or e["m"] == method)]


def entries(r: redis.Redis, run_id: str) -> list[dict[str, Any]]:
    """Every trace entry of the run (starts and ends), oldest first."""
    return [json.loads(raw) for raw in r.lrange(trace_key(run_id), 0, -1)]


# --- chaos: fan-out, join, router -------------------------------------------------------------


class ChaosState(FlowState):
    """``n`` picks the router's branch; every step appends its name to ``effects``."""

    n: int = 0
    effects: Annotated[list[str], append] = []


def _work(flow: Any, method: str) -> str:
    with trace(flow.state.id, method):
        # Seeded by run and step, so a re-run sleeps as long as the first attempt did.
        time.sleep(random.Random(f"{flow.state.id}/{method}").uniform(0.1, 0.5))
        flow.state.effects.append(method)
    return method


class ChaosRouted(Flow[ChaosState]):
    """split -> a, b, c in parallel -> join (and_) -> route (router: even/odd on ``n``)
    -> evens or odds -> finish (or_): seven steps per run."""

    @start()
    def split(self) -> str:
        return _work(self, "split")

    @listen(split)
    def a(self) -> str:
        return _work(self, "a")

    @listen(split)
    def b(self) -> str:
        return _work(self, "b")

    @listen(split)
    def c(self) -> str:
        return _work(self, "c")

    @listen(and_(a, b, c))
    def join(self) -> str:
        return _work(self, "join")

    @router(join)
    def route(self) -> str:
        _work(self, "route")
        return "even" if self.state.n % 2 == 0 else "odd"

    @listen("even")
    def evens(self) -> str:
        return _work(self, "evens")

    @listen("odd")
    def odds(self) -> str:
        return _work(self, "odds")

    @listen(or_(evens, odds))
    def finish(self) -> list[str]:
        _work(self, "finish")
        return sorted(self.state.effects)


def expected_effects(n: int) -> list[str]:
    """What a :class:`ChaosRouted` run with input ``n`` ends with, each step once."""
    branch = "evens" if n % 2 == 0 else "odds"
    return sorted(["split", "a", "b", "c", "join", "route", branch, "finish"])


# --- one slow step ----------------------------------------------------------------------------


class NapState(FlowState):
    """``seconds``: how long ``nap`` sleeps on its first execution (``again``: later ones)."""

    seconds: float = 1.0
    again: float | None = None
    who: str = ""


class Nap(Flow[NapState]):
    """A single step that sleeps ``seconds`` (``again`` on a re-run, if given)."""

    @start()
    def nap(self) -> str:
        run = self.state.id
        with trace(run, "nap"):
            first = len(executions(client(), run, "nap")) == 1
            time.sleep(
                self.state.seconds if first or self.state.again is None else self.state.again
            )
            self.state.who = f"pid {os.getpid()}"
        return self.state.who


# --- time limits --------------------------------------------------------------------------------


class LimitState(FlowState):
    """Nothing but the run's id."""


class OverrunsHard(Flow[LimitState]):
    """A step that ignores its soft time limit, so the pool kills it at the hard one
    (``time_limit * 1.5 + 5`` s); one retry."""

    @start(time_limit=0.5, retries=1, retry_backoff=0.1)
    def stubborn(self) -> None:
        with trace(self.state.id, "stubborn"):
            try:
                time.sleep(60)
            except SoftTimeLimitExceeded:
                time.sleep(60)  # ignores the soft limit: only the hard one stops it


class OverrunsSoft(Flow[LimitState]):
    """A step that overruns its soft time limit (and lets it stop it); one retry."""

    @start(time_limit=0.5, retries=1, retry_backoff=0.1)
    def slow(self) -> None:
        with trace(self.state.id, "slow"):
            time.sleep(5)


# --- a retry waiting on a worker ------------------------------------------------------------


class FailsOnce(Flow[LimitState]):
    """A step whose first execution fails; its retry waits ``retry_backoff`` (20-40 s) on
    the worker that received it, unless recovery sends it sooner."""

    @start(retries=1, retry_backoff=40)
    def shaky(self) -> str:
        with trace(self.state.id, "shaky"):
            n = len(executions(client(), self.state.id, "shaky"))
            if n == 1:
                raise RuntimeError("first execution fails")
        return f"execution {n}"
