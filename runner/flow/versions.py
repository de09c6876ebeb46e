"""Which code version a run's checkpoints were written by.

Every checkpoint records the version of the code that wrote it (:attr:`Checkpoint.version
<runner.store.models.Checkpoint.version>`): the deployment's ``RUNNER_APP_VERSION`` when set,
else a hash of the flow's definition (its name, its graph's fingerprint: the methods' names,
roles and conditions) and its state model's schema (:func:`code_hash`). Workers announce the
version they run (:mod:`runner.distributed.versioned`); ``runner status``, ``runner runs
--version``, the console and its API show a run's.

Pure but for reading the settings: the transitions and the lifecycle stamp what they write
with :func:`of`.
"""

from __future__ import annotations

import hashlib

from runner.flow.graph import FlowGraph
from runner.settings import RunnerSettings, get_settings


def code_hash(graph: FlowGraph) -> str:
    """12 hex digits of a hash of ``graph``'s flow name, wiring and state schema: what
    changes when a method is added, removed or rewired, or the state model changes."""
    text = f"{graph.name}\n{graph.fingerprint}\n{graph.schema}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def of(graph: FlowGraph, settings: RunnerSettings | None = None) -> str:
    """The code version checkpoints of ``graph``'s flow written here record:
    ``RUNNER_APP_VERSION``, else :func:`code_hash`."""
    chosen = (settings or get_settings()).app_version
    return chosen or code_hash(graph)
