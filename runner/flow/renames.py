"""Moving a run on purpose onto code whose methods were renamed (``runner fork RUN --map
old=new``): the run's record and its per-activation notes, with each old method name read as
its new one. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner import ids
from runner.errors import InvalidInputs
from runner.flow.graph import FlowGraph
from runner.flow.transition import ACTIVATION_NOTES
from runner.store.models import ExecutionRecord, RunMeta


def check_map(graph: FlowGraph, renames: Mapping[str, str]) -> None:
    """:class:`InvalidInputs` unless each ``old -> new`` names a method ``graph`` lacks and
    one it has."""
    for old, new in renames.items():
        if new not in graph.methods:
            raise InvalidInputs(
                f"--map {old}={new}: {graph.name} has no method {new} "
                f"(methods: {', '.join(graph.methods)})",
                step=new,
            )
        if old in graph.methods:
            raise InvalidInputs(
                f"--map {old}={new}: {graph.name} still has a method {old}", step=old
            )


def _act(act: str, renames: Mapping[str, str]) -> str:
    split = ids.split_activation(act)
    if split is None:
        return renames.get(act, act)
    method, n = split
    return ids.activation_id(renames.get(method, method), n)


def renamed_record(record: ExecutionRecord, renames: Mapping[str, str]) -> ExecutionRecord:
    """``record`` with every method (and its activations) ``renames`` names renamed."""
    if not renames:
        return record

    def name(value: str) -> str:
        return renames.get(value, value)

    def keys(mapping: Mapping[str, Any], rename: Any = name) -> dict[str, Any]:
        return {rename(k): v for k, v in mapping.items()}

    return record.model_copy(
        update={
            "emitted": keys(record.emitted),
            "dispatched": keys(record.dispatched),
            "forgotten": keys(record.forgotten),
            "done": keys(record.done),
            "in_flight": [_act(a, renames) for a in record.in_flight],
            "outputs": keys(record.outputs),
            "routes": keys(record.routes),
            "triggers": {
                _act(a, renames): (None if t is None else name(t))
                for a, t in record.triggers.items()
            },
            "causes": {
                _act(a, renames): [_act(c, renames) for c in cs] for a, cs in record.causes.items()
            },
            "lineage": {_act(a, renames): keys(line) for a, line in record.lineage.items()},
            "seen": {name(k): [name(v) for v in vs] for k, vs in record.seen.items()},
            "fired": keys(record.fired),
        }
    )


def renamed_meta(meta: RunMeta, renames: Mapping[str, str]) -> RunMeta:
    """``meta`` with its per-activation notes keyed by the renamed activations."""
    if not renames:
        return meta
    update: dict[str, Any] = {}
    for field in ACTIVATION_NOTES:
        notes = meta.field(field)
        update[field] = {_act(a, renames): v for a, v in notes.items()}
    update["ready"] = [_act(a, renames) for a in meta.ready]
    return meta.updated(**update)
