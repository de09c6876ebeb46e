"""One step context: where a step runs and which attempt it is are set by the step runner
of each executor and read from :mod:`runner.flow.context`; ``kickoff()`` names each option
only workers honour, once per flow class."""

from __future__ import annotations

import time
import uuid
import warnings
from typing import Any

import pytest

from runner import Flow, FlowState, listen, start
from runner.distributed.client import submit
from runner.errors import IgnoredOptionWarning
from runner.flow.context import WORKER, StepContext, running, step_context
from runner.flow.orchestrator import Activation
from tests.flows.step_context import OutputsFlow, WhereFlow


def test_a_step_in_process_knows_it_runs_here_and_which_attempt_it_is() -> None:
    flow = WhereFlow()
    assert flow.kickoff() == "process:2 then process:1"
    assert (flow.state.seen, flow.state.after) == ("process:2", "process:1")


def test_a_step_on_a_worker_knows_it_runs_there_and_which_attempt_it_is(rt: Any) -> None:
    handle = submit(WhereFlow, {}, rt=rt)
    handle.wait(timeout=30)
    assert handle.result() == "worker:2 then worker:1"


def test_a_step_is_given_the_runs_committed_outputs_on_both_executors(rt: Any) -> None:
    expected = {"first": "one", "second": "one+two"}
    assert OutputsFlow().kickoff() == expected
    handle = submit(OutputsFlow, {}, rt=rt)
    handle.wait(timeout=30)
    assert handle.result() == expected


def test_outside_a_step_there_is_no_context_and_sleep_just_sleeps() -> None:
    flow = WhereFlow()
    assert step_context() is None
    began = time.monotonic()
    flow.sleep(0.05)  # not a durable sleep: it returns after sleeping, raising nothing
    assert time.monotonic() - began >= 0.05


class Controlled(FlowState):
    note: str = ""


def _controlled_flow() -> type[Flow[Controlled]]:
    """A new flow class setting every option only workers honour."""

    class ControlledFlow(Flow[Controlled]):
        @start(time_limit=30, queue="gpu", priority=7)
        def first(self) -> str:
            return "a"

        @listen(first, rate_limit="100/s", concurrency=3, limits=["llm"])
        def second(self, value: str) -> str:
            return value + "b"

    return ControlledFlow


def test_kickoff_warns_once_per_flow_class_for_each_option_it_cannot_honour() -> None:
    flow_cls = _controlled_flow()
    with pytest.warns(IgnoredOptionWarning) as told:
        assert flow_cls().kickoff() == "ab"
    messages = [str(w.message) for w in told if w.category is IgnoredOptionWarning]
    named = {m.split(" ignores ")[1].split("=")[0]: m for m in messages}
    assert sorted(named) == sorted(
        ["time_limit", "queue", "priority", "rate_limit", "concurrency", "limits"]
    )
    assert len(messages) == 6
    assert "(set on first)" in named["queue"] and "(set on second)" in named["limits"]
    assert all(m.startswith("ControlledFlow.kickoff() runs in this process") for m in messages)
    assert told[0].filename == __file__  # told where kickoff was called

    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")  # Python's own once-per-place filter is not it
        assert flow_cls().kickoff() == "ab"
    assert [w for w in again if w.category is IgnoredOptionWarning] == []

    with pytest.warns(IgnoredOptionWarning):  # another class is told again
        _controlled_flow()().kickoff()


def test_kickoff_of_a_flow_with_only_options_it_honours_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow = WhereFlow()  # retries are honoured in process
        assert flow.kickoff(inputs={"id": str(uuid.uuid4())}) == "process:2 then process:1"


class Napper(Flow[Controlled]):
    @start()
    def nap(self) -> str:
        self.sleep(0.01)  # in process: a plain sleep, whatever runs around the kickoff
        ctx = step_context()
        assert ctx is not None
        return ctx.executor


def test_a_run_kicked_off_inside_a_step_on_a_worker_runs_its_own_steps_in_process() -> None:
    outer = WhereFlow()
    on_a_worker = StepContext(outer, Activation("where#1", "where", 1, None), WORKER)
    with running(on_a_worker):
        assert Napper().kickoff() == "process"
        assert step_context() is on_a_worker  # the outer step's context again after it
