"""Trigger conditions: ``or_`` and ``and_`` over method names and router labels.

A condition is a leaf or a tree of :class:`Or` / :class:`And` nodes. A leaf is a string:
the name of a flow method (the event "that method finished") or a router label (the event
"a router returned that label"). Decorated methods and other callables given as triggers
are turned into their ``__name__``, so ``@listen(plan)`` and ``@listen("plan")`` are the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeAlias

from runner.errors import DefinitionError, InvalidCondition

Cond: TypeAlias = "str | Or | And"
"""A trigger condition: a leaf (method name or router label) or an ``Or`` / ``And`` tree."""


@dataclass(frozen=True)
class Or:
    """Fires when any of its children holds."""

    children: tuple[Cond, ...]
    """The alternatives, already normalized."""

    def __eq__(self, other: object) -> bool:
        return _same(self, other)


@dataclass(frozen=True)
class And:
    """Fires when all of its children hold."""

    children: tuple[Cond, ...]
    """The requirements, already normalized."""

    def __eq__(self, other: object) -> bool:
        return _same(self, other)


def crewai_form(cond: Cond) -> Any:
    """The condition as CrewAI's ``or_``/``and_`` return it: ``{"type": "OR"|"AND",
    "conditions": [...]}`` (children in the order given)."""
    if isinstance(cond, str):
        return cond
    kind = "OR" if isinstance(cond, Or) else "AND"
    return {"type": kind, "conditions": [crewai_form(c) for c in cond.children]}


def _same(cond: Or | And, other: object) -> bool:
    """Equal to the same tree, or to CrewAI's dict form of it (code that compares what
    ``or_``/``and_`` return with such a dict keeps working)."""
    if isinstance(other, Or | And):
        return type(cond) is type(other) and cond.children == other.children
    if isinstance(other, dict):
        return bool(crewai_form(cond) == other)
    return NotImplemented


def normalize(x: object) -> Cond:
    """Turn a trigger as written (str, Enum member, function, ``Or``, ``And``) into a ``Cond``."""
    if isinstance(x, Or | And):
        return x
    if isinstance(x, dict) and set(x) == {"type", "conditions"}:
        # CrewAI's dict form of or_()/and_()
        kind, children = x["type"], x["conditions"]
        if kind in ("OR", "AND") and isinstance(children, list) and children:
            parsed = tuple(normalize(c) for c in children)
            return Or(parsed) if kind == "OR" else And(parsed)
    if isinstance(x, Enum):
        return str(x.value)
    if isinstance(x, str):
        if not x:
            raise DefinitionError("a trigger cannot be the empty string")
        return x
    name = getattr(x, "__name__", None)
    if callable(x) and isinstance(name, str):
        return name
    raise InvalidCondition(
        "Invalid condition: a trigger must be a method, a method name, a router label, "
        f"or_() or and_(); got {x!r}",
        trigger=repr(x),
    )


def _children(conds: Iterable[object], op: str) -> tuple[Cond, ...]:
    children = tuple(normalize(c) for c in conds)
    if not children:
        raise DefinitionError(f"{op}() needs at least one condition")
    return children


def or_(*conds: object) -> Or:
    """A condition that holds when any of ``conds`` holds (CrewAI's ``or_``)."""
    return Or(_children(conds, "or_"))


def and_(*conds: object) -> And:
    """A condition that holds when all of ``conds`` hold (CrewAI's ``and_``)."""
    return And(_children(conds, "and_"))


def leaves(cond: Cond) -> frozenset[str]:
    """Every method name or label the condition mentions."""
    if isinstance(cond, str):
        return frozenset((cond,))
    return frozenset().union(*(leaves(c) for c in cond.children))


def evaluate(cond: Cond, seen: set[str] | frozenset[str]) -> bool:
    """Whether the condition holds given the set of events ``seen``."""
    if isinstance(cond, str):
        return cond in seen
    check: Callable[[Iterable[bool]], bool] = any if isinstance(cond, Or) else all
    return check(evaluate(c, seen) for c in cond.children)


def has_and(cond: Cond) -> bool:
    """Whether an ``And`` occurs anywhere in the condition."""
    if isinstance(cond, str):
        return False
    return isinstance(cond, And) or any(has_and(c) for c in cond.children)


def to_json(cond: Cond) -> Any:
    """A canonical JSON form: a leaf string or ``{"or"|"and": [sorted children]}``.

    Children are sorted (by their JSON text) so that ``or_(a, b)`` and ``or_(b, a)`` give
    the same form; the graph fingerprint relies on this.
    """
    if isinstance(cond, str):
        return cond
    children = sorted((to_json(c) for c in cond.children), key=json.dumps)
    return {"or" if isinstance(cond, Or) else "and": children}


def describe(cond: Cond) -> str:
    """A short human-readable text, e.g. ``and_(research, 'ok')``."""
    if isinstance(cond, str):
        return repr(cond)
    op = "or_" if isinstance(cond, Or) else "and_"
    return f"{op}({', '.join(describe(c) for c in cond.children)})"
