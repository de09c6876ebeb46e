"""``runner rekey``: every sealed (or clear) payload of the deployment re-sealed with the
first key of ``RUNNER_ENCRYPTION_KEYS``, in bounded batches, resumable.

It walks the run index (shard by shard) in the order of the runs' last update, ``batch``
runs at a time; for each run it
re-seals, ``batch`` fields per script call, the snapshots (the sealed part of each), the
state values and the metadata's error text, then the schedules' inputs. Each write is a
compare-and-set (:data:`~runner.store.scripts.REPLACE_SAME`): a value pruned or rewritten
by a commit since it was read is left alone, so it runs beside live workers. A value already
sealed with the first key is skipped, so running it again costs reads only. After each page
of runs the cursor (the last update time reached, and the runs done at that time) is kept in
``P:rekey`` (:meth:`~runner.store.keys.Keys.rekey`): a rekey that stops (a crash,
``--batches``) goes on from there next time; once done the key is gone. A run updated while
a rekey goes moves ahead of the cursor, so it is gone through again (its new values are
sealed with the first key already); none moves behind it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from runner.errors import EncryptionKeyError, StoreError, StoreUnavailable

from . import codec as codecs
from . import scripts
from .redis import RedisProvider, snapshot_json
from .schedules import ScheduleBook


@dataclass
class Rekeyed:
    """What a rekey did (counted over its stopped and resumed parts)."""

    key_id: str
    """The key everything is now sealed with."""
    runs: int = 0
    """Runs gone through."""
    values: int = 0
    """Values re-sealed (snapshots, state values, error texts, schedule inputs)."""
    done: bool = False
    """Every run gone through (else it stopped after the batches asked and goes on later)."""
    resumed: bool = False
    """It went on from where an earlier rekey stopped."""


def rekey(store: RedisProvider, batch: int = 100, batches: int | None = None) -> Rekeyed:
    """Re-seal the deployment's payloads with ``store``'s first key (see the module);
    ``batches`` pages of ``batch`` runs at most (``None``: all). Redis errors are the
    runner's (:class:`StoreUnavailable`, :class:`StoreError`)."""
    try:
        return _rekey(store, batch, batches)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreUnavailable(f"Redis is unreachable: {exc}") from None
    except redis.RedisError as exc:
        raise StoreError(f"Redis error: {exc}") from None


def _rekey(store: RedisProvider, batch: int, batches: int | None) -> Rekeyed:
    codec = store.codec
    if codec is None:
        raise EncryptionKeyError(
            "runner rekey seals with the first key of RUNNER_ENCRYPTION_KEYS, which is unset",
            key_id="",
        )
    client, progress = store.client, store.keys.rekey()
    saved = {k.decode(): v.decode() for k, v in client.hgetall(progress).items()}
    resumed = saved.get("kid") == codec.kid
    if not resumed:
        saved = {"kid": codec.kid, "shard": "0", "score": "-inf", "at": "[]", "runs": "0"}
        saved["values"] = "0"
    done = Rekeyed(codec.kid, int(saved["runs"]), int(saved["values"]), resumed=resumed)
    replace = client.register_script(scripts.REPLACE_SAME)
    shards = store.keys.all_runs()
    shard, score, at = int(saved["shard"]), saved["score"], set(json.loads(saved["at"]))
    pages = 0
    while shard < len(shards):
        if batches is not None and pages >= batches:
            return done
        page = client.zrangebyscore(
            shards[shard], score, "+inf", start=0, num=batch + len(at), withscores=True
        )
        found = [(raw.decode(), when) for raw, when in page if raw.decode() not in at][:batch]
        for run_id, _ in found:
            done.values += _run(store, codec, replace, run_id, batch)
        done.runs += len(found)
        pages += 1
        if found:
            last = found[-1][1]
            kept = at if repr(last) == score else set()
            score, at = repr(last), kept | {r for r, when in found if when == last}
        else:
            shard, score, at = shard + 1, "-inf", set()
        state = {"shard": shard, "score": score, "at": json.dumps(sorted(at))}
        client.hset(
            progress,
            mapping={"kid": codec.kid, **state, "runs": done.runs, "values": done.values},
        )
    done.values += _schedules(store, codec, replace)
    client.delete(progress)
    done.done = True
    return done


def _run(store: RedisProvider, codec: codecs.Codec, replace: Any, run_id: str, batch: int) -> int:
    """Re-seal one run's payloads; how many were written."""
    k = store.keys
    written = 0
    for chunk in _chunks(store.client.hscan_iter(k.snapshots(run_id), count=batch), batch):
        ids = [cid.decode() for cid, _ in chunk]
        by_field = store.client.hmget(k.refs(run_id), ids)
        triples: list[Any] = []
        for (cid, blob), refs in zip(chunk, by_field, strict=True):
            if codec.current(_sealed_part(blob)):
                continue
            ckpt = store.read_snapshot(blob, run_id, cid.decode())
            body = snapshot_json(ckpt, refs is None, codec)
            triples += [cid, blob, f'{{"seq":{ckpt.seq},{body}']
        written += _replace(replace, k.snapshots(run_id), triples)
    for chunk in _chunks(store.client.hscan_iter(k.values(run_id), count=batch), batch):
        triples = []
        for field, value in chunk:
            if codec.current(value):
                continue
            name = field.decode().partition(":")[2]
            where = codecs.field_context(run_id, name)
            what = f"state field {name!r} of run {run_id}"
            plain = codecs.open_value(codec, value, where, what)
            triples += [field, value, codec.seal(plain, where)]
        written += _replace(replace, k.values(run_id), triples)
    error = store.client.hget(k.meta(run_id), "error")
    if error and not codec.current(error):
        where = codecs.field_context(run_id, "error")
        plain = codecs.open_value(codec, error, where, f"the error of run {run_id}")
        written += _replace(replace, k.meta(run_id), ["error", error, codec.seal(plain, where)])
    return written


def _schedules(store: RedisProvider, codec: codecs.Codec, replace: Any) -> int:
    """Re-seal the schedules' inputs (a few: one call)."""
    book = ScheduleBook(store)
    triples: list[Any] = []
    for name, raw in store.client.hgetall(book.key).items():
        if codec.current(_sealed_part(raw)):
            continue
        triples += [name, raw, book.dump(book.load(name.decode(), raw))]
    return _replace(replace, book.key, triples)


def _sealed_part(blob: bytes) -> bytes:
    """The sealed value inside a stored JSON object (``b""`` if none)."""
    at = blob.find(b'"sealed":"')
    return blob[at + 10 :] if at >= 0 else b""


SCRIPT_BYTES = 1 << 20
"""A compare-and-set call carries at most about this many bytes of values (a batch of large
state fields goes in several), so none holds Redis for long."""


def _replace(replace: Any, key: str, triples: list[Any]) -> int:
    """Write ``triples`` (field, value read, new value) where unchanged; how many."""
    done, start, size = 0, 0, 0
    for end in range(0, len(triples), 3):
        size += len(triples[end + 1]) + len(triples[end + 2])
        if size >= SCRIPT_BYTES or end + 3 == len(triples):
            done += int(replace(keys=[key], args=triples[start : end + 3]))
            start, size = end + 3, 0
    return done


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
