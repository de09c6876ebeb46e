"""Flow events and the listener hooks that observe them.

Events mirror CrewAI's names. A listener is any object with an ``on_event``
method; :class:`EventListener` is the no-op base to subclass. A listener that
raises is logged and ignored: observing a run never breaks it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from pydantic import BaseModel, Field

log = logging.getLogger("runner.events")

FLOW_STARTED = "flow_started"
METHOD_STARTED = "method_execution_started"
METHOD_FINISHED = "method_execution_finished"
METHOD_FAILED = "method_execution_failed"
FLOW_FINISHED = "flow_finished"
FLOW_FAILED = "flow_failed"
FLOW_PAUSED = "flow_paused"
STATE_CONFLICT = "state_conflict"

ALL_EVENTS = frozenset(
    {
        FLOW_STARTED,
        METHOD_STARTED,
        METHOD_FINISHED,
        METHOD_FAILED,
        FLOW_FINISHED,
        FLOW_FAILED,
        FLOW_PAUSED,
        STATE_CONFLICT,
    }
)


class FlowEvent(BaseModel):
    """Something that happened in a run."""

    type: str
    """One of the event names in this module."""
    run_id: str
    flow: str
    """The flow's name."""
    method: str | None = None
    """The method the event is about, if any."""
    timestamp: float = Field(default_factory=time.time)
    duration: float | None = None
    """Seconds the method or run took, on ``*_finished`` and ``*_failed`` events."""
    error: str | None = None
    """``Type: message`` on failure events."""
    data: dict[str, Any] = Field(default_factory=dict)


class EventListener:
    """Base class of event hooks: override :meth:`on_event` (a no-op here)."""

    def on_event(self, event: FlowEvent) -> None:
        """Called for every event of every run this listener is attached to."""


_global: list[EventListener] = []
_lock = threading.Lock()


def register(listener: EventListener) -> None:
    """Attach ``listener`` to every run in this process."""
    with _lock:
        _global.append(listener)


def unregister(listener: EventListener) -> None:
    """Detach a listener attached with :func:`register`."""
    with _lock:
        if listener in _global:
            _global.remove(listener)


def wanted(listeners: list[EventListener] | tuple[EventListener, ...] = ()) -> bool:
    """Whether an event would reach anyone: ``listeners`` or a registered one."""
    return bool(listeners or _global)


def emit(event: FlowEvent, listeners: list[EventListener] | tuple[EventListener, ...] = ()) -> None:
    """Deliver ``event`` to ``listeners`` and the global ones; never raises."""
    with _lock:
        targets = [*listeners, *_global]
    for listener in targets:
        try:
            listener.on_event(event)
        except Exception:
            log.exception("event listener %r failed on %s", listener, event.type)
