"""One attempt of a step: running its flow method once, the part both executors share
(what happens to the attempt on a worker is :mod:`runner.distributed.step`).

A step runs against its own copy of the state (made from the JSON snapshot it
started from), so parallel branches never see each other's half-done writes; the
result says what the state became, what the method returned, and for a router
which label it chose.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic_core import to_jsonable_python

from runner.errors import AwaitInput, NotSerializable, PauseRun, SleepRun
from runner.flow import usage
from runner.flow.graph import FlowGraph
from runner.flow.orchestrator import Activation
from runner.store.models import UsageMetrics

current_state: contextvars.ContextVar[Any] = contextvars.ContextVar("runner_step_state")
"""The state object of the step running in this thread or task."""

current_activation: contextvars.ContextVar[tuple[Any, Activation] | None] = contextvars.ContextVar(
    "runner_step_activation", default=None
)
"""The flow object and activation of the step running in this thread or task (child runs
derive their id from it)."""


current_outputs: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "runner_step_outputs", default=None
)
"""Inside a running step: the outputs of the run's steps committed so far, by method (what
a declared flow's ``${outputs.step}`` reads)."""


@dataclass
class Sleeps:
    """The durable sleeps of the step running on a worker: the wake-up times recorded by its
    earlier attempts, and how many sleep calls this attempt made so far."""

    recorded: list[float]
    calls: int = 0


current_sleeps: contextvars.ContextVar[Sleeps | None] = contextvars.ContextVar(
    "runner_step_sleeps", default=None
)
"""Set while a step runs on a worker: ``Flow.sleep`` is then durable (see :class:`Sleeps`)."""


@dataclass
class Answers:
    """The answers people gave to the step running now (``RunMeta.answers`` of its
    activation, in order), and how many of them this attempt consumed so far: its N-th
    ``ask`` takes the N-th answer; ``@human_feedback`` takes the one to its review."""

    recorded: list[Any]
    """:class:`runner.store.models.Answer` records."""
    calls: int = 0
    review: Any = None
    """The :class:`runner.store.models.Awaiting` of the review the step's output went to
    before (``RunMeta.reviews``), if it paused for one."""
    reviewed: Any = None
    """The ``HumanFeedbackResult`` this attempt's review came to (set by ``@human_feedback``)."""


current_answers: contextvars.ContextVar[Answers | None] = contextvars.ContextVar(
    "runner_step_answers", default=None
)
"""Set while a step runs (both executors): what it was answered (see :class:`Answers`)."""


@dataclass(frozen=True)
class Routed:
    """What a router's method returns when its output is not its label (a reviewed method
    with ``emit``: its output stays what it returned, the answer's label routes)."""

    output: Any
    label: str | None


@dataclass
class StepResult:
    """What one attempt of a step produced."""

    activation: Activation
    base_state: dict[str, Any]
    new_state: dict[str, Any] | None = None
    output: Any = None
    label: str | None = None
    error: BaseException | None = None
    paused: str | None = None
    """The reason, when the step paused the run."""
    awaiting: Any = None
    """The :class:`runner.store.models.Awaiting` the step paused on (a person's answer)."""
    sleep: SleepRun | None = None
    """The durable sleep the step stopped at (on workers)."""
    duration: float = 0.0
    attempts: int = 1
    review: Any = None
    """The JSON of the ``HumanFeedbackResult`` a reviewed step came to."""
    usage: UsageMetrics | None = None
    """What the attempt's LLM calls spent (:mod:`runner.flow.usage`), if it recorded any."""


def run_step(
    flow: Any,
    graph: FlowGraph,
    activation: Activation,
    base_state: dict[str, Any],
    arg: Any,
    answers: list[Any] | None = None,
    review: Any = None,
    outputs: dict[str, Any] | None = None,
) -> StepResult:
    """Run ``activation``'s method once on a fresh copy of ``base_state``; ``answers`` are
    the ones people gave it so far (``RunMeta.answers``), ``review`` the review its output
    went to (``RunMeta.reviews``), ``outputs`` the run's committed outputs by method."""
    spec = graph.methods[activation.method]
    began = time.perf_counter()
    result = StepResult(activation, base_state)
    token = None
    running = current_activation.set((flow, activation))
    given = Answers(list(answers or ()), review=review)
    answering = current_answers.set(given)
    seen = current_outputs.set(outputs)
    metering = usage.start_meter()
    try:
        # A private copy (no list or dict shared with ``base_state``): changes a parallel
        # branch makes in place cannot leak into this step, nor a failed step's into the run.
        state_obj = flow._state_from_json(base_state)
        token = current_state.set(state_obj)
        method = getattr(flow, activation.method)
        value = (
            method(flow._step_argument(activation, json_copy(arg))) if spec.takes_arg else method()
        )
        if inspect.isawaitable(value):
            value = run_awaitable(value)
        if isinstance(value, Routed):  # a router whose output is not its label
            result.label, value = value.label, value.output
        elif spec.is_router:
            result.label = route_label(value)
        result.output = to_json(value, activation.method)
        if given.reviewed is not None:
            result.review = to_json(given.reviewed, activation.method)
        result.new_state = flow._dump_state(state_obj)
    except AwaitInput as waiting:
        result.paused = waiting.message
        result.awaiting = waiting.awaiting
        result.new_state = flow._dump_state(state_obj)  # the state so far, kept while it waits
    except PauseRun as pause:
        result.paused = pause.message
    except SleepRun as sleep:
        result.sleep = sleep
        result.new_state = flow._dump_state(state_obj)  # the state so far, committed with it
    except Exception as exc:
        result.error = exc
    finally:
        if token is not None:
            current_state.reset(token)
        result.usage = usage.stop_meter(metering)
        current_answers.reset(answering)
        current_outputs.reset(seen)
        current_activation.reset(running)
        result.duration = time.perf_counter() - began
    return result


def json_copy(value: Any) -> Any:
    """A copy of a JSON value whose dicts and lists are all new (faster than ``deepcopy``)."""
    kind = type(value)
    if kind is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if kind is list:
        return [json_copy(v) for v in value]
    return value


def route_label(value: Any) -> str:
    """A router's return value as a label (Enum members give their value)."""
    if isinstance(value, Enum):
        value = value.value
    return str(value)


def to_json(value: Any, where: str) -> Any:
    """``value`` as JSON-safe data, or :class:`NotSerializable` naming ``where``."""
    try:
        return to_jsonable_python(value)
    except Exception as exc:
        raise NotSerializable(
            f"output of {where} is not JSON-serializable: {exc}", where=where
        ) from None


def run_awaitable(awaitable: Any) -> Any:
    """Run a coroutine (an async method's result) to completion on a loop of its own."""

    async def wrapper() -> Any:
        return await awaitable

    return asyncio.run(wrapper())
