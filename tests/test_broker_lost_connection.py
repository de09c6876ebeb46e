"""A worker's broker connection closed twice after it was lost (Celery's consumer
``collect()``s it, which drops the transport's client, then ``close()``s it) with messages
taken and not acknowledged: the second close must not raise, or Celery reports an
"Unrecoverable error" and the worker stops (seen under Redis restarts in the chaos suite)."""

from __future__ import annotations

import uuid

import kombu
import redis
from kombu import Exchange, Producer, Queue

from runner.distributed.broker import guard_closed_channels


def test_closing_a_connection_whose_client_was_dropped_keeps_the_worker_up(
    redis_url: str, redis_client: redis.Redis
) -> None:
    guard_closed_channels()
    name = f"t-lost-{uuid.uuid4().hex[:8]}"
    conn = kombu.Connection(redis_url)
    channel = conn.default_channel
    Queue(name, Exchange(name), routing_key=name)(channel).declare()
    Producer(channel).publish({"n": 1}, exchange=name, routing_key=name, serializer="json")
    message = channel.basic_get(name, no_ack=False)  # taken, not acknowledged
    assert message is not None
    try:
        conn.transport.client = None  # what collect() leaves on a lost connection
        conn.close()  # the second close: restoring through the dropped client
    finally:
        redis_client.hdel("unacked", message.delivery_tag)
        redis_client.zrem("unacked_index", message.delivery_tag)
        redis_client.delete(name)
