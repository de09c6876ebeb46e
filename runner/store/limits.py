"""Flow-control records in Redis: rate and concurrency limits, what each was set to, and the
steps they defer. This module owns their keys, their scripts and the decoding of what the
scripts write; :mod:`runner.distributed.limits` decides which limits a step counts against.

Keys (``P`` the prefix; one hash tag ``{flow}`` for all, so one script checks every limit of
a step; ``L`` a limit's name, e.g. ``Flow.step[key]`` or ``openai``; ``<kind>:<L>`` with
``kind`` ``rate`` or ``concurrency``):

=========================  ======  ==============================================================
key                        type    holds
=========================  ======  ==============================================================
``P:{flow}:rates``         hash    named limit -> JSON ``[rate, burst]`` (``runner.set_limit``)
``P:{flow}:rate:<L>``      string  ``L``'s theoretical arrival time (GCRA), in Redis's ms
``P:{flow}:started:<L>``   string  the same clock over ``L``'s starts alone, not its reserved turns
``P:{flow}:slots:<L>``     zset    attempt tokens holding a slot of ``L``, by lease expiry (ms)
``P:{flow}:limited``       zset    ``<kind>:<L>`` of every limit in use, by when last used (ms)
``P:{flow}:limit-specs``   hash    ``<kind>:<L>`` -> JSON ``[text, interval ms, burst, period]``
``P:{flow}:waiting:<L>``   zset    ``run|step`` deferred by ``<kind>:<L>``, by when it may go (ms)
=========================  ======  ==============================================================

A limit's spec record carries the interval, burst and period the admission used (a
concurrency limit's: its slots as the burst), so reading a rate's use never parses the rate's
text again (rates are parsed once, by :mod:`runner.flow.rates`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import scripts
from .keys import Keys

RATE, CONCURRENCY = "rate", "concurrency"
"""The kinds of limit; a limit is kept as ``<kind>:<name>``."""

RECENT = 2.0
"""A step noted as waiting on a limit counts until this long after it was due to try again
(the note goes when the limit admits it)."""


class RateLimit(NamedTuple):
    """A rate limit as the admission script takes it."""

    name: str
    """The name it is kept under (``Flow.step[key]``, ``openai``)."""
    interval: float
    """Seconds between two starts at the steady rate."""
    burst: int
    """Starts allowed at once."""
    text: str
    """The rate as people read it (``5/s``, ``5/s (burst 10)``)."""
    period: float | None = None
    """Seconds of the period it is given per (1, 60, 3600): the window its use is shown in."""


class SlotLimit(NamedTuple):
    """A concurrency limit as the admission script takes it."""

    name: str
    slots: int
    """Attempts that may hold a slot at once."""


class Refusal(NamedTuple):
    """Why an admission waits: the limit (``kind``, ``name``) that holds it longest."""

    kind: str
    name: str
    seconds: float
    """Until that limit lets the step try again (without jitter)."""


class LimitUse(NamedTuple):
    """One limit as ``runner limits`` shows it."""

    name: str
    kind: str
    """``rate`` or ``concurrency``."""
    spec: str
    """The rate (``5/s``) or the number of slots."""
    in_use: int
    """Slots taken, or starts counted against the rate now, the turns reserved by the steps
    it holds back included."""
    waiting: list[tuple[str, str, float]]
    """Steps waiting on it: ``(run, step, seconds until it tries again)``."""
    used: int | None = None
    """Slots taken, or starts made within the rate's current window (its burst at most; the
    turns reserved by waiting steps left out); ``None`` when the record predates it."""
    of: int | None = None
    """The slots, or the starts a window allows (the burst)."""
    period: float | None = None
    """A rate's window in seconds (1, 60, 3600)."""

    @property
    def use(self) -> str:
        """The use as people read it: ``3 of 5 in this second``, ``1 of 2 slots``."""
        if self.used is None or self.of is None:
            return str(self.in_use)
        if self.kind == CONCURRENCY:
            return f"{self.used} of {self.of} slots"
        unit = {1.0: "second", 60.0: "minute", 3600.0: "hour"}.get(self.period or 0.0)
        return f"{self.used} of {self.of}" + (f" in this {unit}" if unit else "")

    def as_json(self) -> dict[str, Any]:
        """The limit as JSON values."""
        return {
            "name": self.name,
            "kind": self.kind,
            "spec": self.spec,
            "in_use": self.in_use,
            "used": self.used,
            "of": self.of,
            "period": self.period,
            "use": self.use,
            "waiting": [{"run": r, "step": s, "in": round(w, 3)} for r, s, w in self.waiting],
        }


class LimitBook:
    """A deployment's limits in its Redis (``client`` and ``keys`` of one store)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self._admit = client.register_script(scripts.ADMIT)
        self._renew = client.register_script(scripts.RENEW_SLOTS)

    def set_rate(self, name: str, rate: str, burst: int) -> None:
        """Set the named limit ``name`` to ``rate`` (already checked) for the deployment."""
        self.client.hset(self.keys.rates(), name, json.dumps([rate, burst]))

    def rates(self) -> dict[str, tuple[str, int]]:
        """The named limits set with :meth:`set_rate`: name -> ``(rate, burst)``."""
        found = {}
        for name, raw in self.client.hgetall(self.keys.rates()).items():
            rate, burst = json.loads(raw)
            found[_text(name)] = (str(rate), int(burst))
        return found

    def admit(
        self,
        rates: Sequence[RateLimit],
        slots: Sequence[SlotLimit],
        token: str,
        member: str,
        lease_seconds: float,
        poll_seconds: float,
    ) -> Refusal | None:
        """Take every limit for the attempt ``token`` of ``member`` (``run|step``) in one
        script call (:data:`~runner.store.scripts.ADMIT`), or say which one holds it back."""
        header = {
            "token": token,
            "member": member,
            "lease_ms": int(lease_seconds * 1000),
            "poll_ms": int(poll_seconds * 1000),
            "rates": [
                [
                    r.interval * 1000,
                    r.burst,
                    f"{RATE}:{r.name}",
                    _spec(r.text, r.interval, r.burst, r.period),
                ]
                for r in rates
            ],
            "slots": [
                [s.slots, f"{CONCURRENCY}:{s.name}", _spec(str(s.slots), 0.0, s.slots, None)]
                for s in slots
            ],
        }
        keys = [
            self.keys.limited(),
            *(self.keys.rate(r.name) for r in rates),
            *(self.keys.slots(s.name) for s in slots),
            *(self.keys.waiting(f"{RATE}:{r.name}") for r in rates),
            *(self.keys.waiting(f"{CONCURRENCY}:{s.name}") for s in slots),
            *(self.keys.rate_starts(r.name) for r in rates),
            self.keys.limit_specs(),
        ]
        admitted, wait_ms, limit = self._admit(keys=keys, args=[json.dumps(header)])
        if admitted:
            return None
        kind, _, name = _text(limit).partition(":")
        return Refusal(kind, name, float(wait_ms) / 1000)

    def release(self, names: Sequence[str], token: str) -> None:
        """Give back the slots of the concurrency limits ``names`` the attempt ``token`` holds."""
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.zrem(self.keys.slots(name), token)
        pipe.execute()

    def renew(self, held: Sequence[tuple[str, str]], lease_seconds: float) -> None:
        """Renew each slot ``(limit name, token)`` for ``lease_seconds`` (one script call;
        a lapsed slot stays gone)."""
        if held:
            self._renew(
                keys=[self.keys.slots(name) for name, _ in held],
                args=[int(lease_seconds * 1000), *(token for _, token in held)],
            )

    def uses(self) -> list[LimitUse]:
        """Every limit in use, with its use now and the steps waiting on it."""
        now = self.now()
        limited = [_text(n) for n in self.client.zrange(self.keys.limited(), 0, -1)]
        specs = {
            _text(k): _decoded(v) for k, v in self.client.hgetall(self.keys.limit_specs()).items()
        }
        found = []
        for limit in sorted(limited, key=lambda n: n.partition(":")[::-1]):
            kind, _, name = limit.partition(":")
            spec, interval_ms, burst, period = specs.get(limit, ("?", 0.0, None, None))
            waiting: list[tuple[str, str, float]] = []
            entries: Any = self.client.zrangebyscore(
                self.keys.waiting(limit), (now - RECENT) * 1000, "+inf", withscores=True
            )
            for member, score in entries:
                run, _, step = _text(member).partition("|")
                waiting.append((run, step, max(0.0, float(score) / 1000 - now)))
            if kind == CONCURRENCY:
                used = int(self.client.zcount(self.keys.slots(name), now * 1000, "+inf"))
                found.append(LimitUse(name, kind, spec, used, waiting, used, burst))
                continue
            raw = self.client.get(self.keys.rate(name))
            ahead = (float(raw) - now * 1000) if raw else 0.0
            counted = max(0, int(-(-ahead // interval_ms))) if interval_ms else 0
            # GCRA keeps no list of starts: what it counts now, less the turns reserved by
            # steps still to come back, is what started within the window (the burst at most).
            reserved = sum(1 for _, _, seconds in waiting if seconds > 0)
            made = None if burst is None else min(burst, max(0, counted - reserved))
            found.append(LimitUse(name, kind, spec, counted, waiting, made, burst, period))
        return found

    def now(self) -> float:
        """Redis's clock in seconds (the limits' scores are in its milliseconds)."""
        seconds, micros = self.client.time()
        return float(seconds) + float(micros) / 1e6


def _spec(text: str, interval: float, burst: int, period: float | None) -> str:
    return json.dumps([text, interval * 1000, burst, period])


def _decoded(raw: Any) -> tuple[str, float, int | None, float | None]:
    """A spec record: ``(text, interval ms, burst, period s)``. A record of an older release
    (the bare text; ``[text, interval ms]``) reads without what it lacks until the limit's
    next admission writes it again."""
    text = _text(raw)
    try:
        spec, interval_ms, *rest = json.loads(text)
        burst = int(rest[0]) if rest and rest[0] is not None else None
        period = float(rest[1]) if len(rest) > 1 and rest[1] is not None else None
        return str(spec), float(interval_ms), burst, period
    except (ValueError, TypeError):
        return text, 0.0, None, None


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
