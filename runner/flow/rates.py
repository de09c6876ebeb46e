"""Rates of the flow-control options: ``"5/s"``, ``"60/m"``, ``"500/h"``.

Parsed once, where they are given (a decorator, ``RUNNER_LIMITS``, :func:`runner.set_limit`),
so a bad one is refused there with one clear error rather than when a step would start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runner.errors import DefinitionError

PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
"""Seconds in each period a rate may be given per."""

_RATE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class Rate:
    """``count`` starts per ``period`` seconds, at most ``burst`` of them at once."""

    count: int
    period: float
    burst: int

    @property
    def interval(self) -> float:
        """Seconds between two starts at the steady rate."""
        return self.period / self.count

    def __str__(self) -> str:
        unit = next(u for u, s in PERIODS.items() if s == self.period)
        return f"{self.count}/{unit}" + (
            f" (burst {self.burst})" if self.burst != self.count else ""
        )


def parse_rate(text: object, burst: int | None = None, *, what: str = "rate_limit") -> Rate:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (N >= 1); the burst defaults to one period's worth."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) < 1:
        raise DefinitionError(
            f"{what}={text!r}: must be a count per second, minute or hour, e.g. '5/s', '60/m'",
            option=what,
        )
    count = int(match.group(1))
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
        raise DefinitionError(f"burst={burst!r}: must be an int >= 1", option="burst")
    return Rate(count, PERIODS[match.group(2)], count if burst is None else burst)


def check_name(name: object, what: str) -> str:
    """A queue's or a named limit's name: letters, digits, ``_`` and ``-``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise DefinitionError(
            f"{what}={name!r}: must be a name of letters, digits, '_' and '-'", option=what
        )
    return name


PRIORITIES = range(10)
"""A step's priorities: 0 (the lowest) to 9 (the highest), as in Celery and AMQP."""

DEFAULT_PRIORITY = 5
"""The priority of a step whose method and run give none: in the middle, so a run or a
method can be put before the others or after them."""


def priority_problem(value: object, what: str = "priority") -> str | None:
    """Why ``value`` is not a priority (``None`` if it is one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in PRIORITIES:
        return f"{what}={value!r}: must be an int from 0 (the lowest) to 9 (the highest)"
    return None


def priority_text(value: int) -> str:
    """A run's priority as ``runner status`` and the console's run page show it."""
    return f"{value} (0 lowest, 9 highest)"


def parse_limits(text: str) -> dict[str, Rate]:
    """``"openai=500/m,search=5/s"`` (``RUNNER_LIMITS``) as named rates."""
    found: dict[str, Rate] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, rate = part.partition("=")
        if not sep:
            raise DefinitionError(f"RUNNER_LIMITS: {part!r} must read NAME=RATE, e.g. openai=500/m")
        name = check_name(name.strip(), "RUNNER_LIMITS name")
        found[name] = parse_rate(rate, what=f"RUNNER_LIMITS {name}")
    return found
