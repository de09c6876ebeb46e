"""A step's commit that stops its run tells the run's waiters in the commit's own round trip
(one EVALSHA: its script publishes the stop notice), once it has landed; a duplicate of that
commit tells them again, and a commit that leaves the run running tells nobody."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench._wire import Wire, counted_client
from runner.store.base import CommitRequest
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider


@pytest.fixture
def stores(redis_url: str, prefix: str) -> Iterator[tuple[RedisProvider, Wire, RedisProvider]]:
    """A counted store (the committer's) and another one to listen with."""
    client, wire = counted_client(redis_url)
    store, listener = (
        RedisProvider(client=client, prefix=prefix),
        RedisProvider(redis_url, prefix=prefix),
    )
    yield store, wire, listener
    for key in listener.client.scan_iter(f"{prefix}:*"):
        listener.client.delete(key)
    store.close()
    listener.close()


def _step(status: RunStatus, activation: str) -> Checkpoint:
    return Checkpoint(
        run_id="r",
        event="method_execution_finished",
        step=activation,
        activation=activation,
        attempt=f"token-{activation}",
        status=status,
        state={"id": "r"},
    )


def test_the_commit_that_stops_the_run_tells_waiters_in_its_round_trip(
    stores: tuple[RedisProvider, Wire, RedisProvider],
) -> None:
    store, wire, listener = stores
    first = store.commit(Checkpoint(run_id="r", event="flow_started", state={"id": "r"}))
    with listener.stop_notices("r") as notices:
        wire.reset()
        going = store.commit_request(
            CommitRequest(_step(RunStatus.RUNNING, "one"), expected_seq=first.seq, announce=True)
        )
        assert wire.sends == 1
        assert notices.next(0.3) is None  # still running: nobody told

        wire.reset()
        last = _step(RunStatus.SUCCEEDED, "two")
        store.commit_request(CommitRequest(last, expected_seq=going.seq, announce=True))
        assert wire.sends == 1  # the commit's EVALSHA published the notice too
        assert notices.next(2.0) == "succeeded"

        wire.reset()
        store.commit_request(CommitRequest(last, announce=True))  # a redelivery: a duplicate
        assert notices.next(2.0) == "succeeded"  # told again, as the first commit did

        unasked = _step(RunStatus.FAILED, "three")
        store.commit_request(CommitRequest(unasked))
        assert notices.next(0.3) is None  # without announce, as before: the caller tells
