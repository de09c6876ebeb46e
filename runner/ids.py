"""Time-sortable identifiers for checkpoints and runs.

An id is 12 hex digits of milliseconds since the epoch followed by 16 hex digits
that are random per process and incremented within one millisecond, so ids made
by one process sort by creation time and ids from different processes sort by
millisecond.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def checkpoint_id(now_ms: int | None = None) -> str:
    """Return a new, time-sortable 28-character hex id."""
    global _last_ms, _counter
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    with _lock:
        if ms <= _last_ms:
            ms = _last_ms
            _counter += 1
        else:
            _last_ms = ms
            _counter = secrets.randbits(63)
        tail = _counter & (2**64 - 1)
    return f"{ms:012x}{tail:016x}"


def after_fork() -> None:
    """Make a forked child's ids its own: a fresh lock (a parent thread may have held it at
    the fork) and a fresh random tail (else parent and child make the same ids in the same
    millisecond). Called by the process's one at-fork hook
    (:mod:`runner.distributed.services`)."""
    global _lock, _last_ms
    _lock = threading.Lock()
    _last_ms = 0


def run_id() -> str:
    """Return a fresh run id (a UUID4 string, as CrewAI's flow state ids)."""
    return str(uuid.uuid4())
