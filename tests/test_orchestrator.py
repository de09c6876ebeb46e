"""The pure orchestrator: given what finished, what is ready."""

from __future__ import annotations

from typing import Any

import pytest

from runner.errors import CycleLimitExceeded, GraphChanged, NotInFlight
from runner.flow import orchestrator as orch
from runner.flow.conditions import and_, or_
from runner.flow.decorators import listen, router, start
from runner.flow.graph import FlowGraph, compile_graph
from runner.flow.orchestrator import Activation, ExecutionRecord


class Runner:
    """Drives a record by completing activations in the order a test chooses."""

    def __init__(self, flow: type, outputs: dict[str, Any] | None = None) -> None:
        self.graph: FlowGraph = compile_graph(flow)
        self.outputs = outputs or {}
        self.record, self.ready = orch.ready_starts(self.graph, ExecutionRecord())
        self.runs: list[str] = []

    def finish(self, act_id: str, label: str | None = None) -> list[str]:
        method = act_id.split("#")[0]
        output = self.outputs.get(method, f"{method}-out")
        self.record, ready = orch.complete(self.graph, self.record, act_id, output, label)
        self.runs.append(act_id)
        return [a.id for a in ready]

    def drain(self, labels: dict[str, list[str]] | None = None) -> list[str]:
        """Complete in-flight activations first-in first-out until none is left."""
        labels = {k: list(v) for k, v in (labels or {}).items()}
        while self.record.in_flight:
            act = self.record.in_flight[0]
            method = act.split("#")[0]
            self.finish(act, labels[method].pop(0) if method in labels else None)
        return self.runs


class Chain:
    @start()
    def a(self) -> None: ...

    @listen(a)
    def b(self) -> None: ...

    @listen(b)
    def c(self) -> None: ...


class Diamond:
    @start()
    def top(self) -> None: ...

    @listen(top)
    def left(self) -> None: ...

    @listen(top)
    def right(self) -> None: ...

    @listen(and_(left, right))
    def join(self) -> None: ...

    @listen(left, right)
    def either(self) -> None: ...


class RetryLoop:
    @start()
    def begin(self) -> None: ...

    @listen(or_(begin, "retry"), max_calls=3)
    def attempt(self) -> None: ...

    @router(attempt)
    def check(self) -> str:
        return "ok" if self else "retry"

    @listen(attempt)
    def log(self) -> None: ...

    @listen("ok")
    def done(self) -> None: ...


def test_linear_chain_runs_in_order_and_returns_the_last_output() -> None:
    run = Runner(Chain, outputs={"c": {"final": 1}})
    assert [a.id for a in run.ready] == ["a#1"]
    assert run.drain() == ["a#1", "b#1", "c#1"]
    assert orch.is_finished(run.record)
    assert orch.last_output(run.record) == {"final": 1}
    assert run.record.triggers == {"a#1": None, "b#1": "a", "c#1": "b"}


def test_and_join_fires_exactly_once_when_both_branches_are_done() -> None:
    run = Runner(Diamond)
    assert run.finish("top#1") == ["left#1", "right#1"]
    assert run.finish("right#1") == ["either#1"]
    assert run.record.seen == {"join": ["right"]}
    assert run.finish("left#1") == ["join#1"]
    assert run.record.seen == {}
    run.drain()
    assert sorted(run.runs) == ["either#1", "join#1", "left#1", "right#1", "top#1"]


def test_and_join_resets_and_fires_again_on_the_next_wave() -> None:
    class Waves:
        @start()
        def a(self) -> None: ...

        @listen(or_(a, "more"))
        def left(self) -> None: ...

        @listen(or_(a, "more"))
        def right(self) -> None: ...

        @listen(and_(left, right))
        def join(self) -> None: ...

        @router(join)
        def again(self) -> str:
            return "more" if self else "stop"

    run = Runner(Waves)
    run.finish("a#1")
    assert run.finish("left#1") == []
    assert run.finish("right#1") == ["join#1"]
    run.finish("join#1")
    assert run.finish("again#1", "more") == ["left#2", "right#2"]
    assert run.finish("right#2") == []  # one leaf of the new wave is not enough
    assert run.record.seen == {"join": ["right"]}
    assert run.finish("left#2") == ["join#2"]
    assert run.record.causes["join#2"] == ["right#2", "left#2"]
    run.drain({"again": ["stop"]})
    assert run.record.dispatched == {"a": 1, "left": 2, "right": 2, "join": 2, "again": 2}


def test_or_listener_fires_once_per_wave_with_parallel_triggers() -> None:
    run = Runner(Diamond)
    run.finish("top#1")
    assert run.finish("left#1") == ["either#1"]
    assert run.finish("right#1") == ["join#1"]  # either already fired in this wave
    run.drain()
    assert run.runs.count("either#1") == 1 and "either#2" not in run.record.dispatched


def test_router_loop_rearms_the_or_listener_on_each_retry() -> None:
    run = Runner(RetryLoop)
    runs = run.drain({"check": ["retry", "retry", "ok"]})
    assert [r for r in runs if not r.startswith("log")] == [
        "begin#1",
        "attempt#1",
        "check#1",
        "attempt#2",
        "check#2",
        "attempt#3",
        "check#3",
        "done#1",
    ]
    assert run.record.fired == {"attempt": 3}
    assert run.record.triggers["attempt#3"] == "retry"
    assert run.record.routes == {"check": "ok"}
    assert orch.is_finished(run.record)


def test_retry_loop_through_a_second_router_runs_n_times_then_ok() -> None:
    class Loop:
        @start()
        def attempt(self) -> None: ...

        @router(attempt)
        def check(self) -> str:
            return "ok" if self else "retry"

        @listen("retry")
        def attempt_again(self) -> None: ...

        @router(attempt_again)
        def recheck(self) -> str:
            return "ok" if self else "retry"

        @listen("ok")
        def done(self) -> None: ...

    run = Runner(Loop)
    runs = run.drain({"check": ["retry"], "recheck": ["retry", "retry", "ok"]})
    assert runs == [
        "attempt#1",
        "check#1",
        "attempt_again#1",
        "recheck#1",
        "attempt_again#2",
        "recheck#2",
        "attempt_again#3",
        "recheck#3",
        "done#1",
    ]
    assert run.record.emitted["retry"] == 3 and run.record.emitted["ok"] == 1
    assert orch.is_finished(run.record)


class ChainedRouters:
    @start()
    def a(self) -> None: ...

    @router(a)
    def first(self) -> str:
        return "signal_a"

    @router("signal_a")
    def second(self) -> str:
        return "signal_b"

    @listen(or_("signal_a", "signal_b"))
    def handle(self) -> None: ...

    @listen("signal_b")
    def finish(self, label: str) -> str:
        return label


def test_chained_routers_route_on_each_others_labels() -> None:
    run = Runner(ChainedRouters, outputs={"first": "signal_a", "second": "signal_b"})
    runs = run.drain({"first": ["signal_a"], "second": ["signal_b"]})
    assert runs == ["a#1", "first#1", "second#1", "handle#1", "finish#1"]
    finish = Activation("finish#1", "finish", 1, "signal_b")
    assert orch.argument_for(run.graph, run.record, finish) == "signal_b"


def test_or_listener_does_not_double_fire_across_chained_routers() -> None:
    run = Runner(ChainedRouters)
    run.finish("a#1")
    assert run.finish("first#1", "signal_a") == ["second#1", "handle#1"]
    run.finish("handle#1")  # the listener finishes before the second router
    assert run.finish("second#1", "signal_b") == ["finish#1"]


def test_conditional_start_is_triggered_by_a_label() -> None:
    class CondStart:
        @start()
        def a(self) -> None: ...

        @router(a)
        def r(self) -> str:
            return "again"

        @start("again")
        def b(self) -> None: ...

    run = Runner(CondStart)
    assert [a.id for a in run.ready] == ["a#1"]
    run.finish("a#1")
    assert run.finish("r#1", "again") == ["b#1"]
    assert run.record.triggers["b#1"] == "again"


def test_exceeding_max_calls_raises_naming_the_step() -> None:
    run = Runner(RetryLoop)
    with pytest.raises(CycleLimitExceeded, match="attempt") as info:
        run.drain({"check": ["retry"] * 3})
    assert info.value.fields == {"step": "attempt", "limit": 3}
    assert run.record.dispatched["attempt"] == 3


def test_complete_does_not_change_its_input_record() -> None:
    run = Runner(Diamond)
    before = run.record.model_dump()
    orch.complete(run.graph, run.record, "top#1", {"x": [1]})
    assert run.record.model_dump() == before
    run.finish("top#1")
    run.finish("left#1")
    before = run.record.model_dump()
    orch.complete(run.graph, run.record, "right#1", None)
    assert run.record.model_dump() == before


def test_activation_ids_are_deterministic_for_the_same_record() -> None:
    graph = compile_graph(Diamond)
    record, _ = orch.ready_starts(graph)
    again = ExecutionRecord.model_validate(record.model_dump(mode="json"))
    first = orch.complete(graph, record, "top#1", 1)
    second = orch.complete(graph, again, "top#1", 1)
    assert first == second


def test_committing_an_activation_not_in_flight_raises() -> None:
    run = Runner(Chain)
    run.finish("a#1")
    with pytest.raises(NotInFlight, match="already committed"):
        run.finish("a#1")
    with pytest.raises(NotInFlight, match="unknown"):
        run.finish("c#4")


def test_argument_for_returns_the_trigger_output() -> None:
    run = Runner(Chain, outputs={"a": {"n": 1}})
    (start_act,) = run.ready
    assert orch.argument_for(run.graph, run.record, start_act) is None
    run.finish("a#1")
    (b,) = orch.pending(run.record)
    assert b == Activation("b#1", "b", 1, "a")
    assert orch.argument_for(run.graph, run.record, b) == {"n": 1}


def test_invalidate_reruns_the_step_and_its_downstream_only() -> None:
    run = Runner(Diamond, outputs={"top": "T"})
    run.drain()
    record = orch.invalidate(run.graph, run.record, ["left"])
    assert record.in_flight == ["left#2"]
    assert record.triggers["left#2"] == "top"
    assert orch.completed_steps(record) == {"top", "right"}
    assert set(record.outputs) == {"top", "right"}
    assert record.seen == {"join": ["right"]}  # right is done, not re-run
    (left,) = orch.pending(record)
    assert orch.argument_for(run.graph, record, left) == "T"
    run.record, run.runs = record, []
    assert sorted(run.drain()) == ["either#2", "join#2", "left#2"]
    assert run.record.dispatched == {"top": 1, "left": 2, "right": 1, "join": 2, "either": 2}


def test_invalidate_through_a_router_forgets_its_labels() -> None:
    run = Runner(RetryLoop)
    run.drain({"check": ["retry", "ok"]})
    assert run.record.routes == {"check": "ok"}
    record = orch.invalidate(run.graph, run.record, ["check", "attempt"])
    assert record.in_flight == ["attempt#3"]  # check is downstream of attempt: not re-added
    assert record.triggers["attempt#3"] == "retry"
    assert record.emitted == {"begin": 1} and record.routes == {} and record.fired == {}
    assert record.completed == ["begin#1"]
    run.record, run.runs = record, []
    with pytest.raises(CycleLimitExceeded):  # ids keep counting, so the limit still holds
        run.drain({"check": ["retry"]})


def test_invalidate_of_a_step_that_never_ran_leaves_it_to_its_trigger() -> None:
    run = Runner(Chain)
    run.finish("a#1")
    record = orch.invalidate(run.graph, run.record, ["c"])
    assert record.in_flight == ["b#1"] and record == run.record


def test_pending_lists_in_flight_activations_with_their_triggers() -> None:
    run = Runner(Diamond)
    run.finish("top#1")
    assert [(a.id, a.trigger) for a in orch.pending(run.record)] == [
        ("left#1", "top"),
        ("right#1", "top"),
    ]


def test_check_graph_names_recorded_steps_that_are_gone() -> None:
    run = Runner(Diamond)
    run.drain()
    orch.check_graph(run.graph, run.record)
    with pytest.raises(GraphChanged, match="join") as info:
        orch.check_graph(compile_graph(Chain), run.record)
    assert info.value.fields["missing"] == ["either", "join", "left", "right", "top"]


def test_record_round_trips_through_json() -> None:
    run = Runner(RetryLoop)
    run.drain({"check": ["retry", "ok"]})
    dumped = run.record.model_dump(mode="json")
    assert ExecutionRecord.model_validate(dumped) == run.record


def test_a_start_router_runs_at_kickoff_and_its_label_triggers_listeners() -> None:
    class StartRouter:
        @start()
        @router()
        def decide(self) -> str:
            return "fast"

        @listen("fast")
        def quick(self, label: str) -> str:
            return label

    run = Runner(StartRouter, outputs={"decide": "fast"})
    assert [a.id for a in run.ready] == ["decide#1"]
    assert run.finish("decide#1", "fast") == ["quick#1"]
    (quick,) = orch.pending(run.record)
    assert orch.argument_for(run.graph, run.record, quick) == "fast"


def test_completed_lists_every_activation_grouped_by_method() -> None:
    run = Runner(RetryLoop)
    run.drain({"check": ["retry", "retry", "ok"]})
    # Methods in the order of their latest commit, each one's activations in order
    # (commit order itself for a run without loops).
    assert run.runs[-4:] == ["attempt#3", "check#3", "log#3", "done#1"]
    assert run.record.completed == [
        "begin#1",
        *(f"attempt#{n}" for n in (1, 2, 3)),
        *(f"check#{n}" for n in (1, 2, 3)),
        *(f"log#{n}" for n in (1, 2, 3)),
        "done#1",
    ]
    assert run.record.is_completed("check#2") and not run.record.is_completed("check#4")


def test_the_record_stays_the_same_size_however_long_the_loop() -> None:
    class Long:
        @start()
        def begin(self) -> None: ...

        @listen(or_(begin, "again"), max_calls=5000)
        def step(self) -> None: ...

        @router(step, max_calls=5000)
        def loop(self) -> str:
            return "again" if self else "stop"

    run = Runner(Long)
    run.finish("begin#1")
    sizes = {}
    for i in range(1, 1201):
        run.finish(f"step#{i}")
        run.finish(f"loop#{i}", "again")
        if i in (100, 1100, 1200):
            sizes[i] = len(run.record.model_dump_json())
    # Only numbers grow wider (3 to 4 digits here); at the same width, the same size.
    assert sizes[1200] == sizes[1100] and sizes[1200] < 1.1 * sizes[100], sizes
    assert len(run.record.triggers) == 4 and len(run.record.completed) == 2401
