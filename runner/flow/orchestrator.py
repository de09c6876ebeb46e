"""Given what finished, what is ready: the pure core of running a flow.

The state of a run's *execution* (not its user state) is an :class:`ExecutionRecord`, a
JSON-able model stored inside every checkpoint (defined with the checkpoint, in
:mod:`runner.store.models`). Its size is bounded by the flow graph and the activations in
flight: per method a count and its latest commit, not every activation, so a step costs
the same at the run's 3,000th iteration as at its 10th. Each function takes a record and
returns a new one; none mutates its input, touches Redis or Celery, or reads the clock.
The same call on the same record gives the same result, activation ids included, so a
commit computed twice (a redelivered step) names the same next steps and dispatching them
is idempotent.

An *activation* is one run of one method, ``"<method>#<n>"`` with ``n`` counting that
method's activations in the run from 1.

Firing rules, for a step ``L`` listening to a condition:

* one leaf (``@listen(a)``): ``L`` fires on every emission of ``a`` (so loops re-run it);
* several leaves, all ``or_`` (``@listen(a, b)``): fires *once per wave*: on the k-th
  emission of a leaf it fires if it has fired fewer than k times, or if the activation that
  emitted the event descends (through ``causes``) from ``L``'s latest activation, i.e. the
  event is a consequence of ``L``'s last run. So ``a`` and ``b`` finishing in parallel run
  ``L`` once; a loop that runs ``a`` again runs ``L`` again; ``@listen(or_(begin, "retry"))``
  re-runs on every ``retry`` its own run led to; a label from a router chained off ``a``
  (not off ``L``) does not run it a second time. Rather than walk the causes back through
  the run's history, each activation carries its *lineage*: for every such ``L``, the
  latest activation of ``L`` among its ancestors, the merge of its causes' lineages;
* any ``and_`` inside: the leaves emitted since ``L`` last fired accumulate in
  ``seen[L]``; when the condition holds on them ``L`` fires and ``seen[L]`` is cleared.

A method's name is emitted when it completes, then (for a router) the label it returned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runner import ids
from runner.errors import (
    CycleLimitExceeded,
    DefinitionError,
    GraphChanged,
    NotInFlight,
    RunStateError,
)
from runner.flow.conditions import Cond, evaluate, has_and, leaves
from runner.flow.graph import FlowGraph
from runner.store.models import ExecutionRecord


@dataclass(frozen=True)
class Activation:
    """One run of one method."""

    id: str
    """``"<method>#<n>"``; deterministic, unique within the run."""
    method: str
    """The flow method to call."""
    n: int
    """1 for the method's first activation in the run, 2 for the next, ..."""
    trigger: str | None
    """The event that fired it; ``None`` for a start at kickoff."""


def parse_activation(activation_id: str) -> tuple[str, int]:
    """Split ``"method#n"`` into ``("method", n)``; a malformed id is a corrupt record."""
    split = ids.split_activation(activation_id)
    if split is None:
        raise RunStateError(f"malformed activation id {activation_id!r}", activation=activation_id)
    return split


def _copy(record: ExecutionRecord) -> ExecutionRecord:
    # One level deep is enough: nested lists, dicts and tuples are replaced, never changed
    # in place, and outputs are JSON values nobody mutates.
    update: dict[str, Any] = {}
    for name, value in record:
        if isinstance(value, dict | list):
            update[name] = type(value)(value)
    return record.model_copy(update=update)


def _is_wave(graph: FlowGraph, name: str) -> bool:
    """Whether ``name`` is a multi-leaf ``or_`` listener (it fires once per wave)."""
    spec = graph.methods.get(name)
    cond = None if spec is None else spec.condition
    return cond is not None and not has_and(cond) and len(leaves(cond)) > 1


def _activate(
    graph: FlowGraph,
    rec: ExecutionRecord,
    method: str,
    trigger: str | None,
    causes: list[str] | None = None,
) -> Activation:
    limit = graph.spec(method).max_calls
    n = rec.dispatched.get(method, 0) + 1
    if n > limit:
        raise CycleLimitExceeded(
            f"{graph.name}.{method} has been called {n - 1} times and would run a {n}th "
            f"time; max_calls is {limit}",
            step=method,
            limit=limit,
        )
    act = Activation(ids.activation_id(method, n), method, n, trigger)
    rec.dispatched[method] = n
    rec.in_flight.append(act.id)
    rec.triggers[act.id] = trigger
    rec.causes[act.id] = causes or []
    line = {method: n} if _is_wave(graph, method) else {}
    for cause in causes or ():
        for name, k in rec.lineage.get(cause, {}).items():
            if k > line.get(name, 0) and _is_wave(graph, name):
                line[name] = k
    if line:
        rec.lineage[act.id] = line
    return act


def _descends(rec: ExecutionRecord, act_id: str, listener: str) -> bool:
    """Whether the latest activation of ``listener`` is ``act_id`` or one of its
    (transitive) causes: then it is the latest one of ``listener`` in its lineage."""
    latest = rec.dispatched.get(listener, 0)
    return latest > 0 and rec.lineage.get(act_id, {}).get(listener) == latest


def _latest_done(rec: ExecutionRecord, methods: Iterable[str]) -> str | None:
    """The most recently committed of ``methods``' latest committed activations."""
    done = [(rec.done[m][1], m) for m in methods if m in rec.done]
    if not done:
        return None
    _, method = max(done)
    return ids.activation_id(method, rec.done[method][0])


def _emitter(rec: ExecutionRecord, event: str) -> str | None:
    """The latest committed activation that emitted ``event`` (a method name or a label)."""
    return _latest_done(rec, [event, *(r for r, label in rec.routes.items() if label == event)])


def _join_fires(cond: Cond, name: str, event: str, rec: ExecutionRecord) -> bool:
    seen = rec.seen.get(name, [])
    seen = seen if event in seen else [*seen, event]
    if not evaluate(cond, set(seen)):
        rec.seen[name] = seen
        return False
    rec.seen.pop(name, None)
    return True


def _fires(
    cond: Cond, name: str, event: str, source: str, rec: ExecutionRecord
) -> list[str] | None:
    """The causes of a new activation of listener ``name`` if ``event``, emitted by activation
    ``source``, fires it, else ``None``; updates ``rec.seen`` / ``rec.fired``."""
    if has_and(cond):
        seen = rec.seen.get(name, [])
        if not _join_fires(cond, name, event, rec):
            return None
        emitters = (_emitter(rec, leaf) for leaf in seen if leaf != event)
        return list(dict.fromkeys([*(e for e in emitters if e is not None), source]))
    if len(leaves(cond)) == 1:
        return [source]
    fired = rec.fired.get(name, 0)
    if fired < rec.emitted[event] or _descends(rec, source, name):
        rec.fired[name] = fired + 1
        return [source]
    return None


def _emit(graph: FlowGraph, rec: ExecutionRecord, event: str, source: str) -> list[Activation]:
    rec.emitted[event] = rec.emitted.get(event, 0) + 1
    ready = []
    for name in graph.listeners(event):
        cond = graph.methods[name].condition
        causes = None if cond is None else _fires(cond, name, event, source, rec)
        if causes is not None:
            ready.append(_activate(graph, rec, name, event, causes))
    return ready


def ready_starts(
    graph: FlowGraph, record: ExecutionRecord | None = None
) -> tuple[ExecutionRecord, list[Activation]]:
    """Make the kickoff steps ready: the unconditional starts, or all starts if none."""
    rec = _copy(record or ExecutionRecord())
    ready = [_activate(graph, rec, name, None) for name in graph.kickoff]
    rec.trim()
    return rec, ready


def complete(
    graph: FlowGraph,
    record: ExecutionRecord,
    activation_id: str,
    output: Any,
    label: str | None = None,
) -> tuple[ExecutionRecord, list[Activation]]:
    """Commit a finished activation and return the activations that became ready.

    ``output`` is the method's return value as JSON; ``label`` the router label it emits
    (``None``: a router that returned nothing emits no label). Raises :class:`NotInFlight`
    if the activation is not in flight (already committed, or never made ready).
    """
    if activation_id not in record.in_flight:
        state = "was already committed" if record.is_completed(activation_id) else "is unknown"
        raise NotInFlight(
            f"activation {activation_id!r} is not in flight: it {state}", activation=activation_id
        )
    method, n = parse_activation(activation_id)
    spec = graph.spec(method)
    if label is not None and not spec.is_router:
        raise DefinitionError(f"{graph.name}.{method} is not a router; it cannot emit {label!r}")
    rec = _copy(record)
    rec.in_flight.remove(activation_id)
    rec.commits += 1
    rec.done[method] = (n, rec.commits)
    rec.outputs[method] = output
    ready = _emit(graph, rec, method, activation_id)
    if spec.is_router:
        rec.routes.pop(method, None)
        if label is not None:
            rec.routes[method] = label
            ready += _emit(graph, rec, label, activation_id)
    rec.trim()
    return rec, ready


def _router_of(record: ExecutionRecord, label: str) -> str | None:
    """The router whose latest committed route is ``label``, the most recent first."""
    act = _latest_done(record, [r for r, routed in record.routes.items() if routed == label])
    return None if act is None else parse_activation(act)[0]


def argument_for(graph: FlowGraph, record: ExecutionRecord, activation: Activation) -> Any:
    """What a step that takes an argument receives: the output of its trigger.

    For a method trigger, that method's latest output; for a router label, the output of
    the router that emitted it (the label itself if unknown); ``None`` for a start.
    """
    trigger = activation.trigger
    if trigger is None:
        return None
    if trigger in graph.methods:
        return record.outputs.get(trigger)
    router = _router_of(record, trigger)
    return trigger if router is None else record.outputs.get(router, trigger)


def pending(record: ExecutionRecord) -> list[Activation]:
    """The in-flight activations, in the order they were made ready (re-dispatch on resume)."""
    acts = []
    for act_id in record.in_flight:
        method, n = parse_activation(act_id)
        acts.append(Activation(act_id, method, n, record.triggers.get(act_id)))
    return acts


def pending_activation(record: ExecutionRecord, activation_id: str) -> Activation | None:
    """The in-flight activation with this id, or ``None`` once it committed (or never was)."""
    return next((act for act in pending(record) if act.id == activation_id), None)


def is_finished(record: ExecutionRecord) -> bool:
    """True when nothing is in flight: the run has nothing more to do."""
    return not record.in_flight


def completed_steps(record: ExecutionRecord) -> frozenset[str]:
    """Names of the methods with at least one committed activation."""
    return frozenset(record.done)


def last_output(record: ExecutionRecord) -> Any:
    """The output of the most recently committed activation (what ``kickoff`` returns)."""
    method = last_method(record)
    return None if method is None else record.outputs.get(method)


def last_method(record: ExecutionRecord) -> str | None:
    """The method of the most recently committed activation, or ``None``."""
    act = _latest_done(record, record.done)
    return None if act is None else parse_activation(act)[0]


def check_graph(
    graph: FlowGraph, record: ExecutionRecord, checkpoint_id: str | None = None
) -> None:
    """Raise :class:`GraphChanged` naming the recorded steps the graph no longer has
    (and the checkpoint they were recorded in, when given)."""
    recorded = set(record.done) | {parse_activation(a)[0] for a in record.in_flight}
    missing = sorted(recorded - set(graph.methods))
    if missing:
        since = f" (checkpoint {checkpoint_id})" if checkpoint_id else ""
        raise GraphChanged(
            f"{graph.name} no longer has the steps {', '.join(missing)} this run recorded" + since,
            flow=graph.name,
            missing=missing,
            checkpoint_id=checkpoint_id,
        )


# --- fork --rerun ---------------------------------------------------------------------------


def _roots(graph: FlowGraph, steps: list[str]) -> list[str]:
    """The given steps not reachable from the other given steps (they re-run by themselves)."""
    roots = [s for s in steps if s not in graph.downstream(t for t in steps if t != s)]
    if roots or not steps:
        return roots
    order = list(graph.methods)  # all in one cycle: restart it at its first step
    return [min(steps, key=order.index)]


def _dropped_labels(graph: FlowGraph, rec: ExecutionRecord, down: frozenset[str]) -> set[str]:
    """Labels emitted by invalidated routers and not currently routed by a kept one."""
    kept = {label for r, label in rec.routes.items() if r not in down}
    gone: set[str] = set()
    for r in down:
        spec = graph.methods[r]
        if spec.is_router:
            gone |= graph.emits(r) - {r}
            gone |= {rec.routes[r]} if r in rec.routes else set()
    return {e for e in gone if e not in graph.methods} - kept


def _forget(graph: FlowGraph, record: ExecutionRecord, down: frozenset[str]) -> ExecutionRecord:
    """A copy of ``record`` as if the steps in ``down`` had never run (ids keep counting)."""
    rec = _copy(record)

    def keep(act: str) -> bool:
        return parse_activation(act)[0] not in down

    gone = _dropped_labels(graph, rec, down) | set(down)
    rec.forgotten |= {m: n for m, n in rec.dispatched.items() if m in down}
    rec.done = {m: d for m, d in rec.done.items() if m not in down}
    rec.in_flight = [a for a in rec.in_flight if keep(a)]
    rec.triggers = {a: t for a, t in rec.triggers.items() if keep(a)}
    rec.causes = {a: c for a, c in rec.causes.items() if keep(a)}
    rec.lineage = {a: line for a, line in rec.lineage.items() if keep(a)}
    rec.outputs = {m: v for m, v in rec.outputs.items() if m not in down}
    rec.routes = {m: v for m, v in rec.routes.items() if m not in down}
    rec.emitted = {e: k for e, k in rec.emitted.items() if e not in gone}
    rec.fired = {m: k for m, k in rec.fired.items() if m not in down}
    rec.seen = {m: s for m, s in rec.seen.items() if m not in down}
    for name in sorted(down):
        cond = graph.methods[name].condition
        if cond is not None and has_and(cond):
            # Leaves done by steps that are not re-run still count towards the join.
            done = [leaf for leaf in sorted(leaves(cond)) if rec.emitted.get(leaf, 0) > 0]
            if done:
                rec.seen[name] = done
    return rec


def invalidate(graph: FlowGraph, record: ExecutionRecord, steps: Iterable[str]) -> ExecutionRecord:
    """Make ``steps`` and everything downstream of them run again (``fork --rerun``).

    Every step in ``graph.downstream(steps)`` is forgotten: its activations (committed or in
    flight), outputs, routes, emitted events, router labels no kept router routes, and its
    ``fired`` / ``seen`` entries; an ``and_`` join among them keeps the leaves that kept steps
    already emitted. Then each given step not downstream of another given one is made ready
    again as a new activation with the trigger of its latest activation (so
    :func:`argument_for` gives it the same input); a step that never ran is made ready only
    if it is a kickoff step, otherwise it runs when its trigger fires. Dispatch
    :func:`pending` of the result.
    """
    wanted = list(dict.fromkeys(steps))
    down = graph.downstream(wanted)
    rec = _forget(graph, record, down)
    for step in _roots(graph, wanted):
        n = record.dispatched.get(step, 0)
        if n:
            last = ids.activation_id(step, n)
            causes = [c for c in record.causes.get(last, []) if rec.is_completed(c)]
            _activate(graph, rec, step, record.triggers.get(last), causes)
        elif step in graph.kickoff:
            _activate(graph, rec, step, None)
    rec.trim()
    return rec
