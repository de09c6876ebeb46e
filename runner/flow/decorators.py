"""``@start``, ``@listen`` and ``@router``: mark flow methods and wire them.

Each decorator attaches a :class:`StepDecl` to the function under :data:`STEP_ATTR` and
returns the function itself, so it stays callable and can be named as a trigger further down
the class body (``@listen(plan)``). :func:`runner.flow.graph.compile_graph` reads the marks.

A method has one role. The one allowed combination is ``@start()`` with ``@router()`` (in
either order): a *start router* runs at kickoff and its label triggers listeners. Its trigger,
if any, is written on ``@start(...)``; ``@router`` must then have none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, TypeVar

from runner.errors import DefinitionError
from runner.flow.conditions import Cond, normalize, or_

STEP_ATTR = "__runner_step__"
"""The attribute under which a decorated function carries its :class:`StepDecl`."""

DEFAULT_MAX_CALLS = 100
"""How many times one method may run in one run when ``max_calls`` is not given."""

F = TypeVar("F", bound=Callable[..., Any])


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

    def merged(self, other: StepOptions) -> StepOptions:
        """Options set on either; the same option set differently on both is an error."""
        values: dict[str, Any] = {}
        for name in ("retries", "retry_backoff", "time_limit", "max_calls"):
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
    return opts


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
    """Stack ``@start`` and ``@router``; any other second role is an error."""
    roles = {old.role, new.role}
    if roles != {"start", "router"}:
        raise DefinitionError(
            f"{name}: a method has one role; it is already @{old.role}, cannot also be "
            f"@{new.role} (only @start() and @router() may be combined)",
            method=name,
        )
    start, rtr = (old, new) if old.is_start else (new, old)
    if rtr.condition is not None:
        raise DefinitionError(
            f"{name}: a start router takes its trigger from @start(...), not @router(...)",
            method=name,
        )
    options = start.options.merged(rtr.options)
    return replace(start, is_router=True, labels=rtr.labels, options=options)


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
) -> Callable[[F], F]:
    """Mark a method that runs at kickoff.

    With a ``condition`` it is a *conditional start*: it also runs whenever the condition
    fires, like a listener, and runs at kickoff only if the flow has no unconditional start.
    """
    opts = _check_options(StepOptions(retries, retry_backoff, time_limit, max_calls))
    cond = None if condition is None else normalize(condition)
    return _mark(StepDecl(True, False, cond, None, opts))


def listen(
    condition: object,
    *more: object,
    retries: int | None = None,
    retry_backoff: float | None = None,
    time_limit: float | None = None,
    max_calls: int | None = None,
) -> Callable[[F], F]:
    """Mark a method that runs when ``condition`` (or any of ``condition, *more``) fires.

    If the method takes an argument besides ``self`` it receives the output of the
    method (or router) whose event fired it.
    """
    opts = _check_options(StepOptions(retries, retry_backoff, time_limit, max_calls))
    return _mark(StepDecl(False, False, _trigger(condition, more), None, opts))


def router(
    condition: object = None,
    *more: object,
    labels: Iterable[str | Enum] | type[Enum] | None = None,
    retries: int | None = None,
    retry_backoff: float | None = None,
    time_limit: float | None = None,
    max_calls: int | None = None,
) -> Callable[[F], F]:
    """Mark a method whose return value (a string or Enum member) is a label to emit.

    Listeners of that label (``@listen("label")``) then run. ``labels=`` declares the
    possible labels; without it they are read from the method's ``return`` statements.
    A router needs a trigger unless it is also ``@start()``.
    """
    opts = _check_options(StepOptions(retries, retry_backoff, time_limit, max_calls))
    cond = None if condition is None and not more else _trigger(condition, more)
    return _mark(StepDecl(False, True, cond, _labels(labels), opts))
