"""Crews on real subprocess Celery workers: one Celery task and one checkpoint per task,
resumed at the failed task, forked with edited outputs."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runner.distributed import control
from runner.errors import InvalidInputs
from runner.flow.children import child_run_id
from runner.store.models import Checkpoint, RunStatus
from tests.flows.crews import CrewPipeline, counts, twelve

TASKS = [f"t{i:02d}" for i in range(1, 13)]


def _inputs(**extra: str) -> dict[str, str]:
    return {"topic": "bees", "tag": uuid.uuid4().hex, **extra}


def _after(rt: Any, run_id: str, task: str) -> Checkpoint:
    """The checkpoint committed when ``task`` finished."""
    for ckpt in rt.store.history(run_id, limit=100):
        if ckpt.event == "method_execution_finished" and ckpt.step == task:
            return ckpt
    raise AssertionError(f"no checkpoint after {task}")


def _chain(tasks: list[str], start: str = "bees") -> str:
    text = start
    for task in tasks:
        text = f"{task}({text})"
    return text


def test_each_crew_task_is_a_celery_task_named_crew_dot_task(rt: Any) -> None:
    registered = rt.app.control.inspect(timeout=2).registered() or {}
    names = {name for worker in registered.values() for name in worker}
    assert {f"crew_twelve.{t}" for t in TASKS} <= names
    assert {"crew_a.a1", "crew_d.d3"} <= names


def test_each_crew_task_commits_one_checkpoint_on_workers(rt: Any) -> None:
    inputs = _inputs()
    out = twelve.submit(inputs, rt=rt).result(timeout=30)
    assert out.raw == _chain(TASKS)
    assert [t.name for t in out.tasks_output] == TASKS
    assert counts(inputs["tag"]) == dict.fromkeys(TASKS, 1)


def test_a_crew_resumed_on_workers_reruns_only_the_failed_task_and_later(rt: Any) -> None:
    inputs = _inputs(fail_once="t08")
    handle = twelve.submit(inputs, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.FAILED
    assert handle.latest().step == "t08"
    assert counts(inputs["tag"]) == dict.fromkeys(TASKS[:8], 1)

    resumed = control.resume(handle.run_id, rt=rt)
    resumed.result(timeout=30)
    assert counts(inputs["tag"]) == {**dict.fromkeys(TASKS, 1), "t08": 2}
    assert twelve.output(resumed.latest().state).raw == _chain(TASKS)


@pytest.mark.parametrize("how", ["whole field", "dotted path"])
def test_a_fork_with_an_edited_output_reruns_the_tasks_after_it(rt: Any, how: str) -> None:
    inputs = _inputs()
    source = twelve.submit(inputs, rt=rt)
    source.result(timeout=30)
    at = _after(rt, source.run_id, "t02")
    outputs = dict(at.state["outputs"])
    outputs["t02"] = {**outputs["t02"], "raw": "EDITED"}
    # The dotted path changes one entry of the outputs and keeps the others.
    edit = {"outputs": outputs} if how == "whole field" else {"outputs.t02.raw": "EDITED"}

    fork = control.fork(at.id, set=edit, rerun=["t03"], rt=rt)
    fork.result(timeout=30)
    out = twelve.output(fork.latest().state)
    assert out.tasks_output[1].raw == "EDITED"
    assert out.raw == _chain(TASKS[2:], "EDITED")
    assert counts(inputs["tag"]) == {**dict.fromkeys(TASKS[:2], 1), **dict.fromkeys(TASKS[2:], 2)}
    assert source.latest().state["outputs"]["t02"]["raw"] == "t02(t01(bees))"


def test_a_dotted_edit_through_something_not_an_object_is_refused_in_one_line() -> None:
    state = {"outputs": {"t01": {"raw": "x"}}, "topic": "bees"}
    assert control.nested_edits(state, {"outputs.t02.raw": "y"}) == {
        "outputs": {"t01": {"raw": "x"}, "t02": {"raw": "y"}}
    }
    assert state["outputs"] == {"t01": {"raw": "x"}}  # the source state is left alone
    with pytest.raises(InvalidInputs, match=r"^cannot set topic\.x: topic is not an object$"):
        control.nested_edits(state, {"topic.x": 1})
    with pytest.raises(InvalidInputs, match=r"outputs\.t01\.raw is not an object"):
        control.nested_edits(state, {"outputs.t01.raw.deeper": 1})


def test_crew_fork_reruns_every_task_after_the_first_edited_one(rt: Any) -> None:
    inputs = _inputs()
    source = twelve.submit(inputs, rt=rt)
    source.result(timeout=30)

    fork = twelve.fork(source.run_id, outputs={"t10": "NEW"}, rt=rt)
    out = fork.result(timeout=30)
    assert out.raw == _chain(["t11", "t12"], "NEW")
    assert counts(inputs["tag"]) == {**dict.fromkeys(TASKS, 1), "t11": 2, "t12": 2}
    assert fork.info().parent_run_id == source.run_id


# --- crews inside a flow on workers -------------------------------------------------------


def test_a_flow_of_four_crews_resumes_at_the_failed_task_on_workers(rt: Any) -> None:
    inputs = _inputs(fail_once="c2")
    parent = CrewPipeline.submit(inputs)
    assert parent.wait(timeout=30) is RunStatus.FAILED
    failed = parent.latest()
    assert failed.step == "stage3"
    assert failed.error is not None and "at c2" in failed.error.message
    once = dict.fromkeys(["a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2"], 1)
    assert counts(inputs["tag"]) == once

    out = control.resume(parent.run_id, rt=rt).result(timeout=30)
    assert counts(inputs["tag"]) == {**once, "c2": 2, "c3": 1, "d1": 1, "d2": 1, "d3": 1}
    tasks = ["a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2", "c3", "d1", "d2", "d3"]
    assert out["raw"] == _chain(tasks)
    child = rt.store.latest(child_run_id(parent.run_id, "stage3#1"))
    assert child.meta.links.parent is not None
    assert (child.meta.links.parent.run_id, child.meta.links.parent.activation) == (
        parent.run_id,
        "stage3#1",
    )
    assert child.status is RunStatus.SUCCEEDED
