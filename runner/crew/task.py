"""``Task``: one unit of a crew's work, and what it produced (``TaskOutput``).

A task's work is done by its ``fn`` (any callable taking a :class:`TaskInput`) or, without
one, by its agent's LLM. Either may return a string, a pydantic model or a dict; the result
becomes a :class:`TaskOutput`, stored in the run's state as JSON.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, SerializeAsAny, ValidationError

from runner.checkpointing import CheckpointConfig
from runner.errors import DefinitionError, InvalidInputs, RunnerError

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SLUG_WORDS = 6


class Worker(Protocol):
    """What a task needs of the agent doing it (an :class:`~runner.crew.agent.Agent`); a
    protocol, so tasks do not import agents, which import tasks."""

    @property
    def role(self) -> str:
        """Shown in the task's output."""
        ...

    @property
    def llm(self) -> Any:
        """The client that does the work; a task without ``fn`` needs one."""
        ...

    @property
    def checkpoint(self) -> CheckpointConfig | bool | None:
        """The agent's say in its tasks' checkpoints."""
        ...

    def execute_task(self, task_input: TaskInput, /) -> Any:
        """Do a task."""
        ...


class TaskOutputError(RunnerError):
    """A task's result cannot be turned into the output it declares."""


class Result(BaseModel):
    """A result as text, as a model and as a dict (shared by task and crew outputs)."""

    raw: str = ""
    """The result as text (a model or dict as JSON)."""
    pydantic: SerializeAsAny[BaseModel] | None = None
    """The result as the task's ``output_pydantic`` model, when it has one."""
    json_dict: dict[str, Any] | None = None
    """The result as a dict, when it was structured (a dict or a model)."""

    def __str__(self) -> str:
        return self.raw

    def to_dict(self) -> dict[str, Any]:
        """The structured result: ``json_dict``, else the model's fields, else ``{}``."""
        if self.json_dict is not None:
            return dict(self.json_dict)
        return self.pydantic.model_dump(mode="json") if self.pydantic is not None else {}


class TaskOutput(Result):
    """What one task produced (CrewAI's ``TaskOutput``)."""

    name: str
    """The task's name (also its flow method and Celery task name)."""
    description: str = ""
    """The task's description, placeholders filled in."""
    expected_output: str = ""
    """The task's expected output, placeholders filled in."""
    agent: str = ""
    """Role of the agent that did the task; empty for a ``fn`` task without one."""

    def dump(self) -> dict[str, Any]:
        """JSON form kept in the run's state (``outputs[name]``)."""
        return self.model_dump(mode="json")

    @classmethod
    def load(cls, data: Any, task: Task | None = None) -> TaskOutput:
        """Rebuild from the JSON form; ``task`` fills missing fields and rebuilds ``pydantic``.

        ``data`` may be partial (an edited fork: ``{"raw": "..."}``) or a plain string.
        """
        if isinstance(data, TaskOutput):
            return data
        if isinstance(data, str):
            data = {"raw": data}
        if not isinstance(data, Mapping):
            raise TaskOutputError(f"a task output must be a dict or a string, not {data!r}")
        fields = dict(data)
        model = fields.pop("pydantic", None)
        if task is not None:
            fields.setdefault("name", task.name)
            fields.setdefault("description", task.description)
            fields.setdefault("expected_output", task.expected_output)
            fields.setdefault("agent", task.agent.role if task.agent is not None else "")
        out = cls.model_validate(fields)
        if model is not None:
            if task is not None and task.output_pydantic is not None:
                out.pydantic = task.output_pydantic.model_validate(model)
            elif out.json_dict is None:
                out.json_dict = dict(model)  # the model class is unknown here: keep its fields
        return out


class CrewOutput(Result):
    """What a crew produced (CrewAI's ``CrewOutput``): the last task's result (``raw``,
    ``pydantic``, ``json_dict``) and every task's."""

    tasks_output: list[TaskOutput] = []
    """Every finished task's output, in task order."""


@dataclass(frozen=True)
class TaskInput:
    """What a task's ``fn`` (or its agent) gets to work with."""

    task: Task
    """The task being run."""
    description: str
    """The description with ``{placeholders}`` filled from the kickoff inputs."""
    expected_output: str
    """The expected output with ``{placeholders}`` filled from the kickoff inputs."""
    inputs: dict[str, Any]
    """The crew's kickoff inputs."""
    context: list[TaskOutput]
    """Outputs of the tasks this one sees: every earlier task, or its ``context`` tasks."""
    run_id: str = ""
    """The crew run's id (stable across resumes: use it for idempotency keys)."""

    @property
    def name(self) -> str:
        """The task's name."""
        return self.task.name

    @property
    def agent(self) -> Worker | None:
        """The task's agent, if any."""
        return self.task.agent

    @property
    def context_text(self) -> str:
        """The context outputs' raw texts, separated by ``----------`` lines (CrewAI's form)."""
        return "\n\n----------\n\n".join(out.raw for out in self.context)

    def output(self, name: str) -> TaskOutput:
        """The context output of task ``name``."""
        for out in self.context:
            if out.name == name:
                return out
        raise KeyError(f"task {self.task.name!r} has no context output {name!r}")


current_task: contextvars.ContextVar[TaskInput] = contextvars.ContextVar("runner_current_task")
"""The task running in this thread, for LLM clients and tools that want its run id or name."""


class Task:
    """One task of a crew (CrewAI's ``Task``).

    Equality is identity, so tasks can be listed in each other's ``context``.
    """

    def __init__(
        self,
        description: str,
        expected_output: str = "",
        agent: Worker | None = None,
        context: list[Task] | None = None,
        name: str | None = None,
        output_pydantic: type[BaseModel] | None = None,
        fn: Callable[[TaskInput], Any] | None = None,
        checkpoint: CheckpointConfig | bool | None = None,
        *,
        retries: int | None = None,
        retry_backoff: float | None = None,
        time_limit: float | None = None,
        queue: str | None = None,
        concurrency: int | None = None,
        rate_limit: str | None = None,
        priority: int | None = None,
    ) -> None:
        if not isinstance(description, str) or not description.strip():
            raise DefinitionError("a task needs a non-empty description")
        self.description = description
        """What to do; ``{name}`` placeholders are filled from the kickoff inputs."""
        self.expected_output = expected_output
        """What a good result looks like; placeholders are filled too."""
        self.agent = agent
        """Who does it when there is no ``fn`` (its ``llm`` is called with a prompt)."""
        self.context = None if context is None else list(context)
        """Earlier tasks whose outputs this one sees; ``None``: every earlier task."""
        self.name: str = name if name is not None else slugify(description)
        """Unique within the crew; a slug of the description's first words when not given."""
        self.output_pydantic = output_pydantic
        """Model the result is validated into (a string result is parsed as JSON)."""
        self.fn = fn
        """Does the work instead of the agent: ``fn(task_input) -> str | BaseModel | dict``."""
        self.checkpoint = checkpoint
        """``None`` inherits (agent, then crew); ``True`` is the default; ``False`` opts out."""
        self.retries = retries
        """Retries after a failure before the run fails (``None``: the settings default)."""
        self.retry_backoff = retry_backoff
        """First retry delay in seconds (``None``: the settings default)."""
        self.time_limit = time_limit
        """Soft time limit of one attempt in seconds (``None``: the settings default)."""
        self.queue = queue
        """The deployment's queue this task runs on, by name (``None``: the default queue)."""
        self.concurrency = concurrency
        """Attempts of this task running at once across the deployment (``None``: no limit)."""
        self.rate_limit = rate_limit
        """How often this task may start across the deployment, e.g. ``"60/m"``."""
        self.priority = priority
        """Its step's priority, 0 (lowest) to 9 (highest), in crew runs submitted without one
        (``None``: the default); a child run takes its parent run's, if that has one."""

    def __repr__(self) -> str:
        return f"Task(name={self.name!r})"

    def placeholders(self) -> set[str]:
        """The ``{name}`` placeholders of the description and expected output."""
        text = f"{self.description}\n{self.expected_output}"
        return set(_PLACEHOLDER.findall(text))

    def interpolate(self, inputs: Mapping[str, Any]) -> tuple[str, str]:
        """Description and expected output with placeholders filled from ``inputs``."""
        missing = sorted(self.placeholders() - set(inputs))
        if missing:
            raise InvalidInputs(
                f"task {self.name!r} needs input(s) {', '.join(missing)}",
                task=self.name,
                missing=missing,
            )
        return fill(self.description, inputs), fill(self.expected_output, inputs)

    def make_output(
        self, result: Any, agent_role: str, description: str, expected: str
    ) -> TaskOutput:
        """Turn what ``fn`` or the agent returned into this task's :class:`TaskOutput`."""
        common = {
            "name": self.name,
            "description": description,
            "expected_output": expected,
            "agent": agent_role,
        }
        model = self.output_pydantic
        if isinstance(result, BaseModel):
            if model is not None and not isinstance(result, model):
                result = self._validate(model, result.model_dump(mode="json"))
            data = result.model_dump(mode="json")
            return TaskOutput(**common, raw=json.dumps(data), pydantic=result, json_dict=data)
        if isinstance(result, Mapping):
            try:
                data = json.loads(json.dumps(dict(result)))  # JSON now, or an error here
            except (TypeError, ValueError) as exc:
                raise TaskOutputError(
                    f"task {self.name!r} returned a dict that is not JSON: {exc}", task=self.name
                ) from None
            parsed = self._validate(model, data) if model is not None else None
            return TaskOutput(**common, raw=json.dumps(data), pydantic=parsed, json_dict=data)
        if isinstance(result, str):
            parsed = self._validate(model, _json_in(result, self.name)) if model else None
            data = parsed.model_dump(mode="json") if parsed is not None else None
            return TaskOutput(**common, raw=result, pydantic=parsed, json_dict=data)
        raise TaskOutputError(
            f"task {self.name!r} returned {type(result).__name__}; "
            "return a str, a pydantic model or a dict",
            task=self.name,
        )

    def _validate(self, model: type[BaseModel], data: Any) -> BaseModel:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise TaskOutputError(
                f"task {self.name!r}: result is not a valid {model.__name__}: "
                f"{exc.errors()[0]['msg']}",
                task=self.name,
            ) from None


def fill(text: str, inputs: Mapping[str, Any]) -> str:
    """``text`` with ``{name}`` placeholders replaced; other braces are left alone."""

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in inputs:
            return match.group(0)
        item = inputs[key]
        return item if isinstance(item, str) else json.dumps(item)

    return _PLACEHOLDER.sub(value, text)


def slugify(text: str) -> str:
    """A method-name slug of the first words of ``text``: ``"Research {topic}!"`` ->
    ``"research_topic"``."""
    words = re.findall(r"[a-z0-9]+", text.lower())[:_SLUG_WORDS]
    slug = "_".join(words) or "task"
    return f"task_{slug}" if slug[0].isdigit() else slug


def _json_in(text: str, task: str) -> Any:
    """The JSON value in an LLM's answer: the whole text, else its outermost ``{...}``."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            return json.loads(text[start : end + 1])
        except ValueError:
            pass
    raise TaskOutputError(f"task {task!r}: the answer holds no JSON object", task=task)
