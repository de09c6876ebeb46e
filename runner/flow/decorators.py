"""``@start``, ``@listen`` and ``@router``: mark flow methods and wire them.

Each decorator attaches a :class:`StepDecl` to the function under :data:`STEP_ATTR` and
returns the function itself, so it stays callable and can be named as a trigger further down
the class body (``@listen(plan)``). :func:`runner.flow.graph.compile_graph` reads the marks.

Decorators stack as CrewAI's do (in either order): ``@start()`` with ``@router()`` is a *start
router* (its trigger, if any, is written on ``@start(...)``); ``@router()`` with ``@listen(x)``
is a router triggered by ``x``; ``@start()`` with ``@listen(x)`` runs at kickoff and again
whenever ``x`` fires. A trigger may be given once, and each decorator used once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from runner.errors import DefinitionError
from runner.flow.conditions import Cond, normalize, or_
from runner.flow.rates import Rate, check_name, parse_rate, priority_problem

STEP_ATTR = "__runner_step__"
"""The attribute under which a decorated function carries its :class:`StepDecl`."""

REVIEW_ATTR = "__human_feedback_config__"
"""Where ``@human_feedback`` keeps its config on a method (CrewAI's name; read by the
flow's definition, :mod:`runner.flow.definition`)."""

DEFAULT_MAX_CALLS = 100
"""How many times one method may run in one run when ``max_calls`` is not given."""

F = TypeVar("F", bound=Callable[..., Any])

FIELDS = (
    "retries",
    "retry_backoff",
    "time_limit",
    "max_calls",
    "queue",
    "concurrency",
    "rate",
    "limits",
    "limit_key",
    "priority",
)
"""The options of :class:`StepOptions`, in order."""


CONVERSATIONAL_ONLY = "__conversational_only__"
"""Marks the built-in conversational methods (:mod:`runner.flow.conversation`): steps only of
a flow with ``conversational = True``; the graph compiler leaves them out of every other."""


@dataclass(frozen=True)
class StepOptions:
    """Per-method execution options; ``None`` means "use the settings default"."""

    retries: int | None = None
    """Retries after a failure before the run fails."""
    retry_backoff: float | None = None
    """First retry delay in seconds (doubling on each retry)."""
    time_limit: float | None = None
    """Soft time limit of one attempt, in seconds."""
    max_calls: int | None = None
    """Activations of the method allowed per run (guards loops); default 100."""
    queue: str | None = None
    """Name of the deployment's queue its steps go to (``None``: the default queue)."""
    concurrency: int | None = None
    """Attempts of the method running at once across the deployment (``None``: no limit)."""
    rate: Rate | None = None
    """How often the method may start across the deployment (``None``: no limit)."""
    limits: tuple[str, ...] | None = None
    """Named limits (``RUNNER_LIMITS``, :func:`runner.set_limit`) the method counts against."""
    limit_key: Callable[[Any], object] | None = None
    """Computes a key from the run's state: the rate and concurrency hold per key."""
    priority: int | None = None
    """Its steps' priority (0 lowest, 9 highest) in runs submitted without one."""

    def merged(self, other: StepOptions) -> StepOptions:
        """Options set on either; the same option set differently on both is an error."""
        values: dict[str, Any] = {}
        for name in FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine != theirs:
                raise DefinitionError(f"option {name} is given twice ({mine!r}, {theirs!r})")
            values[name] = mine if mine is not None else theirs
        return StepOptions(**values)


@dataclass(frozen=True)
class StepDecl:
    """What the decorators said about one method."""

    is_start: bool
    """Runs at kickoff (or, with a condition, when the condition fires)."""
    is_router: bool
    """Its return value is a label that triggers listeners of that label."""
    condition: Cond | None
    """The trigger; ``None`` for an unconditional start."""
    labels: frozenset[str] | None
    """Router labels given with ``labels=``; ``None`` to infer them from the source."""
    options: StepOptions
    """Retries, backoff, time limit, call limit."""
    at_kickoff: bool = False
    """A start whose trigger came from a stacked ``@listen``: it also runs at kickoff."""

    @property
    def role(self) -> str:
        """``start``, ``listen``, ``router`` or ``start_router``."""
        if self.is_start:
            return "start_router" if self.is_router else "start"
        return "router" if self.is_router else "listen"


def _check_options(opts: StepOptions) -> StepOptions:
    def bad(name: str, value: object, rule: str) -> DefinitionError:
        return DefinitionError(f"{name}={value!r}: must be {rule}", option=name)

    if opts.retries is not None and (isinstance(opts.retries, bool) or opts.retries < 0):
        raise bad("retries", opts.retries, "an int >= 0")
    if opts.retry_backoff is not None and opts.retry_backoff < 0:
        raise bad("retry_backoff", opts.retry_backoff, ">= 0")
    if opts.time_limit is not None and opts.time_limit <= 0:
        raise bad("time_limit", opts.time_limit, "> 0")
    if opts.max_calls is not None and (isinstance(opts.max_calls, bool) or opts.max_calls < 1):
        raise bad("max_calls", opts.max_calls, "an int >= 1")
    if opts.queue is not None:
        check_name(opts.queue, "queue")
    if opts.concurrency is not None and (
        isinstance(opts.concurrency, bool)
        or not isinstance(opts.concurrency, int)
        or opts.concurrency < 1
    ):
        raise bad("concurrency", opts.concurrency, "an int >= 1")
    for name in opts.limits or ():
        check_name(name, "limits")
    if opts.limit_key is not None and not callable(opts.limit_key):
        raise bad("limit_key", opts.limit_key, "a function of the state")
    if opts.priority is not None and (problem := priority_problem(opts.priority)):
        raise DefinitionError(problem, option="priority")
    return opts


def control(
    queue: str | None = None,
    concurrency: int | None = None,
    rate_limit: str | None = None,
    burst: int | None = None,
    limits: list[str] | tuple[str, ...] | None = None,
    limit_key: Callable[[Any], object] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The flow-control options of a decorator (or a crew's task) as :class:`StepOptions`
    fields; ``burst`` without ``rate_limit`` is an error."""
    if burst is not None and rate_limit is None:
        raise DefinitionError("burst= needs a rate_limit=", option="burst")
    if isinstance(limits, str):
        raise DefinitionError(f"limits= takes a list of names, not the string {limits!r}")
    return {
        "queue": queue,
        "concurrency": concurrency,
        "rate": None if rate_limit is None else parse_rate(rate_limit, burst),
        "limits": None if limits is None else tuple(limits),
        "limit_key": limit_key,
        "priority": priority,
    }


def _trigger(condition: object, more: tuple[object, ...]) -> Cond:
    """Several positional triggers mean any of them (CrewAI's ``@listen(a, b)``)."""
    if more:
        return or_(condition, *more)
    return normalize(condition)


def _labels(labels: Iterable[str | Enum] | type[Enum] | None) -> frozenset[str] | None:
    if labels is None:
        return None
    if isinstance(labels, str):
        raise DefinitionError(f"labels= takes a collection of labels, not the string {labels!r}")
    return frozenset(str(x.value) if isinstance(x, Enum) else str(x) for x in labels)


def _combine(old: StepDecl, new: StepDecl, name: str) -> StepDecl:
    """Stack two decorators on one method (see the module docstring for what combines)."""

    def refuse(why: str) -> DefinitionError:
        return DefinitionError(f"{name}: {why}", method=name)

    for role in ("start", "router", "listen"):
        if old.role == role and new.role == role:
            raise refuse(f"@{role} is given twice; give one @{role}(...) (or_() joins triggers)")
    if (old.is_start and new.is_start) or (old.is_router and new.is_router):
        raise refuse(f"cannot combine @{old.role} with @{new.role}: a role is given twice")
    if old.condition is not None and new.condition is not None:
        raise refuse("a trigger is given twice; join them with or_(...) in one decorator")
    start = old if old.is_start else new if new.is_start else None
    rtr = old if old.is_router else new if new.is_router else None
    if start is not None and rtr is not None and rtr.condition is not None:
        raise refuse("a start router takes its trigger from @start(...), not @router(...)")
    condition = old.condition if old.condition is not None else new.condition
    labels = rtr.labels if rtr is not None else None
    # A trigger that came from @listen on a start adds to the kickoff run, as in CrewAI.
    at_kickoff = start is not None and start.condition is None and condition is not None
    return StepDecl(
        is_start=start is not None,
        is_router=rtr is not None,
        condition=condition,
        labels=labels,
        options=old.options.merged(new.options),
        at_kickoff=at_kickoff or old.at_kickoff or new.at_kickoff,
    )


def _mark(decl: StepDecl) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        name = getattr(fn, "__name__", repr(fn))
        if not callable(fn):
            raise DefinitionError(f"{name!s}: only functions can be flow steps", method=name)
        old: StepDecl | None = getattr(fn, STEP_ATTR, None)
        setattr(fn, STEP_ATTR, decl if old is None else _combine(old, decl, name))
        return fn

    return decorate


def start(
    condition: object = None,
    *,
    retries: int | None = None,
    retry_backoff: float | None = None,
    time_limit: float | None = None,
    max_calls: int | None = None,
    queue: str | None = None,
    concurrency: int | None = None,
    rate_limit: str | None = None,
    burst: int | None = None,
    limits: list[str] | tuple[str, ...] | None = None,
    limit_key: Callable[[Any], object] | None = None,
    priority: int | None = None,
) -> Callable[[F], F]:
    """Mark a method that runs at kickoff.

    With a ``condition`` it is a *conditional start*: it also runs whenever the condition
    fires, like a listener, and runs at kickoff only if the flow has no unconditional start.

    Every decorator takes the flow-control options too: ``queue=`` (the deployment's queue
    its steps go to), ``concurrency=`` (attempts at once across all workers),
    ``rate_limit="60/m"`` with ``burst=`` (starts per second, minute or hour across all
    workers), ``limits=[...]`` (named limits shared with other methods) and
    ``limit_key=lambda state: ...`` (the limits hold per key) and ``priority=`` (0 lowest to
    9 highest: its steps' priority in runs submitted without one); see the README's Flow
    control.
    """
    flow_control = control(queue, concurrency, rate_limit, burst, limits, limit_key, priority)
    opts = _check_options(
        StepOptions(retries, retry_backoff, time_limit, max_calls, **flow_control)
    )
    cond = None if condition is None else normalize(condition)
    return _mark(StepDecl(True, False, cond, None, opts))


def listen(
    condition: object,
    *more: object,
    retries: int | None = None,
    retry_backoff: float | None = None,
    time_limit: float | None = None,
    max_calls: int | None = None,
    queue: str | None = None,
    concurrency: int | None = None,
    rate_limit: str | None = None,
    burst: int | None = None,
    limits: list[str] | tuple[str, ...] | None = None,
    limit_key: Callable[[Any], object] | None = None,
    priority: int | None = None,
) -> Callable[[F], F]:
    """Mark a method that runs when ``condition`` (or any of ``condition, *more``) fires.

    If the method takes an argument besides ``self`` it receives the output of the
    method (or router) whose event fired it.
    """
    flow_control = control(queue, concurrency, rate_limit, burst, limits, limit_key, priority)
    opts = _check_options(
        StepOptions(retries, retry_backoff, time_limit, max_calls, **flow_control)
    )
    return _mark(StepDecl(False, False, _trigger(condition, more), None, opts))


def router(
    condition: object = None,
    *more: object,
    emit: Iterable[str | Enum] | str | None = None,
    labels: Iterable[str | Enum] | type[Enum] | None = None,
    retries: int | None = None,
    retry_backoff: float | None = None,
    time_limit: float | None = None,
    max_calls: int | None = None,
    queue: str | None = None,
    concurrency: int | None = None,
    rate_limit: str | None = None,
    burst: int | None = None,
    limits: list[str] | tuple[str, ...] | None = None,
    limit_key: Callable[[Any], object] | None = None,
    priority: int | None = None,
) -> Callable[[F], F]:
    """Mark a method whose return value (a string or Enum member) is a label to emit.

    Listeners of that label (``@listen("label")``) then run. ``emit=`` (CrewAI's name) or
    ``labels=`` declares the possible labels; without them they are read from the method's
    ``return`` statements. A router needs a trigger unless it is stacked with ``@start()``
    or ``@listen(...)``, which then give it.
    """
    flow_control = control(queue, concurrency, rate_limit, burst, limits, limit_key, priority)
    opts = _check_options(
        StepOptions(retries, retry_backoff, time_limit, max_calls, **flow_control)
    )
    cond = None if condition is None and not more else _trigger(condition, more)
    if emit is not None and labels is not None:
        raise DefinitionError("give emit= or its other name labels=, not both")
    declared = _labels([emit] if isinstance(emit, str) else emit if emit is not None else labels)
    return _mark(StepDecl(False, True, cond, declared, opts))
