"""The Redis checkpoint store (key layout: :mod:`runner.store.keys`).

A commit is one EVALSHA of :data:`~runner.store.scripts.COMMIT`: one round trip,
atomic, idempotent per activation. Reads are single commands or one pipeline.
Redis errors are wrapped at this edge: an unreachable server is
:class:`~runner.errors.StoreUnavailable` naming the (password-masked) URL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import redis
from pydantic import ValidationError
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from runner.embedded import mask_url
from runner.errors import (
    CheckpointNotFound,
    CommitConflict,
    CorruptCheckpoint,
    RunNotFound,
    StaleAttempt,
    StoreError,
    StoreUnavailable,
)
from runner.store import scripts
from runner.store.keys import Keys
from runner.store.models import Checkpoint, RunInfo, RunStatus

T = TypeVar("T")

_EXCLUDE_SEQ = {"seq"}
_SEQ_SLOT = '{"seq":' + " " * 12 + ","
"""Snapshots open with a fixed-width slot the commit script writes the sequence number into
(JSON allows the spaces), so the script never copies the snapshot to add it."""


class RedisProvider:
    """Checkpoint store on Redis; see :class:`~runner.store.base.CheckpointStore`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        prefix: str | None = None,
        max_checkpoints: int | None = None,
        patient: bool = False,
    ) -> None:
        """``patient`` clients retry Redis errors for seconds (workers: a blip must not cost
        a finished step's commit); others report a dead server in well under a second."""
        from runner.settings import get_settings

        settings = get_settings()
        if client is None:
            if url is None:
                from runner.embedded import resolve_redis_url

                url = resolve_redis_url(settings.redis_url)
            client = redis.Redis.from_url(url, retry=_retry(patient))
        self.url = url or _client_url(client)
        self.client: Any = client
        self.keys = Keys(prefix if prefix is not None else settings.prefix)
        self.max_checkpoints = (
            settings.max_checkpoints if max_checkpoints is None else max_checkpoints
        )
        self._commit = client.register_script(scripts.COMMIT)
        self._prune = client.register_script(scripts.PRUNE)
        self._update = client.register_script(scripts.UPDATE_RUN)
        self._delete = client.register_script(scripts.DELETE_RUN)

    # -- writes ----------------------------------------------------------------------------

    def commit(
        self,
        checkpoint: Checkpoint,
        *,
        expected_seq: int | None = None,
        max_checkpoints: int | None = None,
        dispatching: Sequence[str] = (),
    ) -> Checkpoint:
        """Write ``checkpoint`` as the run's next one in one atomic round trip.

        The same round trip drops the lease of ``checkpoint.activation`` and marks
        ``dispatching`` (activations the caller sends next) in the run's dispatch
        markers, so a redelivered commit never sends them again.
        """
        k, run = self.keys, checkpoint.run_id
        keep = self.max_checkpoints if max_checkpoints is None else max_checkpoints
        keep = max(keep, 0)
        body = _SEQ_SLOT + checkpoint.model_dump_json(exclude=_EXCLUDE_SEQ)[1:]
        always, once = _meta_always(checkpoint), _meta_once(checkpoint)
        reply = self._call(
            self._commit,
            [
                k.meta(run),
                k.history(run),
                k.attempts(run),
                k.pins(run),
                k.runs,
                k.checkpoints,
                k.active,
                k.leases(run),
                k.owners(run),
                k.dispatched(run),
            ],
            [
                checkpoint.id,
                body,
                checkpoint.activation or "",
                checkpoint.attempt or "",
                "" if expected_seq is None else expected_seq,
                keep,
                repr(time.time()),
                run,
                k.snapshot_prefix(run),
                checkpoint.status.value,
                len(always),
                len(once),
                len(dispatching),
                *_pairs(always),
                *_pairs(once),
                *dispatching,
            ],
        )
        outcome, value = reply[0].decode(), reply[1].decode()
        if outcome == "ok":
            return checkpoint.model_copy(update={"seq": int(value)})
        if outcome == "dup":
            return self._get_in_run(run, value, default=checkpoint)
        if outcome == "stale":
            raise StaleAttempt(
                f"step {checkpoint.activation} of run {run} was already committed "
                f"by another attempt (checkpoint {value})",
                run_id=run,
                activation=checkpoint.activation,
                checkpoint_id=value,
            )
        raise CommitConflict(
            f"run {run} is at seq {value}, not {expected_seq}",
            run_id=run,
            expected=expected_seq,
            actual=int(value),
        )

    def update_run(self, run_id: str, **fields: Any) -> RunInfo:
        """Set metadata fields of an existing run (``RunNotFound`` if none)."""
        encoded = {key: _field(value) for key, value in fields.items()}
        ok = self._call(
            self._update,
            [self.keys.meta(run_id), self.keys.runs, self.keys.active],
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
        keys = [
            k.meta(run_id),
            k.history(run_id),
            k.attempts(run_id),
            k.pins(run_id),
            k.dispatched(run_id),
            k.leases(run_id),
            k.runs,
            k.checkpoints,
            k.active,
            k.owners(run_id),
        ]
        return bool(self._call(self._delete, keys, [run_id, k.snapshot_prefix(run_id)]))

    def prune(self, run_id: str, keep: int, *, dry_run: bool = False) -> list[str]:
        """Delete all but the newest ``keep`` checkpoints, sparing fork points."""
        k = self.keys
        keep = max(keep, 1)
        gone = self._call(
            self._prune,
            [k.history(run_id), k.pins(run_id), k.checkpoints],
            [keep, k.snapshot_prefix(run_id), "1" if dry_run else "0"],
        )
        return [item.decode() for item in gone]

    def fork(
        self,
        checkpoint_id: str,
        *,
        new_run_id: str,
        branch: str | None = None,
        state: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Start ``new_run_id`` from a copy of a checkpoint; the source is only pinned."""
        from runner.store.models import Lineage

        source = self.get(checkpoint_id)
        self._guard(lambda: self.client.sadd(self.keys.pins(source.run_id), checkpoint_id))
        new_state = dict(source.state if state is None else state)
        if "id" in new_state:
            new_state["id"] = new_run_id
        copy = source.model_copy(
            update={
                "id": _new_id(),
                "run_id": new_run_id,
                "seq": 0,
                "event": "forked",
                "activation": None,
                "attempt": None,
                "status": RunStatus.PENDING,
                "error": None,
                "state": new_state,
                "lineage": Lineage(
                    parent_run_id=source.run_id, parent_checkpoint_id=source.id, branch=branch
                ),
                "created_at": time.time(),
            }
        )
        try:
            return self.commit(copy, expected_seq=0)
        except CommitConflict:
            self._guard(lambda: self.client.srem(self.keys.pins(source.run_id), checkpoint_id))
            raise

    # -- reads -----------------------------------------------------------------------------

    def get(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint with this id (``CheckpointNotFound`` if none)."""
        run = self._guard(lambda: self.client.hget(self.keys.checkpoints, checkpoint_id))
        if run is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id}", checkpoint_id=checkpoint_id)
        return self._get_in_run(run.decode(), checkpoint_id)

    def latest(self, run_id: str) -> Checkpoint | None:
        """The run's newest checkpoint, or ``None``."""
        ids = self._guard(lambda: self.client.zrevrange(self.keys.history(run_id), 0, 0))
        if not ids:
            return None
        return self._get_in_run(run_id, ids[0].decode())

    def history(self, run_id: str, *, limit: int = 50, offset: int = 0) -> list[Checkpoint]:
        """The run's checkpoints, newest first."""
        if limit <= 0:
            return []
        ids = self._guard(
            lambda: self.client.zrevrange(self.keys.history(run_id), offset, offset + limit - 1)
        )
        if not ids:
            return []
        names = [self.keys.snapshot(run_id, raw.decode()) for raw in ids]
        blobs = self._guard(lambda: self.client.mget(names))
        return [_decode(blob, raw.decode()) for raw, blob in zip(ids, blobs, strict=True) if blob]

    def runs(
        self, *, limit: int = 50, offset: int = 0, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """Runs by last update, newest first (the index sorted set, no scans)."""
        found: list[RunInfo] = []
        start, page = offset if status is None else 0, max(limit, 100)
        skipped = 0
        while len(found) < limit:
            ids = self._page(self.keys.runs, start, page)
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
            start += page
        return found

    def run(self, run_id: str) -> RunInfo | None:
        """A run's metadata, or ``None``."""
        return next(iter(self._infos([run_id])), None)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()

    # -- helpers ---------------------------------------------------------------------------

    def _page(self, key: str, start: int, count: int) -> list[bytes]:
        return self._guard(lambda: self.client.zrevrange(key, start, start + count - 1))

    def _infos(self, run_ids: list[str]) -> list[RunInfo]:
        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.hgetall(self.keys.meta(run_id))
            return pipe.execute()

        infos = []
        for raw in self._guard(fetch):
            if raw:
                data = {k.decode(): v.decode() for k, v in raw.items()}
                infos.append(RunInfo.model_validate({k: v for k, v in data.items() if v != ""}))
        return infos

    def _get_in_run(
        self, run_id: str, checkpoint_id: str, default: Checkpoint | None = None
    ) -> Checkpoint:
        blob = self._guard(lambda: self.client.get(self.keys.snapshot(run_id, checkpoint_id)))
        if blob is None:
            if default is not None:
                return default
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id}", checkpoint_id=checkpoint_id)
        return _decode(blob, checkpoint_id)

    def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
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
                f"Redis at {mask_url(self.url)} is unreachable: {exc}", url=mask_url(self.url)
            ) from None
        except redis.RedisError as exc:
            raise StoreError(f"Redis error: {exc}") from None


def _retry(patient: bool) -> Retry:
    """Patient: redis-py's default (10 retries, ~5 s); else 3 quick ones (~0.2 s)."""
    if patient:
        return Retry(ExponentialWithJitterBackoff(base=0.01, cap=1.0), 10)
    return Retry(ExponentialWithJitterBackoff(base=0.02, cap=0.25), 3)


def _decode(blob: bytes, checkpoint_id: str) -> Checkpoint:
    try:
        return Checkpoint.model_validate_json(blob)
    except ValidationError as exc:
        raise CorruptCheckpoint(
            f"checkpoint {checkpoint_id} is corrupt: {exc.errors()[0]['msg']}",
            checkpoint_id=checkpoint_id,
        ) from None


def _field(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, RunStatus):
        return value.value
    return str(value)


def _pairs(fields: dict[str, str]) -> list[str]:
    return [item for pair in fields.items() for item in pair]


def _meta_always(ckpt: Checkpoint) -> dict[str, str]:
    meta = {
        "event": ckpt.event,
        "step": ckpt.step or "",
        "error": f"{ckpt.error.type}: {ckpt.error.message}" if ckpt.error else "",
    }
    if ckpt.flow:
        meta["flow"] = ckpt.flow
    return meta


def _meta_once(ckpt: Checkpoint) -> dict[str, str]:
    meta: dict[str, str] = {}
    if name := ckpt.meta.name:
        meta["name"] = name
    if ckpt.lineage is not None:
        meta["parent_run_id"] = ckpt.lineage.parent_run_id
        meta["parent_checkpoint_id"] = ckpt.lineage.parent_checkpoint_id
        meta["branch"] = ckpt.lineage.branch or ""
    return meta


def _new_id() -> str:
    from runner import ids

    return ids.checkpoint_id()


def _client_url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
