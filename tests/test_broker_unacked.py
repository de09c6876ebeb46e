"""A message a worker took off a Redis broker's queue and died before recording is recovered.

Kombu's Redis transport keeps a message it delivered in its ``unacked`` hash until it is
acknowledged, and gives it back only after the broker's visibility timeout (an hour). A
worker killed between taking a message and recording its receipt leaves a step that is
marked sent and has no lease: it looks queued. The recovery pass reads the ``unacked``
hash and re-sends such a step, once.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis

from runner.distributed.engine import first_checkpoint, task_id
from runner.distributed.recovery import recover, taken_by_dead_receivers
from runner.store.models import RunStatus
from tests._dist_support import eventually
from tests.flows.parity import LinearParity


def test_a_step_taken_by_a_worker_that_died_before_recording_it_is_sent_again(
    rt: Any, redis_client: redis.Redis
) -> None:
    # The run's first step is marked sent (as by a commit) but its message was taken off
    # the queue by a worker that died at once: no message queued, no lease anywhere.
    first = first_checkpoint(LinearParity, {"tag": uuid.uuid4().hex})
    run_id = first.checkpoint.run_id
    rt.store.commit(first.checkpoint, expected_seq=0, dispatching=["one#1"])
    delivered = time.time()  # a worker took the message just after the commit sent it
    lease = rt.settings.lease_seconds
    time.sleep(lease + 1)
    assert recover(rt, force=True) == {}  # looks queued: never re-sent on its own
    assert rt.store.latest(run_id).status is RunStatus.RUNNING

    # ... while kombu still holds its message as delivered then, over a lease ago.
    tag = f"test-{uuid.uuid4().hex}"
    message = {"headers": {"id": task_id(run_id, 0, "one#1"), "task": "LinearParity.one"}}
    redis_client.hset("unacked", tag, json.dumps([message, "", rt.settings.queue]))
    redis_client.zadd("unacked_index", {tag: delivered})
    try:
        assert task_id(run_id, 0, "one#1") in taken_by_dead_receivers(rt)
        # The session workers' own recovery passes may be first: either way it is re-sent
        # and the run finishes.
        recover(rt, force=True)
        status = eventually(
            lambda: (rt.store.latest(run_id).status is RunStatus.SUCCEEDED) or None, timeout=30
        )
        assert status
        # Re-sent once: the marker now postdates that delivery.
        assert recover(rt, force=True) == {}
    finally:
        redis_client.hdel("unacked", tag)
        redis_client.zrem("unacked_index", tag)
