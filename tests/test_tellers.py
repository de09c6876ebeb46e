"""The run's closing event waits for the steps' events: a step's attempt gives its word in the
store before its commit and drops it once it has told its events; the attempt that ends the
run tells the closing event only when no other word is good (one that died lapses after a
lease). Nobody listening costs nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from bench._wire import Wire, counted_client
from runner.distributed.coord import Coordinator
from runner.store.redis import RedisProvider


@pytest.fixture
def counted(redis_url: str, prefix: str) -> Iterator[tuple[RedisProvider, Wire]]:
    client, wire = counted_client(redis_url)
    store = RedisProvider(client=client, prefix=prefix)
    yield store, wire
    for key in store.client.scan_iter(f"{prefix}:*"):
        store.client.delete(key)
    store.close()


def test_nobody_listening_gives_no_word_and_costs_no_round_trip(
    counted: tuple[RedisProvider, Wire],
) -> None:
    store, wire = counted
    coord = Coordinator(store, lease_seconds=5)
    wire.reset()
    with coord.telling("r", "closer", wanted=False) as others_told:
        others_told()
    assert wire.sends == 0


def test_the_closing_event_waits_until_the_other_attempts_told_theirs(
    counted: tuple[RedisProvider, Wire],
) -> None:
    store, _ = counted
    coord = Coordinator(store, lease_seconds=30)
    order: list[str] = []
    gave_word, go = threading.Event(), threading.Event()

    def step() -> None:  # committed; its process tells its end when ``go`` is set
        with coord.telling("r", "step", wanted=True):
            gave_word.set()
            go.wait(10)
            order.append("step's end")

    stepping = threading.Thread(target=step)
    stepping.start()
    assert gave_word.wait(10)
    with coord.telling("r", "closer", wanted=True) as others_told:
        assert sorted(store.tellers("r", time.time())) == ["closer", "step"]
        closing = threading.Thread(target=lambda: (others_told(), order.append("run's end")))
        closing.start()
        closing.join(0.3)
        assert closing.is_alive() and order == []  # still waiting for the step's word
        go.set()
        closing.join(10)
    stepping.join(10)
    assert order == ["step's end", "run's end"]
    assert store.tellers("r", time.time()) == []
    assert not store.client.exists(store.keys.tellers("r"))  # empty: Redis dropped it


def test_a_teller_that_died_holds_the_closing_event_for_no_longer_than_its_word(
    counted: tuple[RedisProvider, Wire],
) -> None:
    store, _ = counted
    coord = Coordinator(store, lease_seconds=30)
    store.add_teller("r", "dead", time.time() + 0.3)  # gave its word, then was killed
    assert 0 < store.client.ttl(store.keys.tellers("r")) <= 1  # the key goes with the word
    with coord.telling("r", "closer", wanted=True) as others_told:
        others_told()  # returns once the dead teller's word lapsed
        assert store.tellers("r", time.time()) == ["closer"]
