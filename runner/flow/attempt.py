"""One attempt of a step: running its flow method once, the part both executors share
(what happens to the attempt on a worker is :mod:`runner.distributed.step`).

A step runs against its own copy of the state (made from the JSON snapshot it
started from), so parallel branches never see each other's half-done writes; the
result says what the state became, what the method returned, and for a router
which label it chose.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic_core import to_jsonable_python

from runner.errors import AwaitInput, NotSerializable, PauseRun, SleepRun
from runner.flow import usage
from runner.flow.context import StepContext, running
from runner.flow.graph import FlowGraph
from runner.flow.orchestrator import Activation
from runner.store.models import UsageMetrics


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
    flow: Any, graph: FlowGraph, ctx: StepContext, base_state: dict[str, Any], arg: Any
) -> StepResult:
    """Run ``ctx``'s activation's method once on a fresh copy of ``base_state``, with ``ctx``
    as the running step's context (:mod:`runner.flow.context`): where it runs, which
    attempt, the answers people gave it and the sleeps earlier attempts recorded."""
    activation = ctx.activation
    spec = graph.methods[activation.method]
    began = time.perf_counter()
    result = StepResult(activation, base_state, attempts=ctx.attempt)
    metering = usage.start_meter()
    try:
        with running(ctx):
            # A private copy (no list or dict shared with ``base_state``): changes a parallel
            # branch makes in place cannot leak into this step, nor a failed step's into the
            # run.
            state_obj = ctx.state = flow._state_from_json(base_state)
            method = getattr(flow, activation.method)
            value = (
                method(flow._step_argument(activation, json_copy(arg)))
                if spec.takes_arg
                else method()
            )
            if inspect.isawaitable(value):
                value = run_awaitable(value)
        if isinstance(value, Routed):  # a router whose output is not its label
            result.label, value = value.label, value.output
        elif spec.is_router:
            result.label = route_label(value)
        result.output = to_json(value, activation.method)
        if ctx.answers.reviewed is not None:
            result.review = to_json(ctx.answers.reviewed, activation.method)
        result.new_state = flow._dump_state(state_obj)
    except AwaitInput as waiting:
        result.paused = waiting.message
        result.awaiting = waiting.awaiting
        result.new_state = flow._dump_state(ctx.state)  # the state so far, kept while it waits
    except PauseRun as pause:
        result.paused = pause.message
    except SleepRun as sleep:
        result.sleep = sleep
        result.new_state = flow._dump_state(ctx.state)  # the state so far, committed with it
    except Exception as exc:
        result.error = exc
    finally:
        result.usage = usage.stop_meter(metering)
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
