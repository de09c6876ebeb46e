"""Durable CrewAI-style flows and crews on Celery workers, with checkpoints in Redis.

The authoring surface mirrors CrewAI's, so moving a flow over is a change of
imports::

    from runner import Flow, FlowState, start, listen, router, or_, and_, persist
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Installs the process's one at-fork hook (runner.distributed.services), which makes a
# forked child's locks, threads and Redis pools its own; it imports no more than the ids.
from runner.distributed import services as _at_fork  # noqa: F401
from runner.flow.executors import EXECUTORS

if TYPE_CHECKING:
    from runner.checkpointing import CheckpointConfig, persist
    from runner.crew import Agent, Crew, CrewOutput, Task, TaskOutput
    from runner.crew.declared import declared_flow, submit_definition
    from runner.crew.tools import BaseTool
    from runner.distributed.client import RunHandle, submit
    from runner.distributed.deploy_check import check_deploy
    from runner.distributed.limits import set_limit
    from runner.errors import DefinitionWarning, RunnerError
    from runner.flow.conditions import and_, or_
    from runner.flow.conversation import (
        ChatState,
        ConversationalConfig,
        ConversationalInputs,
        ConversationConfig,
        ConversationMessage,
        ConversationState,
        RouterConfig,
    )
    from runner.flow.decorators import listen, router, start
    from runner.flow.definition import FlowDefinition
    from runner.flow.events import EventListener, FlowEvent
    from runner.flow.flow import Flow
    from runner.flow.following import stream_run
    from runner.flow.human_feedback import (
        HumanFeedbackConfig,
        HumanFeedbackPending,
        HumanFeedbackProvider,
        HumanFeedbackResult,
        PendingFeedbackContext,
        human_feedback,
    )
    from runner.flow.input_provider import (
        ConsoleProvider,
        FlowConfig,
        InputProvider,
        InputResponse,
        flow_config,
    )
    from runner.flow.llm import register_llm
    from runner.flow.retain import retention
    from runner.flow.state import FlowState, add, append, merge_dict
    from runner.flow.streaming import StreamFrame
    from runner.flow.usage import UsageMetrics, record_usage
    from runner.flow.versions import state_upgrade
    from runner.store.jsondir import JsonProvider
    from runner.store.models import Checkpoint, RunInfo, RunStatus
    from runner.store.persistence import (
        FlowPersistence,
        RedisFlowPersistence,
        SQLiteFlowPersistence,
    )
    from runner.store.persistence_factory import (
        default_flow_persistence,
        set_flow_persistence_factory,
    )
    from runner.store.redis import RedisProvider
    from runner.store.sqlite import SqliteProvider

# Every public name is imported on first use (PEP 562): `import runner.cli` (a cold
# `runner runs`) then loads the store alone, not the flow core, crews and Celery.
_HOMES = {
    "runner.checkpointing": ("CheckpointConfig", "persist"),
    "runner.crew": ("Agent", "Crew", "CrewOutput", "Task", "TaskOutput"),
    "runner.crew.declared": ("declared_flow", "submit_definition"),
    "runner.crew.tools": ("BaseTool",),
    "runner.distributed.client": ("RunHandle", "submit"),
    "runner.distributed.deploy_check": ("check_deploy",),
    "runner.distributed.limits": ("set_limit",),
    "runner.errors": ("DefinitionWarning", "RunnerError"),
    "runner.flow.conditions": ("and_", "or_"),
    "runner.flow.conversation": (
        "ChatState",
        "ConversationConfig",
        "ConversationMessage",
        "ConversationState",
        "ConversationalConfig",
        "ConversationalInputs",
        "RouterConfig",
    ),
    "runner.flow.decorators": ("listen", "router", "start"),
    "runner.flow.definition": ("FlowDefinition",),
    "runner.flow.events": ("EventListener", "FlowEvent"),
    "runner.flow.flow": ("Flow",),
    "runner.flow.retain": ("retention",),
    "runner.flow.human_feedback": (
        "HumanFeedbackConfig",
        "HumanFeedbackPending",
        "HumanFeedbackProvider",
        "HumanFeedbackResult",
        "PendingFeedbackContext",
        "human_feedback",
    ),
    "runner.flow.input_provider": (
        "ConsoleProvider",
        "FlowConfig",
        "InputProvider",
        "InputResponse",
        "flow_config",
    ),
    "runner.flow.following": ("stream_run",),
    "runner.flow.llm": ("register_llm",),
    "runner.flow.streaming": ("StreamFrame",),
    "runner.flow.state": ("FlowState", "add", "append", "merge_dict"),
    "runner.flow.usage": ("UsageMetrics", "record_usage"),
    "runner.flow.versions": ("state_upgrade",),
    "runner.store.jsondir": ("JsonProvider",),
    "runner.store.models": ("Checkpoint", "RunInfo", "RunStatus"),
    "runner.store.persistence": (
        "FlowPersistence",
        "RedisFlowPersistence",
        "SQLiteFlowPersistence",
    ),
    "runner.store.persistence_factory": (
        "default_flow_persistence",
        "set_flow_persistence_factory",
    ),
    "runner.store.redis": ("RedisProvider",),
    "runner.store.sqlite": ("SqliteProvider",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def _kickoff(*args: Any) -> Any:
    from runner.flow.local import kickoff

    return kickoff(*args)


def _answer(*args: Any) -> Any:
    from runner.flow.local import answer

    return answer(*args)


def _declare(*args: Any, **kwargs: Any) -> Any:
    from runner.crew.declared import declared_flow

    return declared_flow(*args, **kwargs)


def _submit(flow_cls: Any, inputs: dict[str, Any] | None, **options: Any) -> Any:
    from runner.distributed.client import submit

    return submit(flow_cls, inputs, **options)


# The executors sit above the flow core; this package, which every import of a flow runs
# first, plugs them into Flow.kickoff and Flow.submit (each imported on its first call).
EXECUTORS.in_process = _kickoff
EXECUTORS.on_workers = _submit
EXECUTORS.answer_in_process = _answer
EXECUTORS.declare = _declare


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first used."""
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'runner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "Agent",
    "BaseTool",
    "ChatState",
    "Checkpoint",
    "CheckpointConfig",
    "ConsoleProvider",
    "ConversationConfig",
    "ConversationMessage",
    "ConversationState",
    "ConversationalConfig",
    "ConversationalInputs",
    "Crew",
    "CrewOutput",
    "DefinitionWarning",
    "EventListener",
    "Flow",
    "FlowConfig",
    "FlowDefinition",
    "FlowEvent",
    "FlowPersistence",
    "FlowState",
    "HumanFeedbackConfig",
    "HumanFeedbackPending",
    "HumanFeedbackProvider",
    "HumanFeedbackResult",
    "InputProvider",
    "InputResponse",
    "JsonProvider",
    "PendingFeedbackContext",
    "RedisFlowPersistence",
    "RedisProvider",
    "RouterConfig",
    "RunHandle",
    "RunInfo",
    "RunStatus",
    "RunnerError",
    "SQLiteFlowPersistence",
    "SqliteProvider",
    "StreamFrame",
    "Task",
    "TaskOutput",
    "UsageMetrics",
    "add",
    "and_",
    "append",
    "check_deploy",
    "declared_flow",
    "default_flow_persistence",
    "flow_config",
    "human_feedback",
    "listen",
    "merge_dict",
    "or_",
    "persist",
    "record_usage",
    "register_llm",
    "retention",
    "router",
    "set_flow_persistence_factory",
    "set_limit",
    "start",
    "state_upgrade",
    "stream_run",
    "submit",
    "submit_definition",
]
