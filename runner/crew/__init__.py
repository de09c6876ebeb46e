"""Crews: ordered tasks done by agents, run as flows of their tasks.

* :mod:`runner.crew.task` -- ``Task``, ``TaskInput``, ``TaskOutput``, ``CrewOutput``.
* :mod:`runner.crew.agent` -- ``Agent`` around any LLM client.
* :mod:`runner.crew.crew` -- ``Crew``: kickoff, submit, resume, fork.
* :mod:`runner.crew.compile` -- the generated flow class (one method per task).
* :mod:`runner.crew.tools` -- ``BaseTool``, CrewAI's tool shape (``call: tool`` actions).
"""

from __future__ import annotations

from runner.crew.agent import Agent
from runner.crew.compile import CrewFlow, CrewState
from runner.crew.crew import Crew, Process
from runner.crew.task import (
    CrewOutput,
    Task,
    TaskInput,
    TaskOutput,
    TaskOutputError,
    current_task,
)
from runner.errors import ChildRunFailed
from runner.flow.children import ChildRun

__all__ = [
    "Agent",
    "ChildRun",
    "ChildRunFailed",
    "Crew",
    "CrewFlow",
    "CrewOutput",
    "CrewState",
    "Process",
    "Task",
    "TaskInput",
    "TaskOutput",
    "TaskOutputError",
    "current_task",
]
