"""The workers' public face: task registration, the allow-list, submit and the run handle,
and what Flower sees (task events, kwargs reprs, extended results)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
import redis
from celery import signals

from examples.fanout import FanoutFlow
from examples.linear import LinearFlow
from runner import Flow, FlowState, start
from runner.distributed import control
from runner.distributed.app import make_app
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime, task_id
from runner.distributed.waiting import waits_of
from runner.errors import InvalidInputs, RunStateError, RunTimeout
from runner.flow import versions
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests._dist_support import eventually
from tests.conftest import _settings_kwargs
from tests.flows import dist
from tests.flows.dist import (
    DistChaos,
    DistDiamond,
    DistEcho,
    DistFan,
    DistGated,
    Triggered,
    executions,
)

FLOWER_SETTINGS = (
    "worker_send_task_events",
    "task_send_sent_event",
    "task_track_started",
    "result_extended",
)


class OutsiderState(FlowState):
    """State of the flows below, which the workers never import."""

    touched: bool = False


class OutsiderFlow(Flow[OutsiderState]):
    """Defined in a test module, not under tests/flows: outside the workers' allow-list."""

    @start()
    def go(self) -> None:
        self.state.touched = True


class Impostor(Flow[OutsiderState]):
    """Takes the name of an allowed flow (same task names), from another module."""

    name = "DistEcho"

    @start()
    def hello(self) -> int:
        dist.client().set(dist.key(self.state.id, "impostor-ran"), 1)
        return 0


def our_node(rt: Runtime) -> str:
    """The name of the session worker: the one consuming our queue (other sessions share
    the broker database)."""

    def find() -> str | None:
        queues = rt.app.control.inspect(timeout=1.0).active_queues() or {}
        for node, consumed in queues.items():
            if any(q["name"] == rt.settings.queue for q in consumed):
                return node
        return None

    return str(eventually(find, timeout=20))


# --- registration and the allow-list ---------------------------------------------------------


def test_workers_register_one_task_per_flow_method(rt: Runtime) -> None:
    node = our_node(rt)
    registered = set(rt.app.control.inspect(timeout=2.0, destination=[node]).registered()[node])
    for flow in (LinearFlow, FanoutFlow, DistDiamond, DistFan, DistEcho, DistChaos, DistGated):
        expected = {f"{flow.flow_name()}.{method}" for method in flow.graph().methods}
        assert {n for n in registered if n.startswith(f"{flow.flow_name()}.")} == expected
    assert "DistDiamond.both" in registered
    assert not any(n.startswith(("OutsiderFlow.", "Impostor.")) for n in registered)


def test_workers_accept_json_only(rt: Runtime) -> None:
    node = our_node(rt)
    conf = rt.app.control.inspect(timeout=2.0, destination=[node]).conf()[node]
    assert conf["accept_content"] == ["json"]
    assert conf["task_serializer"] == "json"
    assert rt.app.conf.accept_content == ["json"]


def unaware(rt: Runtime) -> Runtime:
    """``rt`` as a producer that does not know the workers' allow-list (no
    RUNNER_FLOW_MODULES, no `runner dev`): it stores the run, and the workers do not run it."""
    return dataclasses.replace(rt, settings=rt.settings.model_copy(update={"flow_modules": []}))


def test_flow_outside_the_allow_list_waits_for_a_worker_that_has_it_without_importing_it(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    """The workers lack its tasks: its step goes to the queue of its version, where it waits,
    visibly, for a worker that has it; never a failed run, its code never imported."""
    handle = submit(OutsiderFlow, rt=unaware(rt))
    version = versions.of(OutsiderFlow.graph(), rt.settings)
    try:
        waits = eventually(lambda: waits_of(rt.store, rt.settings, handle.latest(), rt.app), 20)
        assert list(waits.values()) == [f"waiting for a worker of version {version}"]
        latest = handle.latest()
        assert latest.status is RunStatus.RUNNING and latest.error is None
        assert latest.state["touched"] is False
    finally:
        handle.cancel()


def test_flow_posing_under_an_allowed_name_fails_without_running(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    handle = submit(Impostor, rt=unaware(rt))
    assert handle.wait(timeout=20) is RunStatus.FAILED
    error = handle.latest().error
    assert error is not None and error.type == "FlowNotAllowed"
    assert "tests.test_distributed_api:Impostor" in error.message
    assert not redis_client.exists(dist.key(handle.run_id, "impostor-ran"))
    assert executions(redis_client, handle.run_id, "hello") == 0  # DistEcho.hello never ran


# --- submit and the handle ------------------------------------------------------------------


def test_submit_rejects_invalid_inputs_before_storing_or_enqueueing(rt: Runtime) -> None:
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    published: list[str] = []

    def on_publish(sender: Any = None, **_: Any) -> None:
        published.append(str(sender))

    signals.before_task_publish.connect(on_publish, weak=False)
    try:
        with pytest.raises(InvalidInputs, match="count"):
            submit(DistEcho, {"id": run_id, "count": "not a number"}, rt=rt)
    finally:
        signals.before_task_publish.disconnect(on_publish)
    assert published == []
    assert rt.store.run(run_id) is None
    assert rt.store.latest(run_id) is None
    assert rt.coord.dispatched(run_id) == {}


def test_the_trigger_payload_reaches_its_methods_on_workers_and_again_on_resume(
    rt: Runtime,
) -> None:
    handle = submit(Triggered, {"crewai_trigger_payload": {"ticket": 7}}, rt=rt)
    assert handle.wait(timeout=20) is RunStatus.FAILED  # the first attempt fails
    assert "crewai_trigger_payload" not in handle.latest().state  # not state

    resumed = control.resume(handle.run_id, rt=rt)
    assert resumed.result(timeout=20) == "ticket 7, payload here too: True"
    assert resumed.latest().state["seen"] == {"payload": {"ticket": 7}}


def test_a_trigger_payload_that_is_not_json_is_refused_before_storing(rt: Runtime) -> None:
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidInputs, match="crewai_trigger_payload is not JSON"):
        submit(Triggered, {"id": run_id, "crewai_trigger_payload": {1, 2}}, rt=rt)
    assert rt.store.run(run_id) is None


def test_handle_follows_a_run_to_its_result(rt: Runtime, redis_client: redis.Redis) -> None:
    handle = DistEcho.submit({"count": 21})
    assert isinstance(handle, RunHandle)
    assert handle.status() in (RunStatus.RUNNING, RunStatus.SUCCEEDED)
    assert handle.wait(timeout=20) is RunStatus.SUCCEEDED
    assert handle.result() == 42
    assert handle.latest().state["echo"] == "echo 21"
    assert handle.run_id == handle.latest().state["id"]
    assert executions(redis_client, handle.run_id, "hello") == 1
    with pytest.raises(RunStateError, match="already succeeded"):
        handle.cancel()


def test_wait_times_out_while_a_step_runs_then_returns(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    handle = DistGated.submit()
    eventually(lambda: executions(redis_client, handle.run_id, "two") == 1)
    with pytest.raises(RunTimeout, match="still running"):
        handle.wait(timeout=0.3)
    assert handle.status() is RunStatus.RUNNING
    redis_client.set(dist.key(handle.run_id, "gate", "two"), 1)
    assert handle.result(timeout=20) == ["one", "two", "three"]


def test_submit_of_an_existing_run_id_is_refused(rt: Runtime) -> None:
    handle = DistEcho.submit({"count": 1})
    handle.wait(timeout=20)
    with pytest.raises(RunStateError, match="already exists"):
        submit(DistEcho, {"id": handle.run_id}, rt=rt)


# --- what Flower sees -------------------------------------------------------------------------


def test_app_sends_the_events_and_results_flower_needs(rt: Runtime) -> None:
    for name in FLOWER_SETTINGS:
        assert rt.app.conf[name] is True, name
    node = our_node(rt)
    conf = rt.app.control.inspect(timeout=2.0, destination=[node]).conf()[node]
    for name in FLOWER_SETTINGS:
        assert conf[name] is True, name


def test_task_messages_and_events_carry_run_and_step(
    rt: Runtime, task_events: list[dict[str, Any]]
) -> None:
    published: list[dict[str, Any]] = []

    def on_publish(sender: Any = None, headers: Any = None, body: Any = None, **_: Any) -> None:
        published.append({"task": sender, "body": body, **(headers or {})})

    signals.before_task_publish.connect(on_publish, weak=False)
    try:
        handle = DistEcho.submit({"count": 2})
        assert handle.result(timeout=20) == 4
    finally:
        signals.before_task_publish.disconnect(on_publish)
    run = handle.run_id
    ids = {"hello#1": task_id(run, 0, "hello#1"), "shout#1": task_id(run, 0, "shout#1")}

    # The producer sends the start step itself: its message names run and step.
    start_msg = next(m for m in published if m.get("id") == ids["hello#1"])
    assert start_msg["task"] == "DistEcho.hello"
    assert start_msg["kwargsrepr"] == f"run={run} step=hello#1"

    # Workers send the next step; Flower sees every step sent, received, started, succeeded.
    def events_of(uuid_: str) -> dict[str, dict[str, Any]]:
        return {e["type"]: e for e in task_events if e.get("uuid") == uuid_}

    for act, tid in ids.items():
        got = eventually(lambda tid=tid: len(events_of(tid)) >= 4 and events_of(tid))
        assert {"task-sent", "task-received", "task-started", "task-succeeded"} <= set(got)
        method = act.split("#")[0]
        assert got["task-sent"]["name"] == got["task-received"]["name"] == f"DistEcho.{method}"
        assert got["task-sent"]["kwargs"] == f"run={run} step={act}"
        assert got["task-received"]["kwargs"] == f"run={run} step={act}"

    # The message carries its deployment, so another deployment's worker hands it back.
    assert start_msg["body"][1]["deployment"] == rt.settings.prefix


def test_step_results_stay_out_of_the_result_backend_unless_asked(rt: Runtime) -> None:
    # Checkpoints are the record; Flower reads events. RUNNER_TASK_RESULTS=true stores them.
    assert rt.app.conf.task_ignore_result is True
    stored = make_app(RunnerSettings(**{**_settings_kwargs({}), "task_results": True}))
    assert stored.conf.task_ignore_result is False
    stored.close()
