"""A crew as a flow: its tasks become the methods of a generated ``Flow`` subclass.

The sequential process is a linear chain (task *i* listens to task *i-1*), so every task is
one Celery task ``<crew name>.<task name>`` and one checkpoint, and resume, fork and
``--rerun`` work on crews exactly as on flows. The state is JSON: the kickoff ``inputs``
and each finished task's :class:`TaskOutput` under ``outputs[task name]``.

In process, which checkpoints reach the store follows CrewAI's crew rules: the crew's
default events (``task_completed``, ``task_failed``, ``crew_kickoff_started``), and no
checkpoint about a task whose effective ``checkpoint`` is off (see
:meth:`Crew.effective_checkpoint`). On workers every task commits a checkpoint: that
commit is how the run advances.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, Field, model_validator

from runner.checkpointing import CheckpointConfig, Sink, StoreSink, persistable, resolve_config
from runner.crew.task import Task, TaskInput, TaskOutput, TaskOutputError, current_task
from runner.flow import events as ev
from runner.flow.attempt import run_awaitable
from runner.flow.decorators import listen, start
from runner.flow.flow import Flow
from runner.flow.state import FlowState
from runner.store.base import CheckpointStore
from runner.store.models import Checkpoint

CREW_EVENT_NAMES = {
    ev.FLOW_STARTED: "crew_kickoff_started",
    ev.METHOD_FINISHED: "task_completed",
    ev.METHOD_FAILED: "task_failed",
    ev.FLOW_FINISHED: "crew_kickoff_completed",
    ev.FLOW_FAILED: "crew_kickoff_failed",
}
"""Checkpoint events as CrewAI names them for crews (``on_events`` accepts either name)."""


class Crewlike(Protocol):
    """What the generated flow needs of its crew (a :class:`~runner.crew.crew.Crew`); a
    protocol, so this module does not import the crew module, which imports it."""

    @property
    def name(self) -> str:
        """Prefix of the Celery task names."""
        ...

    @property
    def module(self) -> str:
        """Where the crew was made; the flow class is placed there."""
        ...

    @property
    def tasks(self) -> list[Task]:
        """The tasks, in order."""
        ...

    @property
    def checkpoint(self) -> CheckpointConfig | bool | None:
        """The crew's checkpoint setting."""
        ...

    def flow_path(self) -> str:
        """``module:variable`` of the crew."""
        ...

    def output(self, state: Mapping[str, Any]) -> BaseModel:
        """The crew's output from a run's state."""
        ...

    def effective_checkpoint(
        self, task: Task, default: CheckpointConfig | None = None
    ) -> CheckpointConfig | None:
        """The checkpoint config in force for ``task``."""
        ...


class CrewState(FlowState):
    """State of a crew run: kickoff inputs and the outputs of finished tasks (all JSON).

    Top-level keys that are not fields are kickoff inputs: ``{"topic": "x"}`` validates as
    ``{"inputs": {"topic": "x"}}``, so ``submit(crew.as_flow(), {"topic": "x"})`` and
    ``runner submit pkg.mod:crew --input topic=x`` work. ``id``, ``inputs`` and
    ``outputs`` are therefore not usable as input names.
    """

    inputs: dict[str, Any] = Field(default_factory=dict)
    """The crew's kickoff inputs (``{placeholders}`` in tasks are filled from them)."""
    outputs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Task name -> that task's :class:`TaskOutput`, as a dict."""

    @model_validator(mode="before")
    @classmethod
    def _collect_inputs(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        extra = {k: v for k, v in data.items() if k not in cls.model_fields}
        if not extra:
            return data
        known = {k: v for k, v in data.items() if k in cls.model_fields}
        return {**known, "inputs": {**dict(known.get("inputs") or {}), **extra}}


class CrewSink(StoreSink):
    """Crew checkpoints: CrewAI's crew events, and nothing about opted-out tasks."""

    def __init__(
        self,
        store: CheckpointStore,
        events: frozenset[str],
        task_events: Mapping[str, frozenset[str] | None],
        max_checkpoints: int | None = None,
    ) -> None:
        super().__init__(store, events, max_checkpoints)
        self.task_events = dict(task_events)

    def write(self, ckpt: Checkpoint) -> Checkpoint:
        """Commit ``ckpt`` if its event is selected for the run or for its task."""
        assert self.store is not None
        # A run's failure names the task that failed it, but is the run's event, not the task's.
        task = ckpt.step if ckpt.event != ev.FLOW_FAILED else None
        events = self.task_events.get(task, self.events) if task else self.events
        if events is None:
            return ckpt
        crew_name = CREW_EVENT_NAMES.get(ckpt.event)
        if "*" in events or ckpt.event in events or crew_name in events:
            return self.commit_to(self.store, persistable(ckpt), self.max_checkpoints)
        return ckpt


class CrewFlow(Flow[CrewState]):
    """Base of the flow classes generated from crews (see :func:`compile_crew`)."""

    crew: ClassVar[Crewlike]
    """The crew this class runs."""

    @classmethod
    def flow_name(cls) -> str:
        """The crew's name: Celery tasks are ``<crew name>.<task name>``."""
        return cls.crew.name

    @classmethod
    def flow_path(cls) -> str:
        """``module:variable`` of the crew, which :func:`load_flow` turns into this class."""
        return cls.crew.flow_path()

    @classmethod
    def result_of(cls, state: Mapping[str, Any]) -> Any:
        """A finished run's result from its state: the :class:`CrewOutput`, as JSON."""
        return cls.crew.output(state).model_dump(mode="json")

    @classmethod
    def checkpoint_sink(cls, checkpoint: CheckpointConfig | bool | None, persistence: Any) -> Sink:
        """Crew checkpoints (:class:`CrewSink`); a crew has no ``@persist``."""
        config = resolve_config(checkpoint)
        if config is None:
            return Sink()
        crew = cls.crew
        # A config given to this run (a restore, a parent flow's store) covers the tasks
        # that have no say of their own; one an agent or task turned on covers only those.
        default = config if checkpoint is not cls.checkpoint else None
        task_events = {}
        for task in crew.tasks:
            own = crew.effective_checkpoint(task, default=default)
            task_events[task.name] = None if own is None else own.events("crew")
        return CrewSink(config.store(), config.events("crew"), task_events, config.max_checkpoints)

    def _perform(self, index: int) -> dict[str, Any]:
        """Run task ``index`` on the current state; record and return its output."""
        crew = type(self).crew
        task = crew.tasks[index]
        state = self.state
        description, expected = task.interpolate(state.inputs)
        seen = task.context if task.context is not None else crew.tasks[:index]
        context = []
        for earlier in seen:
            if earlier.name not in state.outputs:
                raise TaskOutputError(
                    f"task {task.name!r} needs the output of {earlier.name!r}, "
                    "which the state's outputs do not hold",
                    task=task.name,
                )
            context.append(TaskOutput.load(state.outputs[earlier.name], earlier))
        task_input = TaskInput(task, description, expected, dict(state.inputs), context, state.id)
        token = current_task.set(task_input)
        try:
            if task.fn is not None:
                result = task.fn(task_input)
            else:
                assert task.agent is not None  # Crew checks every task can be done
                result = task.agent.execute_task(task_input)
            if inspect.isawaitable(result):
                result = run_awaitable(result)  # an async fn or LLM client
        finally:
            current_task.reset(token)
        role = task.agent.role if task.agent is not None else ""
        output = task.make_output(result, role, description, expected).dump()
        state.outputs = {**state.outputs, task.name: output}
        return output


def compile_crew(crew: Crewlike) -> type[CrewFlow]:
    """A new flow class running ``crew``'s tasks in order, one method per task."""
    config = _run_config(crew)
    namespace: dict[str, Any] = {
        "crew": crew,
        "name": crew.name,
        "checkpoint": config,
        "__module__": crew.module,
        "__qualname__": crew.name,
        "__doc__": f"The tasks of crew {crew.name!r}, one method each, in order.",
    }
    previous: Callable[..., Any] | None = None
    for index, task in enumerate(crew.tasks):
        method = _task_method(index, task.name, crew.name)
        options: dict[str, Any] = {
            "retries": task.retries,
            "retry_backoff": task.retry_backoff,
            "time_limit": task.time_limit,
            "queue": task.queue,
            "concurrency": task.concurrency,
            "rate_limit": task.rate_limit,
            "priority": task.priority,
        }
        decorate = start(**options) if previous is None else listen(previous, **options)
        namespace[task.name] = previous = decorate(method)
    return type(crew.name, (CrewFlow,), namespace)


def _task_method(index: int, name: str, owner: str) -> Callable[[CrewFlow], dict[str, Any]]:
    def run_task(self: CrewFlow) -> dict[str, Any]:
        return self._perform(index)

    run_task.__name__ = name
    run_task.__qualname__ = f"{owner}.{name}"
    run_task.__doc__ = f"Task {index + 1} of crew {owner!r}."
    return run_task


def _run_config(crew: Crewlike) -> CheckpointConfig | None:
    """Where an in-process run writes: the crew's config, else the first task's that is on."""
    own = resolve_config(crew.checkpoint)
    if own is not None:
        return own
    for task in crew.tasks:
        config = crew.effective_checkpoint(task)
        if config is not None:
            return config
    return None
