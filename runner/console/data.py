"""What the console shows, as JSON values: the API returns these dicts, the pages render them.

Everything is read from the checkpoint store; the flow class (for the graph) is imported
by its path when it can be, and a run whose flow does not import here is shown without
a graph rather than not at all.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from runner import ids
from runner.distributed.client import load_flow
from runner.distributed.control import find_checkpoint
from runner.distributed.engine import Runtime, task_id
from runner.distributed.waiting import waits_of
from runner.errors import RunnerError, RunNotFound
from runner.flow import conversation, results, usage
from runner.flow import transition as tr
from runner.flow.graph import TRIGGER_PAYLOAD, FlowGraph
from runner.store.base import DeploymentStore, latest_readable
from runner.store.models import Checkpoint, RunInfo, RunStatus, StepError
from runner.store.schedules import schedule_json
from runner.store.selection import Where, page_of
from runner.views import (
    WAITING,
    StepState,
    answers_given,
    asleep,
    awaiting_of,
    checkpoint_diff,
    method_state,
    pause_reason,
    scheduled_until,
    short_runs,
    step_states,
)

HISTORY_LIMIT = 500
"""Checkpoints of one run shown on its page (newest first)."""
INDEX_SCAN = 2000
"""Runs read from the index to find a run's forks (the lineage tree)."""
_PAGE = 200


# --- flows -----------------------------------------------------------------------------------


def flow_of(path: str | None) -> tuple[Any, str | None]:
    """The flow class at ``path`` and ``None``, or ``None`` and why it cannot be loaded here."""
    if not path:
        return None, "the run records no flow path"
    try:
        flow_cls = load_flow(path)
        flow_cls.graph()  # a flow that no longer compiles has no graph to show
    except RunnerError as exc:
        return None, str(exc)
    return flow_cls, None


# --- runs list -------------------------------------------------------------------------------


def _methods_of(activations: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for act in activations:
        seen.setdefault(ids.method_of(act), None)
    return list(seen)


def run_row(info: RunInfo, latest: Checkpoint | None, now: float | None = None) -> dict[str, Any]:
    """One run of the list: status, flow, times, current step, fork and child links."""
    running = info.status in (RunStatus.RUNNING, RunStatus.PENDING)
    end = (now or time.time()) if running else info.updated_at
    current = _methods_of(latest.in_flight) if latest is not None and running else []
    parent = latest.meta.links.parent if latest is not None else None
    return {
        "run_id": info.run_id,
        "flow": info.flow,
        "name": info.name or info.flow or "-",
        "status": info.status.value,
        "seq": info.seq,
        "step": ", ".join(current) or info.step,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        "duration": max(end - info.created_at, 0.0) if info.created_at else None,
        "parent_run_id": info.parent_run_id,
        "parent_checkpoint_id": info.parent_checkpoint_id,
        "branch": info.branch,
        "child_of": parent.model_dump(mode="json") if parent is not None else None,
        "children": len(latest.meta.links.children) if latest is not None else 0,
        "error": info.error,
    }


def list_runs(
    store: DeploymentStore,
    *,
    status: RunStatus | None = None,
    flow: str | None = None,
    text: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Up to ``limit`` runs, most recently updated first, matching every filter given.

    ``flow`` is a flow name or import path; ``text`` is found (case-insensitively) in
    the run id, flow, step, error or branch.
    """
    where = Where(
        statuses=(status,) if status else (), flows=(flow,) if flow else (), text=text or ""
    )
    return runs_page(store, where, limit=limit)["runs"]


def runs_page(
    store: DeploymentStore, where: Where, *, offset: int = 0, limit: int = 50
) -> dict[str, Any]:
    """One page of the runs ``where`` keeps (:mod:`runner.store.selection`, as the CLI's
    ``--where``), most recently updated first: their rows, each with ``short`` (its
    unambiguous short id), and the count of the whole selection (``total``)."""
    page = page_of(store, where, offset=offset, limit=limit)
    now = time.time()
    latest = latest_readable(store, [info.run_id for info in page.runs])
    rows = nested([run_row(info, latest.get(info.run_id), now) for info in page.runs])
    ids = [row["run_id"] for row in rows] + [
        str(r)
        for row in rows
        for r in (row["parent_run_id"], (row["child_of"] or {}).get("run_id"))
        if r
    ]
    shown = short_runs(store.run_ids(), ids)
    for row in rows:
        row["short"] = shown.get(row["run_id"], row["run_id"])
        row["parent_short"] = shown.get(row["parent_run_id"] or "", row["parent_run_id"])
        child_of = (row["child_of"] or {}).get("run_id")
        row["child_of_short"] = shown.get(child_of or "", child_of)
    return {
        "runs": rows,
        "total": page.total,
        "offset": offset,
        "limit": limit,
        "more": page.more,
        "where": where.source,
    }


def nested(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with each child run right under its parent's row, ``depth`` set (0 for a run
    without a parent in ``rows``), as ``runner runs`` nests them."""
    listed = {row["run_id"] for row in rows}
    kids: dict[str, list[dict[str, Any]]] = {}
    top = []
    for row in rows:
        parent = str((row["child_of"] or {}).get("run_id"))
        if parent in listed and parent != row["run_id"]:
            kids.setdefault(parent, []).append(row)
        else:
            top.append(row)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()

    def walk(row: dict[str, Any], depth: int) -> None:
        if row["run_id"] in seen:
            return
        seen.add(row["run_id"])
        out.append({**row, "depth": depth})
        for kid in kids.get(row["run_id"], []):
            walk(kid, depth + 1)

    for row in top:
        walk(row, 0)
    return out


def flow_names(store: DeploymentStore, scan: int = 500) -> list[str]:
    """The distinct flow names of the newest ``scan`` runs (the list's flow filter)."""
    return sorted({info.name or info.flow or "" for info in store.runs(limit=scan)} - {""})


# --- one run ---------------------------------------------------------------------------------


def method_states(
    graph: FlowGraph | None,
    latest: Checkpoint,
    error_step: str | None,
    states: dict[str, StepState] | None = None,
) -> list[dict[str, Any]]:
    """Each method's state (done, running, waiting, failed, paused, pending, skipped) and
    count of completed activations, in the graph's order (or the order seen, without a
    graph). An in-flight method is ``running`` or ``waiting`` as ``states``
    (:func:`runner.views.step_states`) shows its activations; ``waits_for`` says why."""
    states = states or {}
    counts: dict[str, int] = {}
    for act in latest.completed:
        method = ids.method_of(act)
        counts[method] = counts.get(method, 0) + 1
    in_flight = set(_methods_of(latest.in_flight))
    names = (
        list(graph.methods)
        if graph is not None
        else _methods_of([*latest.completed, *latest.in_flight])
    )
    status = latest.status
    rows = []
    for name in names:
        if status is RunStatus.FAILED and name == error_step:
            state = "failed"
        elif status is RunStatus.PAUSED and name == latest.step and name in in_flight:
            state = "paused"
        elif name in in_flight and status is RunStatus.RUNNING:
            state = method_state(states, name)
        elif counts.get(name):
            state = "done"
        elif status is RunStatus.SUCCEEDED:
            state = "skipped"  # e.g. a router branch not taken
        else:
            state = "pending"
        spec = graph.methods[name] if graph is not None else None
        kind = "step"
        if spec is not None and spec.is_router:
            kind = "router"
        elif spec is not None and spec.is_start:
            kind = "start"
        why = [
            s.line(step)
            for step, s in states.items()
            if state == WAITING and ids.method_of(step) == name
        ]
        rows.append(
            {
                "name": name,
                "state": state,
                "count": counts.get(name, 0),
                "kind": kind,
                "waits_for": "; ".join(why) or None,
            }
        )
    return rows


_NODE = re.compile(r'^\s+(\S+?)(?:\(\[|\[|\{)"(.*)"(?:\]\)|\]|\})\s*$')
_CLASSES = {
    "done": "fill:#d1f2d8,stroke:#1e7b34,color:#0b3d17",
    "running": "fill:#d6e8ff,stroke:#1f5fbf,color:#0b2a5c,stroke-width:3px",
    # In flight but not running: held by a limit, a queue, a worker of a version, a sleep.
    "waiting": "fill:#fff7e0,stroke:#b26a00,color:#4a3000,stroke-width:3px,stroke-dasharray:6 3",
    "failed": "fill:#ffd9d6,stroke:#b3261e,color:#5c0b07,stroke-width:3px",
    "paused": "fill:#fff1c2,stroke:#a16800,color:#4a3000",
    "pending": "fill:#f4f4f4,stroke:#8a8a8a,color:#333",
    "skipped": "fill:#fafafa,stroke:#c8c8c8,color:#999,stroke-dasharray:4 3",
}


def legend() -> list[dict[str, str]]:
    """The graph's states with the fill and stroke colours it draws them in (a legend)."""
    found = []
    for state, style in _CLASSES.items():
        parts = dict(part.split(":", 1) for part in style.split(","))
        found.append({"state": state, "fill": parts["fill"], "stroke": parts["stroke"]})
    return found


def mermaid(graph: FlowGraph, methods: list[dict[str, Any]]) -> str:
    """The flow's Mermaid chart with each method coloured by state and its count shown."""
    by_name = {m["name"]: m for m in methods}
    lines = graph.to_mermaid().splitlines()
    out = []
    classes: dict[str, list[str]] = {}
    for line in lines:
        match = _NODE.match(line)
        method = by_name.get(match.group(2)) if match else None
        if match and method is not None:
            if method["count"] > 1:
                label = f"{method['name']} x{method['count']}"
                line = line.replace(f'"{method["name"]}"', f'"{label}"')
            classes.setdefault(method["state"], []).append(match.group(1))
        out.append(line)
    for state, style in _CLASSES.items():
        out.append(f"    classDef {state} {style}")
    for state, nodes in classes.items():
        out.append(f"    class {','.join(nodes)} {state}")
    return "\n".join(out) + "\n"


def _activation_of(ckpt: Checkpoint) -> str | None:
    """The activation id (``method#n``) a checkpoint is about, if any."""
    if ckpt.activation:
        return ids.activation_of_key(ckpt.activation)
    if ckpt.step:
        return next((a for a in ckpt.in_flight if ids.method_of(a) == ckpt.step), None)
    return None


def flower_link(flower_url: str | None, run_id: str, epoch: int, activation: str) -> str | None:
    """Flower's page of an activation's Celery task (task ids are deterministic).

    The id is one path segment, percent-encoded: its ``#`` (``review#1``) would otherwise
    start the URL's fragment and Flower would look up a truncated id."""
    if not flower_url:
        return None
    return f"{flower_url.rstrip('/')}/task/{quote(task_id(run_id, epoch, activation), safe='')}"


def timeline_row(ckpt: Checkpoint, flower_url: str | None) -> dict[str, Any]:
    """One checkpoint of the timeline: event, step, attempts, worker, duration, time."""
    act = _activation_of(ckpt)
    # A fork's first checkpoint copies its source's step: no task of this run ran for it.
    task = act if act is not None and ckpt.event != "forked" else None
    return {
        "id": ckpt.id,
        "seq": ckpt.seq,
        "event": ckpt.event,
        "step": ckpt.step,
        "activation": act,
        "status": ckpt.status.value,
        "attempts": ckpt.attempts or (ckpt.error.attempts if ckpt.error else None),
        "worker": ckpt.worker,
        "duration": ckpt.duration,
        "created_at": ckpt.created_at,
        "error": f"{ckpt.error.type}: {ckpt.error.message}" if ckpt.error else None,
        "usage": ckpt.usage.model_dump() if ckpt.usage is not None else None,
        "flower": (
            flower_link(flower_url, ckpt.run_id, tr.attempt_epoch(ckpt, task), task)
            if task
            else None
        ),
    }


def last_error(status: RunStatus, history: list[Checkpoint]) -> tuple[StepError, str] | None:
    """The error that failed the run and its step: the newest failure in its history.

    A failed run's latest checkpoint may be a parallel branch's later commit, which
    carries no error, so the history (newest first) is searched.
    """
    for ckpt in history:
        if ckpt.error is not None and ckpt.step:
            return ckpt.error, ckpt.step
        if ckpt.event == "flow_resumed" or status is not RunStatus.FAILED:
            break  # an error before a resume is history, not why the run stands here
    return None


def children(store: DeploymentStore, latest: Checkpoint) -> list[dict[str, Any]]:
    """Child runs (e.g. crews) started by the run's methods, with their status."""
    found = []
    for activation, link in latest.meta.links.children.items():
        child = store.run(link.run_id)
        found.append(
            {
                "activation": activation,
                "run_id": link.run_id,
                "name": link.name,
                "flow": link.flow,
                "waiting": link.waiting,
                "status": child.status.value if child is not None else None,
                "step": child.step if child is not None else None,
            }
        )
    return found


def first_checkpoint(
    store: DeploymentStore, run_id: str, history: list[Checkpoint]
) -> Checkpoint | None:
    """The run's first checkpoint (seq 1), from ``history`` (newest first) or the store;
    ``None`` once it was pruned."""
    oldest = history[-1] if history else None
    if oldest is not None and oldest.seq != 1 and len(history) >= HISTORY_LIMIT:
        # Without gaps, the first checkpoint is the latest's seq - 1 entries further back.
        found = store.history(run_id, limit=1, offset=history[0].seq - 1)
        oldest = found[0] if found else None
    return oldest if oldest is not None and oldest.seq == 1 else None


def inputs_of(first: Checkpoint | None) -> dict[str, Any] | None:
    """What the run started with: its first checkpoint's state (the submitted inputs on
    the state's defaults; for a fork, the source checkpoint's state with its edits)
    without ``id`` (the run id), plus a CrewAI trigger payload if it was given one.
    ``None`` when that checkpoint is no longer kept."""
    if first is None:
        return None
    inputs = {key: value for key, value in first.state.items() if key != "id"}
    if first.meta.trigger_payload is not None:
        inputs[TRIGGER_PAYLOAD] = first.meta.trigger_payload
    return inputs


def result_of(status: RunStatus, latest: Checkpoint, flow_cls: Any = None) -> Any:
    """A succeeded run's result, as ``runner submit --wait`` prints it and
    ``RunHandle.result()`` returns it (:func:`runner.flow.results.result_json`)."""
    return results.result_json(status, latest, flow_cls)


def conversation_of(flow_cls: Any, latest: Checkpoint) -> list[dict[str, Any]] | None:
    """The messages of a conversational run (``None`` for other runs, or when its flow does
    not import here)."""
    if flow_cls is None or not conversation.is_conversational(flow_cls):
        return None
    return [conversation.as_llm_message(m) for m in latest.state.get("messages") or []]


def schedules(store: DeploymentStore) -> list[dict[str, Any]]:
    """Each schedule (``runner schedule list``): flow, inputs, cron or period, next tick."""
    return [
        {**schedule_json(s, store.next_tick(s.name)), "when": s.describe()}
        for s in store.schedules()
    ]


def limits(store: DeploymentStore) -> list[dict[str, Any]]:
    """Each rate and concurrency limit in use: its setting, use now, steps waiting on it."""
    return [use.as_json() for use in store.limit_uses()]


def run_detail(rt: Runtime, run_id: str, flower_url: str | None) -> dict[str, Any]:
    """Everything the run page shows: summary, inputs, result, graph, timeline, error,
    children, lineage."""
    info = rt.store.run(run_id)
    latest = rt.store.latest(run_id)
    if info is None or latest is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    history = rt.store.history(run_id, limit=HISTORY_LIMIT)
    flow_cls, problem = flow_of(latest.flow)
    graph = flow_cls.graph() if flow_cls is not None else None
    failure = last_error(info.status, history)
    waiting = waits_of(rt.store, rt.settings, latest, rt.app)
    methods = method_states(
        graph, latest, failure[1] if failure else None, step_states(latest, waiting)
    )
    parent = latest.meta.links.parent
    answers = {
        ckpt_id: {
            "text": a.text,
            "outcome": a.outcome,
            "by": a.by,
            "method": a.awaited.method,
        }
        for ckpt_id, a in answers_given(history).items()
    }
    return {
        "run": run_row(info, latest),
        "checkpoint": latest.id,
        "completed": latest.completed,
        "in_flight": latest.in_flight,
        # In-flight step -> what it waits for (a limit, a queue no live worker consumes).
        "waiting": waiting,
        "pause_reason": pause_reason(info.status, latest),
        # A person's answer it waits for: a review of a step's output, or a question.
        "awaiting": awaiting_of(info.status, latest),
        # Time (README, Time and identity): a delayed start, durable sleeps, the deadline.
        "scheduled_until": scheduled_until(latest),
        "sleeping": {act: why for act in latest.in_flight if (why := asleep(latest, act))},
        "deadline": latest.meta.scheduling.deadline,
        # The code version that wrote its latest checkpoint (runner.flow.versions).
        "version": latest.version,
        "fingerprint": latest.fingerprint,
        # Its steps' priority (submit(priority=...)); None: each method's, else the default.
        "priority": latest.meta.scheduling.priority,
        "cancel_reason": latest.meta.cancel_reason if info.status is RunStatus.CANCELLED else None,
        "inputs": inputs_of(first_checkpoint(rt.store, run_id, history)),
        "result": result_of(info.status, latest, flow_cls),
        # A conversational run's messages (its chat panel), else None.
        "conversation": conversation_of(flow_cls, latest),
        "graph_error": problem,
        "methods": methods,
        "mermaid": mermaid(graph, methods) if graph is not None else None,
        "legend": legend(),
        "error": ({**failure[0].model_dump(mode="json"), "step": failure[1]} if failure else None),
        "timeline": [{**timeline_row(c, flower_url), "answer": answers.get(c.id)} for c in history],
        # Tokens (runner.flow.usage): in all, since the latest start or resume, and saved.
        "usage": usage.run_sums(latest),
        "parent": parent.model_dump(mode="json") if parent is not None else None,
        "children": children(rt.store, latest),
        "lineage": lineage(rt.store, info),
        # What the page's diff compares the latest checkpoint with by default: the
        # checkpoint a fork started from, else the oldest checkpoint kept.
        "diff_base": info.parent_checkpoint_id or history[-1].id,
    }


# --- lineage ---------------------------------------------------------------------------------


def _index(store: DeploymentStore) -> dict[str, RunInfo]:
    found: dict[str, RunInfo] = {}
    offset = 0
    while offset < INDEX_SCAN:
        batch = store.runs(limit=_PAGE, offset=offset)
        found.update((info.run_id, info) for info in batch)
        if len(batch) < _PAGE:
            break
        offset += _PAGE
    return found


def lineage(store: DeploymentStore, info: RunInfo) -> dict[str, Any]:
    """The fork tree ``info`` belongs to, from its root: each run with its forks grouped
    under the checkpoint they started from (as CrewAI's checkpoint browser nests them).

    Forks are found in the newest :data:`INDEX_SCAN` runs of the index.
    """
    runs = _index(store)
    runs[info.run_id] = info
    root = info
    seen = {root.run_id}
    while root.parent_run_id and root.parent_run_id not in seen:
        parent = runs.get(root.parent_run_id) or store.run(root.parent_run_id)
        if parent is None:
            break  # the parent run was deleted: the oldest run still here is the root
        runs[parent.run_id] = parent
        seen.add(parent.run_id)
        root = parent
    forks: dict[str, list[RunInfo]] = {}
    for run in sorted(runs.values(), key=lambda r: r.created_at):
        if run.parent_run_id:
            forks.setdefault(run.parent_run_id, []).append(run)
    return _node(store, root, forks, info.run_id, set())


def _node(
    store: DeploymentStore,
    run: RunInfo,
    forks: dict[str, list[RunInfo]],
    current: str,
    seen: set[str],
) -> dict[str, Any]:
    seen.add(run.run_id)
    points: dict[str, list[dict[str, Any]]] = {}
    for fork in forks.get(run.run_id, []):
        if fork.run_id not in seen and fork.parent_checkpoint_id:
            node = _node(store, fork, forks, current, seen)
            points.setdefault(fork.parent_checkpoint_id, []).append(node)
    at = []
    for checkpoint_id, nodes in points.items():
        try:
            ckpt = store.get(checkpoint_id)
            where: dict[str, Any] = {"seq": ckpt.seq, "event": ckpt.event, "step": ckpt.step}
        except RunnerError:  # pruned or corrupt: the fork still shows, without the detail
            where = {"seq": None, "event": None, "step": None}
        at.append({"checkpoint_id": checkpoint_id, **where, "runs": nodes})
    at.sort(key=lambda point: point["seq"] or 0)
    return {
        "run_id": run.run_id,
        "name": run.name or run.flow,
        "status": run.status.value,
        "branch": run.branch,
        "current": run.run_id == current,
        "forks": at,
    }


# --- checkpoints -----------------------------------------------------------------------------


def checkpoint_view(rt: Runtime, ref: str) -> dict[str, Any]:
    """One checkpoint in full (by id, or a run id for its latest), with the steps completed
    and in flight and their outputs at top level (they live in its record)."""
    ckpt = find_checkpoint(rt, ref)
    return {
        **ckpt.model_dump(mode="json"),
        "completed": ckpt.completed,
        "in_flight": ckpt.in_flight,
        "outputs": ckpt.outputs,
    }


def diff(rt: Runtime, a: str, b: str) -> dict[str, Any]:
    """State fields added, removed, changed from checkpoint ``a`` to ``b``; steps completed
    on one side only (the same comparison as ``runner diff``)."""
    first, second = find_checkpoint(rt, a), find_checkpoint(rt, b)
    return {
        "a": {"id": first.id, "run_id": first.run_id, "seq": first.seq, "event": first.event},
        "b": {"id": second.id, "run_id": second.run_id, "seq": second.seq, "event": second.event},
        **checkpoint_diff(first, second),
    }
