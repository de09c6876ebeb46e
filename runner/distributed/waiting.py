"""What a running run's in-flight steps wait for: a limit (deferred, see :mod:`.limits`) or a
queue no live worker consumes (see :mod:`.routing`). Read by ``runner status``, ``runner
steps``, ``runner limits`` and the console; it reads Redis only (no Celery)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from runner.errors import RunnerError
from runner.flow.loading import load_flow
from runner.settings import RunnerSettings
from runner.store.keys import Keys
from runner.store.models import Checkpoint, RunStatus

from . import routing

RECENT = 2.0
"""A step noted as waiting on a limit counts until this long after it was due to try again
(the note goes when the limit admits it)."""


@dataclass(frozen=True)
class LimitUse:
    """One limit as ``runner limits`` shows it."""

    name: str
    kind: str
    """``rate`` or ``concurrency``."""
    spec: str
    """The rate (``5/s``) or the number of slots."""
    in_use: int
    """Slots taken, or starts counted against the rate now."""
    waiting: list[tuple[str, str, float]]
    """Steps waiting on it: ``(run, step, seconds until it tries again)``."""

    def as_json(self) -> dict[str, Any]:
        """The limit as JSON values."""
        return {
            "name": self.name,
            "kind": self.kind,
            "spec": self.spec,
            "in_use": self.in_use,
            "waiting": [{"run": r, "step": s, "in": round(w, 3)} for r, s, w in self.waiting],
        }


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def now_of(client: redis.Redis) -> float:
    """Redis's clock (the limits' scores are in its milliseconds)."""
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


def limit_uses(client: redis.Redis, keys: Keys) -> list[LimitUse]:
    """Every limit in use, with its use now and the steps waiting on it."""
    now = now_of(client)
    limited = [_text(n) for n in client.zrange(keys.limited(), 0, -1)]
    specs = {_text(k): _text(v) for k, v in client.hgetall(keys.limit_specs()).items()}
    found = []
    for limit in sorted(limited, key=lambda n: n.partition(":")[::-1]):
        kind, _, name = limit.partition(":")
        spec = specs.get(limit, "?")
        if kind == "concurrency":
            used = int(client.zcount(keys.slots(name), now * 1000, "+inf"))
        else:
            raw = client.get(keys.rate(name))
            interval = _interval(spec)
            ahead = (float(raw) - now * 1000) if raw else 0.0
            used = max(0, int(-(-ahead // interval))) if interval else 0
        waiting: list[tuple[str, str, float]] = []
        entries: Any = client.zrangebyscore(
            keys.waiting(limit), (now - RECENT) * 1000, "+inf", withscores=True
        )
        for member, score in entries:
            run, _, step = _text(member).partition("|")
            waiting.append((run, step, max(0.0, float(score) / 1000 - now)))
        found.append(LimitUse(name, kind, spec, used, waiting))
    return found


def _interval(spec: str) -> float:
    """Milliseconds between starts of a rate ``N/s`` (``N/m``, ``N/h``); 0 if unreadable."""
    count, _, unit = spec.partition(" ")[0].partition("/")
    seconds = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(unit)
    return 1000 * seconds / int(count) if seconds and count.isdigit() and int(count) else 0.0


def waits_of(
    client: redis.Redis, keys: Keys, settings: RunnerSettings, latest: Checkpoint
) -> dict[str, str]:
    """In-flight step -> what it waits for, for the steps of a running run that wait."""
    if latest.status is not RunStatus.RUNNING or not latest.in_flight:
        return {}
    found: dict[str, str] = {}
    for use in limit_uses(client, keys):
        for run, step, seconds in use.waiting:
            if run == latest.run_id:
                found[step] = f"limit {use.name} ({use.spec}), tries again in {seconds:.1f}s"
    try:
        graph = load_flow(str(latest.flow)).graph()
    except (RunnerError, ImportError):
        return found  # the flow cannot be imported here: its queues are unknown
    for act in latest.in_flight:
        step = act.rpartition("/")[2]
        spec = graph.methods.get(step.partition("#")[0])
        if spec is None or spec.queue is None or step in found:
            continue
        if routing.unconsumed(client, keys, settings, spec.queue):
            queue = routing.queue_name(settings, spec.queue)
            found[step] = f"queue {spec.queue} ({queue}): no live worker consumes it"
    return found
