"""Messages written by the commit that makes their steps ready (a transactional outbox).

When the broker is the store's own Redis, the Celery messages of the steps a commit makes
ready (and their ``task-sent`` events for Flower) need not travel separately: Celery and
kombu build them as for any send, but instead of running kombu's final Redis commands
(``LPUSH`` onto the queue, ``PUBLISH`` of the event) we hand those commands to the commit's
script, which runs them only if the commit lands. A step is then committed ready and queued
in one atomic write: no window in which it is marked sent but not in the queue, no sender
lease to take or drop, no extra round trip.

The commands are caught through kombu's publish-batch protocol (kombu >= 5.7: a channel's
``create_publish_batch`` returns a session whose ``publish`` routes a message through
``basic_publish`` and whose ``add`` receives each final Redis command): :func:`recording`
gives the producer's channel a session that keeps the commands instead of running them.

Celery's ``before_task_publish``/``after_task_publish`` signals fire when the message is
built, which is just before the commit; a commit that does not land (a conflict, rebuilt
and recorded again) sends nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runner.store.redis import OUTBOX_COMMANDS
from runner.store.redis import OutboxCommand as Command


class NotRecordable(Exception):
    """kombu asked for a command the commit cannot run for it."""


class _Session:
    """kombu's publish-batch session, keeping the commands rather than running them."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.commands: list[Command] = []

    def publish(self, message: Any, **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        if name not in OUTBOX_COMMANDS or len(args) != 2:
            raise NotRecordable(f"kombu publishes with {name}/{len(args)}")
        self.commands.append((name, str(args[0]), args[1]))

    def flush(self) -> None:
        """Nothing to run: the commit runs the commands."""

    def discard(self) -> None:
        self.commands.clear()

    def close(self) -> None:
        """Nothing held."""


def recordable(channel: Any) -> bool:
    """Whether ``channel`` (a kombu channel) is a Redis channel whose publishes can be caught:
    it batches (else kombu would publish at once) and adds no key prefix of its own (its
    client would apply it when running the commands, and our script would not)."""
    return (
        callable(getattr(channel, "create_publish_batch", None))
        and bool(getattr(channel, "supports_batch_publish", False))
        and not getattr(channel, "global_keyprefix", "")
    )


@contextmanager
def recording(producer: Any) -> Iterator[list[Command] | None]:
    """Catch the commands of what ``producer`` publishes inside the block.

    Yields the list they are added to, or ``None`` when the producer's channel cannot be
    recorded (the caller sends the usual way). The producer must be the caller's alone for
    the block (as one from Celery's producer pool is). ``NotRecordable`` if kombu asks for
    an unexpected command: nothing was sent.
    """
    channel = producer.channel
    if not recordable(channel):
        yield None
        return
    session = _Session(channel)
    # The channel's own factory, shadowed for this block only.
    channel.create_publish_batch = lambda max_size: session
    try:
        with producer.batch():
            yield session.commands
    finally:
        del channel.create_publish_batch
