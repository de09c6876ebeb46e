"""A run's metadata (:class:`RunMeta`) is a few fields and the groups of
:data:`META_GROUPS`; :meth:`RunMeta.updated` is the one way it changes, and metadata stored
before it was grouped (every field at the top level, some of them sealed) still loads, from
every store provider: Redis, SQLite, a JSON directory and a PostgreSQL archive
(``RUNNER_TEST_POSTGRES_URL``, default the server on 127.0.0.1:5432; a database of each
test's own, dropped after it)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.store import codec as codecs
from runner.store._common import run_info_after
from runner.store.codec import Codec
from runner.store.jsondir import JsonProvider
from runner.store.models import (
    GROUP_OF,
    META_GROUPS,
    Awaiting,
    Checkpoint,
    Human,
    RunMeta,
    RunStatus,
)
from runner.store.redis import RedisProvider
from runner.store.sqlite import SqliteProvider
from tests.test_archive import pg_database  # noqa: F401 (a fixture)
from tests.test_epochs import full_meta

SEALED = Codec([("test", bytes(range(32)))])

_OLD_AWAITING: dict[str, Any] = {"message": True, "output": True, "metadata": True}
OLD_SEALED_META: dict[str, Any] = {
    "trigger_payload": True,
    "submitted": True,
    "pause_reason": True,
    "usage": True,
    "feedback": True,
    "awaiting": _OLD_AWAITING,
    "reviews": {"__all__": _OLD_AWAITING},
    "answers": {"__all__": {"__all__": {"text": True, "by": True, "awaited": _OLD_AWAITING}}},
    "children": {"__all__": {"before": True, "after": True, "usage": True}},
}
"""What a sealed checkpoint's flat metadata had sealed before the groups (the codec's
``PAYLOAD["meta"]`` of then)."""


def flat(meta: dict[str, Any]) -> dict[str, Any]:
    """Grouped metadata JSON as it was written before the groups: every field at the top."""
    out = {k: v for k, v in meta.items() if k not in META_GROUPS}
    for group in META_GROUPS:
        out.update(meta.get(group, {}))
    return out


def _pick(data: Any, shape: Any) -> Any:
    """The part of ``data`` that pydantic's ``include=shape`` keeps."""
    if isinstance(data, list) and shape is not True:
        return [_pick(item, shape["__all__"]) for item in data]
    if shape is True or not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        sub = shape.get(key, shape.get("__all__"))
        if sub is not None and value is not None:
            out[key] = _pick(value, sub)
    return out


def _drop(data: Any, shape: Any) -> Any:
    """The part of ``data`` that pydantic's ``exclude=shape`` keeps."""
    if isinstance(data, list):
        return [_drop(item, shape["__all__"]) for item in data]
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        sub = shape.get(key, shape.get("__all__"))
        if sub is True:
            continue
        out[key] = value if sub is None or value is None else _drop(value, sub)
    return out


def old_format(raw: str | bytes, run_id: str, checkpoint_id: str, codec: Codec | None) -> str:
    """A stored checkpoint's JSON as it was written before the groups: its metadata flat and,
    if sealed, sealed with the payload shape of then."""
    data = json.loads(raw)
    sealed = data.pop("sealed", None)
    where = codecs.snapshot_context(run_id, checkpoint_id)
    secret = json.loads(codec.open(sealed, where, "test")) if sealed and codec else {}
    meta = flat(codecs.merge(data.get("meta", {}), secret.get("meta", {})))
    assert set(meta) - set(RunMeta.model_fields) - set(GROUP_OF) == set()
    assert not set(meta) & set(META_GROUPS) and "priority" in meta
    if sealed is None:
        data["meta"] = meta
        return json.dumps(data, separators=(",", ":"))
    assert codec is not None
    data["meta"] = _drop(meta, OLD_SEALED_META)
    secret["meta"] = _pick(meta, OLD_SEALED_META)
    data["sealed"] = codec.seal(json.dumps(secret).encode(), where)
    return json.dumps(data, separators=(",", ":"))  # compact, as the stores write it


def checkpoint(run_id: str) -> Checkpoint:
    """A paused checkpoint whose metadata has every field away from its default."""
    return Checkpoint(
        run_id=run_id,
        event="flow_paused",
        step="write",
        status=RunStatus.PAUSED,
        state={"id": run_id, "topic": "seals"},
        meta=full_meta(),
    )


# -- the model ----------------------------------------------------------------------------


def test_every_field_is_in_one_place_the_top_level_or_one_group() -> None:
    top = [f for f in RunMeta.model_fields if f not in META_GROUPS]
    grouped = [f for model in META_GROUPS.values() for f in model.model_fields]
    assert set(META_GROUPS) <= set(RunMeta.model_fields)
    assert len(grouped) == len(set(grouped)) == len(GROUP_OF)
    assert not set(top) & set(grouped) and not set(META_GROUPS) & set(grouped)
    for name, model in META_GROUPS.items():
        assert RunMeta.model_fields[name].annotation in (model, model.__name__)
        assert model.model_config.get("extra") == "ignore"
        assert model.model_config.get("defer_build") is True
        assert model.__doc__


def test_updated_returns_new_metadata_and_leaves_the_old_and_its_groups_as_they_were() -> None:
    meta = full_meta()
    before = meta.model_dump(mode="json")
    waiting = Awaiting(kind="ask", message="why?")

    new = meta.updated(epoch=9, priority=2, awaiting=waiting, children={}, pinned="v9")

    assert meta.model_dump(mode="json") == before  # nothing changed in place
    assert (new.epoch, new.scheduling.priority, new.human.awaiting) == (9, 2, waiting)
    assert new.links.children == {} and new.versions.pinned == "v9"
    assert new.links.parent == meta.links.parent  # the rest of a group is kept
    assert new.scheduling.deadline == meta.scheduling.deadline
    assert new.replay is meta.replay  # a group not changed is shared, never copied
    assert meta.updated().model_dump() == meta.model_dump()


def test_updated_takes_whole_groups_and_a_groups_fields_beside_it() -> None:
    meta = full_meta()
    cleared = meta.updated(human=Human())
    assert cleared.human == Human() and cleared.links == meta.links
    answered = meta.updated(human={"pause_reason": "p"}, feedback=[{"f": 1}])
    assert answered.human == Human(pause_reason="p", feedback=[{"f": 1}])
    with pytest.raises(TypeError, match="no field 'pausereason'"):
        meta.updated(pausereason="x")


def test_metadata_written_flat_before_the_groups_loads_into_them() -> None:
    meta = full_meta()
    grouped = meta.model_dump(mode="json")
    old = flat(grouped)
    assert "priority" in old and "scheduling" not in old
    assert RunMeta.model_validate(old) == meta
    assert RunMeta.model_validate_json(json.dumps(old)) == meta
    assert Checkpoint.model_validate({"run_id": "r", "event": "e", "meta": old}).meta == meta
    # Written both ways (a group beside a stray flat field): the group's own value wins.
    both = {**grouped, "priority": 1}
    assert RunMeta.model_validate(both).scheduling.priority == meta.scheduling.priority


def test_field_reads_a_top_level_or_a_grouped_field_by_its_plain_name() -> None:
    meta = full_meta()
    assert meta.field("epoch") == meta.epoch
    assert meta.field("sleeps") == meta.replay.sleeps
    assert meta.field("awaiting") == meta.human.awaiting


# -- every store provider reads a record written flat --------------------------------------


Rewrite = Callable[[Checkpoint, Codec | None], Any]
"""Writes ``checkpoint`` through a provider, rewrites its stored record raw in the old flat
format, and returns a fresh provider to read it back with."""


def _redis(request: pytest.FixtureRequest, tmp_path: Path) -> Rewrite:
    url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("prefix")

    def write(ckpt: Checkpoint, codec: Codec | None) -> Any:
        store = RedisProvider(url, prefix=prefix, codec=codec)
        request.addfinalizer(store.close)
        store.commit(ckpt, expected_seq=0)
        key = store.keys.snapshots(ckpt.run_id)
        raw = store.client.hgetall(key)
        assert raw, "the snapshot is stored"
        for field, blob in raw.items():
            name = field.decode()
            store.client.hset(key, name, old_format(blob, ckpt.run_id, ckpt.id, codec))
        fresh = RedisProvider(url, prefix=prefix, codec=codec)
        request.addfinalizer(fresh.close)
        return fresh

    return write


def _reopened(
    request: pytest.FixtureRequest,
    make: Callable[[Codec | None], Any],
    rewrite: Callable[[Checkpoint, Callable[[Any], str]], None],
) -> Rewrite:
    """A :data:`Rewrite` for a store kept in files: written through ``make(codec)``'s
    provider and closed, its record rewritten by ``rewrite(ckpt, to_old)``, opened anew."""

    def write(ckpt: Checkpoint, codec: Codec | None) -> Any:
        store = make(codec)
        store.commit(ckpt, expected_seq=0)
        store.close()
        rewrite(ckpt, lambda raw: old_format(raw, ckpt.run_id, ckpt.id, codec))
        fresh = make(codec)
        request.addfinalizer(fresh.close)
        return fresh

    return write


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> Rewrite:
    path = tmp_path / "store.db"

    def rewrite(ckpt: Checkpoint, to_old: Callable[[Any], str]) -> None:
        with sqlite3.connect(path) as db:
            (raw,) = db.execute("SELECT data FROM checkpoints WHERE id = ?", (ckpt.id,)).fetchone()
            db.execute("UPDATE checkpoints SET data = ? WHERE id = ?", (to_old(raw), ckpt.id))

    return _reopened(request, lambda codec: SqliteProvider(path, codec=codec), rewrite)


def _jsondir(request: pytest.FixtureRequest, tmp_path: Path) -> Rewrite:
    root = tmp_path / "store"

    def rewrite(ckpt: Checkpoint, to_old: Callable[[Any], str]) -> None:
        (path,) = [p for p in root.rglob("*.json") if ckpt.id in p.name]
        path.write_text(to_old(path.read_text()))

    return _reopened(request, lambda codec: JsonProvider(root, codec=codec), rewrite)


def _postgres(request: pytest.FixtureRequest, tmp_path: Path) -> Rewrite:
    url = request.getfixturevalue("pg_database")
    import psycopg

    from runner.store.postgres import PostgresProvider

    def write(ckpt: Checkpoint, codec: Codec | None) -> Any:
        store = PostgresProvider(url, codec=codec)
        stored = ckpt.model_copy(update={"seq": 1})
        store.put_run(run_info_after(stored, None), [stored])
        store.close()
        with psycopg.connect(url, autocommit=True) as db:
            (raw,) = db.execute(
                "SELECT data FROM runner_checkpoints WHERE id = %s", (ckpt.id,)
            ).fetchone()
            old = old_format(raw, ckpt.run_id, ckpt.id, codec)
            db.execute("UPDATE runner_checkpoints SET data = %s WHERE id = %s", (old, ckpt.id))
        fresh = PostgresProvider(url, codec=codec)
        request.addfinalizer(fresh.close)
        return fresh

    return write


PROVIDERS = {"redis": _redis, "sqlite": _sqlite, "jsondir": _jsondir, "postgres": _postgres}


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_a_checkpoint_stored_with_flat_metadata_reads_back_grouped_from_each_provider(
    request: pytest.FixtureRequest, tmp_path: Path, provider: str, sealed: bool
) -> None:
    codec = SEALED if sealed else None
    ckpt = checkpoint(f"flat-{uuid.uuid4().hex[:8]}")
    store = PROVIDERS[provider](request, tmp_path)(ckpt, codec)

    for read in (store.get(ckpt.id), store.latest(ckpt.run_id), *store.history(ckpt.run_id)):
        assert read.id == ckpt.id
        assert read.meta == ckpt.meta, provider
        assert read.state == ckpt.state
