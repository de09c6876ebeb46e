"""Resume and fork runs on the workers.

* ``resume(run_id)`` continues a run from its latest (or a named) checkpoint:
  only steps not completed there run, the failed or paused one included.
* ``fork(ref)`` starts a new run from any checkpoint, with edited state and/or
  steps to re-run (everything downstream of them re-runs too); the source run's
  history is untouched and the new run records its lineage. A fork that would change
  nothing (no edit, no step to run) is refused here, for the CLI, the API and the
  console alike.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from runner.errors import (
    CheckpointNotFound,
    InvalidInputs,
    RunNotFound,
    RunStateError,
    UnknownStep,
)
from runner.flow import epochs, plans, usage, versions
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.flow import apply_inputs
from runner.flow.graph import FlowGraph
from runner.flow.plans import check_fields, check_graph
from runner.flow.renames import check_map, renamed_meta, renamed_record
from runner.store.models import Checkpoint, RunStatus

from .answers import deliver
from .client import RunHandle, load_flow, runtime
from .engine import Runtime, commit_on_latest, dispatch_ready, running_steps


class ForkChangesNothing(InvalidInputs):
    """A fork whose new run would be a copy of its checkpoint: no value set differs from
    the checkpoint's state, no step is re-run, and nothing is left to run there."""


def check_steps(flow_cls: Any, steps: list[str]) -> FlowGraph:
    """``flow_cls``'s graph; :class:`UnknownStep` naming the ``steps`` that are not its
    methods and listing the ones it has (one message for the CLI, the API and the console)."""
    graph: FlowGraph = flow_cls.graph()
    unknown = sorted({step for step in steps if step not in graph.methods})
    if unknown:
        name = flow_cls.flow_name()
        raise UnknownStep(
            f"{name} has no step(s) {', '.join(unknown)}; its steps: {', '.join(graph.methods)}",
            flow=name,
            steps=unknown,
            known=list(graph.methods),
        )
    return graph


def find_checkpoint(rt: Runtime, ref: str) -> Checkpoint:
    """A checkpoint by id, or a run's latest by run id."""
    try:
        return rt.store.get(ref)
    except CheckpointNotFound:
        latest = rt.store.latest(ref)
        if latest is None:
            raise CheckpointNotFound(f"no checkpoint or run {ref}", checkpoint_id=ref) from None
        return latest


def resume(
    run_id: str,
    from_checkpoint: str | None = None,
    inputs: dict[str, Any] | None = None,
    *,
    rt: Runtime | None = None,
) -> RunHandle:
    """Continue ``run_id`` on the workers; completed steps are never re-run. Whether it
    may, and from what, :func:`runner.flow.plans.plan_resume` decides (as for every way of
    resuming: one refusal wording and exit code each).

    A child run (a crew a step started) whose parent stopped with it (failed, or cancelled
    with its tree) is continued through its parent: the topmost stopped parent is resumed,
    which resumes the child where it stopped. The handle is of the run resumed (compare its
    ``run_id``); inputs given for such a child are refused, as they would go to the parent.
    """
    rt = rt or runtime()
    info = rt.store.run(run_id)
    if info is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    top = stopped_ancestor(rt, run_id) if from_checkpoint is None else run_id
    if top != run_id:
        if inputs:
            raise InvalidInputs(
                f"run {run_id} is a child of {top}, which stopped with it: resume {top} "
                "(inputs apply to the run resumed)",
                run_id=run_id,
            )
        return resume(top, rt=rt)
    latest = rt.store.latest(run_id)
    # A checkpoint of another run is refused by the planner, as every resume's.
    source = latest if from_checkpoint is None else rt.store.get(from_checkpoint)
    if source is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    flow_cls = load_flow(str(source.flow))
    plan = plans.plan_resume(
        flow_cls(),
        source,
        inputs,
        run_id=run_id,
        info=info,
        latest=latest,
        running=running_steps(rt, latest) if latest and tr.goes_on(latest, source) else (),
    )
    done = commit_on_latest(rt, run_id, plan.opening)
    assert done is not None
    ckpt, step = done
    dispatch_ready(rt, flow_cls, ckpt, step.ready)
    return RunHandle(run_id, rt)


def stopped_ancestor(rt: Runtime, run_id: str) -> str:
    """The topmost run above ``run_id`` whose chain of parents all failed or were cancelled
    (``run_id`` itself when its parent is not stopped, or it has none).

    A parent still running waits on the child and continues when it succeeds; one that
    failed or was cancelled must be resumed itself, and resuming it resumes the child.
    """
    current = run_id
    while True:
        latest = rt.store.latest(current)
        parent = latest.meta.links.parent if latest is not None else None
        info = rt.store.run(parent.run_id) if parent is not None else None
        if info is None or info.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            return current
        current = info.run_id


def answer(
    run_id: str,
    text: str | None,
    *,
    by: str | None = None,
    outcome: str | None = None,
    step: str | None = None,
    rt: Runtime | None = None,
) -> RunHandle:
    """Give a paused run the answer it awaits (``@human_feedback``'s review, ``self.ask``'s
    question) and go on: the answer is recorded in the run (with ``by``, who gave it) and
    the step that waited is sent again in a new epoch. ``outcome`` picks an ``emit`` label
    directly instead of collapsing ``text`` to one. Every way of answering (the CLI's
    ``resume --feedback``, ``RunHandle.resume(feedback=)``, the console and its API, an
    ``ask`` timeout with ``text=None``) comes here (:func:`.answers.deliver`, which also
    says what ``step`` guards against)."""
    rt = rt or runtime()
    deliver(rt, run_id, text, by=by, outcome=outcome, step=step)
    return RunHandle(run_id, rt)


def fork(
    ref: str,
    set: dict[str, Any] | None = None,
    rerun: list[str] | None = None,
    branch: str | None = None,
    run_id: str | None = None,
    *,
    renames: dict[str, str] | None = None,
    rt: Runtime | None = None,
) -> RunHandle:
    """Start a new run from checkpoint (or run) ``ref`` with edits; the source is untouched.

    ``renames`` (``old -> new`` method names, ``runner fork --map``) moves a run onto code
    whose methods were renamed: the new run's record reads each old method as its new one,
    and the run is pinned to the code forking it (:mod:`runner.flow.renames`)."""
    rt = rt or runtime()
    source = find_checkpoint(rt, ref)
    flow_cls = load_flow(str(source.flow))
    graph = check_steps(flow_cls, rerun or [])
    renames = dict(renames or {})
    if renames:
        check_map(graph, renames)
        source = source.model_copy(
            update={
                "record": renamed_record(source.record, renames),
                "meta": renamed_meta(source.meta, renames),
            }
        )
    check_graph(graph, source)
    new_id = run_id or str(uuid.uuid4())
    if rt.store.run(new_id) is not None:
        raise RunStateError(f"run {new_id} already exists", run_id=new_id)
    loaded, _upgrade = versions.read_state(flow_cls, source.state, source.version, source.run_id)
    edits = nested_edits(loaded, set or {})
    state = _validated(flow_cls, loaded, {**edits, "id": new_id})
    record = tr.record_of(source)
    if rerun:
        record = orch.invalidate(graph, record, rerun)
    pending = orch.pending(record)
    if not pending and {**state, "id": source.run_id} == {**source.state, "id": source.run_id}:
        # Nothing to run and no edit: the new run would be a copy that "succeeds" at once.
        raise ForkChangesNothing(
            f"this fork would change nothing: nothing is left to run at checkpoint "
            f"{source.id} ({source.status.value}) and no value set differs from its state; "
            f"pass --rerun STEP (one of {', '.join(graph.methods)}) or a --set that differs",
            checkpoint_id=source.id,
            steps=list(graph.methods),
        )
    first = rt.store.fork(source.id, new_run_id=new_id, branch=branch, state=state)
    meta = renamed_meta(first.meta, renames)
    if renames:  # moved on purpose: this code is the run's from now on
        meta = meta.updated(pinned=versions.of(graph))
    start = tr.with_record(
        first,
        record,
        event="flow_started",
        step=None,
        status=RunStatus.RUNNING if pending else RunStatus.SUCCEEDED,
        version=versions.of(graph),
        # A record renamed onto this graph is this graph's.
        **({"fingerprint": graph.fingerprint} if renames else {}),
        # The source's run-local notes (a pause, a resume, merge conflicts) are not the fork's.
        meta=epochs.carry(
            meta,
            epochs.Opening.FORK,
            ready=[a.id for a in pending],
            epoch=0,
            forked_from=source.id,
            # A new run: it spent nothing yet; the steps it keeps saved what they spent.
            usage=usage.resumed(None, first.meta.usage, record.done),
        ),
    )
    rt.store.commit(start, expected_seq=first.seq)
    dispatch_ready(rt, flow_cls, start, pending)
    return RunHandle(new_id, rt)


def nested_edits(state: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    """``edits`` as top-level field values of ``state``: a dotted key (``outputs.t02.raw``)
    changes one entry of a nested object and keeps the others; a key that is a field of
    ``state`` as it is, or has no dot, replaces that field (``InvalidInputs`` when a dotted
    key goes through something that is not an object)."""
    top: dict[str, Any] = {}
    for key, value in edits.items():
        if key in state or "." not in key:
            top[key] = value
            continue
        head, *path, last = key.split(".")
        root = top.get(head, state.get(head, {}))
        if not isinstance(root, dict):
            raise InvalidInputs(f"cannot set {key}: {head} is not an object", field=key)
        node = top[head] = copy.deepcopy(root)
        for depth, part in enumerate(path, 1):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                where = ".".join([head, *path[:depth]])
                raise InvalidInputs(f"cannot set {key}: {where} is not an object", field=key)
        node[last] = value
    return top


def _validated(flow_cls: Any, state: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    check_fields(flow_cls, inputs)
    return apply_inputs(flow_cls(), inputs, state)
