"""Bounded execution records (issue 14): same semantics as the unbounded ones they replace,
flat size in the run's length, and records written before the change still load.

The fixtures were written by the code of commit adcadd7 (records that listed every
activation), before records were bounded:

* ``fixtures/record_v1_traces.json``: seeded random drives of the graphs below through the
  orchestrator (which in-flight activation commits next, which label a router returns,
  now and then a ``fork --rerun`` invalidation), with the ready activations, arguments,
  last output and whole record after every step;
* ``fixtures/checkpoints_v1.json``: every checkpoint of a
  :class:`~tests.flows.loops.LoopFlow` run whose ``right`` step failed in the third round,
  then of its in-process resume.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from runner import CheckpointConfig, JsonProvider, SqliteProvider
from runner.distributed import control
from runner.distributed.engine import Runtime
from runner.errors import CycleLimitExceeded
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.conditions import and_, or_
from runner.flow.decorators import listen, router, start
from runner.flow.graph import FlowGraph, compile_graph
from runner.flow.orchestrator import ExecutionRecord
from runner.store.models import Checkpoint, RunStatus
from tests.flows.loops import LoopFlow

FIXTURES = Path(__file__).parent / "fixtures"


class RetryLoop:
    @start()
    def begin(self) -> None: ...

    @listen(or_(begin, "retry"), max_calls=4)
    def attempt(self) -> None: ...

    @router(attempt)
    def check(self) -> str:
        return "ok" if self else "retry"

    @listen(attempt)
    def log(self) -> None: ...

    @listen("ok")
    def done(self) -> None: ...


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

    @listen(or_(left, "stop"))
    def either(self) -> None: ...


class ChainedRouters:
    @start()
    def a(self) -> None: ...

    @router(or_(a, "back"))
    def first(self) -> str:
        return "signal_a"

    @router("signal_a")
    def second(self) -> str:
        return "signal_b"

    @listen(or_("signal_a", "signal_b"))
    def handle(self) -> None: ...

    @router(handle)
    def third(self) -> str:
        return "back"

    @listen(and_("signal_b", or_(handle, "back")))
    def finish(self) -> None: ...


class Mixed:
    @start()
    def s1(self) -> None: ...

    @start()
    def s2(self) -> None: ...

    @listen(or_(s1, s2, "redo"))
    def gather(self) -> None: ...

    @listen(and_(s1, s2))
    def both(self) -> None: ...

    @router(or_(gather, both))
    def judge(self) -> str:
        return "redo" if self else "fine"

    @listen(and_("fine", gather))
    def out(self) -> None: ...

    @listen(or_("fine", "redo"))
    def note(self) -> None: ...


GRAPHS: dict[str, type] = {
    "RetryLoop": RetryLoop,
    "Waves": Waves,
    "ChainedRouters": ChainedRouters,
    "Mixed": Mixed,
}


def _traces() -> list[dict[str, Any]]:
    traces: list[dict[str, Any]] = json.loads((FIXTURES / "record_v1_traces.json").read_text())
    return traces


def _same_as_old(graph: FlowGraph, new: ExecutionRecord, old: dict[str, Any]) -> None:
    """``new`` (bounded) means what the unbounded record ``old`` meant."""
    assert sorted(new.completed) == sorted(old["completed"])
    assert new.in_flight == old["in_flight"]
    for name in ("outputs", "routes", "emitted", "dispatched", "seen", "fired"):
        assert getattr(new, name) == old[name], name
    assert [(a.id, a.trigger) for a in orch.pending(new)] == [
        (a, old["triggers"][a]) for a in old["in_flight"]
    ]
    assert orch.completed_steps(new) == {a.rpartition("#")[0] for a in old["completed"]}
    last = old["completed"][-1].rpartition("#")[0] if old["completed"] else None
    assert orch.last_output(new) == (old["outputs"].get(last) if last else None)
    for act in orch.pending(new):
        assert act.id in old["in_flight"]
    # Bounded: notes only on activations in flight and each method's latest ones.
    assert len(new.triggers) <= len(new.in_flight) + 2 * len(graph.methods)
    assert set(new.causes) == set(new.triggers)


@pytest.mark.parametrize(
    "trace", _traces(), ids=lambda t: f"{t['graph']}-{t['seed']}" if isinstance(t, dict) else ""
)
def test_bounded_records_replay_the_unbounded_ones_step_for_step(trace: dict[str, Any]) -> None:
    print(f"trace {trace['graph']} seed={trace['seed']}")
    graph = compile_graph(GRAPHS[trace["graph"]])
    record, ready = orch.ready_starts(graph, ExecutionRecord())
    assert [a.id for a in ready] == trace["ready"]
    _same_as_old(graph, record, trace["begin"])
    previous = trace["begin"]
    for step in trace["steps"]:
        # Both the record carried along and the old record upgraded on read must give
        # exactly what the old code gave.
        for before in (record, ExecutionRecord.model_validate(previous)):
            if step["op"] == "invalidate":
                after = orch.invalidate(graph, before, step["steps"])
            elif "error" in step:
                with pytest.raises(CycleLimitExceeded):
                    orch.complete(graph, before, step["act"], step["output"], step["label"])
                continue
            else:
                after, made = orch.complete(
                    graph, before, step["act"], step["output"], step["label"]
                )
                assert [a.id for a in made] == step["ready"], step["act"]
                assert {a.id: orch.argument_for(graph, after, a) for a in made} == step["args"]
                assert orch.last_output(after) == step["last_output"]
            _same_as_old(graph, after, step["record"])
        if "error" in step:
            break
        record, previous = after, step["record"]
        assert ExecutionRecord.model_validate(record.model_dump(mode="json")) == record


def test_checkpoint_size_is_flat_in_the_number_of_iterations(tmp_path: Path) -> None:
    sizes = {}
    for rounds in (10, 110, 330):
        store = SqliteProvider(tmp_path / f"{rounds}.db")
        flow = LoopFlow(checkpoint=CheckpointConfig(provider=store))
        assert flow.kickoff(inputs={"rounds": rounds}) == rounds * 10
        latest = store.latest(flow.flow_id)
        assert latest is not None and latest.status.value == "succeeded"
        assert len(latest.completed) == 2 + 4 * rounds
        sizes[rounds] = len(latest.record.model_dump_json())
    print(f"record bytes by rounds: {sizes}")
    # Only the widths of the numbers grow ("left#10" -> "left#110"): 3-digit counts
    # take the same room, whatever the count.
    assert sizes[330] - sizes[110] <= 8 and sizes[330] < 1.2 * sizes[10], sizes


def test_records_written_before_they_were_bounded_still_load() -> None:
    doc = json.loads((FIXTURES / "checkpoints_v1.json").read_text())
    graph = LoopFlow.graph()
    for raw in [*doc["failed_history"], *doc["resumed_history"]]:
        ckpt = Checkpoint.model_validate(raw)
        assert sorted(ckpt.completed) == sorted(raw["completed"])
        assert ckpt.in_flight == raw["in_flight"]
        assert ckpt.outputs == raw["outputs"]
        _same_as_old(graph, tr.record_of(ckpt), raw["record"])
        again = Checkpoint.model_validate_json(ckpt.model_dump_json())
        assert again == ckpt and "completed" not in json.loads(ckpt.model_dump_json())


def test_a_view_of_a_checkpoint_with_its_copies_reads_back_as_the_checkpoint() -> None:
    flow = LoopFlow()
    graph = flow.graph()
    record, _ = orch.ready_starts(graph, ExecutionRecord())
    for act, label in (("begin#1", None), ("left#1", None), ("right#1", None)):
        record, _ = orch.complete(graph, record, act, 1, label)
    ckpt = tr.with_record(tr.start(graph, "r", {"id": "r"}, flow="f", name="n").checkpoint, record)
    view = {**ckpt.model_dump(mode="json"), "completed": ckpt.completed, "outputs": {}}
    assert Checkpoint.model_validate(view) == ckpt


def test_an_unreadable_old_record_is_one_validation_error() -> None:
    raw = json.loads((FIXTURES / "checkpoints_v1.json").read_text())["failed_history"][3]
    raw["record"]["causes"] = ["not", "a", "mapping"]
    with pytest.raises(ValidationError, match="unreadable record of a previous version"):
        Checkpoint.model_validate(raw)


def test_a_run_resumes_in_process_from_a_checkpoint_written_before(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "checkpoints_v1.json").read_text())
    failed = doc["failed_history"][-1]
    assert failed["status"] == "failed" and failed["in_flight"] == ["right#3"]
    store = JsonProvider(tmp_path / "json")
    for raw in doc["failed_history"]:
        store.commit(Checkpoint.model_validate(raw))
    flow = LoopFlow(checkpoint=CheckpointConfig(provider=store))
    result = flow.kickoff(from_checkpoint=failed["id"], inputs={"fail_at": -1})
    assert result == doc["resumed_result"]
    assert flow.state.model_dump(mode="json") == doc["resumed_state"]
    history = list(reversed(store.history(doc["run_id"], limit=100)))
    resumed = history[len(doc["failed_history"]) :]
    old = doc["resumed_history"]
    assert [(c.event, c.step) for c in resumed][:1] == [(old[0]["event"], old[0]["step"])]
    assert sorted(c.activation or "" for c in resumed) == sorted(c["activation"] or "" for c in old)
    assert sorted(resumed[-1].completed) == sorted(old[-1]["completed"])
    assert resumed[-1].outputs == old[-1]["outputs"]


def test_fork_rerun_of_an_old_checkpoint_matches_a_new_one() -> None:
    doc = json.loads((FIXTURES / "checkpoints_v1.json").read_text())
    graph = LoopFlow.graph()
    # Mid-run, after the second round's router: the third round is in flight.
    raw = next(c for c in doc["failed_history"] if c["activation"] == "check#2")
    old = tr.record_of(Checkpoint.model_validate(raw))
    # The same point reached by the bounded code.
    new, _ = orch.ready_starts(graph, ExecutionRecord())
    for act in raw["completed"]:
        label = raw["record"]["routes"].get("check") if act.startswith("check") else None
        new, _ = orch.complete(graph, new, act, raw["outputs"].get(act.split("#")[0]), label)
    for steps in (["left"], ["join"], ["check"], ["begin"], ["right", "check"]):
        a, b = orch.invalidate(graph, old, steps), orch.invalidate(graph, new, steps)
        assert [(x.id, x.trigger) for x in orch.pending(a)] == [
            (x.id, x.trigger) for x in orch.pending(b)
        ], steps
        assert sorted(a.completed) == sorted(b.completed), steps
        for name in ("emitted", "dispatched", "seen", "fired", "routes", "forgotten"):
            assert getattr(a, name) == getattr(b, name), (steps, name)


def _old_run(rt: Runtime) -> dict[str, Any]:
    """The fixture's failed run, committed checkpoint by checkpoint into the test's store."""
    doc: dict[str, Any] = json.loads((FIXTURES / "checkpoints_v1.json").read_text())
    for raw in doc["failed_history"]:
        rt.store.commit(Checkpoint.model_validate(raw))
    return doc


@pytest.mark.slow
def test_workers_resume_and_fork_a_run_written_before(rt: Runtime) -> None:
    doc = _old_run(rt)
    run_id = doc["run_id"]
    resumed = control.resume(run_id, inputs={"fail_at": -1}, rt=rt)
    assert resumed.result(timeout=60) == doc["resumed_result"]
    latest = rt.store.latest(run_id)
    assert latest is not None and latest.status is RunStatus.SUCCEEDED
    assert latest.state == doc["resumed_state"]
    assert sorted(latest.completed) == sorted(doc["resumed_history"][-1]["completed"])

    # Forks with --rerun from the old checkpoint of the second round's router and from
    # the same point of the same run made today end alike.
    flow = LoopFlow(checkpoint=CheckpointConfig(provider=rt.store))
    with pytest.raises(RuntimeError, match="right fails once"):
        flow.kickoff(inputs={"fail_at": 3})
    today = next(c for c in rt.store.history(flow.flow_id, limit=100) if c.activation == "check#2")
    old = next(c for c in doc["failed_history"] if c["activation"] == "check#2")
    for rerun in (["check"], ["left"], ["join", "right"]):
        ends = []
        for source in (old["id"], today.id):
            fork = control.fork(source, set={"fail_at": -1, "rounds": 5}, rerun=rerun, rt=rt)
            result = fork.result(timeout=60)
            end = rt.store.latest(fork.run_id)
            assert end is not None and end.status is RunStatus.SUCCEEDED
            ends.append((result, {**end.state, "id": None}, end.outputs, sorted(end.completed)))
        assert ends[0] == ends[1], rerun
        if rerun == ["check"]:  # the router runs again: the loop goes on to five rounds
            assert ends[0][0] == 50
