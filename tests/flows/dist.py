"""Flows of the distributed tests; the test workers import this module (allow-list).

Every method records its execution in Redis (:func:`executed`: one counter per run and
method, bumped when the method body starts), so tests can tell how often a step *ran*
from how often it was *committed* (the run's history). Keys live under
``dist-test:{<run id>}:`` on the test database.
"""

from __future__ import annotations

import os
import random
import time
from functools import lru_cache
from typing import Annotated, Any

import redis

from runner import Flow, FlowState, and_, append, listen, or_, start

WAIT = 20.0
"""Longest a step waits on a barrier or a gate before giving up."""


@lru_cache(maxsize=1)
def _client(pid: int) -> redis.Redis:
    # One client per process (prefork children fork after import).
    return redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"])


def client() -> redis.Redis:
    """A client on the test database (``RUNNER_REDIS_URL``)."""
    return _client(os.getpid())


def key(run_id: str, *parts: str) -> str:
    """A test key of run ``run_id``."""
    return ":".join(["dist-test", f"{{{run_id}}}", *parts])


def executed(run_id: str, method: str) -> int:
    """Count one execution of ``method`` in run ``run_id``; the count so far."""
    r = client()
    r.rpush(key(run_id, "pids", method), os.getpid())
    return int(r.incr(key(run_id, "exec", method)))


def executions(r: redis.Redis, run_id: str, method: str) -> int:
    """How often ``method`` of run ``run_id`` started (read from a test)."""
    return int(r.get(key(run_id, "exec", method)) or 0)


def barrier(run_id: str, name: str, parties: int) -> None:
    """Block until ``parties`` steps reached the barrier ``name`` (or :data:`WAIT` passed)."""
    r = client()
    r.incr(key(run_id, "barrier", name))
    deadline = time.monotonic() + WAIT
    while int(r.get(key(run_id, "barrier", name)) or 0) < parties:
        if time.monotonic() > deadline:
            return
        time.sleep(0.005)


def wait_gate(run_id: str, name: str) -> bool:
    """Block until a test opens the gate ``name`` (``True``), or :data:`WAIT` passed."""
    r = client()
    deadline = time.monotonic() + WAIT
    while not r.exists(key(run_id, "gate", name)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- exactly-once dispatch -------------------------------------------------------------------


class TrailState(FlowState):
    """Each method appends its name to ``trail``."""

    trail: Annotated[list[str], append] = []


class DistDiamond(Flow[TrailState]):
    """top -> left, right -> both (and_), any (or_) -> end (and_ of both and any)."""

    @start()
    def top(self) -> str:
        executed(self.state.id, "top")
        self.state.trail.append("top")
        return "top"

    @listen(top)
    def left(self) -> str:
        executed(self.state.id, "left")
        self.state.trail.append("left")
        return "left"

    @listen(top)
    def right(self) -> str:
        executed(self.state.id, "right")
        self.state.trail.append("right")
        return "right"

    @listen(and_(left, right))
    def both(self) -> str:
        executed(self.state.id, "both")
        self.state.trail.append("both")
        return "both"

    @listen(or_(left, right))
    def any(self) -> str:
        executed(self.state.id, "any")
        self.state.trail.append("any")
        return "any"

    @listen(and_(both, any))
    def end(self) -> list[str]:
        executed(self.state.id, "end")
        self.state.trail.append("end")
        return sorted(self.state.trail)


class RaceState(FlowState):
    """Two branches write ``winner`` (no reducer) and ``notes`` (append)."""

    winner: str = ""
    notes: Annotated[list[str], append] = []
    joined: int = 0


class DistRace(Flow[RaceState]):
    """go -> red, blue (released together by a barrier) -> join (and_)."""

    @start()
    def go(self) -> None:
        executed(self.state.id, "go")

    @listen(go)
    def red(self) -> str:
        executed(self.state.id, "red")
        barrier(self.state.id, "race", 2)
        self.state.winner = "red"
        self.state.notes.append("red")
        return "red"

    @listen(go)
    def blue(self) -> str:
        executed(self.state.id, "blue")
        barrier(self.state.id, "race", 2)
        self.state.winner = "blue"
        self.state.notes.append("blue")
        return "blue"

    @listen(and_(red, blue))
    def join(self) -> str:
        executed(self.state.id, "join")
        self.state.joined += 1
        return self.state.winner


# --- ten parallel branches --------------------------------------------------------------------


class FanState(FlowState):
    """Ten branches each append to ``items`` and set a field of their own."""

    items: Annotated[list[str], append] = []
    f0: str = ""
    f1: str = ""
    f2: str = ""
    f3: str = ""
    f4: str = ""
    f5: str = ""
    f6: str = ""
    f7: str = ""
    f8: str = ""
    f9: str = ""
    seen: int = 0


def _branch(i: int):  # type: ignore[no-untyped-def]
    def branch(self: DistFan) -> int:
        executed(self.state.id, f"b{i}")
        self.state.items.append(f"item-{i}")
        setattr(self.state, f"f{i}", f"set-{i}")
        return i

    branch.__name__ = f"b{i}"
    return branch


class DistFan(Flow[FanState]):
    """root -> b0..b9 in parallel -> gather (and_ of all ten)."""

    @start()
    def root(self) -> None:
        executed(self.state.id, "root")

    b0 = listen(root)(_branch(0))
    b1 = listen(root)(_branch(1))
    b2 = listen(root)(_branch(2))
    b3 = listen(root)(_branch(3))
    b4 = listen(root)(_branch(4))
    b5 = listen(root)(_branch(5))
    b6 = listen(root)(_branch(6))
    b7 = listen(root)(_branch(7))
    b8 = listen(root)(_branch(8))
    b9 = listen(root)(_branch(9))

    @listen(and_(b0, b1, b2, b3, b4, b5, b6, b7, b8, b9))
    def gather(self) -> int:
        executed(self.state.id, "gather")
        self.state.seen = len(self.state.items)
        return self.state.seen


# --- failures ---------------------------------------------------------------------------------


class RetryState(FlowState):
    """``done`` is set by the step that finally succeeds."""

    done: str = ""
    sibling: str = ""


class DistFlaky(Flow[RetryState]):
    """setup -> flaky (fails twice, then succeeds; retries=2)."""

    @start()
    def setup(self) -> None:
        executed(self.state.id, "setup")

    @listen(setup, retries=2, retry_backoff=0.05)
    def flaky(self) -> str:
        n = executed(self.state.id, "flaky")
        if n <= 2:
            raise RuntimeError(f"flaky attempt {n}")
        self.state.done = f"after {n} attempts"
        return self.state.done


class DistDoomed(Flow[RetryState]):
    """setup -> doomed (always fails; retries=2) and sibling (slow, succeeds) in parallel."""

    @start()
    def setup(self) -> None:
        executed(self.state.id, "setup")

    @listen(setup, retries=2, retry_backoff=0.05)
    def doomed(self) -> None:
        n = executed(self.state.id, "doomed")
        raise ValueError(f"boom {n}")

    @listen(setup)
    def sibling(self) -> str:
        executed(self.state.id, "sibling")
        wait_gate(self.state.id, "sibling")
        self.state.sibling = "finished"
        return "finished"

    @listen(and_(doomed, sibling))
    def never(self) -> None:
        executed(self.state.id, "never")


class DistSlow(Flow[RetryState]):
    """A start with a 1 s soft time limit that sleeps 5 s."""

    @start(time_limit=1)
    def slow(self) -> None:
        executed(self.state.id, "slow")
        time.sleep(5)
        self.state.done = "slept"


# --- crashes and cancel -------------------------------------------------------------------------


class DistSleeper(Flow[TrailState]):
    """first -> nap (tells a test it started, then sleeps 3 s) -> last."""

    @start()
    def first(self) -> None:
        executed(self.state.id, "first")
        self.state.trail.append("first")

    @listen(first)
    def nap(self) -> None:
        executed(self.state.id, "nap")
        client().set(key(self.state.id, "nap-pid"), os.getpid())
        time.sleep(3)
        self.state.trail.append("nap")

    @listen(nap)
    def last(self) -> list[str]:
        executed(self.state.id, "last")
        self.state.trail.append("last")
        return list(self.state.trail)


class DistGated(Flow[TrailState]):
    """one -> two (waits for a test to open its gate) -> three."""

    @start()
    def one(self) -> None:
        executed(self.state.id, "one")
        self.state.trail.append("one")

    @listen(one)
    def two(self) -> None:
        executed(self.state.id, "two")
        wait_gate(self.state.id, "two")
        self.state.trail.append("two")

    @listen(two)
    def three(self) -> list[str]:
        executed(self.state.id, "three")
        self.state.trail.append("three")
        return list(self.state.trail)


# --- inputs, results, events ----------------------------------------------------------------


class EchoState(FlowState):
    """A typed input and the echo of it."""

    count: int = 0
    echo: str = ""


class DistEcho(Flow[EchoState]):
    """hello -> shout: returns the doubled input."""

    @start()
    def hello(self) -> int:
        executed(self.state.id, "hello")
        return self.state.count

    @listen(hello)
    def shout(self, count: int) -> int:
        executed(self.state.id, "shout")
        self.state.echo = f"echo {count}"
        return count * 2


class TriggerState(FlowState):
    """What the start method saw of the trigger payload."""

    seen: dict[str, Any] = {}


class Triggered(Flow[TriggerState]):
    """receive (takes CrewAI's trigger payload; fails its first execution) -> reply."""

    @start()
    def receive(self, crewai_trigger_payload: Any = None) -> str:
        if executed(self.state.id, "receive") == 1:
            raise RuntimeError("the first attempt fails")
        self.state.seen = {"payload": crewai_trigger_payload}
        return str((crewai_trigger_payload or {}).get("ticket"))

    @listen(receive)
    def reply(self, ticket: str, crewai_trigger_payload: Any = "unset") -> str:
        return f"ticket {ticket}, payload here too: {crewai_trigger_payload is not None}"


# --- chaos --------------------------------------------------------------------------------------


class ChaosState(FlowState):
    """Every step appends its name to ``effects``."""

    effects: Annotated[list[str], append] = []


def _work(flow: DistChaos, method: str) -> str:
    executed(flow.state.id, method)
    # Long enough for kills to land mid-step; seeded by the run and step, as
    # tests/flows/reliability.py does, so a run's timings repeat.
    time.sleep(random.Random(f"{flow.state.id}/{method}").uniform(0.2, 0.6))
    flow.state.effects.append(method)
    return method


class DistChaos(Flow[ChaosState]):
    """begin -> p1, p2, p3 in parallel -> join (and_) -> final: six steps."""

    @start()
    def begin(self) -> str:
        return _work(self, "begin")

    @listen(begin)
    def p1(self) -> str:
        return _work(self, "p1")

    @listen(begin)
    def p2(self) -> str:
        return _work(self, "p2")

    @listen(begin)
    def p3(self) -> str:
        return _work(self, "p3")

    @listen(and_(p1, p2, p3))
    def join(self) -> str:
        return _work(self, "join")

    @listen(join)
    def final(self) -> list[str]:
        _work(self, "final")
        return sorted(self.state.effects)
