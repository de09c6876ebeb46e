"""Step outcomes are variants: each way an attempt ends (returned, asked a person, paused,
slept, raised) is its own type carrying what that end has, and the lifecycle decides and
settles by matching on it (runner.flow.attempt, runner.flow.lifecycle). Pure: no Redis."""

from __future__ import annotations

import pytest

from runner import Flow, FlowState, start
from runner.flow import lifecycle, versions
from runner.flow import transition as tr
from runner.flow.attempt import Asked, Halted, Raised, Returned, Slept, StepResult, run_step
from runner.flow.context import WORKER, StepContext
from runner.flow.lifecycle import Outcome
from runner.flow.orchestrator import Activation
from runner.settings import RunnerSettings
from runner.store.models import RunStatus


class Ends(FlowState):
    note: str = ""


class EndsFlow(Flow[Ends]):
    """One start per way a step can end."""

    @start()
    def returns(self) -> str:
        self.state.note = "returned"
        return "out"

    @start()
    def asks(self) -> str | None:
        self.state.note = "asked"
        return self.ask("which one?")

    @start()
    def pauses(self) -> None:
        self.pause("wait for me")

    @start()
    def sleeps(self) -> None:
        self.state.note = "before the sleep"
        self.sleep(60)

    @start(retries=1)
    def raises(self) -> None:
        raise ValueError("broken")


SETTINGS = RunnerSettings()


def attempt(method: str, n: int = 1) -> tuple[StepResult, Outcome]:
    """Run ``method`` once as on a worker (where a sleep and an ask are durable)."""
    flow = EndsFlow()
    act = Activation(f"{method}#1", method, 1, None)
    result = run_step(flow, EndsFlow.graph(), StepContext(flow, act, WORKER, n), {"id": "r"}, None)
    return result, lifecycle.decide(result, EndsFlow.graph().methods[method], SETTINGS)


def test_each_way_an_attempt_ends_is_its_own_variant_with_what_that_end_has() -> None:
    result, outcome = attempt("returns")
    assert result.end == Returned({"id": "r", "note": "returned"}, "out")
    assert outcome is Outcome.DONE

    result, outcome = attempt("asks")
    assert isinstance(result.end, Asked) and result.end.reason == "which one?"
    assert result.end.new_state["note"] == "asked"  # the state so far, kept while it waits
    assert outcome is Outcome.PAUSED

    result, outcome = attempt("pauses")
    assert result.end == Halted("wait for me")
    assert outcome is Outcome.PAUSED

    result, outcome = attempt("sleeps")
    assert isinstance(result.end, Slept) and result.end.sleep.index == 0
    assert result.end.new_state["note"] == "before the sleep"
    assert outcome is Outcome.SLEEPING

    result, outcome = attempt("raises")
    assert isinstance(result.end, Raised) and str(result.end.error) == "broken"
    assert outcome is Outcome.RETRY
    assert attempt("raises", n=2)[1] is Outcome.FAILED  # its one retry spent


def test_settle_matches_the_decided_outcome_with_how_the_attempt_ended() -> None:
    graph = EndsFlow.graph()
    first = tr.start(graph, "r", {"id": "r"}, flow="tests:EndsFlow", name="EndsFlow")
    latest = first.checkpoint

    def settled(method: str, outcome: Outcome, n: int = 1) -> lifecycle.Settled | None:
        result = attempt(method, n)[0]
        return lifecycle.settle(
            graph, latest, result, outcome, epoch=0, reducers={}, version=versions.of(graph)
        )

    done = settled("returns", Outcome.DONE)
    assert done is not None and done.outcome is Outcome.DONE
    assert done.transition.checkpoint.state["note"] == "returned"
    failed = settled("raises", Outcome.FAILED, n=2)
    assert failed is not None and failed.transition.checkpoint.status is RunStatus.FAILED
    assert isinstance(failed.error, ValueError)
    paused = settled("pauses", Outcome.PAUSED)
    assert (
        paused is not None and paused.transition.checkpoint.meta.human.pause_reason == "wait for me"
    )
    # An outcome the attempt did not end with is refused, naming both (not an assert).
    with pytest.raises(ValueError, match="not done for Raised"):
        settled("raises", Outcome.DONE)
    with pytest.raises(ValueError, match="not paused for Returned"):
        settled("returns", Outcome.PAUSED)
