"""The workers' roster: what each worker of a deployment last said about itself.

A runner worker writes its record into ``P:{flow}:workers`` (a hash: worker name -> JSON)
when it is ready and every recovery interval after (:func:`runner.distributed.routing.serve`),
and removes it at a warm shutdown. A record holds at least ``at`` (when it was written, Unix
seconds: the worker's last heartbeat) and ``until`` (when it lapses unless written again),
and what the worker chose to say: the queues it consumes, the queues its flows route to, its
versions, its pid. ``runner workers`` and the console's Workers page read it beside Celery's
own answers (:mod:`runner.distributed.fleet`).

A worker killed without a warm shutdown leaves its record: it reads as lapsed, and is
dropped by the next worker that starts once it is older than :data:`FORGET_AFTER`; the whole
hash expires when no worker has written it for four of its lapses.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from .keys import Keys

FORGET_AFTER = 3600.0
"""Seconds after its lapse when a dead worker's record is dropped."""


def write(
    client: redis.Redis | redis.client.Pipeline,
    keys: Keys,
    worker: str,
    record: dict[str, Any],
    ttl: float,
) -> None:
    """Write ``worker``'s ``record`` (with ``at`` now and ``until`` in ``ttl`` seconds);
    on a pipeline, the commands are queued for its ``execute``."""
    now = time.time()
    body = json.dumps({**record, "at": now, "until": now + ttl}, sort_keys=True)
    client.hset(keys.workers(), worker, body)
    client.expire(keys.workers(), max(1, int(ttl * 4)))


def remove(client: redis.Redis | redis.client.Pipeline, keys: Keys, worker: str) -> None:
    """Drop ``worker``'s record (it stops)."""
    client.hdel(keys.workers(), worker)


def read(client: redis.Redis, keys: Keys) -> dict[str, dict[str, Any]]:
    """Every record, by worker name (lapsed ones too: see each one's ``until``); a record
    that is not a JSON object is left out."""
    found: dict[str, dict[str, Any]] = {}
    for name, raw in client.hgetall(keys.workers()).items():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("until"), int | float):
            found[name.decode() if isinstance(name, bytes) else str(name)] = record
    return found


def forget_dead(client: redis.Redis, keys: Keys, older_than: float = FORGET_AFTER) -> list[str]:
    """Drop the records that lapsed more than ``older_than`` seconds ago; their names."""
    cutoff = time.time() - older_than
    dead = [name for name, record in read(client, keys).items() if record["until"] < cutoff]
    if dead:
        client.hdel(keys.workers(), *dead)
    return dead
