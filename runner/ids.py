"""Time-sortable identifiers for checkpoints and runs, and the activation keys of steps.

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


# --- activation ids -------------------------------------------------------------------------

ACTIVATION_MARK = "#"
"""Between a method's name and its activation's number (``write#2``: write's second run)."""


def activation_id(method: str, n: int) -> str:
    """The id of ``method``'s ``n``-th activation in a run (``write#2``)."""
    return f"{method}{ACTIVATION_MARK}{n}"


def split_activation(activation_id: str) -> tuple[str, int] | None:
    """``write#2`` as ``("write", 2)``; ``None`` for an id that is not ``method#n``."""
    method, _, n = activation_id.rpartition(ACTIVATION_MARK)
    return (method, int(n)) if method and n.isdigit() else None


def method_of(activation_id: str) -> str:
    """The method an activation id names (``write#2`` -> ``write``); an id that is not
    ``method#n`` is taken as a method's name."""
    split = split_activation(activation_id)
    return activation_id if split is None else split[0]


# --- activation keys ------------------------------------------------------------------------

EPOCH_MARK = "/"
"""Between an activation key's epoch and its activation id (``2/write#1``)."""


def activation_key_in(epoch: int, activation_id: str) -> str:
    """The idempotency key (also the lease and dispatch-marker key) of an activation in
    ``epoch``: epoch 0 keeps the bare id, so runs that were never resumed read naturally."""
    return f"{epoch}{EPOCH_MARK}{activation_id}" if epoch else activation_id


def activation_of_key(key: str) -> str:
    """The activation id of an activation key, its epoch dropped (``2/write#1`` ->
    ``write#1``; a bare id is itself)."""
    return key.rpartition(EPOCH_MARK)[2]


def epoch_of_key(key: str) -> int:
    """The epoch of an activation key (0 for a bare id)."""
    epoch, mark, _ = key.partition(EPOCH_MARK)
    return int(epoch) if mark and epoch.isdigit() else 0
