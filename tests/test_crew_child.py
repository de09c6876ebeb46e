"""Crews as child runs of flow methods, through the real engine on real workers.

A flow method that runs a crew does not block its worker: the engine links the method's
activation to the child run, and commits it with the child's output when the child ends.
"""

from __future__ import annotations

import uuid
from typing import Any

from runner.distributed import control, engine
from runner.distributed.client import submit
from runner.flow import plans
from runner.flow import transition as tr
from runner.flow.attempt import Returned, StepResult
from runner.flow.children import ChildRun, child_run_id
from runner.flow.orchestrator import Activation
from runner.store.models import ParentLink, RunStatus
from tests._dist_support import history
from tests.flows import crews
from tests.flows.crews import HostFlow, counts


def _inputs(**extra: str) -> dict[str, str]:
    return {"topic": "bees", "tag": uuid.uuid4().hex, **extra}


def engine_submit(rt: Any, inputs: dict[str, str]) -> Any:
    return submit(HostFlow, inputs, rt=rt)


def test_a_child_run_is_linked_to_the_waiting_parent_activation(rt: Any) -> None:
    parent = engine_submit(rt, _inputs())
    parent.result(timeout=30)
    child_id = child_run_id(parent.run_id, "stage#1")
    linked = next(c for c in history(rt, parent.run_id) if c.event == "child_run_started")
    assert linked.in_flight == ["stage#1"]
    link = linked.meta.links.children["stage#1"]
    assert (link.run_id, link.waiting) == (child_id, True)
    assert link.after == {"notes": "written before the crew"}
    assert linked.state["notes"] == ""  # applied when the activation commits
    child = rt.store.latest(child_id)
    assert child is not None
    assert child.meta.links.parent == ParentLink(run_id=parent.run_id, activation="stage#1")
    assert child.state["inputs"]["topic"] == "bees"


def test_a_finished_child_commits_the_parent_activation_with_its_output(rt: Any) -> None:
    inputs = _inputs()
    parent = engine_submit(rt, inputs)
    assert parent.wait(timeout=30) is RunStatus.SUCCEEDED
    latest = parent.latest()
    assert latest.state["summary"] == "a3(a2(a1(bees)))"
    assert latest.state["notes"] == "written before the crew"
    assert [t["name"] for t in latest.outputs["stage"]["tasks_output"]] == ["a1", "a2", "a3"]
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 1, "a3": 1}
    assert latest.meta.links.children["stage#1"].waiting is False


def test_reporting_a_finished_child_twice_commits_once(rt: Any) -> None:
    parent = engine_submit(rt, _inputs())
    parent.result(timeout=30)
    child = rt.store.latest(child_run_id(parent.run_id, "stage#1"))
    assert child is not None
    seq = parent.latest().seq
    assert engine.on_child_finished(rt, child) == []
    assert parent.latest().seq == seq


def test_a_failed_child_fails_the_parent_and_resuming_it_resumes_the_child(rt: Any) -> None:
    inputs = _inputs(fail_once="a2")
    parent = engine_submit(rt, inputs)
    assert parent.wait(timeout=30) is RunStatus.FAILED
    latest = parent.latest()
    assert latest.error is not None
    assert latest.error.type == "ChildRunFailed"
    assert "at a2" in latest.error.message
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 1}

    control.resume(parent.run_id, rt=rt).result(timeout=30)
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 2, "a3": 1}
    assert parent.latest().state["summary"] == "a3(a2(a1(bees)))"


def test_a_resumed_parent_links_the_child_it_stopped_with_only_once_the_child_runs_again(
    rt: Any,
) -> None:
    """The re-run of the step that started the child resumes the child before it commits the
    link of the new epoch: no link ever waits on a child still stopped (a recovery pass
    reading one would report the child ended and fail the parent again)."""
    inputs = _inputs(fail_once="a2")
    parent = engine_submit(rt, inputs)
    assert parent.wait(timeout=30) is RunStatus.FAILED
    control.resume(parent.run_id, rt=rt).result(timeout=30)
    epoch = parent.latest().meta.epoch
    (link,) = [
        c
        for c in history(rt, parent.run_id)
        if c.event == "child_run_started" and c.meta.epoch == epoch
    ]
    child_id = child_run_id(parent.run_id, "stage#1")
    (again,) = [c for c in history(rt, child_id) if c.event == "flow_resumed"]
    assert again.created_at <= link.created_at
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 2, "a3": 1}


def test_an_attempt_from_an_earlier_epoch_does_not_relink(rt: Any) -> None:
    parent = engine_submit(rt, _inputs())
    parent.result(timeout=30)
    seq = parent.latest().seq
    first = history(rt, parent.run_id)[0]
    act = next(a for a in tr.record_of(first).in_flight if a.startswith("stage"))
    marker = ChildRun(flow=crews.crew_a.flow_path(), name="crew_a", inputs={"topic": "x"})
    result = StepResult(Activation(act, "stage", 1, None), {}, Returned({"notes": "x"}, None))
    reply = engine.start_child(rt, parent.run_id, 7, marker, result)
    assert reply["skipped"] == "the activation is no longer waiting"
    assert parent.latest().seq == seq


def test_a_child_stopped_with_its_parent_does_not_end_the_resumed_activation(rt: Any) -> None:
    """Between a resume and the re-run of the activation that started the child, the child
    is still the one that stopped: its end (as recovery reports a child it finds ended) is
    not the new epoch's, and the re-run resumes it."""
    inputs = _inputs(fail_once="a2")
    parent = engine_submit(rt, inputs)
    assert parent.wait(timeout=30) is RunStatus.FAILED
    child = rt.store.latest(child_run_id(parent.run_id, "stage#1"))
    assert child is not None and child.status is RunStatus.FAILED
    # control.resume's commit, its steps not yet sent (as if the worker had not got them).
    latest = parent.latest()
    plan = plans.plan_resume(HostFlow(), latest, None, run_id=parent.run_id, latest=latest)
    done = engine.commit_on_latest(rt, parent.run_id, plan.opening)
    assert done is not None
    resumed, step = done
    assert engine.on_child_finished(rt, child) == []
    assert parent.latest().seq == resumed.seq  # the parent was not failed again
    assert parent.status() is RunStatus.RUNNING
    engine.dispatch_ready(rt, HostFlow, resumed, step.ready)
    assert parent.wait(timeout=30) is RunStatus.SUCCEEDED
    assert parent.latest().state["summary"] == "a3(a2(a1(bees)))"
    assert counts(inputs["tag"]) == {"a1": 1, "a2": 2, "a3": 1}
    linked = parent.latest().meta.links.children["stage#1"]
    assert (linked.epoch, linked.waiting) == (resumed.meta.epoch, False)
