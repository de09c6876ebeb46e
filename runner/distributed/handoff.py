"""Soft leases: who answers for a step between the commit that makes it ready and its run.

Recovery re-sends a step only when nobody answers for it, and a lease says who does.
Besides the lease of the attempt that runs a step (a *hard* lease, renewed by the
heartbeat of :mod:`runner.distributed.coord`), two *soft* leases cover the moments a
message could be lost with no attempt running:

* the **sender**'s, taken by the commit that makes the step ready (or before the
  dispatch marker) and dropped once the broker accepted the message: a sender that dies
  in between leaves a lease that lapses;
* the **receiving worker**'s, taken when the message reaches a worker (prefetched, or a
  retry waiting for its countdown) and renewed by that worker until an attempt begins:
  a worker that dies holding messages leaves leases that lapse, and so does a worker done
  with a message that no attempt began (its pool child died first: Celery requeues the
  message, or drops it if it was redelivered before).

An attempt that begins takes over any soft lease at once, and a receiving worker a
sender's (the store's begin lets them give way; the commit that makes steps ready gives
them the sender's lease in the same round trip). So a step that is marked sent and has
no lease at all is in the broker's queue, and stays there however long the backlog:
recovery never re-sends it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .coord import Coordinator, attempt_token

SOFT = "~"
"""Tokens of soft leases start with this (an attempt's token never does; the store's
begin script knows it too)."""

_senders: dict[int, str] = {}


def soft_token(kind: str) -> str:
    """A fresh soft-lease token of ``kind`` (``send``, ``recv``) that says where it is held."""
    return f"{SOFT}{kind}:{attempt_token()}"


def sender_token() -> str:
    """This process's sender token (one per process: a forked child gets its own)."""
    pid = os.getpid()
    token = _senders.get(pid)
    if token is None:
        token = _senders[pid] = soft_token("send")
    return token


def hold(coord: Coordinator, run_id: str, keys: Sequence[str]) -> None:
    """Take the sender's lease of ``keys`` before marking (or committing) them ready.

    A key whose lease another live holder has is left alone (someone answers for it),
    and so is a key already committed.
    """
    token = sender_token()
    for key in keys:
        coord.begin(run_id, key, token)


def let_go(coord: Coordinator, run_id: str, keys: Sequence[str]) -> None:
    """Drop the sender's lease of ``keys`` (the broker has the messages, or none is due)."""
    token = sender_token()
    for key in keys:
        coord.release(run_id, key, token)
