"""Durable CrewAI-style flows and crews on Celery workers, with checkpoints in Redis.

The authoring surface mirrors CrewAI's, so moving a flow over is a change of
imports::

    from runner import Flow, FlowState, start, listen, router, or_, and_, persist
"""

from __future__ import annotations

from typing import Any

from runner.checkpointing import CheckpointConfig, persist
from runner.crew import Agent, Crew, CrewOutput, Task, TaskOutput
from runner.errors import DefinitionWarning, RunnerError
from runner.flow import local
from runner.flow.conditions import and_, or_
from runner.flow.decorators import listen, router, start
from runner.flow.events import EventListener, FlowEvent
from runner.flow.flow import EXECUTORS, Flow
from runner.flow.state import FlowState, add, append, merge_dict
from runner.store.jsondir import JsonProvider
from runner.store.models import Checkpoint, RunInfo, RunStatus
from runner.store.persistence import (
    FlowPersistence,
    RedisFlowPersistence,
    SQLiteFlowPersistence,
)
from runner.store.sqlite import SqliteProvider

_LAZY = {
    "RedisProvider": ("runner.store.redis", "RedisProvider"),
    "submit": ("runner.distributed.client", "submit"),
    "RunHandle": ("runner.distributed.client", "RunHandle"),
}


def _submit(flow_cls: type[Flow[Any]], inputs: dict[str, Any] | None) -> Any:
    from runner.distributed.client import submit

    return submit(flow_cls, inputs)


# The executors sit above the flow core; this package, which every import of a flow runs
# first, plugs them into Flow.kickoff and Flow.submit (Celery is imported on first submit).
EXECUTORS.in_process = local.kickoff
EXECUTORS.on_workers = _submit


def __getattr__(name: str) -> Any:
    """Import the Redis and Celery parts only when used."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'runner' has no attribute {name!r}")


__all__ = [
    "Agent",
    "Checkpoint",
    "CheckpointConfig",
    "Crew",
    "CrewOutput",
    "DefinitionWarning",
    "EventListener",
    "Flow",
    "FlowEvent",
    "FlowPersistence",
    "FlowState",
    "JsonProvider",
    "RedisFlowPersistence",
    "RedisProvider",
    "RunHandle",
    "RunInfo",
    "RunStatus",
    "RunnerError",
    "SQLiteFlowPersistence",
    "SqliteProvider",
    "Task",
    "TaskOutput",
    "add",
    "and_",
    "append",
    "listen",
    "merge_dict",
    "or_",
    "persist",
    "router",
    "start",
    "submit",
]
