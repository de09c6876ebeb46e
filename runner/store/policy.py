"""Retention policies: how long a finished run stays in Redis, by how it ended.

A policy maps each status a run can end in (``succeeded``, ``failed``, ``cancelled``) to a
duration counted from the run's end; a status it does not name is kept for ever. The
deployment's (``RUNNER_RETENTION=succeeded=7d,failed=30d``) applies to every run; a flow's
own (``@retention(succeeded="1d")`` or a ``retention`` class attribute) overrides it status
by status. Paused, running (sleeping, scheduled) and corrupt runs are never expired.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

EXPIRING = ("succeeded", "failed", "cancelled")
"""The statuses a run may expire in: it ended, and nothing runs it without a resume."""

FOREVER = math.inf
"""A run kept until someone deletes it (no policy for its status, or pinned)."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

Policy = dict[str, float]
"""Status -> seconds a run ending in it is kept (only the statuses named)."""


def parse_duration(text: str) -> float:
    """``45s``, ``30m``, ``12h``, ``7d`` (``0d``: at the next pass) as seconds;
    :class:`ValueError` naming ``text`` otherwise."""
    match = _DURATION.match(str(text).lower())
    if match is None:
        raise ValueError(f"retention {text!r} is not a number with a unit s, m, h or d")
    return float(match.group(1)) * _UNIT[match.group(2)]


def parse_policy(text: str) -> Policy:
    """``succeeded=7d,failed=30d,cancelled=7d`` as a policy ('' = keep every run);
    :class:`ValueError` naming the bad part."""
    pairs: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        status, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{part!r} is not status=duration (e.g. succeeded=7d)")
        pairs[status.strip()] = value.strip()
    return policy_of(pairs)


def policy_of(given: Mapping[str, str | float | int]) -> Policy:
    """A policy from ``{status: duration}`` (``"7d"``, or seconds as a number);
    :class:`ValueError` naming an unknown status or a bad duration."""
    policy: Policy = {}
    for status, value in given.items():
        if status not in EXPIRING:
            raise ValueError(
                f"retention of {status!r}: a run expires only when {', '.join(EXPIRING)}"
            )
        seconds = float(value) if isinstance(value, int | float) else parse_duration(value)
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"retention of {status!r} is negative")
        policy[status] = seconds
    return policy


def kept_for(status: str, deployment: Policy, flow: Policy | None) -> float:
    """Seconds a run that ended ``status`` is kept: the flow's word for that status, else
    the deployment's, else :data:`FOREVER` (also for a status that never expires)."""
    if status not in EXPIRING:
        return FOREVER
    if flow is not None and status in flow:
        return flow[status]
    return deployment.get(status, FOREVER)


def describe(policy: Policy) -> str:
    """The policy as ``RUNNER_RETENTION`` spells it (``succeeded=7d,failed=30d``)."""
    return ",".join(f"{status}={_short(policy[status])}" for status in EXPIRING if status in policy)


def _short(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds and seconds % _UNIT[unit] == 0:
            return f"{int(seconds // _UNIT[unit])}{unit}"
    return f"{seconds:g}s"
