"""Changes a kombu release could make to the internals runner relies on, injected into kombu.

Each fault is a plausible edit of kombu 5.7.0's own code (not of runner's): the broker
conformance suite (``tests/test_broker_conformance.py``) injects one into the test process
(``monkeypatch.setattr(*FAULTS[name])``) or into a worker (``celery -A
tests.kombu_faulty_worker worker`` with ``KOMBU_FAULT=<name>``) and checks that runner notices
it, says so once, and still delivers every step without publishing one before its commit.
"""

from __future__ import annotations

import time
from typing import Any

import kombu.messaging
import kombu.transport.redis
from kombu.transport import virtual
from kombu.utils.json import dumps


def _session_from_class(self: Any, channel: Any) -> Any:
    """kombu 5.7's ``_ProducerBatchState._get_session``, looking the batch factory up on
    the channel's class instead of the instance."""
    if self.immediate:
        return None
    if self.session is None:
        create_batch = getattr(type(channel), "create_publish_batch", None)
        supports_batch = getattr(channel, "supports_batch_publish", True)
        if create_batch is None or not supports_batch:
            self.immediate = True
            return None
        self.session = create_batch(channel, max_size=self.max_size)
    elif self.session.channel is not channel:
        raise RuntimeError("Producer channel changed while a publish batch was active")
    return self.session


def _append_as_object(self: Any, message: Any, delivery_tag: str) -> None:
    """kombu 5.7's Redis ``QoS.append``, recording an unacknowledged message as a JSON
    object instead of the list ``[message, exchange, routing key]``."""
    delivery = message.delivery_info
    entry = {"message": message._raw, "exchange": delivery["exchange"]}
    with self.pipe_or_acquire() as pipe:
        pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}).hset(
            self.unacked_key, delivery_tag, dumps(entry)
        ).execute()
    virtual.QoS.append(self, message, delivery_tag)


_put = kombu.transport.redis.Channel._put


class _RightPushes:
    """A publish batch as kombu would see it if its ``_put`` appended with ``rpush``."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def add(self, name: str, *args: Any) -> None:
        self.batch.add("rpush" if name == "lpush" else name, *args)


def _put_with_rpush(self: Any, queue: str, message: Any, **kwargs: Any) -> None:
    """kombu 5.7's Redis ``Channel._put``, handing a batch ``rpush`` instead of ``lpush``."""
    if kwargs.get("_publish_batch") is not None:
        kwargs["_publish_batch"] = _RightPushes(kwargs["_publish_batch"])
    _put(self, queue, message, **kwargs)


def _create_client_with_options(
    self: Any, asynchronous: bool = False, *, single_connection: bool = False
) -> Any:
    """kombu 5.7's Redis ``Channel._create_client`` with an option more: a release that builds
    its clients differently (one connection of their own, say)."""
    pool = self.async_pool if asynchronous else self.pool
    return self.Client(connection_pool=pool, single_connection_client=single_connection)


FAULTS: dict[str, tuple[Any, str, Any]] = {
    "batch-factory-on-class": (
        kombu.messaging._ProducerBatchState,
        "_get_session",
        _session_from_class,
    ),
    "unacked-as-object": (kombu.transport.redis.QoS, "append", _append_as_object),
    "rpush": (kombu.transport.redis.Channel, "_put", _put_with_rpush),
    "client-with-options": (
        kombu.transport.redis.Channel,
        "_create_client",
        _create_client_with_options,
    ),
}
"""Fault name -> (kombu object, attribute, replacement)."""


def inject(name: str) -> None:
    """Apply the fault ``name`` to kombu for the rest of this process."""
    target, attribute, replacement = FAULTS[name]
    setattr(target, attribute, replacement)
