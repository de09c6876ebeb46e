"""Routing records in Redis: which workers consume which queue, until when. This module owns
the key and its decoding; :mod:`runner.distributed.routing` decides where a step goes and
when a worker says what it consumes. A worker's own record in the workers' roster
(:mod:`.roster`) is written and dropped in the same round trip as its word on its queues.

Keys (``P`` the prefix; ``Q`` a broker queue's name):

=========================  ======  ==============================================================
key                        type    holds
=========================  ======  ==============================================================
``P:{flow}:queue:<Q>``     zset    worker names consuming ``Q``, by when that lapses (unix s)
=========================  ======  ==============================================================

A worker's word lapses unless it is said again, so a killed worker stops counting on its own;
the key expires after four of its words' lengths with no worker renewing it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .keys import Keys
from .roster import Roster, WorkerFacts


class QueueBook:
    """The consumers of a deployment's queues in its Redis (``client`` and ``keys`` of one
    store)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self.roster = Roster(client, keys)

    def announce(
        self, queues: Sequence[str], worker: str, ttl: float, facts: WorkerFacts | None = None
    ) -> None:
        """Say that ``worker`` consumes ``queues`` for the next ``ttl`` seconds and, with
        ``facts``, write its record in the roster (:meth:`Roster.write`): one round trip."""
        until = time.time() + ttl
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            pipe.zadd(self.keys.consumers(queue), {worker: until})
            pipe.expire(self.keys.consumers(queue), max(1, int(ttl * 4)))
        if facts is not None:
            self.roster.write(pipe, worker, queues, facts, ttl)
        pipe.execute()

    def retire(self, queues: Sequence[str], worker: str) -> None:
        """``worker`` stops consuming ``queues`` (a warm shutdown); its roster record goes
        with it."""
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            pipe.zrem(self.keys.consumers(queue), worker)
        self.roster.remove(pipe, worker)
        pipe.execute()

    def consumers(self, queue: str) -> list[str]:
        """Workers that said they consume ``queue`` and whose word has not lapsed, by name."""
        found = self.client.zrangebyscore(self.keys.consumers(queue), time.time(), "+inf")
        return sorted(w.decode() if isinstance(w, bytes) else str(w) for w in found)
