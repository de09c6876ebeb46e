"""The user's copy of a persisted method's state, on workers (``@persist`` and the factory).

On workers a run's checkpoints stay in the workers' Redis whatever persistence the flow
names: leases and dispatch markers live beside them and each commit is one atomic write
there. What ``@persist`` names, or for an ``@persist`` given none the persistence of the
factory an allow-listed module set at import (``set_flow_persistence_factory``), gets the
user's copy, as CrewAI's persistence holds the state: after a persisted method's step
has committed in Redis, the worker saves its state there (a persistence on a checkpoint
store, like ``SQLiteFlowPersistence``, gets the whole checkpoint). With neither, or with
a persistence on the workers' own Redis (the built-in default), nothing more is written.

The copy is made after the commit, at least once: a worker dying in between leaves the
copy a state behind until the run's next persisted step, and a redelivered step may save
the same state again. A persistence that fails is logged (WARNING) and does not fail the
step, which is committed and whose successors are sent; Redis holds the run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from runner.checkpointing import Sink, state_copy
from runner.store.base import CheckpointStore
from runner.store.models import METHOD_FINISHED, Checkpoint
from runner.store.persistence_factory import flow_persistence_factory

from .services import services

log = logging.getLogger("runner.worker")


class _Resolved:
    """(store, flow class) -> (the factory it was resolved under, where copies go): once per
    worker process (a forked child resolves its own), so a factory making a new persistence
    per call is not called per step."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.found: dict[tuple[int, type], tuple[Any, Sink | None]] = {}


def keep_copy(flows: Mapping[str, Any], own: CheckpointStore, ckpt: Checkpoint) -> None:
    """Save the state of committed ``ckpt`` where its flow persists, beyond ``own``."""
    if ckpt.event != METHOD_FINISHED or ckpt.step is None:
        return
    flow_cls = flows.get(str(ckpt.meta.name))
    if flow_cls is None:
        return  # not a flow this process runs (a producer's commit)
    try:
        sink = _sink_of(flow_cls, own)
        if sink is not None:
            sink.write(ckpt)
    except Exception as exc:  # the step is committed: a copy that fails must not undo it
        log.warning(
            "run %s step %s: its state was not copied to the flow's persistence: %s: %s",
            ckpt.run_id,
            ckpt.step,
            type(exc).__name__,
            exc,
        )


def _sink_of(flow_cls: type, own: CheckpointStore) -> Sink | None:
    factory = flow_persistence_factory()
    key = (id(own), flow_cls)
    resolved = services().one(_Resolved, _Resolved)
    with resolved.lock:
        found = resolved.found.get(key)
        if found is None or found[0] is not factory:
            found = (factory, state_copy(flow_cls, own))
            resolved.found[key] = found
        return found[1]
