"""What one process keeps for its life, in one object, and the one at-fork hook.

A producer or worker process holds a Celery app, a runtime (app, store, coordinator),
clients on the broker's Redis, and a few background threads (a lease heartbeat per
coordinator, the sender-lease let-go thread, the concurrency-slot renewer). A Celery pool
child is forked from the worker's main process and inherits all of it, but not the
threads, and a lock a parent thread held at the fork stays held for ever in the child.

So everything per process is here, in :func:`services`, and one
``os.register_at_fork(after_in_child=...)`` hook (:meth:`Services.after_fork`) makes a
child's own:

* what this process made on demand (:meth:`Services.one`: the let-go thread and its
  leases, the sender token, limit gates and their slots, broker clients, where state
  copies go, what the outbox said) is forgotten: the child makes its own on first use;
* each object adopted with :meth:`Services.adopt` (a coordinator's heartbeats, the broker
  checks) gets fresh locks, forgets its parent's work and starts its thread again on
  first use;
* every live :class:`~runner.store.redis.RedisProvider` (whoever made it) gets a new
  connection pool and a fresh lock, and so does the id generator (:mod:`runner.ids`);
* the app and the runtime are kept: the pool child runs its steps with them.

Background threads start on first use, never at import or fork, so a step pays no thread
start and a forked child starts only those it needs.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from runner import ids

if TYPE_CHECKING:
    from celery import Celery

T = TypeVar("T")


class ForkAware(Protocol):
    """An object a forked child must make its own (fresh locks, no parent's threads)."""

    def after_fork(self) -> None:
        """Called in the child right after a fork, before any other thread runs."""


class Services:
    """This process's app, runtime, per-process parts and fork-aware objects."""

    def __init__(self) -> None:
        self.app: Celery | None = None
        """The process-wide Celery app (:func:`runner.distributed.app.get_app`)."""
        self.runtime: Any = None
        """The process-wide :class:`~runner.distributed.engine.Runtime`
        (:func:`runner.distributed.client.runtime`)."""
        self.lock = threading.Lock()
        self.made: dict[Hashable, Any] = {}
        self.adopted: weakref.WeakSet[Any] = weakref.WeakSet()
        self.forks = 0
        """How many forks this process is from the one that imported this module."""

    def one(self, key: Hashable, make: Callable[[], T]) -> T:
        """This process's object for ``key``, made by ``make`` on first use (a forked
        child makes its own)."""
        found = self.made.get(key)
        if found is None:
            with self.lock:
                found = self.made.get(key)
                if found is None:
                    found = self.made[key] = make()
        return found

    def adopt(self, part: ForkAware) -> None:
        """Have ``part.after_fork()`` called in every child forked from now (held weakly)."""
        with self.lock:
            self.adopted.add(part)

    def after_fork(self) -> None:
        """Make a forked child's services its own (see the module docstring)."""
        self.lock = threading.Lock()
        self.made = {}
        self.forks += 1
        ids.after_fork()
        for part in list(self.adopted):
            part.after_fork()
        # Providers exist only once their module is loaded: a process that never used
        # Redis does not import redis-py here.
        if "runner.store.redis" in sys.modules:
            from runner.store.redis import RedisProvider

            for provider in RedisProvider.live():
                provider.after_fork()


_services = Services()


def services() -> Services:
    """This process's services (one object for the process's life; a forked child's has
    been made its own by the at-fork hook)."""
    return _services


os.register_at_fork(after_in_child=_services.after_fork)
