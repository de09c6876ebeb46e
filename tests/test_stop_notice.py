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


def test_a_wait_on_a_run_that_already_stopped_reads_it_once_and_subscribes_to_nothing(
    stores: tuple[RedisProvider, Wire, RedisProvider], redis_url: str, prefix: str
) -> None:
    from runner.distributed.app import make_app
    from runner.distributed.client import RunHandle
    from runner.distributed.coord import Coordinator
    from runner.distributed.engine import Runtime
    from runner.errors import RunTimeout
    from runner.settings import RunnerSettings

    store, wire, _ = stores
    first = store.commit(Checkpoint(run_id="r", event="flow_started", state={"id": "r"}))
    settings = RunnerSettings(redis_url=redis_url, prefix=prefix)
    rt = Runtime(make_app(settings), store, Coordinator(store, settings.lease_seconds), settings)
    try:
        running = RunHandle("r", rt)
        with pytest.raises(RunTimeout, match="still running"):
            running.wait(timeout=0.2)  # a run still going: it subscribes and waits

        store.commit(_step(RunStatus.SUCCEEDED, "one").model_copy(update={"seq": first.seq}))
        wire.reset()
        assert RunHandle("r", rt).wait(timeout=5) is RunStatus.SUCCEEDED
        # One read, no SUBSCRIBE (nor the connection a subscription takes) for a run that
        # had stopped: a producer waiting on many runs in turn pays for one only while a
        # run still goes.
        assert wire.sends == 1
    finally:
        rt.app.close()
