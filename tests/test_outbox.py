"""With the broker on the store's Redis, a commit writes the messages of the steps it makes
ready (the outbox): committed ready and queued in one atomic write, with no sender lease.
With a broker of its own, the steps go after their commit under the sender's lease."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from kombu import Connection

from runner.distributed import handoff
from runner.distributed.broker import queue_length, recording, unrecordable
from runner.distributed.client import submit
from runner.store.models import RunStatus
from tests._dist_support import private_pool
from tests.flows.dist import DistEcho

pytestmark = pytest.mark.broker  # part of the broker conformance suite (make test-latest)


@pytest.mark.workers
def test_a_start_is_queued_by_the_commit_that_creates_its_run(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        assert rt.sends_in_commit
        # Let-gos an earlier test of this process gave the thread are dropped first (under
        # xdist any file may have run here before), so the flush below sees only this submit.
        assert handoff.flush(10.0)
        handle = submit(DistEcho, {"count": 2}, rt=rt)
        # Nothing runs yet: the message is in the queue, marked sent, and nobody holds a
        # lease for it (nor ever did: no let-go is left to drop one).
        assert queue_length(rt.app, env["RUNNER_QUEUE"]) == 1
        assert set(rt.coord.dispatched(handle.run_id)) == {"hello#1"}
        assert rt.coord.leases(handle.run_id) == {}
        assert handoff.flush(0.0)

        pool.start()
        assert handle.result(timeout=30) == 4
        assert rt.coord.leases(handle.run_id) == {}
        assert queue_length(rt.app, env["RUNNER_QUEUE"]) == 0


@pytest.mark.workers
def test_with_a_broker_of_its_own_a_step_is_sent_after_its_commit(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    # The same Redis under another name is a broker of its own to the runner.
    broker = worker_env["RUNNER_REDIS_URL"].replace("127.0.0.1", "localhost")
    assert broker != worker_env["RUNNER_REDIS_URL"]
    with private_pool(worker_env, str(tmp_path), RUNNER_BROKER_URL=broker) as (pool, rt, env):
        assert not rt.sends_in_commit
        with rt.app.producer_or_acquire() as producer:
            assert unrecordable(producer) is None  # its channel could be: the URL decides
        handle = submit(DistEcho, {"count": 2}, rt=rt)
        assert queue_length(rt.app, env["RUNNER_QUEUE"]) == 1
        assert handoff.flush(5.0)  # the sender's lease, taken by the commit, is dropped
        assert rt.coord.leases(handle.run_id) == {}

        pool.start()
        assert handle.wait(timeout=30) is RunStatus.SUCCEEDED
        assert handle.result() == 4


def test_a_channel_that_would_change_or_send_the_commands_is_not_recorded(
    redis_url: str, redis_client: redis.Redis
) -> None:
    # A key prefix is applied by kombu's client when it runs the commands (the script would
    # not), and a channel that retries on timeout does not batch (kombu would publish at
    # once): either way the steps are sent the usual way.
    for options, recorded in (
        ({}, True),
        ({"global_keyprefix": "p:"}, False),
        ({"retry_on_timeout": True}, False),
    ):
        with Connection(redis_url, transport_options=options) as conn:
            producer = conn.Producer()
            with recording(producer) as commands:
                assert (commands is not None) is recorded, options
                if commands is not None:
                    producer.publish({"x": 1}, routing_key="outbox-test-queue")
                    assert [c[0] for c in commands] == ["lpush"]
        assert redis_client.llen("outbox-test-queue") == 0  # recorded, not run
