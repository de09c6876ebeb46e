"""Crews as child runs of flow methods, on the worker side, without workers.

A fake Celery app records what is sent; :func:`pump` delivers it through the real engine
(``start_run``, ``execute``), adding what the engine does once wired to
:mod:`runner.crew.child` (see :func:`wired_execute`): a step run inside ``deferring()``
whose output is a :class:`ChildRun` goes to ``start_child``, and a run that ended is
reported with ``on_child_finished``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from runner import EventListener, Flow, FlowEvent, FlowState, listen, start
from runner.crew import ChildRun, RunsCrews
from runner.crew import child as child_module
from runner.crew.child import child_run_id, deferring, on_child_finished, start_child, waiting
from runner.distributed import control, engine
from runner.distributed.client import submit
from runner.distributed.coord import Coordinator
from runner.distributed.engine import START_TASK, Runtime
from runner.flow import events
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.steps import run_step
from runner.settings import get_settings
from runner.store.models import RunStatus
from runner.store.redis import RedisProvider
from tests.flows import crews
from tests.flows.crews import counts


class HostState(FlowState):
    topic: str = ""
    tag: str = ""
    fail_once: str = ""
    notes: str = ""
    summary: str = ""


class HostFlow(RunsCrews, Flow[HostState]):
    """Writes a note, runs crew_a as a child, then summarises the crew's output."""

    @start()
    def stage(self) -> Any:
        self.state.notes = "written before the crew"
        inputs = {"topic": self.state.topic, "tag": self.state.tag}
        return self.run_crew(crews.crew_a, {**inputs, "fail_once": self.state.fail_once})

    @listen(stage)
    def finish(self, crew_output: dict[str, Any]) -> str:
        self.state.summary = crew_output["raw"]
        return "done"


class FakeApp:
    """Records ``send_task`` calls instead of talking to a broker."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(self, name: str, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
        self.sent.append((name, dict(kwargs or {})))


class FakeTask:
    """The bound Celery task ``execute`` gets (retries are not expected here)."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.request = SimpleNamespace(kwargs=kwargs)

    def retry(self, **_: Any) -> Exception:
        raise AssertionError("no retry expected")


@pytest.fixture
def crt(redis_url: str, prefix: str) -> Iterator[Runtime]:
    """A runtime on the test Redis with a fake app; HostFlow and crew_a registered."""
    store = RedisProvider(redis_url, prefix=prefix)
    rt = Runtime(FakeApp(), store, Coordinator(store, 30.0), get_settings())  # type: ignore[arg-type]
    for flow_cls in (HostFlow, crews.crew_a.as_flow()):
        rt.flows[flow_cls.flow_name()] = flow_cls
    yield rt
    store.close()


def execute(rt: Runtime, flow_cls: Any, kwargs: dict[str, Any]) -> None:
    """What the worker's step task does with a message's kwargs."""
    run_id, activation = kwargs["run_id"], kwargs["activation"]
    epoch, attempt = kwargs.get("epoch", 0), kwargs.get("attempt", 1)
    engine.execute(rt, FakeTask(kwargs), flow_cls, run_id, activation, epoch, attempt)


def wired_execute(rt: Runtime, flow_cls: Any, kwargs: dict[str, Any]) -> None:
    """``engine.execute`` plus the child-run hooks the engine is to get."""
    run_id, epoch = kwargs["run_id"], kwargs.get("epoch", 0)
    latest = rt.store.latest(run_id)
    assert latest is not None
    act = next(
        (a for a in orch.pending(tr.record_of(latest)) if a.id == kwargs["activation"]), None
    )
    if act is not None and flow_cls is HostFlow and act.method == "stage":
        graph = flow_cls.graph()
        arg = orch.argument_for(graph, tr.record_of(latest), act)
        with deferring():
            result = run_step(flow_cls(), graph, act, dict(latest.state), arg)
        marker = ChildRun.from_output(result.output)
        assert marker is not None
        start_child(
            rt, run_id, act, epoch, marker, base_state=result.base_state, new_state=result.new_state
        )
        return
    execute(rt, flow_cls, kwargs)
    ended = rt.store.latest(run_id)
    assert ended is not None
    if ended.status.finished:
        child_module.on_child_finished(rt, ended)


def pump(rt: Runtime, keep: Callable[[str, dict[str, Any]], bool] = lambda n, k: True) -> None:
    """Deliver the sent tasks ``keep`` selects, and those they send, until none is left."""
    app: FakeApp = rt.app  # type: ignore[assignment]
    while True:
        todo = [(n, k) for n, k in app.sent if keep(n, k)]
        if not todo:
            return
        name, kwargs = todo[0]
        app.sent.remove((name, kwargs))
        if name == START_TASK:
            engine.start_run(rt, kwargs["run_id"])
        else:
            wired_execute(rt, rt.flows[name.rpartition(".")[0]], kwargs)


def _inputs(**extra: str) -> dict[str, str]:
    return {"topic": "bees", "tag": uuid.uuid4().hex, **extra}


def test_a_child_run_is_linked_to_the_waiting_parent_activation(crt: Runtime) -> None:
    parent = submit(HostFlow, _inputs(), rt=crt)
    pump(crt, lambda name, kwargs: kwargs["run_id"] == parent.run_id)
    latest = parent.latest()
    child_id = child_run_id(parent.run_id, "stage#1")
    assert latest.event == "child_run_started"
    assert latest.in_flight == ["stage#1"]
    link = latest.meta["children"]["stage#1"]
    assert link["run_id"] == child_id
    assert link["waiting"] is True
    assert link["after"] == {"notes": "written before the crew"}
    assert latest.state["notes"] == ""  # applied when the activation commits
    child = crt.store.latest(child_id)
    assert child is not None
    assert child.meta["parent"] == {"run_id": parent.run_id, "activation": "stage#1"}
    assert child.state["inputs"]["topic"] == "bees"
    first = {"run_id": child_id, "activation": "a1#1", "epoch": 0}
    assert ("crew_a.a1", first) in crt.app.sent  # type: ignore[attr-defined]
    assert waiting(crt, latest) == {"stage#1"}


def test_a_finished_child_commits_the_parent_activation_with_its_output(crt: Runtime) -> None:
    inputs = _inputs()
    parent = submit(HostFlow, inputs, rt=crt)
    pump(crt)
    assert parent.status() is RunStatus.SUCCEEDED
    state = parent.latest().state
    assert state["summary"] == "a3(a2(a1(bees)))"
    assert state["notes"] == "written before the crew"
    crew_output = parent.latest().outputs["stage"]
    assert [t["name"] for t in crew_output["tasks_output"]] == ["a1", "a2", "a3"]
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 1, "a3": 1}
    assert parent.latest().meta["children"]["stage#1"]["waiting"] is False


def test_the_parent_step_a_child_finished_is_reported_to_listeners(crt: Runtime) -> None:
    seen: list[tuple[str, str | None]] = []

    class Recorder(EventListener):
        def on_event(self, event: FlowEvent) -> None:
            if event.flow == "HostFlow":
                seen.append((event.type, event.method))

    recorder = Recorder()
    events.register(recorder)
    try:
        submit(HostFlow, _inputs(), rt=crt)
        pump(crt)
    finally:
        events.unregister(recorder)
    assert ("method_execution_finished", "stage") in seen
    assert seen[-1] == ("flow_finished", None)


def test_reporting_a_finished_child_twice_commits_once(crt: Runtime) -> None:
    parent = submit(HostFlow, _inputs(), rt=crt)
    pump(crt)
    child = crt.store.latest(child_run_id(parent.run_id, "stage#1"))
    assert child is not None
    seq = parent.latest().seq
    assert on_child_finished(crt, child) == []
    assert parent.latest().seq == seq


def test_a_failed_child_fails_the_parent_and_resuming_it_resumes_the_child(
    crt: Runtime,
) -> None:
    inputs = _inputs(fail_once="a2")
    parent = submit(HostFlow, inputs, rt=crt)
    pump(crt)
    latest = parent.latest()
    assert latest.status is RunStatus.FAILED
    assert latest.error is not None
    assert latest.error.type == "ChildRunFailed"
    assert "at a2" in latest.error.message
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 1}

    control.resume(parent.run_id, rt=crt)
    pump(crt)
    assert parent.status() is RunStatus.SUCCEEDED
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 2, "a3": 1}
    assert parent.latest().state["summary"] == "a3(a2(a1(bees)))"


def test_recovery_reports_a_child_whose_end_was_not_reported(
    crt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = submit(HostFlow, _inputs(), rt=crt)
    child_id = child_run_id(parent.run_id, "stage#1")
    pump(crt, lambda name, kwargs: kwargs["run_id"] == parent.run_id)
    monkeypatch.setattr(child_module, "on_child_finished", lambda rt, ckpt: [])  # report lost
    pump(crt, lambda name, kwargs: kwargs["run_id"] == child_id)
    monkeypatch.undo()
    child = crt.store.latest(child_id)
    assert child is not None and child.status is RunStatus.SUCCEEDED
    assert parent.latest().in_flight == ["stage#1"]

    assert waiting(crt, parent.latest()) == {"stage#1"}
    assert parent.latest().in_flight == ["finish#1"]
    pump(crt)
    assert parent.status() is RunStatus.SUCCEEDED


def test_an_activation_whose_child_is_missing_is_not_waiting(crt: Runtime) -> None:
    parent = submit(HostFlow, _inputs(), rt=crt)
    pump(crt, lambda name, kwargs: kwargs["run_id"] == parent.run_id)
    crt.store.delete_run(child_run_id(parent.run_id, "stage#1"))
    assert waiting(crt, parent.latest()) == set()


def test_a_child_outside_the_allow_list_fails_the_parent(crt: Runtime) -> None:
    del crt.flows["crew_a"]
    parent = submit(HostFlow, _inputs(), rt=crt)
    pump(crt)
    latest = parent.latest()
    assert latest.status is RunStatus.FAILED
    assert latest.error is not None
    assert latest.error.type == "FlowNotAllowed"


def test_an_attempt_from_an_earlier_epoch_does_not_relink(crt: Runtime) -> None:
    parent = submit(HostFlow, _inputs(), rt=crt)
    pump(crt, lambda name, kwargs: kwargs["run_id"] == parent.run_id)
    seq = parent.latest().seq
    act = orch.pending(tr.record_of(parent.latest()))[0]
    marker = ChildRun(flow=crews.crew_a.flow_path(), name="crew_a", inputs={"topic": "x"})
    result = start_child(crt, parent.run_id, act, 7, marker, base_state={}, new_state={"x": 1})
    assert result["skipped"] == "the activation is no longer waiting"
    assert parent.latest().seq == seq
