"""``Agent``: a role, a goal and a backstory around any LLM client.

The runner prescribes no LLM library and makes no network call itself: ``llm`` is whatever
the user passes, called with one prompt string (:func:`runner.flow.llm.call_llm`: ``.call``,
``.invoke`` or a callable), each call's token usage recorded for the step running it. A
string (CrewAI's ``Agent(llm="gpt-4o-mini")``) names a client given to
:func:`runner.flow.llm.register_llm`, resolved when the agent works a task (on a worker:
in the worker, which registers it by importing the module that does).
"""

from __future__ import annotations

import asyncio
from typing import Any

from runner.checkpointing import CheckpointConfig
from runner.crew.task import Task, TaskInput, TaskOutput, current_task, fill
from runner.errors import DefinitionError
from runner.flow.llm import call_llm, is_llm

_PROMPT = """You are {role}. {backstory}
Your personal goal is: {goal}

Current Task: {description}

This is the expected criteria for your final answer: {expected_output}
You MUST return the actual complete content as the final answer, not a summary."""

_CONTEXT = """

This is the context you're working with:
{context}"""


class Agent:
    """Who does a task that has no ``fn`` (CrewAI's ``Agent``)."""

    def __init__(
        self,
        role: str,
        goal: str = "",
        backstory: str = "",
        llm: Any = None,
        checkpoint: CheckpointConfig | bool | None = None,
    ) -> None:
        if llm is not None and not is_llm(llm):
            raise DefinitionError(
                f"agent {role!r}: llm must be a client (callable, .call() or .invoke()) or a "
                f"name given to runner.register_llm; got {llm!r}",
                agent=role,
            )
        self.role = role
        """The agent's role, e.g. ``"Senior researcher"``."""
        self.goal = goal
        """What the agent tries to achieve."""
        self.backstory = backstory
        """Who the agent is; part of every prompt."""
        self.llm = llm
        """Any LLM client (``.call(prompt)``, ``.invoke(prompt)`` or ``llm(prompt)``), or the
        name it is registered under."""
        self.checkpoint = checkpoint
        """``None`` inherits from the crew; ``True`` defaults; ``False`` opts its tasks out."""

    def __repr__(self) -> str:
        return f"Agent(role={self.role!r})"

    def kickoff(self, messages: str | list[dict[str, Any]]) -> TaskOutput:
        """This agent on its own (CrewAI's ``Agent.kickoff``): ``messages`` (text, or chat
        messages whose contents are joined) as one task's description, answered by one call
        of its ``llm`` (no crew, no run); returns the :class:`TaskOutput` (``raw``)."""
        if isinstance(messages, list):
            messages = "\n".join(str(m.get("content", "")) for m in messages)
        text = str(messages)
        task = Task(description=text or "-", expected_output="A response.", agent=self)
        work = TaskInput(task, text, task.expected_output, {}, [])
        token = current_task.set(work)
        try:
            answer = self.execute_task(work)
        finally:
            current_task.reset(token)
        return task.make_output(answer, self.role, text, task.expected_output)

    async def kickoff_async(self, messages: str | list[dict[str, Any]]) -> Any:
        """:meth:`kickoff` without blocking the event loop (CrewAI's; what a definition's
        ``agent`` action awaits, so a test that mocks it runs no LLM)."""
        return await asyncio.to_thread(self.kickoff, messages)

    def prompt(self, task_input: TaskInput) -> str:
        """The prompt sent to ``llm`` for ``task_input`` (CrewAI's wording); ``{placeholders}``
        in the role, goal and backstory are filled from the kickoff inputs too."""
        inputs = task_input.inputs
        text = _PROMPT.format(
            role=fill(self.role, inputs),
            backstory=fill(self.backstory, inputs),
            goal=fill(self.goal, inputs),
            description=task_input.description,
            expected_output=task_input.expected_output,
        )
        if task_input.context:
            text += _CONTEXT.format(context=task_input.context_text)
        return text

    def execute_task(self, task_input: TaskInput) -> Any:
        """Call ``llm`` with this task's prompt; return its answer (text, dict or model). A
        client that streams (LangChain's ``.stream``, a callable taking ``stream=``) streams
        its tokens to the step's stream meanwhile (:func:`runner.flow.llm.call_llm`)."""
        if self.llm is None:
            raise DefinitionError(
                f"agent {self.role!r} has no llm: pass Agent(llm=...) or give the task a fn",
                agent=self.role,
            )
        return call_llm(self.llm, self.prompt(task_input), stream=True)
