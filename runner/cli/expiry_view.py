"""When each run leaves Redis, as ``runner runs`` (its ``expires`` column and ``--json``) and
``runner status`` show it.

Apart from :mod:`runner.cli.retain` so listing runs loads no other command's module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from runner.store.expiry import RetainingStore
from runner.store.models import RunInfo
from runner.store.policy import EXPIRING

PINNED, NEVER, NEXT_PASS, NOT_FINISHED = "pinned", "never", "next pass", "not finished"
"""Where a run stands with retention, when it has no time to expire at: pinned (kept until
unpinned), kept by its policy, ended and decided by the next retention pass, not finished
(running, paused, sleeping, scheduled: never expired)."""


def expiries(store: object, infos: Sequence[RunInfo]) -> dict[str, tuple[str, float | None]]:
    """Each run's ``(word, time)``: one of :data:`PINNED`, :data:`NEVER`, :data:`NEXT_PASS`,
    :data:`NOT_FINISHED` with no time, or ``("at", when it expires)``; none for a store that
    does not expire runs (one round trip)."""
    if not isinstance(store, RetainingStore) or not infos:
        return {}
    found = store.expiries([i.run_id for i in infos])
    out: dict[str, tuple[str, float | None]] = {}
    for info in infos:
        seen = found[info.run_id]
        if seen.pinned:
            out[info.run_id] = (PINNED, None)
        elif info.status.value not in EXPIRING:
            out[info.run_id] = (NOT_FINISHED, None)
        elif seen.expires_at is None:
            out[info.run_id] = (NEXT_PASS, None)
        elif math.isinf(seen.expires_at):
            out[info.run_id] = (NEVER, None)
        else:
            out[info.run_id] = ("at", seen.expires_at)
    return out


def expiry_texts(store: object, infos: Sequence[RunInfo]) -> dict[str, str]:
    """What ``runner runs`` shows in its ``expires`` column (and ``status`` in its
    ``expires`` row) for each run."""
    from .render import stamp

    return {
        run_id: stamp(at) if at is not None else "-" if word == NOT_FINISHED else word
        for run_id, (word, at) in expiries(store, infos).items()
    }


def expiry_fields(store: object, infos: Sequence[RunInfo]) -> dict[str, dict[str, Any]]:
    """What ``runs --json`` and ``status --json`` say of each run's expiry: ``expires_at``
    (Unix time, or ``null``) and ``expires`` (that time in ISO 8601 UTC, or ``pinned``,
    ``never``, ``next pass``, ``not finished``)."""
    return {
        run_id: {
            "expires": word if at is None else datetime.fromtimestamp(at, UTC).isoformat(),
            "expires_at": at,
        }
        for run_id, (word, at) in expiries(store, infos).items()
    }


def expiry_line(store: object, info: RunInfo) -> str | None:
    """``runner status``'s ``expires`` row of a run (``None``: a store that keeps runs)."""
    found = expiries(store, [info]).get(info.run_id)
    if found is None:
        return None
    from runner.views import when

    word, at = found
    return {
        PINNED: "never: pinned (runner unpin lets its retention apply)",
        NEVER: "never: its retention keeps it",
        NEXT_PASS: "ended: the next retention pass decides when",
        NOT_FINISHED: "- (not finished: never expired)",
    }.get(word) or when(at)
