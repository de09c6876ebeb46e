"""The CrewAI authoring model run in process: state, triggers, routers, loops, async, parallel."""

from __future__ import annotations

import asyncio
import threading
import uuid
from enum import Enum
from typing import Any

import pytest

from runner import Flow, FlowState, and_, listen, or_, router, start
from runner.errors import CycleLimitExceeded
from tests._flow_support import Tally

# --- state ----------------------------------------------------------------------------------


class TopicState(FlowState):
    topic: str = "tides"
    seen: list[str] = []


class TopicFlow(Flow[TopicState]):
    @start()
    def plan(self) -> str:
        self.state.seen.append("plan")
        return f"plan:{self.state.topic}"


def test_flowstate_id_defaults_to_a_fresh_uuid_per_flow():
    first, second = TopicFlow(), TopicFlow()

    assert str(uuid.UUID(first.state.id)) == first.state.id
    assert first.state.id != second.state.id
    assert first.flow_id == first.state.id


def test_inputs_set_state_fields_before_the_first_method():
    flow = TopicFlow()

    assert flow.kickoff(inputs={"topic": "reefs"}) == "plan:reefs"
    assert flow.state.topic == "reefs"
    assert flow.state.seen == ["plan"]


class DictFlow(Flow[dict[str, Any]]):
    initial_state = dict()  # CrewAI spells it so

    @start()
    def plan(self) -> str:
        self.state["steps"] = [*self.state.get("steps", []), "plan"]
        return str(self.state.get("topic"))


class Notes(dict[str, Any]):
    """A dict subclass used as an unstructured state."""


class DictSubclassFlow(Flow[Any]):
    initial_state = Notes

    @start()
    def plan(self) -> str:
        self.state["kind"] = type(self.state).__name__
        return "done"


def test_dict_state_has_a_uuid_under_id_and_takes_inputs():
    flow = DictFlow()

    result = flow.kickoff(inputs={"topic": "reefs"})

    assert result == "reefs"
    assert str(uuid.UUID(flow.state["id"])) == flow.state["id"] == flow.flow_id
    assert flow.state["steps"] == ["plan"]


def test_dict_subclass_as_initial_state_is_an_unstructured_state():
    flow = DictSubclassFlow()

    assert flow.kickoff() == "done"
    assert isinstance(flow.state, dict)
    assert flow.state["kind"] == "Notes"
    assert "id" in flow.state


# --- triggers -------------------------------------------------------------------------------


class Wiring(Flow[FlowState]):
    """Every way of naming a trigger."""

    def __init__(self, tally: Tally, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally

    @start()
    def begin(self) -> str:
        self.tally("begin")
        return "b"

    @listen(begin)
    def by_method(self) -> str:
        self.tally("by_method")
        return "m"

    @listen("begin")
    def by_name(self) -> str:
        self.tally("by_name")
        return "n"

    @router(by_method)
    def decide(self) -> str:
        self.tally("decide")
        return "go" if self.state.id else "never"

    @listen("go")
    def by_label(self) -> str:
        self.tally("by_label")
        return "l"

    @start("go")
    def conditional_start(self) -> str:
        self.tally("conditional_start")
        return "c"

    @listen(or_(and_(by_name, by_label), "never"))
    def nested(self) -> str:
        self.tally("nested")
        return "nested"

    @listen("never")
    def unreached(self) -> None:
        self.tally("unreached")


def test_listen_by_method_name_label_and_nested_conditions():
    tally = Tally()

    Wiring(tally).kickoff()

    assert dict(tally.counts) == {
        "begin": 1,
        "by_method": 1,
        "by_name": 1,
        "decide": 1,
        "by_label": 1,
        "conditional_start": 1,
        "nested": 1,
    }
    order = tally.order
    assert order.index("begin") < order.index("by_method") < order.index("decide")
    assert order.index("decide") < order.index("by_label") < order.index("nested")
    assert order.index("by_name") < order.index("nested")
    # a conditional start does not run at kickoff when there is an unconditional one
    assert order.index("decide") < order.index("conditional_start")


class OnlyConditionalStarts(Flow[FlowState]):
    def __init__(self, tally: Tally, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally

    @start("label_a")
    def first(self) -> None:
        self.tally("first")

    @start("label_b")
    def second(self) -> None:
        self.tally("second")

    @router(and_(first, second), labels=["label_a", "label_b", "done"])
    def after(self) -> str:
        self.tally("after")
        return "done"


def test_conditional_starts_all_run_at_kickoff_when_no_start_is_unconditional():
    tally = Tally()

    OnlyConditionalStarts(tally).kickoff()

    assert dict(tally.counts) == {"first": 1, "second": 1, "after": 1}


class Route(Enum):
    FAST = "fast"
    SLOW = "slow"


class EnumRouterState(FlowState):
    slow: bool = False
    path: str = ""


class EnumRouterFlow(Flow[EnumRouterState]):
    @start()
    def begin(self) -> int:
        return 7

    @router(begin)
    def choose(self) -> Route:
        return Route.SLOW if self.state.slow else Route.FAST

    @listen(Route.FAST)
    def on_fast(self) -> str:
        self.state.path = "fast"
        return "took fast"

    @listen("slow")
    def on_slow(self) -> str:
        self.state.path = "slow"
        return "took slow"


@pytest.mark.parametrize("slow", [False, True])
def test_router_returning_an_enum_member_emits_its_value(slow):
    flow = EnumRouterFlow()

    result = flow.kickoff(inputs={"slow": slow})

    expected = "slow" if slow else "fast"
    assert flow.state.path == expected
    assert result == f"took {expected}"


class ArgumentFlow(Flow[FlowState]):
    received: dict[str, Any]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.received = {}

    @start()
    def plan(self) -> dict[str, Any]:
        return {"outline": ["a", "b"]}

    @listen(plan)
    def research(self, plan_output: dict[str, Any]) -> int:
        self.received["research"] = plan_output
        return len(plan_output["outline"])

    @router(research)
    def check(self, count: int) -> str:
        self.received["check"] = count
        return "enough" if count >= 2 else "more"

    @listen("enough")
    def write(self, label_output: str) -> str:
        self.received["write"] = label_output
        return "report"

    @listen(or_(plan, research))
    def either(self, value: Any) -> None:
        self.received.setdefault("either", value)


def test_listeners_taking_an_argument_receive_their_triggers_output():
    flow = ArgumentFlow()

    flow.kickoff()

    assert flow.received["research"] == {"outline": ["a", "b"]}
    assert flow.received["check"] == 2
    assert flow.received["write"] == "enough"  # a label's listener gets the router's output
    assert flow.received["either"] == {"outline": ["a", "b"]}


class LoopState(FlowState):
    tries: int = 0
    limit: int = 3


class LoopFlow(Flow[LoopState]):
    def __init__(self, tally: Tally, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally

    @start()
    def begin(self) -> None:
        self.tally("begin")

    @router(or_(begin, "retry"), max_calls=5)
    def attempt(self) -> str:
        self.tally("attempt")
        self.state.tries += 1
        return "retry" if self.state.tries < self.state.limit else "done"

    @listen("done")
    def finish(self) -> int:
        self.tally("finish")
        return self.state.tries


def test_router_listening_to_its_own_label_loops_until_it_routes_elsewhere():
    tally = Tally()
    flow = LoopFlow(tally)

    assert flow.kickoff() == 3
    assert dict(tally.counts) == {"begin": 1, "attempt": 3, "finish": 1}


def test_a_loop_beyond_max_calls_raises():
    tally = Tally()

    with pytest.raises(CycleLimitExceeded, match="max_calls is 5"):
        LoopFlow(tally).kickoff(inputs={"limit": 100})

    assert tally["attempt"] == 5
    assert tally["finish"] == 0


# --- return value, async, parallel ----------------------------------------------------------


class ChainFlow(Flow[FlowState]):
    @start()
    def one(self) -> int:
        return 1

    @listen(one)
    def two(self, n: int) -> int:
        return n + 1

    @listen(two)
    def three(self, n: int) -> dict[str, int]:
        return {"n": n + 1}


def test_kickoff_returns_the_last_completed_methods_output():
    assert ChainFlow().kickoff() == {"n": 3}


class AsyncState(FlowState):
    trail: list[str] = []


class AsyncFlow(Flow[AsyncState]):
    @start()
    async def fetch(self) -> str:
        await asyncio.sleep(0.001)
        self.state.trail.append("fetch")
        return "page"

    @listen(fetch)
    def parse(self, page: str) -> str:
        self.state.trail.append("parse")
        return page.upper()

    @listen(parse)
    async def store(self, parsed: str) -> str:
        await asyncio.sleep(0.001)
        self.state.trail.append("store")
        return f"stored {parsed}"


def test_async_and_sync_methods_mix():
    flow = AsyncFlow()

    assert flow.kickoff() == "stored PAGE"
    assert flow.state.trail == ["fetch", "parse", "store"]


async def test_kickoff_async_and_akickoff_run_without_blocking_the_loop():
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.0005)

    task = asyncio.create_task(ticker())
    try:
        first = await AsyncFlow().kickoff_async()
        second = await AsyncFlow().akickoff(inputs={})
    finally:
        task.cancel()
    assert first == second == "stored PAGE"
    assert ticks > 1


class ParallelState(FlowState):
    left: str = ""
    right: str = ""
    joined: str = ""


class ParallelFlow(Flow[ParallelState]):
    def __init__(self, barrier: threading.Barrier, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.barrier = barrier

    @start()
    def begin(self) -> None: ...

    @listen(begin)
    def left_branch(self) -> str:
        self.barrier.wait()  # returns only once the other branch is running too
        self.state.left = "L"
        return "L"

    @listen(begin)
    def right_branch(self) -> str:
        self.barrier.wait()
        self.state.right = "R"
        return "R"

    @listen(and_(left_branch, right_branch))
    def join(self) -> str:
        self.state.joined = self.state.left + self.state.right
        return self.state.joined


def test_parallel_listeners_run_concurrently_and_both_writes_survive():
    flow = ParallelFlow(threading.Barrier(2, timeout=5))

    assert flow.kickoff() == "LR"
    assert (flow.state.left, flow.state.right) == ("L", "R")


class NestedLoopFlow(Flow[FlowState]):
    """A sync method that runs an event loop of its own (as many client libraries do)."""

    @start()
    def fetch(self) -> str:
        async def get() -> str:
            await asyncio.sleep(0)
            return "page"

        return asyncio.run(get())

    @listen(fetch)
    async def parse(self, page: str) -> str:
        await asyncio.sleep(0)
        return page.upper()


def test_sync_kickoff_works_outside_an_event_loop_with_methods_that_start_loops():
    assert NestedLoopFlow().kickoff() == "PAGE"


async def test_sync_kickoff_called_inside_a_running_event_loop_still_runs_every_method():
    assert NestedLoopFlow().kickoff() == "PAGE"
    assert AsyncFlow().kickoff() == "stored PAGE"


class ThreadsFlow(Flow[FlowState]):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threads: dict[str, str] = {}

    @start()
    def one(self) -> None:
        self.threads["one"] = threading.current_thread().name

    @listen(one)
    def left(self) -> None:
        self.threads["left"] = threading.current_thread().name

    @listen(one)
    def right(self) -> None:
        self.threads["right"] = threading.current_thread().name


def test_a_lone_sync_method_runs_on_the_callers_thread_and_parallel_ones_on_the_pool():
    flow = ThreadsFlow()

    flow.kickoff()

    assert flow.threads["one"] == threading.current_thread().name
    assert flow.threads["left"].startswith("flow") and flow.threads["right"].startswith("flow")
