"""Redis-specific store behaviour: corrupt snapshots and an unreachable server are named errors;
snapshots of the earlier layout are upgraded."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from runner.errors import CorruptCheckpoint, StoreUnavailable
from runner.store.models import Checkpoint
from runner.store.redis import RedisProvider


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    provider = RedisProvider(redis_url, prefix=prefix)
    yield provider
    for key in provider.client.scan_iter(f"{prefix}:*"):
        provider.client.delete(key)
    provider.close()


def test_a_corrupt_snapshot_is_a_named_error_and_other_runs_still_read(
    store: RedisProvider,
) -> None:
    bad = store.commit(Checkpoint(run_id="bad", event="flow_started", state={"id": "bad"}))
    good = store.commit(Checkpoint(run_id="good", event="flow_started", state={"id": "good"}))
    store.client.hset(store.keys.snapshots("bad"), bad.id, b'{"seq": 1, "run_id": ')

    with pytest.raises(CorruptCheckpoint) as info:
        store.get(bad.id)
    assert bad.id in str(info.value)
    with pytest.raises(CorruptCheckpoint):
        store.latest("bad")
    assert store.get(good.id).state == {"id": "good"}
    assert store.run("bad") is not None  # the metadata is intact, only the snapshot is bad


def test_an_unreachable_redis_is_store_unavailable_in_one_line_with_the_password_masked() -> None:
    store = RedisProvider("redis://:s3cret@127.0.0.1:1/0", prefix="nowhere")
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.latest("any")
    message = str(info.value)
    assert "127.0.0.1:1" in message
    assert "s3cret" not in message
    assert "\n" not in message
    assert time.monotonic() - began < 10
    store.close()


def test_a_commit_to_an_unreachable_redis_fails_fast_as_store_unavailable() -> None:
    store = RedisProvider("redis://127.0.0.1:1/0", prefix="nowhere")
    began = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.commit(Checkpoint(run_id="r", event="flow_started"))
    assert time.monotonic() - began < 2
    store.close()


def test_a_client_passed_in_is_used_as_given(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    store = RedisProvider(client=client, prefix=prefix)
    assert store.client is client
    store.commit(Checkpoint(run_id="r", event="flow_started"))
    assert store.latest("r") is not None
    store.delete_run("r")
    store.close()


def test_upgrade_moves_snapshots_of_the_earlier_one_key_per_snapshot_layout(
    store: RedisProvider,
) -> None:
    made = [store.commit(Checkpoint(run_id="old", event="step", state={"n": i})) for i in range(3)]
    client, snaps = store.client, store.keys.snapshots("old")
    for ckpt in made:  # as an earlier version wrote them: one string key per snapshot
        client.set(store.keys.run("old", f"ckpt:{ckpt.id}"), client.hget(snaps, ckpt.id))
    client.delete(snaps)
    assert store.history("old") == []

    assert store.upgrade() == 3
    assert store.upgrade() == 0
    assert store.history("old") == list(reversed(made))
    assert store.latest("old") == made[-1]
    assert not list(client.scan_iter(match=store.keys.run("old", "ckpt:*")))
