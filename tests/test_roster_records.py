"""The workers' roster through the store protocol (:class:`DeploymentStore`) on Redis: written
with a worker's queues, decoded by :mod:`runner.store.roster` (records an older or a foreign
writer left included), dropped at a warm shutdown or once long dead. No worker needed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from runner.errors import StoreUnavailable
from runner.store.base import DeploymentStore
from runner.store.redis import RedisProvider
from runner.store.roster import WorkerFacts, WorkerRecord

FACTS = WorkerFacts(routes=("q", "q.night"), pid=41, host="box", runner="1.2", celery="5.7.0")


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    provider = RedisProvider(redis_url, prefix=prefix)
    yield provider
    for key in provider.client.scan_iter(f"{prefix}:*"):
        provider.client.delete(key)
    provider.close()


def test_a_worker_s_record_is_written_with_its_queues_and_read_back(
    store: DeploymentStore,
) -> None:
    before = time.time()
    store.announce_queues(["q.gpu", "q"], "w1", ttl=30, facts=FACTS)
    store.announce_queues(["q"], "w0", ttl=30)  # no facts: consumers only, no record
    (record,) = store.workers()
    assert (record.name, record.queues, record.facts) == ("w1", ("q", "q.gpu"), FACTS)
    assert before <= record.at <= time.time() and record.until == pytest.approx(record.at + 30)
    assert record.live(time.time()) and not record.live(record.until + 1)
    assert store.queue_consumers("q") == ["w0", "w1"]  # the same round trip as its queues


def test_a_record_lapses_unless_written_again_and_goes_with_a_warm_shutdown(
    store: DeploymentStore,
) -> None:
    store.announce_queues(["q"], "w1", ttl=0.2, facts=FACTS)
    store.announce_queues(["q"], "w2", ttl=30, facts=FACTS)
    time.sleep(0.3)
    assert [(r.name, r.live(time.time())) for r in store.workers()] == [
        ("w1", False),
        ("w2", True),
    ]
    store.retire_queues(["q"], "w2")
    assert [r.name for r in store.workers()] == ["w1"]  # a lapsed record stays, listed as gone
    assert store.queue_consumers("q") == []


def test_only_records_long_dead_are_forgotten(store: DeploymentStore) -> None:
    store.announce_queues(["q"], "dead", ttl=0.1, facts=FACTS)
    store.announce_queues(["q"], "alive", ttl=30, facts=FACTS)
    time.sleep(0.3)
    assert store.forget_dead_workers(older_than=60) == []  # lapsed, but not long ago
    assert store.forget_dead_workers(older_than=0.1) == ["dead"]
    assert [r.name for r in store.workers()] == ["alive"]


def test_records_another_writer_left_are_decoded_field_by_field(store: RedisProvider) -> None:
    now = time.time()
    store.client.hset(
        store.keys.workers(),
        mapping={
            # An older worker: no facts, but its queues and times.
            "old": json.dumps({"queues": ["q"], "at": now, "until": now + 30}),
            # Fields of the wrong type read as unknown.
            "odd": json.dumps(
                {"queues": "q", "pid": "41", "host": 7, "at": now, "until": int(now) + 30}
            ),
            "no-until": json.dumps({"queues": ["q"], "at": now}),
            "bool-until": json.dumps({"at": now, "until": True}),
            "a-list": json.dumps([1, 2]),
            "not-json": "{",
        },
    )
    records = {r.name: r for r in store.workers()}
    assert sorted(records) == ["odd", "old"]
    assert records["old"] == WorkerRecord("old", ("q",), WorkerFacts(), now, now + 30)
    odd = records["odd"]
    assert (odd.queues, odd.facts, odd.until) == ((), WorkerFacts(), float(int(now) + 30))


def test_the_roster_of_an_unreachable_redis_is_store_unavailable() -> None:
    store = RedisProvider("redis://127.0.0.1:1/0", prefix="nowhere")
    for call in (
        lambda: store.workers(),
        lambda: store.forget_dead_workers(),
        lambda: store.announce_queues(["q"], "w", 1.0, FACTS),
        lambda: store.retire_queues(["q"], "w"),
    ):
        with pytest.raises(StoreUnavailable):
            call()
    store.close()
