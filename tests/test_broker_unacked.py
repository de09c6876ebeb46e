"""Messages a Redis broker loses between a queue and a worker are recovered; queued ones are not.

Kombu's Redis transport pops a message off the queue (``BRPOP``), then records it in its
``unacked`` hash until it is acknowledged, and gives it back only after the broker's
visibility timeout (an hour). A worker killed in between leaves a step that is marked sent
and has no lease: it looks queued. The recovery pass reads the broker (at most once per
pass) and re-sends, once, a step whose message is in nobody's hands: taken more than a
lease ago with no lease recorded for it, or neither queued nor taken a lease after it
was sent. A message waiting in the queue, however long, is never re-sent.

The deployment here has no worker: its queue keeps what is sent to it, and the recovery
pass is run by hand on a runtime that knows the flow.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from runner.distributed import handoff, recovery
from runner.distributed.app import make_app
from runner.distributed.broker import QUEUE_READ_LIMIT, BrokerView, queue_length
from runner.distributed.engine import Runtime, first_checkpoint, task_id, task_name
from runner.distributed.recovery import recover
from runner.settings import RunnerSettings
from runner.store.base import CommitRequest
from tests.flows.parity import LinearParity

pytestmark = pytest.mark.broker  # part of the broker conformance suite (make test-latest)

LEASE = 1.0


@pytest.fixture
def lone(worker_env: dict[str, str], redis_client: redis.Redis) -> Iterator[Runtime]:
    """A deployment no worker serves, whose recovery pass knows ``LinearParity``."""
    name = f"lone-{uuid.uuid4().hex[:8]}"
    url = worker_env["RUNNER_REDIS_URL"]
    settings = RunnerSettings(redis_url=url, prefix=name, queue=name, lease_seconds=LEASE)
    rt = Runtime.create(make_app(settings), settings)
    rt.flows[LinearParity.flow_name()] = LinearParity
    yield rt
    assert handoff.flush(5.0)  # the re-sends' sender leases, dropped before the store closes
    redis_client.delete(name)
    for key in redis_client.scan_iter(f"{name}:*"):
        redis_client.delete(key)
    rt.app.close()
    rt.store.close()


def _view(rt: Runtime) -> BrokerView:
    return BrokerView(rt.app, rt.settings.lease_seconds, rt.settings.queue)


def _marked_sent(rt: Runtime) -> str:
    """A new run whose first step is marked sent by its commit, and sent nowhere."""
    first = first_checkpoint(LinearParity, {"tag": uuid.uuid4().hex})
    rt.store.commit_request(CommitRequest(first.checkpoint, expected_seq=0, dispatching=["one#1"]))
    return first.checkpoint.run_id


def test_a_message_lost_between_queue_and_worker_is_sent_again_once(
    lone: Runtime, redis_client: redis.Redis
) -> None:
    run = _marked_sent(lone)  # its message was popped by a worker that died at once
    assert recover(lone, force=True) == {}  # younger than a lease: could be in a worker's hands
    time.sleep(LEASE + 0.2)

    assert recover(lone, force=True) == {run: ["one#1"]}

    # The message sent again waits in the queue: a backlog, never re-sent however long.
    assert queue_length(lone.app, lone.settings.queue) == 1
    time.sleep(LEASE + 0.2)
    assert recover(lone, force=True) == {}
    assert queue_length(lone.app, lone.settings.queue) == 1


def test_a_message_a_live_worker_records_while_the_pass_looks_is_not_sent_again(
    lone: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker pops the message of a step queued for over a lease (a backlog) just as the
    # pass reads the broker: between its BRPOP and kombu's record in ``unacked`` the message
    # is in neither place, and the pass must not send it again (it would start twice).
    run = _marked_sent(lone)
    time.sleep(LEASE + 0.2)
    with lone.app.connection_for_read() as conn:
        taken = []

        def the_worker_records_it() -> None:
            # What the worker does in that moment: the message reaches it (sent here, where
            # the lost one would have been) and kombu records it as taken.
            name = task_name(LinearParity.flow_name(), "one")
            lone.app.send_task(name, task_id=task_id(run, 0, "one#1"), queue=lone.settings.queue)
            taken.append(conn.default_channel.basic_get(lone.settings.queue, no_ack=False))

        monkeypatch.setattr(recovery, "settle_handoff", the_worker_records_it)
        try:
            assert recover(lone, force=True) == {}  # found nowhere once, then taken: not lost
            assert [m.headers["id"] for m in taken] == [task_id(run, 0, "one#1")]
            assert queue_length(lone.app, lone.settings.queue) == 0  # nothing sent again
        finally:
            for message in taken:
                message.ack()


def test_a_message_taken_by_a_worker_that_died_before_recording_it_is_sent_again_once(
    lone: Runtime, redis_client: redis.Redis
) -> None:
    run = _marked_sent(lone)
    time.sleep(LEASE + 0.2)
    assert recover(lone, force=True) == {run: ["one#1"]}  # lost: nowhere
    # A worker takes the message sent again and dies without recording it (no lease):
    # kombu itself moves it to its ``unacked`` hash, and keeps it there for as long as the
    # channel that took it is neither closed (it would give it back) nor acknowledges it.
    with lone.app.connection_for_read() as conn:
        message = conn.default_channel.basic_get(lone.settings.queue, no_ack=False)
        assert message is not None and message.headers["id"] == task_id(run, 0, "one#1")
        assert redis_client.hexists("unacked", message.delivery_tag)
        try:
            assert recover(lone, force=True) == {}  # taken just now: a worker holds it
            time.sleep(LEASE + 0.2)
            assert task_id(run, 0, "one#1") in _view(lone).taken_long_ago()

            assert recover(lone, force=True) == {run: ["one#1"]}

            # Sent again once: the marker now postdates that delivery, and the new message
            # is queued.
            time.sleep(LEASE + 0.2)
            assert recover(lone, force=True) == {}
        finally:
            message.ack()


def test_past_the_queue_read_limit_a_step_counts_as_queued(
    lone: Runtime, redis_client: redis.Redis
) -> None:
    run = _marked_sent(lone)
    # A backlog longer than the pass reads, none of it this step's message.
    filler = [b'{"headers": {"id": "other"}}'] * (QUEUE_READ_LIMIT + 1)
    redis_client.lpush(lone.settings.queue, *filler)
    time.sleep(LEASE + 0.2)
    assert _view(lone).lost(task_id(run, 0, "one#1"), "LinearParity.one") is False
    assert recover(lone, force=True) == {}

    redis_client.ltrim(lone.settings.queue, 0, QUEUE_READ_LIMIT - 2)  # short enough to read
    assert _view(lone).lost(task_id(run, 0, "one#1"), "LinearParity.one") is True
    assert recover(lone, force=True) == {run: ["one#1"]}
    assert queue_length(lone.app, lone.settings.queue) == QUEUE_READ_LIMIT
