"""Soft leases: who answers for a step between the commit that makes it ready and its run.

Recovery re-sends a step only when nobody answers for it, and a lease says who does.
Besides the lease of the attempt that runs a step (a *hard* lease, renewed by the
heartbeat of :mod:`runner.distributed.coord`), two *soft* leases cover the moments a
message could be lost with no attempt running:

* the **sender**'s, taken by the commit that makes the step ready (or before the
  dispatch marker) and dropped once the broker accepted the message: a sender that dies
  in between leaves a lease that lapses. The drop is off the step's path: a thread of
  the sending process does it (:func:`let_go`), so a step costs no round trip for it.
  A commit that writes its steps' messages itself (a Redis broker on the store's Redis,
  see :mod:`runner.distributed.outbox`) has no in between, and takes no such lease;
* the **receiving worker**'s, for a message a worker holds without running it (prefetched,
  or a retry waiting for its countdown): taken within a third of a lease of its arrival
  and renewed until an attempt begins. A worker that dies holding messages leaves leases
  that lapse, and so does a worker done with a message that no attempt began (its pool
  child died first: Celery requeues the message, or drops it if it was redelivered
  before). A message whose attempt begins at once (the usual case) needs no such lease;
  one whose worker dies before the lease is taken is the broker's to give back (RabbitMQ
  requeues it, and recovery reads a Redis broker's unacknowledged messages).

An attempt that begins takes over any soft lease at once, and a receiving worker a
sender's (the store's begin lets them give way; the commit that makes steps ready gives
them the sender's lease in the same round trip). So a step that is marked sent and has
no lease at all is in the broker's queue, and stays there however long the backlog:
recovery never re-sends it.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Sequence

from runner.errors import RunnerError

from . import outage
from .coord import Coordinator, attempt_token
from .services import services

log = logging.getLogger("runner.worker")

SOFT = "~"
"""Tokens of soft leases start with this (an attempt's token never does; the store's
lease scripts know it too)."""


def soft_token(kind: str) -> str:
    """A fresh soft-lease token of ``kind`` (``send``, ``recv``) that says where it is held."""
    return f"{SOFT}{kind}:{attempt_token()}"


def sender_token() -> str:
    """This process's sender token (one per process: a forked child makes its own)."""
    return services().one(SENDER_TOKEN, lambda: soft_token("send"))


def hold(coord: Coordinator, run_id: str, keys: Sequence[str]) -> None:
    """Take the sender's lease of ``keys`` before marking (or committing) them ready.

    A key whose lease another live holder has is left alone (someone answers for it),
    and so is a key already committed.
    """
    coord.claim(run_id, keys, sender_token())


def let_go(coord: Coordinator, run_id: str, keys: Sequence[str]) -> None:
    """Drop the sender's lease of ``keys`` soon (the broker has the messages, or none is due).

    A thread of this process drops what a short while brought together in one round trip,
    so the caller (a step on its way to the next) does not wait, and a busy worker pays a
    fraction of a round trip per step. Should the process die first, the leases lapse
    and recovery sends those steps again: a duplicate message, which begin turns away.
    """
    if keys:
        releases().add(coord, [(run_id, key, sender_token()) for key in keys])


def flush(timeout: float = 5.0) -> bool:
    """Wait until the leases :func:`let_go` was given are dropped; whether they were."""
    found = services().made.get(_Releases)
    return True if found is None else found.flush(timeout)  # none given to this process


LINGER = 0.05
"""Seconds the let-go thread waits for more leases to drop before it drops them together:
short beside any lease, long beside a step."""


SENDER_TOKEN = "handoff.sender-token"
"""The key of this process's sender token in its services."""


def releases() -> _Releases:
    """This process's let-go thread and the leases it is to drop (a forked child's own)."""
    return services().one(_Releases, _Releases)


class _Releases:
    """Sender leases to drop, dropped together by one thread per process (started on
    first use; a forked child makes a new one of these, with a thread of its own)."""

    def __init__(self) -> None:
        self.pending: dict[Coordinator, list[tuple[str, str, str]]] = {}
        self.busy = False
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def add(self, coord: Coordinator, held: list[tuple[str, str, str]]) -> None:
        with self.cond:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="let-go", daemon=True)
                self.thread.start()
            self.pending.setdefault(coord, []).extend(held)
            self.cond.notify_all()

    def flush(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: not self.pending and not self.busy, timeout)

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: bool(self.pending))
                self.busy = True
            time.sleep(LINGER)
            with self.cond:
                batches, self.pending = self.pending, {}
            for coord, held in batches.items():
                try:
                    coord.release_all(held)
                except RunnerError as exc:  # they lapse instead: a duplicate send at worst
                    if not outage.report(exc):  # a lost connection is said once, per worker
                        log.warning("could not drop %d sender lease(s): %s", len(held), exc)
                except Exception:  # a bug; the thread must live on for the next drops
                    log.exception("could not drop %d sender lease(s)", len(held))
            with self.cond:
                self.busy = False
                self.cond.notify_all()


# A producer script that submits and exits drops its leases first, so a start waiting
# in a backlog is not sent twice.
atexit.register(flush, 2.0)
