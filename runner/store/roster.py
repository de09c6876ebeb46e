"""The workers' roster in Redis: what each worker of a deployment last said about itself. This
module owns the key and its decoding; :mod:`runner.distributed.routing` decides when a worker
writes its record (:meth:`DeploymentStore.announce_queues
<runner.store.base.DeploymentStore.announce_queues>`), :mod:`runner.distributed.fleet` reads
the records (:meth:`~runner.store.base.DeploymentStore.workers`).

Keys (``P`` the prefix):

=========================  ======  ==============================================================
key                        type    holds
=========================  ======  ==============================================================
``P:{flow}:workers``       hash    worker name -> its last record (JSON: :class:`WorkerRecord`)
=========================  ======  ==============================================================

A runner worker writes its record when it is ready and every recovery interval after, in the
same round trip as its queues' consumers (:mod:`.queues`), and its record is dropped with its
word on its queues at a warm shutdown. A record holds ``at`` (when it was written, Unix
seconds: the worker's last heartbeat), ``until`` (when it lapses unless written again), the
queues it consumes and what the worker says of itself (:class:`WorkerFacts`: the queues its
flows route to, its pid and host, the runner's and Celery's versions and the code versions of
the app it runs). A record written before ``app`` was known reads as no app version.

A worker killed without a warm shutdown leaves its record: it reads as lapsed, and is dropped
once it lapsed more than :data:`FORGET_AFTER` ago by the next worker that starts
(:meth:`~runner.store.base.DeploymentStore.forget_dead_workers`); the whole hash expires when
no worker has written it for four of its lapses.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeGuard

from .keys import Keys

FORGET_AFTER = 3600.0
"""Seconds after its lapse when a dead worker's record is dropped."""


class WorkerFacts(NamedTuple):
    """What a worker says of itself beside the queues it consumes."""

    routes: tuple[str, ...] = ()
    """The broker queues its flows route to (a queue nobody consumes is known that way)."""
    pid: int | None = None
    host: str | None = None
    runner: str | None = None
    """The runner's version."""
    celery: str | None = None
    """Celery's version."""
    app: tuple[str, ...] = ()
    """The code versions of the app it runs (``RUNNER_APP_VERSION``, else each of its flows'
    hashes: :func:`runner.distributed.routing.worker_versions`), whose queue twins
    ``<queue>@<version>`` it consumes."""


class WorkerRecord(NamedTuple):
    """A worker's last record in the roster."""

    name: str
    queues: tuple[str, ...]
    """The broker queues it consumes."""
    facts: WorkerFacts
    at: float
    """When it was written (Unix seconds): the worker's last heartbeat."""
    until: float
    """When it lapses unless written again."""

    def live(self, now: float) -> bool:
        """Whether its word has not lapsed at ``now``."""
        return self.until >= now


def encode(queues: Sequence[str], facts: WorkerFacts, at: float, until: float) -> str:
    """A record's JSON (the hash's value)."""
    return json.dumps(
        {
            "queues": list(queues),
            "routes": list(facts.routes),
            "pid": facts.pid,
            "host": facts.host,
            "runner": facts.runner,
            "celery": facts.celery,
            "app": list(facts.app),
            "at": at,
            "until": until,
        },
        sort_keys=True,
    )


def decode(name: str, raw: Any) -> WorkerRecord | None:
    """The record of ``name`` from its JSON; ``None`` for one that is not a JSON object with
    numeric ``at`` and ``until`` (a field of the wrong type reads as unknown)."""
    try:
        body = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    at, until = body.get("at"), body.get("until")
    if not _number(at) or not _number(until):
        return None
    facts = WorkerFacts(
        routes=_names(body.get("routes")),
        pid=body["pid"] if isinstance(body.get("pid"), int) else None,
        host=_text(body.get("host")),
        runner=_text(body.get("runner")),
        celery=_text(body.get("celery")),
        app=_names(body.get("app")),
    )
    return WorkerRecord(name, _names(body.get("queues")), facts, float(at), float(until))


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _names(value: Any) -> tuple[str, ...]:
    return tuple(sorted(str(q) for q in value)) if isinstance(value, list) else ()


class Roster:
    """The workers' records of a deployment in its Redis (``client`` and ``keys`` of one
    store)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client, self.keys = client, keys

    def write(
        self, pipe: Any, worker: str, queues: Sequence[str], facts: WorkerFacts, ttl: float
    ) -> None:
        """Queue on ``pipe`` the writing of ``worker``'s record (``at`` now, lapsing in
        ``ttl`` seconds), for its ``execute``."""
        now = time.time()
        pipe.hset(self.keys.workers(), worker, encode(queues, facts, now, now + ttl))
        pipe.expire(self.keys.workers(), max(1, int(ttl * 4)))

    def remove(self, pipe: Any, worker: str) -> None:
        """Queue on ``pipe`` the dropping of ``worker``'s record (it stops)."""
        pipe.hdel(self.keys.workers(), worker)

    def all(self) -> list[WorkerRecord]:
        """Every readable record, lapsed ones too, by worker name."""
        found = []
        for name, raw in self.client.hgetall(self.keys.workers()).items():
            record = decode(name.decode() if isinstance(name, bytes) else str(name), raw)
            if record is not None:
                found.append(record)
        return sorted(found, key=lambda r: r.name)

    def forget_dead(self, older_than: float) -> list[str]:
        """Drop the records that lapsed more than ``older_than`` seconds ago; their names."""
        cutoff = time.time() - older_than
        dead = [r.name for r in self.all() if r.until < cutoff]
        if dead:
            self.client.hdel(self.keys.workers(), *dead)
        return dead
