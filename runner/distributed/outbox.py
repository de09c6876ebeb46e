"""Messages written by the commit that makes their steps ready (a transactional outbox).

When the broker is the store's own Redis, the Celery messages of the steps a commit makes
ready (and their ``task-sent`` events for Flower) need not travel separately: Celery and
kombu build them as for any send, but instead of running kombu's final Redis commands
(``LPUSH`` onto the queue, ``PUBLISH`` of the event) we hand those commands to the commit's
script, which runs them only if the commit lands. A step is then committed ready and queued
in one atomic write: no window in which it is marked sent but not in the queue, no sender
lease to take or drop, no extra round trip.

Catching the commands relies on kombu internals, all in :mod:`.broker`, which checks them
once per process before the first use (:func:`~.broker.outbox_ready`). Where they differ
from what it expects, or kombu hands over an unexpected command later, the process logs one
WARNING and, for its life, sends the steps after their commit under the sender's lease
(:mod:`.handoff`), as with a broker of its own. A broker configuration that cannot be
recorded (a key prefix, retries on timeout) does the same, said once at INFO.

Celery's ``before_task_publish``/``after_task_publish`` signals fire when the message is
built, which is just before the commit; a commit that does not land (a conflict, rebuilt
and recorded again) sends nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.store.base import OutboxCommand as Command

from .services import services

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("runner.broker")

SAID = "outbox.said"
"""The key, in the process's services, of why the outbox is off as this process said it."""


def recorded(app: Celery, publish: Callable[[Any], None]) -> list[Command] | None:
    """The Redis commands of what ``publish(producer)`` publishes (at least one message),
    unsent; ``None`` when the outbox is off for this process or this broker configuration:
    nothing was sent, and the caller sends after the commit."""
    from . import broker  # kombu: imported by a process that sends (it has the app) only

    if not broker.outbox_ready(app):
        return None
    try:
        with app.producer_or_acquire() as producer, broker.recording(producer) as commands:
            if commands is None:
                _say_off(broker.unrecordable(producer) or "")
                return None
            publish(producer)
    except broker.NotRecordable as exc:
        broker.checks.differs(broker.OUTBOX, str(exc))
        return None
    return commands


def _say_off(why: str) -> None:
    own = services()
    said: set[str] = own.one(SAID, set)
    with own.lock:
        if why in said:
            return
        said.add(why)
    log.info("steps are sent after their commit (no outbox): %s", why)
