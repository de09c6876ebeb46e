"""A lost connection to Redis (or the broker), said once: one WARNING when it goes, one INFO
when it answers again, however many threads noticed.

Every background thread of a worker (the recovery pass, the receipts' leases, the lease
heartbeats, the sender-lease let-go thread, the concurrency-slot renewer) hands a failure
to :func:`report`, which takes a connection error as the outage it is (a state change,
said once, no traceback) and leaves any other error to the caller's own log. Celery's and
kombu's records of the same outage are folded in by the worker's logging filter
(:mod:`runner.distributed.worker`). A forked pool child stays silent: its parent uses the
same servers, notices the same outage and says it for the whole worker.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

from runner.errors import StoreUnavailable

from .services import services

log = logging.getLogger("runner.worker")

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    StoreUnavailable,
    ConnectionError,
    TimeoutError,
)
"""What the store (and the standard library) raise for a server that does not answer."""


SETTLE = 10.0
"""Seconds after a connection came back during which losing it again is taken as the same
outage settling (stale connections of the pool failing one by one, a restarted Redis
loading its data): one WARNING and one INFO per outage, not one pair per stale socket."""


class Watch:
    """One process's view of its connection: down since when, and back when."""

    def __init__(self, what: str = "Redis") -> None:
        self.what = what
        self.down_since: float | None = None
        self.back_at = -float("inf")
        self.quiet = False
        """The present outage began within :data:`SETTLE` seconds of the last one's end: the
        same outage's aftermath (a connection opened before it failing once more, a server
        still loading its data), not said again."""
        self.lock = threading.Lock()

    def lost(self, cause: object) -> None:
        """Something failed for want of a connection: say so once per outage."""
        with self.lock:
            if self.down_since is not None or not speaks():
                return
            self.down_since = time.monotonic()
            self.quiet = self.down_since - self.back_at < SETTLE
            if self.quiet:
                return
        log.warning(
            "lost the connection to %s (%s); the worker waits and reconnects",
            self.what,
            first_line(cause),
        )

    def back(self) -> None:
        """Something that needs the connection worked: end the outage, if there was one."""
        with self.lock:
            since, self.down_since = self.down_since, None
            quiet, self.quiet = self.quiet, False
            if since is not None:
                self.back_at = time.monotonic()
        if since is not None and not quiet:
            log.info("connection to %s is back after %.1fs", self.what, time.monotonic() - since)


_speaker: list[int] = []
"""The pid of the worker's main process, once :func:`speak_here` named it (inherited by its
pool children, which so know they are not it)."""


def speak_here(what: str) -> Watch:
    """Make this process (a worker's main process, before its pool forks) the one that says
    its outages, naming the connection ``what`` (``Redis at <url>``); its :class:`Watch`."""
    _speaker[:] = [os.getpid()]
    found = watch()
    found.what = what
    return found


def speaks() -> bool:
    """Whether this process says its outages: any process, unless a worker's main process
    said it speaks for its pool children."""
    return not _speaker or _speaker[0] == os.getpid()


def watch() -> Watch:
    """This process's :class:`Watch` (a forked child makes its own, which stays silent)."""
    return services().one(Watch, Watch)


def is_connection_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` says a server did not answer (refused, reset, timed out)."""
    if exc is None:
        return False
    if isinstance(exc, CONNECTION_ERRORS):
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.ECONNREFUSED, errno.ECONNRESET)


def report(exc: BaseException) -> bool:
    """Take ``exc`` as an outage if it is a connection error (said once, see :class:`Watch`);
    whether it was one (if not, the caller logs it as its own)."""
    if not is_connection_error(exc):
        return False
    watch().lost(exc)
    return True


def first_line(cause: object) -> str:
    """The first line of ``cause`` (its type's name if it says nothing)."""
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__
