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
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pydantic_core import to_jsonable_python

from runner.errors import AwaitInput, NotSerializable, PauseRun, SleepRun
from runner.flow import streaming, usage, versions
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


@dataclass(frozen=True)
class Returned:
    """The method returned: what the state became and its output (JSON); a router's label;
    the JSON of the ``HumanFeedbackResult`` a reviewed method came to. (Whether it is done
    or started a child run, :func:`runner.flow.lifecycle.decide` tells from the output.)"""

    new_state: dict[str, Any]
    output: Any
    label: str | None = None
    review: Any = None


@dataclass(frozen=True)
class Asked:
    """The method waits for a person's answer (:class:`~runner.errors.AwaitInput`): the
    run pauses with the state so far and what it waits for."""

    new_state: dict[str, Any]
    awaiting: Any
    """The :class:`runner.store.models.Awaiting` the step paused on."""

    @property
    def reason(self) -> str:
        """Why the run paused: the question."""
        return str(self.awaiting.message)


@dataclass(frozen=True)
class Halted:
    """The method paused the run (``self.pause(reason)``); its state changes are dropped
    and it runs again on resume."""

    reason: str


@dataclass(frozen=True)
class Slept:
    """The method stopped at a durable sleep (on workers): the state so far is committed
    with the wake-up time."""

    new_state: dict[str, Any]
    sleep: SleepRun


@dataclass(frozen=True)
class Raised:
    """The method raised ``error`` (or its output or state is not JSON)."""

    error: BaseException


Ending = Returned | Asked | Halted | Slept | Raised
"""How an attempt of a step ended: one of these variants, each with what that end has."""


@dataclass
class StepResult:
    """What one attempt of a step produced: how it ended and what every attempt has."""

    activation: Activation
    base_state: dict[str, Any]
    end: Ending
    duration: float = 0.0
    attempts: int = 1
    usage: UsageMetrics | None = None
    """What the attempt's LLM calls spent (:mod:`runner.flow.usage`), if it recorded any."""
    patches: dict[str, bool] = field(default_factory=dict)
    """The patch decisions (``self.patched``) this attempt made that the run had not recorded."""


def run_step(
    flow: Any, graph: FlowGraph, ctx: StepContext, base_state: dict[str, Any], arg: Any
) -> StepResult:
    """Run ``ctx``'s activation's method once on a fresh copy of ``base_state``, with ``ctx``
    as the running step's context (:mod:`runner.flow.context`): where it runs, which
    attempt, the answers people gave it and the sleeps earlier attempts recorded."""
    began = time.perf_counter()
    metering = usage.start_meter()
    try:
        end = _ending(flow, graph, ctx, base_state, arg)
    finally:
        spent = usage.stop_meter(metering)
        # Every chunk the attempt wrote is in the store before it settles (and commits).
        streaming.finish(ctx)
    return StepResult(
        ctx.activation,
        base_state,
        end,
        duration=time.perf_counter() - began,
        attempts=ctx.attempt,
        usage=spent,
        patches=dict(ctx.patches.decided),
    )


def _ending(
    flow: Any, graph: FlowGraph, ctx: StepContext, base_state: dict[str, Any], arg: Any
) -> Ending:
    activation = ctx.activation
    spec = graph.methods[activation.method]
    try:
        with running(ctx):
            # A private copy (no list or dict shared with ``base_state``): changes a parallel
            # branch makes in place cannot leak into this step, nor a failed step's into the
            # run.
            # Mapped by this code's @state_upgrade hook when another version wrote it (the
            # model then reads it below; the planners refuse an unreadable one in one line).
            loaded, _ = versions.upgraded(type(flow), base_state, ctx.version)
            state_obj = ctx.state = flow._state_from_json(loaded)
            method = getattr(flow, activation.method)
            value = (
                method(flow._step_argument(activation, json_copy(arg)))
                if spec.takes_arg
                else method()
            )
            if inspect.isawaitable(value):
                value = run_awaitable(value)
        label = None
        if isinstance(value, Routed):  # a router whose output is not its label
            label, value = value.label, value.output
        elif spec.is_router:
            label = route_label(value)
        output = flow._output_json(value, activation.method)
        reviewed = ctx.answers.reviewed
        review = None if reviewed is None else flow._output_json(reviewed, activation.method)
        return Returned(flow._dump_state(state_obj), output, label, review)
    except AwaitInput as waiting:
        # The state so far, kept while it waits.
        return Asked(flow._dump_state(ctx.state), waiting.awaiting)
    except PauseRun as pause:
        return Halted(pause.message)
    except SleepRun as sleep:
        return Slept(flow._dump_state(ctx.state), sleep)  # the state so far, committed with it
    except Exception as exc:
        return Raised(exc)


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
