"""The Redis checkpoint store (key layout: :mod:`runner.store.keys`).

It implements :class:`~runner.store.base.DeploymentStore`: beside the history it keeps
the dispatch markers and step leases of the engine on workers (and, through
:class:`~runner.store.deployment.DeploymentRecords`, the deployment's limits, queue
consumers, timers and schedules). A commit is one EVALSHA
of :data:`~runner.store.scripts.COMMIT` (its arguments a
:class:`~runner.store.base.CommitRequest`): one round trip, atomic, idempotent per
activation, dropping the step's lease, marking the next steps dispatched, publishing their
messages (the outbox) and, when the step ends the run, writing the run's closing checkpoint.

A checkpoint costs what its step changed: the state of a checkpoint over
:data:`INLINE_BYTES` is stored by top-level field, each value once per version, and each
checkpoint lists its fields' versions (a smaller one goes whole inside the snapshot). The
provider remembers the field digests and versions of the latest checkpoint it read or
wrote for a run (a small per-process cache), and a commit based on that checkpoint sends
only the fields whose encoding changed (and the field list); the script refuses a change
whose base is not the run's latest checkpoint, and the commit is sent again whole. Any
kept checkpoint reads back whole exactly as committed; reading the latest state is one
round trip.

Other reads are single commands, one pipeline or two. Redis errors are wrapped at this
edge: an unreachable server is :class:`~runner.errors.StoreUnavailable` naming the
(password-masked) URL.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import math
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import redis
from pydantic_core import to_json
from redis.cluster import RedisCluster

from runner.embedded import mask_url
from runner.errors import (
    CheckpointNotFound,
    CommitConflict,
    CorruptCheckpoint,
    RunNotFound,
    StaleAttempt,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from runner.store import codec as codecs
from runner.store import connection, pools, scripts
from runner.store._common import (
    SERIALIZATION_ERRORS,
    conflict,
    decode,
    decode_info,
    forked,
    not_serializable,
    run_info_after,
    run_info_updated,
)
from runner.store.base import (
    OUTBOX_COMMANDS,
    BeginOutcome,
    Begun,
    CommitRequest,
    Coordination,
    OutboxCommand,
    latest_readable,
)
from runner.store.deployment import DeploymentRecords
from runner.store.expiry import RetentionRecords
from runner.store.keys import CLUSTER_SHARDS, Keys, match_prefix
from runner.store.models import Checkpoint, RunInfo, RunStatus
from runner.store.pending import PendingFeedbackStore
from runner.store.streams import StreamRecords

if TYPE_CHECKING:
    from runner.store.memory import StoreMemory

T = TypeVar("T")

_EXCLUDE_SEQ = {"seq"}
_EXCLUDE = {"seq", "state"}
INLINE_BYTES = 16 * 1024
"""A checkpoint whose JSON is smaller is written whole, its state inside the snapshot:
below it, storing the state by field costs more bookkeeping than the bytes it saves. A run
whose latest checkpoint was stored by field goes on by field."""
_READ_ONLY = ("", "", "0", "0")
"""The arguments of :data:`~runner.store.scripts.BEGIN_STEP` that only read the latest
checkpoint (no activation, so no lease)."""
_BASES_KEPT = 1024
"""Runs whose latest field digests a provider remembers (least recently used go first)."""
_INFO_FIELDS = frozenset(RunInfo.model_fields)
_LISTED = ("version", "child_of", "child_runs", "not_before")
"""Metadata a listing of runs selects and shows by, which each commit copies from its
checkpoint (an earlier version's records lack it: :meth:`RedisProvider.upgrade`)."""
_EVERY_COMMIT = ("event", "step", "error", "flow", *_LISTED)
"""Metadata set by every commit besides what the script sets (seq, latest, status, updated_at)."""
_NEW_RUN = ("name", "parent_run_id", "parent_checkpoint_id", "branch")
"""Metadata set when a commit creates the run besides the script's (run_id, created_at)."""


_live: weakref.WeakSet[RedisProvider] = weakref.WeakSet()
"""Every provider of this process (:meth:`RedisProvider.live`)."""


class RedisProvider(DeploymentRecords, RetentionRecords, PendingFeedbackStore, StreamRecords):
    """Checkpoint store on Redis or Redis Cluster; see :class:`~runner.store.base.CoordinatedStore`.

    A ``redis+cluster://`` URL or a ``redis.cluster.RedisCluster`` client selects the
    cluster layout (:data:`~runner.store.keys.CLUSTER_SHARDS` index shards).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | RedisCluster | None = None,
        prefix: str | None = None,
        max_checkpoints: int | None = None,
        patient: bool = False,
        codec: codecs.Codec | None = None,
    ) -> None:
        """Every command waits up to ``RUNNER_STORE_RETRY`` seconds for a restarting Redis or
        a Sentinel failover (see :func:`_connect`), then reports it. ``patient`` (workers: a
        commit short of its replicas is sent again by its task) asks ``WAIT`` once.
        ``codec`` seals the payloads written (default: ``RUNNER_ENCRYPTION_KEYS``'s, if set;
        see :mod:`runner.store.codec`)."""
        from runner.settings import get_settings

        settings = get_settings()
        if client is None:
            if url is None:
                from runner.embedded import resolve_redis_url

                url = resolve_redis_url(settings.redis_url)
            client = _connect(url)
        self.url = url or pools.client_url(client)
        self.client: Any = client
        self.cluster = isinstance(client, RedisCluster)
        """The store is on a Redis Cluster."""
        shards = CLUSTER_SHARDS if self.cluster else 0
        self.keys = Keys(prefix if prefix is not None else settings.prefix, shards)
        self.max_checkpoints = (
            settings.max_checkpoints if max_checkpoints is None else max_checkpoints
        )
        wait, sentinel = settings.redis_wait_replicas, connection.is_sentinel(self.url)
        self.wait_replicas = (1 if sentinel else 0) if wait is None else wait
        """Replicas each commit waits for (``WAIT``) before it counts as done."""
        self.wait_timeout = settings.redis_wait_timeout
        self.wait_patience = 0.0 if patient else settings.store_retry
        """Seconds a commit short of its replicas asks again (a producer during a failover:
        ``RUNNER_STORE_RETRY``; a worker's commit is sent again by its task instead)."""
        self.max_bytes, self.high_water = settings.store_max_bytes, settings.store_high_water
        """``RUNNER_STORE_MAX_BYTES`` and ``RUNNER_STORE_HIGH_WATER`` (see :meth:`check_room`)."""
        self.codec = codec if codec is not None else codecs.of_settings(settings)
        """Seals and opens payloads (``None``: written clear; a sealed one read is an
        :class:`~runner.errors.EncryptionKeyError` naming its key)."""
        self._commit = client.register_script(scripts.COMMIT)
        self._prune = client.register_script(scripts.PRUNE)
        self._update = client.register_script(scripts.UPDATE_RUN)
        self._delete = client.register_script(scripts.DELETE_RUN)
        self._begin = client.register_script(scripts.BEGIN_STEP)
        self._claim = client.register_script(scripts.CLAIM)
        self._renew = client.register_script(scripts.RENEW)
        self._take_over = client.register_script(scripts.TAKE_OVER)
        self._release = client.register_script(scripts.RELEASE)
        self._upgrade = client.register_script(scripts.UPGRADE_RUN)
        self._bases: OrderedDict[str, _Base] = OrderedDict()
        self._bases_lock = threading.Lock()
        _live.add(self)  # reset in a forked child: :meth:`after_fork`

    # -- writes ----------------------------------------------------------------------------

    def commit(
        self,
        checkpoint: Checkpoint,
        *,
        expected_seq: int | None = None,
        max_checkpoints: int | None = None,
    ) -> Checkpoint:
        """Write ``checkpoint`` as the run's next one (:meth:`commit_request` of it alone)."""
        return self.commit_request(CommitRequest(checkpoint, expected_seq, max_checkpoints))

    def commit_request(self, request: CommitRequest) -> Checkpoint:
        """Write ``request.checkpoint`` and all the request says in one atomic round trip (one
        EVALSHA of :data:`~runner.store.scripts.COMMIT`): the step's lease dropped, its
        ``dispatching`` marked (so a redelivered commit never sends them again), each under
        the ``sender``'s soft lease until the broker has it, the ``outbox``'s messages
        published, and the run's ``closing`` checkpoint written next. An outbox runs on this
        same Redis only, so never on a Cluster (:class:`StoreError`). An ``announce`` of a
        stopped run is one more PUBLISH of the script (on a Cluster, or when commits wait for
        replicas, one after the commit).

        When commits wait for replicas, a commit whose node was demoted before its ``WAIT``
        (a Sentinel group whose failover changed its mind, or an old primary back as a
        replica) is sent again to the group's primary of now, unless its checkpoint is
        there already (the write reached the new primary before the demotion): the write
        may have gone with the demoted node's data, or not."""
        ckpt = request.checkpoint
        deadline = time.monotonic() + self.wait_patience
        demoted = False
        while True:
            try:
                if demoted and (found := self._read(ckpt.run_id, [ckpt.id])):
                    self._replicated(ckpt.run_id)
                    return found[0]
                return self._commit_once(request)
            except _Demoted:
                demoted = True
                self._forget(ckpt.run_id)
                self.client.connection_pool.disconnect()  # its next connects ask the sentinels
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"Redis at {mask_url(self.url)} has no primary to commit to: the node "
                        f"written to became a replica (a Sentinel failover)",
                        url=mask_url(self.url),
                    ) from None
                time.sleep(0.1)

    def _commit_once(self, request: CommitRequest) -> Checkpoint:
        ckpt, run = request.checkpoint, request.checkpoint.run_id
        stopped = _stopped(request)
        told = stopped is not None and not self.cluster and not self.wait_replicas
        if told:  # a waiter is told in the commit's round trip, never before it lands
            assert stopped is not None
            notice = ("publish", self.keys.stopped(run), stopped.value)
            request = request._replace(outbox=[*request.outbox, notice])
        keys = [*self._commit_keys(run), *_outbox_keys(request.outbox, self.cluster)]
        now = time.time()
        base = self._base(run)
        # A run seen by field goes on so.
        state = _State.of(ckpt, by_field=base is not None, codec=self.codec)
        closing = "" if request.closing is None else _body(request.closing, state, self.codec)
        for whole in (base is None, True):
            delta = state.delta(None if whole else base)
            args = _commit_args(
                request, now, self.max_checkpoints, state, delta, closing, self.codec
            )
            reply = self._call(self._commit, keys, args)
            if reply[0] != b"rebase":
                break
        outcome, value = reply[0].decode(), reply[1].decode()
        if outcome in ("ok", "dup") and self.wait_replicas:
            self._replicated(run)
        if stopped is not None and outcome == "ok" and not told:
            self.notify_stopped(run, stopped)
        if outcome == "ok":
            seq = int(value)
            if state.inline:
                self._forget(run)
            else:  # the run's latest is now the closing checkpoint, if any, of the same state
                made = [seq if v == -1 else v for v in delta.versions]
                versions = dict(zip(state.values, made, strict=True))
                self._remember(run, (request.closing or ckpt).id, state.digests, versions)
            return ckpt.model_copy(update={"seq": seq})
        if outcome == "dup":
            done = self._get_in_run(run, value, default=ckpt)
            if request.announce and done.status is not RunStatus.RUNNING:
                self.notify_stopped(run, done.status)  # as the first commit did
            return done
        if outcome == "stale":
            raise StaleAttempt(
                f"step {ckpt.activation} of run {run} was already committed "
                f"by another attempt (checkpoint {value})",
                run_id=run,
                activation=ckpt.activation,
                checkpoint_id=value,
            )
        assert request.expected_seq is not None
        raise conflict(run, request.expected_seq, int(value))

    def _replicated(self, run: str) -> None:
        """Wait until :attr:`wait_replicas` replicas have every write so far (the commit's
        included), so a failover to one of them cannot lose it; :class:`StoreUnavailable`
        if they do not within :attr:`wait_timeout` (the commit, idempotent, is sent again)."""
        want, ms = self.wait_replicas, int(self.wait_timeout * 1000)
        deadline = time.monotonic() + self.wait_patience
        while True:  # a producer waits for a failover's new primary to get its replica back
            try:
                got = int(self._guard(lambda: self.client.execute_command("WAIT", want, ms)))
            except StoreError as exc:
                if _REPLICA_REFUSES_WAIT in str(exc):
                    raise _Demoted from None
                raise
            if got >= want or time.monotonic() >= deadline:
                break
        if got < want:
            raise StoreUnavailable(
                f"a commit of run {run} reached {got} of {want} Redis replicas in "
                f"{self.wait_timeout} s (RUNNER_REDIS_WAIT_REPLICAS): not yet durable",
                url=mask_url(self.url),
            )

    def _commit_keys(self, run: str) -> list[str]:
        k = self.keys
        return [
            k.meta(run),
            k.history(run),
            k.snapshots(run),
            k.attempts(run),
            k.acts(run),
            k.pins(run),
            k.leases(run),
            k.owners(run),
            k.dispatched(run),
            k.runs_of(run),
            k.checkpoints_of(run),
            k.active_of(run),
            k.values(run),
            k.refs(run),
            k.ended_of(run),
        ]

    def update_run(self, run_id: str, **fields: Any) -> RunInfo:
        """Set metadata fields of an existing run (``RunNotFound`` if none)."""
        # The shared rule first: an unknown field or a bad value is a StoreError, unwritten.
        checked = run_info_updated(RunInfo(run_id=run_id), fields)
        encoded = {key: _field(getattr(checked, key)) for key in fields}
        _seal_meta(self.codec, run_id, encoded)
        ok = self._call(
            self._update,
            [
                self.keys.meta(run_id),
                self.keys.runs_of(run_id),
                self.keys.active_of(run_id),
                self.keys.ended_of(run_id),
            ],
            [run_id, repr(time.time()), json.dumps(encoded)],
        )
        if not ok:
            raise RunNotFound(f"no run {run_id}", run_id=run_id)
        info = self.run(run_id)
        assert info is not None
        return info

    def delete_run(self, run_id: str) -> bool:
        """Remove a run and every checkpoint of it."""
        k = self.keys
        keys = k.of_run_deleted(run_id)
        self._forget(run_id)
        return bool(self._call(self._delete, keys, [run_id]))

    def prune(self, run_id: str, keep: int, *, dry_run: bool = False) -> list[str]:
        """Delete all but the newest ``keep`` checkpoints, sparing fork points."""
        k = self.keys
        gone = self._call(
            self._prune,
            [
                k.history(run_id),
                k.snapshots(run_id),
                k.checkpoints_of(run_id),
                k.acts(run_id),
                k.attempts(run_id),
                k.dispatched(run_id),
                k.refs(run_id),
                k.values(run_id),
                k.pins(run_id),
            ],
            [max(keep, 1), "1" if dry_run else "0"],
        )
        return [item.decode() for item in gone]

    def upgrade(self) -> int:
        """Move snapshots an earlier version wrote (one string key each, ``P:{R}:ckpt:<id>``)
        into the runs' snapshot hashes; the number moved. Runs that ended before retention
        existed join its index (:meth:`index_ended`). Safe to run again."""
        moved = 0
        every = self._every_run()
        for run_id in every:
            ids = [raw.decode() for raw in self._history_ids(run_id)]
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                old = [self.keys.run(run_id, f"ckpt:{cid}") for cid in chunk]
                keys = [self.keys.snapshots(run_id), *old]
                moved += int(self._call(self._upgrade, keys, chunk))
        for start in range(0, len(every), 500):
            self.index_ended(every[start : start + 500])
        self._record_listing(every)
        return moved

    def _record_listing(self, run_ids: list[str]) -> None:
        """Give the records of runs an earlier version wrote what a listing reads from them
        (:data:`_LISTED`, from each run's latest checkpoint). HSETNX: a commit since then
        wrote newer values, which stay."""
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start : start + 500]
            has = self._pipelined([("hexists", self.keys.meta(r), _LISTED[0]) for r in chunk])
            older = [run_id for run_id, there in zip(chunk, has, strict=True) if not there]
            writes: list[tuple[str, ...]] = []
            for run_id, latest in latest_readable(self, older).items():
                if latest is not None:
                    always = _meta_fields(latest, time.time())[0]  # as a commit writes them
                    key = self.keys.meta(run_id)
                    writes += [("hsetnx", key, name, always[name]) for name in _LISTED]
            self._pipelined(writes)

    def _pipelined(self, commands: list[tuple[str, ...]]) -> list[Any]:
        """The replies of ``commands`` (name, args...), sent in one round trip."""

        def send() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for name, *args in commands:
                getattr(pipe, name)(*args)
            return pipe.execute()

        return self._guard(send) if commands else []

    def fork(
        self,
        checkpoint_id: str,
        *,
        new_run_id: str,
        branch: str | None = None,
        state: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Start ``new_run_id`` from a copy of a checkpoint; the source is only pinned."""
        source = self.get(checkpoint_id)
        pins = self.keys.pins(source.run_id)
        self._guard(lambda: self.client.sadd(pins, checkpoint_id))
        try:
            return self.commit(forked(source, new_run_id, branch, state), expected_seq=0)
        except CommitConflict:
            self._guard(lambda: self.client.srem(pins, checkpoint_id))
            raise

    # -- reads -----------------------------------------------------------------------------

    def get(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint with this id (``CheckpointNotFound`` if none)."""

        def lookup() -> list[Any]:
            if not self.keys.shards:
                return [self.client.hget(self.keys.checkpoints, checkpoint_id)]
            pipe = self.client.pipeline(transaction=False)
            for key in self.keys.all_checkpoints():
                pipe.hget(key, checkpoint_id)
            return pipe.execute()

        run = next((found for found in self._guard(lookup) if found is not None), None)
        if run is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id}", checkpoint_id=checkpoint_id)
        return self._get_in_run(run.decode(), checkpoint_id)

    def latest(self, run_id: str) -> Checkpoint | None:
        """The run's newest checkpoint, or ``None``: one round trip."""
        return self._begin_script(run_id, _READ_ONLY).latest

    def latest_each(self, run_ids: Sequence[str]) -> dict[str, Checkpoint | None]:
        """:meth:`latest` of each run, in one round trip (one pipeline of its script; one
        call each on a Redis Cluster, whose pipelines take no scripts)."""
        if self.cluster or len(run_ids) < 2:
            return {run_id: self.latest(run_id) for run_id in run_ids}

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for run_id in run_ids:
                keys = self._begin_keys(run_id)
                pipe.evalsha(self._begin.sha, len(keys), *keys, *_READ_ONLY)
            return pipe.execute(raise_on_error=False)

        found: dict[str, Checkpoint | None] = {}
        for run_id, reply in zip(run_ids, self._guard(fetch), strict=True):
            if isinstance(reply, redis.exceptions.NoScriptError):
                found[run_id] = self.latest(run_id)  # Redis lost its scripts: this loads it
            elif isinstance(reply, Exception):
                with self._wrapped():
                    raise reply
            else:
                found[run_id] = self._begun(run_id, reply).latest
        return found

    def history(self, run_id: str, *, limit: int = 50, offset: int = 0) -> list[Checkpoint]:
        """The run's checkpoints, newest first."""
        if limit <= 0:
            return []
        ids = self._guard(
            lambda: self.client.zrevrange(self.keys.history(run_id), offset, offset + limit - 1)
        )
        return self._read(run_id, [raw.decode() for raw in ids])

    def runs(
        self, *, limit: int = 50, offset: int = 0, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """Runs by last update, newest first (the index sorted set, no scans)."""
        found: list[RunInfo] = []
        start, page = offset if status is None else 0, max(limit, 100)
        skipped = 0
        while len(found) < limit:
            ids = self._page(start, page)
            if not ids:
                break
            for info in self._infos([raw.decode() for raw in ids]):
                if status is not None and info.status != status:
                    continue
                if status is not None and skipped < offset:
                    skipped += 1
                    continue
                found.append(info)
                if len(found) == limit:
                    break
            if len(ids) < page:  # the end of the index: no next page to ask for
                break
            start += page
        return found

    def run(self, run_id: str) -> RunInfo | None:
        """A run's metadata, or ``None``."""
        return next(iter(self._infos([run_id])), None)

    def run_ids(self, prefix: str = "") -> list[str]:
        """Ids of the indexed runs that start with ``prefix`` (SCAN of every index shard,
        never ``KEYS``)."""
        pattern = match_prefix(prefix)
        return self._guard(
            lambda: [
                raw.decode()
                for key in self.keys.all_runs()
                for raw, _score in self.client.zscan_iter(key, match=pattern, count=1000)
            ]
        )

    def checkpoint_ids(self, prefix: str) -> list[str]:
        """Ids of the checkpoints that start with ``prefix`` (HSCAN of the lookup's shards)."""
        pattern = match_prefix(prefix)
        return self._guard(
            lambda: [
                raw.decode()
                for key in self.keys.all_checkpoints()
                for raw, _run in self.client.hscan_iter(key, match=pattern, count=1000)
            ]
        )

    def memory(self) -> list[StoreMemory]:
        """Each Redis server's memory, limit and high-water mark (see :mod:`.memory`)."""
        from runner.store import memory as memories

        limit, high, url = self.max_bytes, self.high_water, mask_url(self.url)
        return self._guard(lambda: memories.read(self.client, self.cluster, url, limit, high))

    def check_room(self, incoming: int = 0) -> None:
        """:class:`StoreFull` if ``incoming`` more bytes take the store past its high-water
        mark (a submit asks before it creates its run)."""
        from runner.store import memory as memories

        memories.check_room(self.memory(), incoming, self.high_water)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()

    @classmethod
    def live(cls) -> list[RedisProvider]:
        """The providers of this process not yet garbage-collected."""
        return list(_live)

    def after_fork(self) -> None:
        """Make this provider a forked child's own (a Celery pool process): a new connection
        pool and a fresh lock, as the parent's may be held by one of its threads at the fork
        (redis-py would then wait for ever). The process's one at-fork hook calls it
        (:mod:`runner.distributed.services`) for every live provider."""
        self._bases_lock = threading.Lock()
        _fresh_pool(self)

    # -- coordination: dispatch markers, leases, locks, stop notices --------------------------

    def begin_attempt(self, run_id: str, key: str, token: str, lease_seconds: float) -> Begun:
        """The run's latest checkpoint and ``key``'s lease for ``token``, in one round trip."""
        now = time.time()
        return self._begin_script(run_id, [key, token, repr(now + lease_seconds), repr(now)])

    def claim(
        self, run_id: str, keys: Sequence[str], token: str, lease_seconds: float
    ) -> list[BeginOutcome]:
        """:meth:`begin_attempt`'s lease rule for each of ``keys``, without reading the run."""
        now = time.time()
        k = self.keys
        names = [k.history(run_id), k.attempts(run_id), k.leases(run_id), k.owners(run_id)]
        args = [token, repr(now + lease_seconds), repr(now), *keys]
        found = [BeginOutcome(raw.decode()) for raw in self._call(self._claim, names, args)]
        return [BeginOutcome.NO_RUN] * len(keys) if found[:1] == [BeginOutcome.NO_RUN] else found

    def mark_dispatched(
        self, run_id: str, keys: Sequence[str], at: float | None = None
    ) -> list[bool]:
        """Mark activations dispatched (``HSETNX``); ``True`` for each newly marked."""
        stamp = repr(time.time() if at is None else at)
        name = self.keys.dispatched(run_id)

        def write() -> list[bool]:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.hsetnx(name, key, stamp)
            return [bool(flag) for flag in pipe.execute()]

        return self._guard(write) if keys else []

    def stamp(self, run_id: str, key: str, at: float | None = None) -> None:
        """Re-date ``key``'s marker: sent again now, or a retry due at ``at``."""
        stamp = repr(time.time() if at is None else at)
        self._guard(lambda: self.client.hset(self.keys.dispatched(run_id), key, stamp))

    def markers(self, run_id: str) -> dict[str, float]:
        """Activation key -> when it was last dispatched."""
        return self.coordination(run_id).markers

    def leases(self, run_id: str) -> dict[str, float]:
        """Activation key -> lease expiry."""
        return self.coordination(run_id).leases

    def coordination(self, run_id: str) -> Coordination:
        """The run's leases and markers, in one round trip."""

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.zrange(self.keys.leases(run_id), 0, -1, withscores=True)
            pipe.hgetall(self.keys.dispatched(run_id))
            return pipe.execute()

        leases, sent = self._guard(fetch)
        return Coordination(
            leases={k.decode(): float(v) for k, v in leases},
            markers={k.decode(): float(v) for k, v in sent.items()},
        )

    def renew(self, run_id: str, key: str, token: str, lease_seconds: float) -> bool:
        """Extend the lease ``token`` holds; ``False`` if it is gone or another's."""
        keys = [self.keys.leases(run_id), self.keys.owners(run_id)]
        return bool(self._call(self._renew, keys, [key, token, repr(time.time() + lease_seconds)]))

    def take_over(self, run_id: str, key: str, dead: str, token: str, lease_seconds: float) -> bool:
        """Move ``key``'s lease from the dead attempt ``dead`` to ``token``."""
        keys = [self.keys.leases(run_id), self.keys.owners(run_id)]
        args = [key, dead, token, repr(time.time() + lease_seconds)]
        return bool(self._call(self._take_over, keys, args))

    def release(self, run_id: str, key: str, token: str) -> bool:
        """Drop the lease if ``token`` still holds it."""
        keys = [self.keys.leases(run_id), self.keys.owners(run_id)]
        return bool(self._call(self._release, keys, [key, token]))

    def release_all(self, held: Sequence[tuple[str, str, str]]) -> None:
        """Drop each ``(run id, key, token)`` lease its token still holds: one pipeline (one
        call each on a Redis Cluster, whose pipelines take no scripts)."""
        if self.cluster:
            for item in held:
                self.release(*item)
            return

        def drop() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for run_id, key, token in held:
                names = (self.keys.leases(run_id), self.keys.owners(run_id))
                pipe.evalsha(self._release.sha, 2, *names, key, token)
            return pipe.execute(raise_on_error=False)

        for item, done in zip(held, self._guard(drop), strict=True):
            if isinstance(done, redis.exceptions.NoScriptError):
                self.release(*item)  # Redis lost its scripts (a restart): this loads it
            elif isinstance(done, Exception):
                with self._wrapped():
                    raise done

    def add_teller(self, run_id: str, token: str, until: float) -> None:
        """Score ``token`` by ``until`` in the run's tellers; the key itself lapses with the
        last word given, so a teller that died leaves nothing behind for long."""
        key = self.keys.tellers(run_id)

        def add() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(key, {token: until})
            pipe.expire(key, max(1, math.ceil(until - time.time())))
            return pipe.execute()

        self._guard(add)

    def drop_teller(self, run_id: str, token: str) -> None:
        """Remove ``token`` from the run's tellers (Redis deletes the key once it is empty)."""
        self._guard(lambda: self.client.zrem(self.keys.tellers(run_id), token))

    def tellers(self, run_id: str, now: float) -> list[str]:
        """Tokens in the run's tellers scored after ``now``."""
        found = self._guard(
            lambda: self.client.zrangebyscore(self.keys.tellers(run_id), f"({now!r}", "+inf")
        )
        return [raw.decode() for raw in found]

    def active_runs(self) -> list[str]:
        """Ids of runs whose status is running."""

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in self.keys.all_active():
                pipe.zrange(key, 0, -1)
            return pipe.execute()

        return [r.decode() for shard in self._guard(fetch) for r in shard]

    def runs_to_check(
        self, committed_before: float, now: float, also: Collection[str] = ()
    ) -> list[str]:
        """Running runs whose last commit is older than ``committed_before``, that have a
        lease expired at ``now``, or that are in ``also``: two round trips, reading no
        checkpoint."""

        def active() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in self.keys.all_active():
                pipe.zrange(key, 0, -1, withscores=True)
            return pipe.execute()

        quiet: list[str] = []
        recent: list[str] = []
        for shard in self._guard(active):
            for raw, at in shard:
                run_id = raw.decode()
                (quiet if at < committed_before or run_id in also else recent).append(run_id)
        if not recent:
            return quiet

        def lapsed() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for run_id in recent:
                pipe.zrangebyscore(self.keys.leases(run_id), "-inf", now, start=0, num=1)
            return pipe.execute()

        return quiet + [
            run_id for run_id, hit in zip(recent, self._guard(lapsed), strict=True) if hit
        ]

    def try_lock(self, name: str, ttl: float) -> bool:
        """Take the deployment-wide lock ``name`` for ``ttl`` seconds unless another holds it."""
        ms = max(1, int(ttl * 1000))
        return bool(self._guard(lambda: self.client.set(self.keys.lock(name), "1", nx=True, px=ms)))

    def notify_stopped(self, run_id: str, status: RunStatus) -> None:
        """Publish the run's new status on its stop channel."""
        self._guard(lambda: self.client.publish(self.keys.stopped(run_id), status.value))

    @contextmanager
    def stop_notices(self, run_id: str) -> Iterator[_StopNotices]:
        """A subscription to the run's stop channel while the block runs."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            self._guard(lambda: pubsub.subscribe(self.keys.stopped(run_id)))
            yield _StopNotices(self, pubsub)
        finally:
            pubsub.close()

    # -- helpers ---------------------------------------------------------------------------

    def _begin_script(self, run_id: str, args: Sequence[str]) -> Begun:
        return self._begun(run_id, self._call(self._begin, self._begin_keys(run_id), args))

    def _begin_keys(self, run_id: str) -> list[str]:
        k = self.keys
        return [
            k.history(run_id),
            k.snapshots(run_id),
            k.attempts(run_id),
            k.leases(run_id),
            k.owners(run_id),
            k.refs(run_id),
            k.values(run_id),
        ]

    def _begun(self, run_id: str, reply: list[Any]) -> Begun:
        """:data:`~runner.store.scripts.BEGIN_STEP`'s reply for ``run_id``, read."""
        blob, outcome, holder, refs, *values = [*reply, None, None]
        found = BeginOutcome(outcome.decode())
        if blob is None:
            return Begun(None, found, "")
        latest = self.read_snapshot(blob, run_id, "")
        if refs is not None:
            pairs = _refs(refs, latest.id)
            names = [name for name, _ in pairs]
            values = self._open_values(run_id, latest.id, names, values[: len(names)])
            latest.state = _state(latest.id, names, values)
            digests = dict(zip(names, map(_digest, values), strict=False))
            self._remember(run_id, latest.id, digests, dict(pairs))
        return Begun(latest, found, holder.decode() if holder else "")

    def _page(self, start: int, count: int) -> list[bytes]:
        """Run ids ``start`` .. ``start + count`` of the run index, newest update first."""
        if not self.keys.shards:
            key = self.keys.runs
            return self._guard(lambda: self.client.zrevrange(key, start, start + count - 1))

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in self.keys.all_runs():
                pipe.zrevrange(key, 0, start + count - 1, withscores=True)
            return pipe.execute()

        merged = heapq.merge(*self._guard(fetch), key=lambda pair: -pair[1])
        return [run for run, _ in itertools.islice(merged, start, start + count)]

    def _every_run(self) -> list[str]:
        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in self.keys.all_runs():
                pipe.zrange(key, 0, -1)
            return pipe.execute()

        return [raw.decode() for shard in self._guard(fetch) for raw in shard]

    def _history_ids(self, run_id: str) -> list[bytes]:
        key = self.keys.history(run_id)
        ids: list[bytes] = self._guard(lambda: self.client.zrange(key, 0, -1))
        return ids

    def _infos(self, run_ids: list[str]) -> list[RunInfo]:
        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.hgetall(self.keys.meta(run_id))
            return pipe.execute()

        infos = []
        for run_id, raw in zip(run_ids, self._guard(fetch), strict=True):
            if raw:
                data = {k.decode(): v.decode() for k, v in raw.items()}
                fields = {k: v for k, v in data.items() if v != "" and k in _INFO_FIELDS}
                if "error" in fields:
                    where = codecs.field_context(run_id, "error")
                    what = f"the error of run {run_id}"
                    error = codecs.open_value(self.codec, fields["error"], where, what)
                    fields["error"] = error.decode()
                infos.append(decode_info(fields, run_id, "Redis"))
        return infos

    def _get_in_run(
        self, run_id: str, checkpoint_id: str, default: Checkpoint | None = None
    ) -> Checkpoint:
        found = self._read(run_id, [checkpoint_id])
        if found:
            return found[0]
        if default is not None:
            return default
        raise CheckpointNotFound(f"no checkpoint {checkpoint_id}", checkpoint_id=checkpoint_id)

    def _read(self, run_id: str, ids: list[str]) -> list[Checkpoint]:
        """The checkpoints ``ids`` of a run that exist, whole, in order: two round trips."""
        if not ids:
            return []
        k = self.keys

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(k.snapshots(run_id), ids)
            pipe.hmget(k.refs(run_id), ids)
            return pipe.execute()

        blobs, refs = self._guard(fetch)
        lists = {cid: _refs(raw, cid) for cid, raw in zip(ids, refs, strict=True) if raw}
        wanted = sorted({f"{v}:{name}" for pairs in lists.values() for name, v in pairs})
        found: dict[str, bytes | None] = {}
        if wanted:
            got = self._guard(lambda: self.client.hmget(k.values(run_id), wanted))
            found = dict(zip(wanted, got, strict=True))
        out = []
        for cid, blob in zip(ids, blobs, strict=True):
            if blob is None:
                continue
            ckpt = self.read_snapshot(blob, run_id, cid)
            if cid in lists:
                names = [name for name, _ in lists[cid]]
                values = [found[f"{v}:{name}"] for name, v in lists[cid]]
                ckpt.state = _state(cid, names, self._open_values(run_id, cid, names, values))
            out.append(ckpt)
        return out

    # -- sealed payloads (see runner.store.codec) ------------------------------------------

    def read_snapshot(self, blob: bytes, run_id: str, checkpoint_id: str) -> Checkpoint:
        """A stored snapshot of run ``run_id`` (``checkpoint_id``: ``""`` for its latest), its
        sealed part opened."""
        what = f"checkpoint {checkpoint_id or '(the latest)'} of run {run_id}"
        try:
            data = codecs.open_snapshot(self.codec, blob, run_id, what)
        except ValueError as exc:
            raise CorruptCheckpoint(
                f"{what} in Redis cannot be decoded: {exc}", checkpoint_id=checkpoint_id
            ) from None
        return decode(blob if data is None else data, checkpoint_id, "Redis")

    def _open_values(
        self, run_id: str, checkpoint_id: str, names: list[str], values: list[Any]
    ) -> list[Any]:
        """State field values as stored (``None`` for a missing one) in clear."""
        if self.codec is None and not any(v is not None and codecs.is_sealed(v) for v in values):
            return values
        return [
            None
            if value is None
            else codecs.open_value(
                self.codec,
                value,
                codecs.field_context(run_id, name),
                f"state field {name!r} of checkpoint {checkpoint_id} of run {run_id}",
            )
            for name, value in zip(names, values, strict=True)
        ]

    # -- the field digests of the latest checkpoint seen, per run ----------------------------

    def _base(self, run_id: str) -> _Base | None:
        with self._bases_lock:
            return self._bases.get(run_id)

    def _remember(
        self,
        run_id: str,
        checkpoint_id: str,
        digests: dict[str, bytes],
        versions: dict[str, int],
    ) -> None:
        with self._bases_lock:
            self._bases[run_id] = _Base(checkpoint_id, digests, versions)
            self._bases.move_to_end(run_id)
            while len(self._bases) > _BASES_KEPT:
                self._bases.popitem(last=False)

    def _forget(self, run_id: str) -> None:
        with self._bases_lock:
            self._bases.pop(run_id, None)

    def _call(self, script: Any, keys: list[str], args: Sequence[Any]) -> Any:
        return self._guard(lambda: script(keys=keys, args=args))

    def _guard(self, fn: Callable[[], T]) -> T:
        with self._wrapped():
            return fn()

    @contextmanager
    def _wrapped(self) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(
                f"Redis at {mask_url(self.url)} is unreachable: {connection.describe(exc)}",
                url=mask_url(self.url),
            ) from None
        except redis.exceptions.OutOfMemoryError:
            raise StoreFull(
                f"Redis at {mask_url(self.url)} is out of memory (maxmemory): the write was "
                f"refused and nothing of it was written",
                url=mask_url(self.url),
            ) from None
        except redis.RedisError as exc:
            raise StoreError(f"Redis error: {exc}") from None


def _connect(url: str) -> Any:
    """A client for ``url``: :func:`runner.store.connection.client` (Cluster, Sentinel, TLS).

    Every client, a worker's as a producer's, retries until Redis answers again within
    ``RUNNER_STORE_RETRY`` seconds (:class:`~runner.store.connection.Patience`: tries at most
    a second apart), so a restart or a Sentinel failover is waited out rather than
    reported. Workers once retried 10 times (about 4 s, less with jitter): a 3 s restart
    then failed the commits of the steps running through it, which ran again only when
    their leases lapsed and a recovery pass re-sent them, 10-15 s after Redis was back."""
    return connection.client(url, retry=connection.patience())


def _field(value: Any) -> str:
    if value is None or value == []:
        return ""
    if isinstance(value, RunStatus):
        return value.value
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)


def _pairs(fields: dict[str, str]) -> list[str]:
    return [item for pair in fields.items() for item in pair]


def _stopped(request: CommitRequest) -> RunStatus | None:
    """The status a commit of ``request`` announces: its last checkpoint's, unless running
    or not asked to."""
    if not request.announce:
        return None
    status = request.checkpoint.status  # the run's, as the script records it
    return None if status is RunStatus.RUNNING else status


def _outbox_keys(outbox: Sequence[OutboxCommand], cluster: bool) -> list[str]:
    """The keys ``outbox`` writes, in order, for the script's KEYS (``StoreError`` if it
    holds another command, or on a Cluster, whose slots the messages' keys are not in)."""
    if not outbox:
        return []
    if cluster:
        raise StoreError("a commit on a Redis Cluster cannot publish messages (no outbox)")
    for command, _, _ in outbox:
        if command not in OUTBOX_COMMANDS:
            raise StoreError(f"a commit's outbox cannot run {command!r}")
    return [target for command, target, _ in outbox if OUTBOX_COMMANDS[command]]


_REPLICA_REFUSES_WAIT = "WAIT cannot be used with replica"
"""Redis's error for a ``WAIT`` sent to a replica: the node the commit reached is no longer
the primary."""


class _Demoted(Exception):
    """The node a commit was written to answered its ``WAIT`` as a replica."""


class _Base(NamedTuple):
    """The latest checkpoint a provider read or wrote for a run: its fields' digests and
    versions."""

    checkpoint_id: str
    digests: dict[str, bytes]
    versions: dict[str, int]


class _State(NamedTuple):
    """How a checkpoint's state is written: inside its snapshot (``inline``) or by field
    (``values``, each field's JSON, and their ``digests``); ``body`` is the snapshot."""

    inline: bool
    body: str
    values: dict[str, bytes]
    digests: dict[str, bytes]

    @classmethod
    def of(cls, checkpoint: Checkpoint, *, by_field: bool, codec: codecs.Codec | None) -> _State:
        """``checkpoint``'s state inline if its snapshot is small (and ``by_field`` is not
        asked), else by field; its payloads sealed by ``codec`` if given."""
        if not by_field:
            body = snapshot_json(checkpoint, True, codec)
            if len(body) < INLINE_BYTES:
                return cls(True, body, {}, {})
        values = _encode_state(checkpoint)
        digests = {name: _digest(value) for name, value in values.items()}
        return cls(False, snapshot_json(checkpoint, False, codec), values, digests)

    def delta(self, base: _Base | None) -> _Delta:
        """What a commit writes of the state: the fields changed since ``base`` (the run's
        latest checkpoint as this provider last saw it), or all of them."""
        if self.inline:
            return _Delta("", [], [])
        if base is None:
            return _Delta("", list(self.values), [-1] * len(self.values))
        changed = [n for n, d in self.digests.items() if base.digests.get(n) != d]
        fresh = set(changed)
        versions = [-1 if n in fresh else base.versions[n] for n in self.values]
        return _Delta(base.checkpoint_id, changed, versions)


class _Delta(NamedTuple):
    """The state a commit writes: changed fields, the others' versions (``-1``: written now),
    based on checkpoint ``base`` (``""``: the whole state)."""

    base: str
    changed: list[str]
    versions: list[int]


def _commit_args(
    request: CommitRequest,
    now: float,
    default_keep: int,
    state: _State,
    delta: _Delta,
    closing: str,
    codec: codecs.Codec | None = None,
) -> list[Any]:
    """The COMMIT script's ARGV for ``request`` (see its header), payloads sealed by
    ``codec`` if given (the script reads none of them)."""
    ckpt = request.checkpoint
    always, once = _meta_fields(ckpt, now)
    _seal_meta(codec, ckpt.run_id, always)
    keep = default_keep if request.max_checkpoints is None else request.max_checkpoints
    header: dict[str, Any] = {
        "id": ckpt.id,
        "run": ckpt.run_id,
        "status": ckpt.status.value,
        "epoch": str(ckpt.meta.epoch),
        "activation": ckpt.activation or "",
        "attempt": ckpt.attempt or "",
        "expected": "" if request.expected_seq is None else str(request.expected_seq),
        "keep": max(keep, 0),
        "now": repr(now),
        "always": _pairs(always),
        "once": _pairs(once),
        "dispatching": list(request.dispatching),
        "base": delta.base,
        "names": "" if state.inline else json.dumps(list(state.values)),
        "versions": json.dumps(delta.versions, separators=(",", ":")),
        "changed": delta.changed,
        "sender": request.sender,
        "sender_until": repr(now + request.sender_lease),
        "outbox": [[command, target] for command, target, _ in request.outbox],
        "closing": "",
        "carried": list(request.carried),
        "released": list(request.released or ("", "")),
    }
    if request.closing is not None:
        closing_always = _meta_fields(request.closing, now)[0]
        _seal_meta(codec, ckpt.run_id, closing_always)
        header["closing"] = {"id": request.closing.id, "always": _pairs(closing_always)}
    values: Iterator[str | bytes] = (state.values[name] for name in delta.changed)
    if codec is not None:
        values = (
            codec.seal(state.values[name], codecs.field_context(ckpt.run_id, name))
            for name in delta.changed
        )
    return [
        json.dumps(header, ensure_ascii=False, separators=(",", ":")),
        state.body,
        closing,
        *values,
        *(value for _, _, value in request.outbox),
    ]


def _dump(checkpoint: Checkpoint, exclude: Any = None, include: Any = None) -> str:
    """The checkpoint's JSON, ``exclude``/``include`` as pydantic takes them."""
    try:
        return checkpoint.model_dump_json(exclude=exclude, include=include)
    except SERIALIZATION_ERRORS as exc:
        raise not_serializable(checkpoint, exc) from None


def snapshot_json(checkpoint: Checkpoint, inline: bool, codec: codecs.Codec | None) -> str:
    """The snapshot JSON without its opening ``{`` (the script writes ``{"seq":N,`` there),
    its state inside if ``inline``; with a ``codec``, its payloads (:data:`codecs.PAYLOAD`)
    taken out and put back sealed, as ``"sealed":"enc:..."``."""
    if codec is None:
        return _dump(checkpoint, _EXCLUDE_SEQ if inline else _EXCLUDE)[1:]
    clear = _dump(checkpoint, exclude=codecs.CLEAR_EXCLUDE)
    secret = _dump(checkpoint, include=codecs.PAYLOAD if inline else codecs.PAYLOAD_BY_FIELD)
    where = codecs.snapshot_context(checkpoint.run_id, checkpoint.id)
    return f'{clear[1:-1]},"sealed":"{codec.seal(secret.encode(), where)}"}}'


def _body(checkpoint: Checkpoint, state: _State, codec: codecs.Codec | None) -> str:
    """:func:`snapshot_json` of a checkpoint stored as ``state`` is (the run's closing one)."""
    return snapshot_json(checkpoint, state.inline, codec)


def _seal_meta(codec: codecs.Codec | None, run_id: str, fields: dict[str, str]) -> None:
    """Seal the metadata fields that hold a payload (the error's text) in place."""
    if codec is not None and fields.get("error"):
        where = codecs.field_context(run_id, "error")
        fields["error"] = codec.seal(fields["error"].encode(), where)


def _encode_state(checkpoint: Checkpoint) -> dict[str, bytes]:
    """Each state field's JSON, in the state's order."""
    try:
        return {name: to_json(value) for name, value in checkpoint.state.items()}
    except SERIALIZATION_ERRORS as exc:
        raise not_serializable(checkpoint, exc) from None


def _digest(value: bytes | None) -> bytes:
    return hashlib.blake2b(value or b"", digest_size=16).digest()


def _refs(raw: bytes, checkpoint_id: str) -> list[tuple[str, int]]:
    """A checkpoint's ``[[names], [versions]]`` as (name, version) pairs."""
    try:
        names, versions = json.loads(raw)
        return list(zip(names, versions, strict=True))
    except (ValueError, TypeError) as exc:
        raise CorruptCheckpoint(
            f"checkpoint {checkpoint_id} in Redis cannot be decoded: its field list: {exc}",
            checkpoint_id=checkpoint_id,
        ) from None


def _state(checkpoint_id: str, names: list[str], values: list[Any]) -> dict[str, Any]:
    """The state of a checkpoint from its field names and their stored JSON values."""
    state = {}
    for name, value in zip(names, values, strict=True):
        if value is None:
            raise CorruptCheckpoint(
                f"checkpoint {checkpoint_id} in Redis cannot be decoded: "
                f"the value of state field {name!r} is missing",
                checkpoint_id=checkpoint_id,
            )
        try:
            state[name] = json.loads(value)
        except ValueError as exc:
            raise CorruptCheckpoint(
                f"checkpoint {checkpoint_id} in Redis cannot be decoded: state field {name!r}: "
                f"{exc}",
                checkpoint_id=checkpoint_id,
            ) from None
    return state


def _meta_fields(ckpt: Checkpoint, now: float) -> tuple[dict[str, str], dict[str, str]]:
    """The metadata hash fields a commit sets: every time, and only when it creates the run.

    Both come from :func:`run_info_after` (the rule every provider shares), read as if the
    commit created the run; ``seq`` and ``latest`` are the script's to set.
    """
    info = run_info_after(ckpt, None, now).model_dump(exclude={"seq", "latest"})
    always = {name: _field(info[name]) for name in _EVERY_COMMIT}
    if not info["flow"]:
        del always["flow"]  # a checkpoint without a flow keeps the run's
    once = {name: _field(info[name]) for name in _NEW_RUN if info[name] is not None}
    return always, once


class _StopNotices:
    """:class:`~runner.store.base.StopNotices` on a redis-py pub/sub."""

    def __init__(self, store: RedisProvider, pubsub: Any) -> None:
        self.store, self.pubsub = store, pubsub

    def next(self, timeout: float) -> str | None:
        message = self.store._guard(lambda: self.pubsub.get_message(timeout=timeout))
        if message is None or message.get("type") != "message":
            return None
        data = message["data"]
        return data.decode() if isinstance(data, bytes) else str(data)


def _fresh_pool(provider: RedisProvider) -> None:
    """Give ``provider``'s client a new connection pool (in a forked child)."""
    pools.fresh_pool(provider.client)
