"""Redis-specific store behaviour: corrupt snapshots and an unreachable server are named errors;
snapshots of the earlier layouts are read or upgraded; a small change of a big state is small
on the wire."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from bench._wire import counted_client
from runner.errors import (
    CommitConflict,
    CorruptCheckpoint,
    StaleAttempt,
    StoreError,
    StoreUnavailable,
)
from runner.store.base import CommitRequest
from runner.store.models import Checkpoint
from runner.store.redis import RedisProvider
from tests.redis_servers import short_patience


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
    with short_patience():
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


def test_a_commit_to_an_unreachable_redis_is_store_unavailable_past_the_store_retry() -> None:
    with short_patience():
        store = RedisProvider("redis://127.0.0.1:1/0", prefix="nowhere")
    began = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.commit(Checkpoint(run_id="r", event="flow_started"))
    assert 0.4 < time.monotonic() - began < 2.5  # waited RUNNER_STORE_RETRY, then gave up
    store.close()


@pytest.mark.redis_internals  # its URL is read off the pool (runner.store.pools)
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


def test_a_step_changing_one_small_field_of_a_5_mb_state_sends_well_under_100_kb(
    redis_url: str, prefix: str
) -> None:
    client, wire = counted_client(redis_url)
    store = RedisProvider(client=client, prefix=prefix)
    state = {"id": "big", "pages": ["p" * 1000] * 5000, "summary": "s" * 100}
    first = store.commit(Checkpoint(run_id="big", event="flow_started", state=state))
    wire.reset()
    step = store.commit(
        Checkpoint(run_id="big", event="step", state={**state, "summary": "t" * 100}),
        expected_seq=first.seq,
    )
    assert wire.sends == 1  # one EVALSHA
    assert wire.bytes < 10_000, wire.bytes

    wire.reset()
    latest = store.latest("big")
    assert wire.sends == 1  # the latest state, whole, in one round trip
    assert latest == step
    assert store.get(first.id) == first
    store.delete_run("big")
    store.close()


def test_a_snapshot_that_holds_its_whole_state_reads_as_written(store: RedisProvider) -> None:
    # As an earlier version wrote them: the state inside the snapshot, no field list.
    old = Checkpoint(run_id="whole", event="flow_started", seq=1, state={"id": "whole", "n": 1})
    k, client = store.keys, store.client
    client.hset(k.snapshots("whole"), old.id, old.model_dump_json())
    client.zadd(k.history("whole"), {old.id: 1})
    client.hset(k.meta("whole"), mapping={"run_id": "whole", "seq": 1, "latest": old.id})
    client.hset(k.checkpoints_of("whole"), old.id, "whole")

    assert store.latest("whole") == old
    assert store.get(old.id) == old
    new = store.commit(Checkpoint(run_id="whole", event="step", state={"id": "whole", "n": 2}))
    assert store.history("whole") == [new, old]


@pytest.mark.redis_internals
def test_a_forked_child_gets_a_connection_pool_of_its_own(redis_url: str, prefix: str) -> None:
    # A Celery pool process is forked while the parent's threads use Redis. If one holds the
    # pool's lock at the fork, a child sharing that pool waits on the lock for ever.
    import os
    import threading
    import time

    provider = RedisProvider(redis_url, prefix=prefix)
    provider.client.ping()
    pool = provider.client.connection_pool
    holding, release = threading.Event(), threading.Event()

    def take_a_connection() -> None:  # another thread, mid-way through taking a connection
        with pool._lock:
            holding.set()
            release.wait(30)

    threading.Thread(target=take_a_connection, daemon=True).start()
    holding.wait(10)
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - the child's exit code is the assertion
            try:
                provider.client.ping()
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10
        while (done := os.waitpid(child, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(child, 9)
                os.waitpid(child, 0)
                raise AssertionError("the forked child hung on the parent's pool lock")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        release.set()
        provider.close()


def _subscribed(store: RedisProvider, channel: str) -> redis.client.PubSub:
    sub = store.client.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(channel)
    sub.get_message(timeout=1)  # the subscription's confirmation
    return sub


def test_a_commits_outbox_is_written_only_when_the_commit_lands(store: RedisProvider) -> None:
    queue, channel = f"{store.keys.prefix}:queue", f"{store.keys.prefix}:events"
    sub = _subscribed(store, channel)
    first = store.commit(Checkpoint(run_id="r", event="flow_started", state={"id": "r"}))
    outbox = [("lpush", queue, "message-1"), ("publish", channel, "sent-1")]

    step = Checkpoint(run_id="r", event="method_finished", state={"id": "r"}, activation="a")
    with pytest.raises(CommitConflict):  # not on a conflict
        store.commit_request(
            CommitRequest(step.model_copy(update={"attempt": "t1"}), expected_seq=0, outbox=outbox)
        )
    assert store.client.llen(queue) == 0
    assert sub.get_message(timeout=0.2) is None

    landed = step.model_copy(update={"attempt": "t1"})
    store.commit_request(
        CommitRequest(landed, expected_seq=first.seq, dispatching=["b"], outbox=outbox)
    )
    assert store.client.lrange(queue, 0, -1) == [b"message-1"]
    got = sub.get_message(timeout=2)
    assert got is not None and got["data"] == b"sent-1"

    again = [("lpush", queue, "message-2")]
    # The same attempt again: a duplicate, sends nothing.
    store.commit_request(CommitRequest(landed, outbox=again))
    with pytest.raises(StaleAttempt):  # another attempt of the committed step: nothing either
        store.commit_request(CommitRequest(step.model_copy(update={"attempt": "t2"}), outbox=again))
    assert store.client.lrange(queue, 0, -1) == [b"message-1"]
    sub.close()


def test_an_outbox_with_another_command_is_refused_and_nothing_is_written(
    store: RedisProvider,
) -> None:
    first = store.commit(Checkpoint(run_id="r", event="flow_started", state={"id": "r"}))
    with pytest.raises(StoreError, match="'del'"):
        store.commit_request(
            CommitRequest(
                Checkpoint(run_id="r", event="x", state={"id": "r"}),
                expected_seq=first.seq,
                outbox=[("del", f"{store.keys.prefix}:meta", "")],
            )
        )
    latest = store.latest("r")
    assert latest is not None and latest.seq == first.seq
