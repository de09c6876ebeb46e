"""Flow events reach listeners, a broken listener never breaks a run, and failures are recorded."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import CheckpointConfig, EventListener, Flow, FlowState, listen, start
from runner.errors import CycleLimitExceeded
from runner.flow import events as ev
from runner.flow.decorators import router
from runner.flow.events import FlowEvent
from runner.store.base import CheckpointStore
from tests._flow_support import STORES, Recorder, Tally, history, make_store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made = make_store(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture
def registered() -> Iterator[Recorder]:
    """A recorder attached to every run in the process for the test's duration."""
    recorder = Recorder()
    ev.register(recorder)
    yield recorder
    ev.unregister(recorder)


class Steps(FlowState):
    done: list[str] = []


class TwoSteps(Flow[Steps]):
    def __init__(self, broken: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.broken = broken

    @start()
    def prepare(self) -> str:
        self.state.done.append("prepare")
        return "ready"

    @listen(prepare)
    def deliver(self) -> str:
        if self.broken:
            raise LookupError("no such parcel")
        self.state.done.append("deliver")
        return "delivered"


def test_a_run_delivers_its_events_in_order_to_a_listener_of_the_flow():
    recorder = Recorder()
    flow = TwoSteps(listeners=[recorder])

    flow.kickoff()

    assert recorder.types() == [
        "flow_started",
        "method_execution_started",
        "method_execution_finished",
        "method_execution_started",
        "method_execution_finished",
        "flow_finished",
    ]
    assert {e.run_id for e in recorder.events} == {flow.flow_id}
    assert {e.flow for e in recorder.events} == {"TwoSteps"}
    assert [e.method for e in recorder.of("method_execution_finished")] == ["prepare", "deliver"]
    timed = recorder.of("method_execution_finished") + recorder.of("flow_finished")
    assert all(e.duration is not None and e.duration >= 0 for e in timed)
    stamps = [e.timestamp for e in recorder.events]
    assert stamps == sorted(stamps)


def test_a_registered_listener_sees_every_run(registered):
    first, second = TwoSteps(), TwoSteps()

    first.kickoff()
    second.kickoff()

    starts = registered.of("flow_started")
    assert [e.run_id for e in starts] == [first.flow_id, second.flow_id]
    assert len(registered.of("flow_finished")) == 2


def test_an_unregistered_listener_hears_nothing():
    recorder = Recorder()
    ev.register(recorder)
    ev.unregister(recorder)

    TwoSteps().kickoff()

    assert recorder.events == []


class Exploding(EventListener):
    def on_event(self, event: FlowEvent) -> None:
        raise RuntimeError(f"listener broke on {event.type}")


def test_a_listener_that_raises_is_logged_and_the_run_still_succeeds(caplog):
    recorder = Recorder()
    flow = TwoSteps(listeners=[Exploding(), recorder])

    with caplog.at_level(logging.ERROR, logger="runner.events"):
        result = flow.kickoff()

    assert result == "delivered"
    assert flow.state.done == ["prepare", "deliver"]
    assert "flow_finished" in recorder.types()  # listeners after the broken one still hear
    failures = [r for r in caplog.records if "listener" in r.getMessage()]
    assert len(failures) == len(recorder.events)
    assert all(r.exc_info is not None for r in failures)


def test_a_method_failure_is_an_event_a_failed_checkpoint_and_the_raised_exception(store):
    recorder = Recorder()
    flow = TwoSteps(broken=True, listeners=[recorder], checkpoint=CheckpointConfig(provider=store))

    with pytest.raises(LookupError, match="no such parcel"):
        flow.kickoff()

    failed = recorder.of("method_execution_failed")
    assert [(e.method, e.error) for e in failed] == [("deliver", "LookupError: no such parcel")]
    assert failed[0].duration is not None
    assert recorder.types()[-1] == "flow_failed"
    assert recorder.of("flow_failed")[0].error == "LookupError: no such parcel"
    assert "flow_finished" not in recorder.types()

    latest = store.latest(flow.flow_id)
    assert latest is not None
    assert (latest.event, latest.step, latest.status) == (
        "method_execution_failed",
        "deliver",
        "failed",
    )
    assert latest.error is not None
    assert (latest.error.type, latest.error.message) == ("LookupError", "no such parcel")
    assert "Traceback" in latest.error.traceback and "no such parcel" in latest.error.traceback
    assert latest.in_flight == ["deliver#1"]
    info = store.run(flow.flow_id)
    assert info is not None and info.status == "failed"
    assert info.error == "LookupError: no such parcel"


def test_a_failed_run_on_every_event_ends_with_a_flow_failed_checkpoint(store):
    flow = TwoSteps(broken=True, checkpoint=CheckpointConfig(provider=store, on_events=["*"]))

    with pytest.raises(LookupError):
        flow.kickoff()

    events = [c.event for c in history(store, flow.flow_id)]
    assert events[-2:] == ["method_execution_failed", "flow_failed"]
    latest = store.latest(flow.flow_id)
    assert latest is not None and latest.status == "failed"
    assert latest.error is not None and latest.error.type == "LookupError"


class Race(FlowState):
    slow: str = ""


class FailFastWhileSlowRuns(Flow[Race]):
    """``fast`` fails while ``slow`` is still running; ``slow`` then finishes."""

    def __init__(self, tally: Tally, broken: bool = True, **kwargs: Any) -> None:
        self.fast_failed = threading.Event()
        super().__init__(listeners=[_FailWatch(self.fast_failed)], **kwargs)
        self.tally = tally
        self.broken = broken

    @start()
    def begin(self) -> None:
        self.tally("begin")

    @listen(begin)
    def fast(self) -> str:
        self.tally("fast")
        if self.broken:
            raise ValueError("fast broke")
        return "fast ok"

    @listen(begin)
    def slow(self) -> str:
        self.tally("slow")
        assert self.fast_failed.wait(5) or not self.broken
        self.state.slow = "done"
        return "slow ok"


class _FailWatch(EventListener):
    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def on_event(self, event: FlowEvent) -> None:
        if event.type == "method_execution_failed":
            self.flag.set()


def test_a_parallel_step_finishing_after_a_failure_keeps_the_run_failed_and_resumable(store):
    config = CheckpointConfig(provider=store)
    flow = FailFastWhileSlowRuns(Tally(), checkpoint=config)

    with pytest.raises(ValueError, match="fast broke"):
        flow.kickoff()

    latest = store.latest(flow.flow_id)
    assert latest is not None
    assert latest.step == "slow" and latest.status == "failed"
    assert latest.error is not None and latest.error.message == "fast broke"
    assert store.run(flow.flow_id).error == "ValueError: fast broke"
    assert latest.state["slow"] == "done"

    tally = Tally()
    resumed = FailFastWhileSlowRuns.from_checkpoint(
        CheckpointConfig(provider=store, restore_from=flow.flow_id), tally=tally, broken=False
    )
    assert resumed.kickoff() == "fast ok"
    assert dict(tally.counts) == {"fast": 1}


class Runaway(FlowState):
    spins: int = 0


class RunawayLoop(Flow[Runaway]):
    @start()
    def begin(self) -> None: ...

    @router(begin, "again", max_calls=3)
    def spin(self) -> str:
        self.state.spins += 1
        return "again"


def test_a_loop_past_max_calls_fails_the_run_with_a_recorded_error(store):
    recorder = Recorder()
    flow = RunawayLoop(listeners=[recorder], checkpoint=CheckpointConfig(provider=store))

    with pytest.raises(CycleLimitExceeded):
        flow.kickoff()

    latest = store.latest(flow.flow_id)
    assert latest is not None and latest.status == "failed"
    assert latest.error is not None and latest.error.type == "CycleLimitExceeded"
    assert latest.state["spins"] == 2  # the third spin's commit would start a fourth
    assert recorder.types()[-1] == "flow_failed"


def test_events_of_a_paused_run(store):
    class Hold(Flow[FlowState]):
        @start()
        def wait_for_human(self) -> None:
            self.pause("sign here")

    recorder = Recorder()
    Hold(listeners=[recorder], checkpoint=CheckpointConfig(provider=store)).kickoff()

    assert recorder.types() == ["flow_started", "method_execution_started", "flow_paused"]
    paused = recorder.of("flow_paused")[0]
    # The pause ends the run's part as an end does: its epoch, start and duration.
    assert paused.data == {"reason": "sign here", "epoch": 0, "opened_at": paused.data["opened_at"]}
    assert paused.duration is not None and 0 <= paused.duration < 5
    assert paused.method == "wait_for_human"
