"""Every Redis key the runner uses, built in one place.

Layout (``P`` is the deployment prefix, default ``runner``; ``{T}`` is the run's hash tag,
so every key of one run lives in one Redis Cluster slot):

=========================  ======  ===========================================================
key                        type    holds
=========================  ======  ===========================================================
``P:{T}:meta``             hash    run metadata (:class:`RunInfo` fields) and its ``epoch``
``P:{T}:history``          zset    checkpoint ids scored by sequence number
``P:{T}:snaps``            hash    checkpoint id -> snapshot JSON (the state inside when small)
``P:{T}:values``           hash    ``<version>:<field>`` -> a state field's JSON value
``P:{T}:refs``             hash    checkpoint id -> ``[[field names], [versions]]`` of its state
``P:{T}:attempts``         hash    activation -> ``token|checkpoint id`` (idempotency, fencing)
``P:{T}:acts``             hash    checkpoint id -> the activation it committed (trimming)
``P:{T}:pins``             set     checkpoint ids a fork points to (never pruned)
``P:{T}:dispatched``       hash    activation -> when it was last sent (or its retry is due)
``P:{T}:leases``           zset    running activations scored by lease expiry
``P:{T}:owners``           hash    activation -> attempt token holding its lease
``P:{T}:tellers``          zset    attempts telling a committed step's events, by when their
                                   word lapses (the run's closing event waits for them)
``P:{T}:stopped``          channel pub/sub: the run's new status when it stops running
``P:{T}:stream``           stream  the run's live output: one entry per chunk (step, attempt,
                                   channel, type, JSON payload, writing run), capped
``P:{T}:stream-attempts``  hash    step -> its newest attempt's number; ``step|writer`` -> the
                                   number of that writer's attempt (superseded = not newest)
``P:[{S}:]runs``           zset    run ids scored by last update (the run index)
``P:[{S}:]ckpts``          hash    checkpoint id -> run id (lookup by checkpoint id)
``P:[{S}:]active``         zset    run ids whose status is ``running`` (recovery scans it)
``P:[{S}:]ended``          zset    finished runs whose expiry is not decided yet, by end time
``P:[{S}:]expires``        zset    finished runs scored by when they expire (``inf``: kept)
``P:{time}:deadlines``     zset    run ids scored by their deadline (recovery cancels them)
``P:{time}:starts``        zset    run ids scored by their delayed start (recovery sends them)
``P:{time}:answers``       zset    run ids scored by their ``ask`` deadline (recovery answers)
``P:{time}:schedules``     hash    schedule name -> its definition (JSON: flow, inputs, cron)
``P:{time}:ticks``         hash    schedule name -> the time of its next tick not yet fired
``P:<name>-lock``          string  a deployment-wide lock (``recover``: the recovery pass)
``P:rekey``                hash    ``runner rekey``'s progress: key id, index shard, cursor
``P:{flow}:rates``         hash    named limit -> its rate (``runner.set_limit``)
``P:{flow}:rate:<L>``      string  limit ``L``'s theoretical arrival time (GCRA), in ms
``P:{flow}:started:<L>``   string  the same clock over ``L``'s starts alone (late turns)
``P:{flow}:slots:<L>``     zset    attempt tokens holding a slot of ``L`` by lease expiry
``P:{flow}:limited``       zset    every limit ``<kind>:L`` in use, scored by when last used
``P:{flow}:limit-specs``   hash    ``<kind>:L`` -> JSON ``[its rate or slots, interval ms]``
``P:{flow}:waiting:<L>``   zset    ``run|step`` deferred by limit ``<L>`` (``<kind>:L``), by time
``P:{flow}:queue:<Q>``     zset    workers consuming queue ``Q``, scored by when that lapses
``P:{flow}:workers``       hash    worker name -> what it said of itself last (JSON, roster)
=========================  ======  ===========================================================

Each group has one owner, the only module that reads or writes it: the run's keys, the
indexes and the locks :mod:`runner.store.redis` (scripts in :mod:`runner.store.scripts`);
``{flow}:rate*``, ``slots``, ``limited``, ``limit-specs`` and ``waiting``
:mod:`runner.store.limits`; ``{flow}:queue`` :mod:`runner.store.queues`; ``{flow}:workers``
:mod:`runner.store.roster`; ``{time}:deadlines`` / ``starts`` / ``answers``
:mod:`runner.store.timers`; ``{time}:schedules`` / ``ticks`` :mod:`runner.store.schedules`;
``ended`` and ``expires`` :mod:`runner.store.expiry` (the commit script adds a run that ends
to ``ended``); ``rekey`` :mod:`runner.store.rekey`; ``stream`` / ``stream-attempts``
:mod:`runner.store.streams`. Code outside ``runner/store`` reaches them only through
:class:`runner.store.base.DeploymentStore` (``tests/test_boundaries.py`` checks it).

On a single Redis (``shards=0``) the tag ``{T}`` is the run id (``P:{R}:meta``) and the
three indexes are single keys. A state stored by field (see :mod:`runner.store.redis`)
is in ``values``, each version once; ``<version>`` is the seq of the commit that wrote it.
On Redis Cluster (``shards=N``) every run belongs to one of
``N`` shards by a hash of its id; its tag is the shard's (``P:{sK}:R:meta``) and each index
is split into one key per shard, tagged alike (``P:{sK}:runs``). Either way every script
touches the keys of one run and its own shard's index entries: one slot, every key declared.
Reading the whole run list, the checkpoint lookup or the active runs reads every shard
(one pipeline).
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple, Protocol

CLUSTER_SHARDS = 64
"""Index shards on Redis Cluster: runs spread over up to this many slots. Fixed, because
every process of a deployment must agree on it."""


class Keys(NamedTuple):
    """Key builder for one deployment prefix (``shards``: 0 = single Redis)."""

    prefix: str = "runner"
    shards: int = 0

    def shard(self, run_id: str) -> int:
        """The index shard of ``run_id`` (always 0 on a single Redis)."""
        return zlib.crc32(run_id.encode()) % self.shards if self.shards else 0

    def run(self, run_id: str, part: str) -> str:
        """A per-run key: ``P:{run_id}:part``, or ``P:{sK}:run_id:part`` when sharded."""
        if self.shards:
            return f"{self.prefix}:{{s{self.shard(run_id)}}}:{run_id}:{part}"
        return f"{self.prefix}:{{{run_id}}}:{part}"

    def of_run_deleted(self, run_id: str) -> list[str]:
        """Every key a run's delete script touches, in the order its ``KEYS`` header names
        them: meta, history, the run's entries in the shard's indexes (runs, checkpoint
        lookup, active, ended, expires), then every other per-run key (:data:`RUN_PARTS`)."""
        return [
            self.meta(run_id),
            self.history(run_id),
            self.runs_of(run_id),
            self.checkpoints_of(run_id),
            self.active_of(run_id),
            self.ended_of(run_id),
            self.expires_of(run_id),
            *(part(self, run_id) for part in RUN_PARTS),
        ]

    def run_pattern(self, run_id: str) -> str:
        """A SCAN ``MATCH`` pattern of every per-run key of ``run_id``."""
        escaped = _glob_escape(run_id)
        if self.shards:
            return f"{self.prefix}:{{s{self.shard(run_id)}}}:{escaped}:*"
        return f"{self.prefix}:{{{escaped}}}:*"

    def meta(self, run_id: str) -> str:
        """The run's metadata hash."""
        return self.run(run_id, "meta")

    def history(self, run_id: str) -> str:
        """The run's checkpoint history sorted set."""
        return self.run(run_id, "history")

    def snapshots(self, run_id: str) -> str:
        """The run's snapshots: checkpoint id -> JSON."""
        return self.run(run_id, "snaps")

    def values(self, run_id: str) -> str:
        """``<version>:<field>`` -> JSON value, every version a kept checkpoint refers to."""
        return self.run(run_id, "values")

    def refs(self, run_id: str) -> str:
        """Checkpoint id -> its state's field names and their versions."""
        return self.run(run_id, "refs")

    def attempts(self, run_id: str) -> str:
        """Committed activations and their attempt tokens."""
        return self.run(run_id, "attempts")

    def acts(self, run_id: str) -> str:
        """Checkpoint id -> the activation it committed (to trim ``attempts`` when pruned)."""
        return self.run(run_id, "acts")

    def pins(self, run_id: str) -> str:
        """Checkpoint ids protected from pruning."""
        return self.run(run_id, "pins")

    def dispatched(self, run_id: str) -> str:
        """Activations already sent to workers."""
        return self.run(run_id, "dispatched")

    def leases(self, run_id: str) -> str:
        """Running activations by lease expiry."""
        return self.run(run_id, "leases")

    def owners(self, run_id: str) -> str:
        """Attempt tokens holding the leases."""
        return self.run(run_id, "owners")

    def tellers(self, run_id: str) -> str:
        """Attempts telling a committed step's events, by when their word lapses (the run's
        closing event waits for them)."""
        return self.run(run_id, "tellers")

    def stopped(self, run_id: str) -> str:
        """Pub/sub channel told the run's status when it stops running (``RunHandle.wait``)."""
        return self.run(run_id, "stopped")

    def stream(self, run_id: str) -> str:
        """The run's stream of live output (chunks written by its steps while they run)."""
        return self.run(run_id, "stream")

    def stream_attempts(self, run_id: str) -> str:
        """Which attempt of each step wrote the run's stream last (older ones: superseded)."""
        return self.run(run_id, "stream-attempts")

    def lock(self, name: str) -> str:
        """A deployment-wide lock (``recover``: the periodic recovery pass)."""
        return f"{self.prefix}:{name}-lock"

    def rekey(self) -> str:
        """``runner rekey``'s progress, so a run of it that stopped goes on from there."""
        return f"{self.prefix}:rekey"

    # -- flow control: one hash tag for all, so one script checks every limit of a step -------

    def rates(self) -> str:
        """Named limits set for the whole deployment (``runner.set_limit``)."""
        return f"{self.prefix}:{{flow}}:rates"

    def rate(self, limit: str) -> str:
        """A rate limit's theoretical arrival time (GCRA)."""
        return f"{self.prefix}:{{flow}}:rate:{limit}"

    def rate_starts(self, limit: str) -> str:
        """A rate limit's theoretical arrival time counted over its starts alone: turns a
        deferred step reserved but began late do not let late steps start together."""
        return f"{self.prefix}:{{flow}}:started:{limit}"

    def slots(self, limit: str) -> str:
        """A concurrency limit's slots: attempt tokens scored by lease expiry."""
        return f"{self.prefix}:{{flow}}:slots:{limit}"

    def limited(self) -> str:
        """Every limit in use, scored by when it was last used (``runner limits`` reads it)."""
        return f"{self.prefix}:{{flow}}:limited"

    def limit_specs(self) -> str:
        """Each limit in use -> ``rate:5/s`` or ``concurrency:2`` (what it was last set to)."""
        return f"{self.prefix}:{{flow}}:limit-specs"

    def waiting(self, limit: str) -> str:
        """Steps a limit deferred (``run|step``), scored by when they may start."""
        return f"{self.prefix}:{{flow}}:waiting:{limit}"

    def consumers(self, queue: str) -> str:
        """Workers consuming ``queue``, scored by when that lapses unless renewed."""
        return f"{self.prefix}:{{flow}}:queue:{queue}"

    def workers(self) -> str:
        """Worker name -> its last word on itself: queues, routes, versions, when (JSON)."""
        return f"{self.prefix}:{{flow}}:workers"

    # -- time: run timers, one hash tag for all (read by the recovery pass) -------------------

    def timers(self, kind: str) -> str:
        """Run ids scored by when the recovery pass must act on them (``deadlines``, ``starts``)."""
        return f"{self.prefix}:{{time}}:{kind}"

    def schedules(self) -> str:
        """Schedule name -> its definition (JSON)."""
        return f"{self.prefix}:{{time}}:schedules"

    def ticks(self) -> str:
        """Schedule name -> the time of its next tick not yet fired."""
        return f"{self.prefix}:{{time}}:ticks"

    # -- indexes: one key each on a single Redis, one per shard on Redis Cluster ---------------

    def runs_of(self, run_id: str) -> str:
        """The run index (shard) that lists ``run_id``."""
        return self._index(self.shard(run_id), "runs")

    def checkpoints_of(self, run_id: str) -> str:
        """The checkpoint lookup (shard) holding ``run_id``'s checkpoint ids."""
        return self._index(self.shard(run_id), "ckpts")

    def active_of(self, run_id: str) -> str:
        """The active-run index (shard) that lists ``run_id`` while it runs."""
        return self._index(self.shard(run_id), "active")

    def ended_of(self, run_id: str) -> str:
        """The index (shard) of finished runs whose expiry the retention pass has yet to
        decide, scored by when they ended."""
        return self._index(self.shard(run_id), "ended")

    def expires_of(self, run_id: str) -> str:
        """The index (shard) of finished runs scored by when they expire."""
        return self._index(self.shard(run_id), "expires")

    def all_ended(self) -> list[str]:
        """Every shard of the finished runs not yet decided."""
        return self._every("ended")

    def all_expires(self) -> list[str]:
        """Every shard of the expiry index."""
        return self._every("expires")

    def all_runs(self) -> list[str]:
        """Every shard of the run index."""
        return self._every("runs")

    def all_checkpoints(self) -> list[str]:
        """Every shard of the checkpoint lookup."""
        return self._every("ckpts")

    def all_active(self) -> list[str]:
        """Every shard of the active-run index."""
        return self._every("active")

    @property
    def runs(self) -> str:
        """The run index of a single Redis (``shards=0``)."""
        return self._index(0, "runs")

    @property
    def checkpoints(self) -> str:
        """The checkpoint lookup of a single Redis (``shards=0``)."""
        return self._index(0, "ckpts")

    def _index(self, shard: int, name: str) -> str:
        return f"{self.prefix}:{{s{shard}}}:{name}" if self.shards else f"{self.prefix}:{name}"

    def _every(self, name: str) -> list[str]:
        return [self._index(shard, name) for shard in range(max(self.shards, 1))]


RUN_PARTS = (
    Keys.snapshots,
    Keys.attempts,
    Keys.acts,
    Keys.pins,
    Keys.dispatched,
    Keys.leases,
    Keys.owners,
    Keys.tellers,
    Keys.values,
    Keys.stream,
    Keys.stream_attempts,
    Keys.refs,
)
"""Per-run keys besides meta and history (which the delete scripts name first)."""


def match_prefix(text: str) -> str:
    """A SCAN ``MATCH`` pattern of every member or field starting with ``text``."""
    return _glob_escape(text) + "*"


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisHandle(Protocol):
    """What the store's own modules (timers, schedules, limits, queues) are built on: a
    redis-py client and the deployment's key builder, as a :class:`RedisProvider
    <runner.store.redis.RedisProvider>` holds them. Code outside ``runner/store`` never
    uses either; it asks the store (:class:`runner.store.base.DeploymentStore`)."""

    @property
    def client(self) -> Any:
        """The redis-py client."""
        ...

    @property
    def keys(self) -> Keys:
        """The deployment's key builder."""
        ...
