"""Flow events and the listener hooks that observe them.

Events mirror CrewAI's names (those a checkpoint also records are defined with the
checkpoint, :mod:`runner.store.models`). A listener is any object with an ``on_event``
method; :class:`EventListener` is the no-op base to subclass. A listener that
raises is logged and ignored: observing a run never breaks it.

Both executors tell the same events in the same order: ``flow_started``, then per
attempt ``method_execution_started`` and per settled step ``method_execution_finished``
(after any ``state_conflict``), ``method_execution_failed`` or ``flow_paused``, and
``flow_finished`` or ``flow_failed`` once, when the run ends (see
:func:`runner.flow.lifecycle.announce`). On workers each is told in the worker process
that runs or commits the step, to the flow object's listeners and those registered there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from runner.store.models import (
    FLOW_FAILED,
    FLOW_FINISHED,
    FLOW_PAUSED,
    FLOW_STARTED,
    METHOD_FAILED,
    METHOD_FINISHED,
)

log = logging.getLogger("runner.events")

METHOD_STARTED = "method_execution_started"
STATE_CONFLICT = "state_conflict"
"""Two parallel steps wrote the same state field; the last commit won."""
INPUT_REQUESTED = "flow_input_requested"
"""``self.ask`` put a question to someone (``data``: ``message``, ``metadata``)."""
INPUT_RECEIVED = "flow_input_received"
"""``self.ask`` got its answer (``data`` adds ``response``, ``response_metadata``)."""
FEEDBACK_REQUESTED = "human_feedback_requested"
"""A ``@human_feedback`` method's output went to review (``data``: ``message``, ``output``,
``emit``)."""
FEEDBACK_RECEIVED = "human_feedback_received"
"""The review was answered (``data``: ``feedback``, ``outcome``)."""
TURN_STARTED = "conversation_turn_started"
"""An in-process conversational turn began (``data``: ``session_id``), before its run."""
TURN_COMPLETED = "conversation_turn_completed"
"""The turn's run returned (``data``: ``session_id``)."""
TURN_FAILED = "conversation_turn_failed"
"""The turn's run raised (``data``: ``session_id``; ``error``); a turn paused for a review
is neither completed nor failed."""

__all__ = [
    "FEEDBACK_RECEIVED",
    "FEEDBACK_REQUESTED",
    "FLOW_FAILED",
    "FLOW_FINISHED",
    "FLOW_PAUSED",
    "FLOW_STARTED",
    "INPUT_RECEIVED",
    "INPUT_REQUESTED",
    "METHOD_FAILED",
    "METHOD_FINISHED",
    "METHOD_STARTED",
    "STATE_CONFLICT",
    "TURN_COMPLETED",
    "TURN_FAILED",
    "TURN_STARTED",
    "EventListener",
    "FlowEvent",
    "emit",
    "register",
    "tell",
    "unregister",
    "wanted",
]


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


def wanted(listeners: Sequence[EventListener] = ()) -> bool:
    """Whether an event would reach anyone: ``listeners`` or a registered one."""
    return bool(listeners or _global)


def tell(
    kind: str,
    run_id: str,
    flow: str,
    listeners: Sequence[EventListener] = (),
    **fields: Any,
) -> None:
    """Emit a ``kind`` event of run ``run_id`` of flow ``flow`` if anyone listens (an event
    nobody hears is not even built)."""
    if wanted(listeners):
        emit(FlowEvent(type=kind, run_id=run_id, flow=flow, **fields), listeners)


def emit(event: FlowEvent, listeners: Sequence[EventListener] = ()) -> None:
    """Deliver ``event`` to ``listeners`` and the global ones; never raises."""
    with _lock:
        targets = [*listeners, *_global]
    for listener in targets:
        try:
            listener.on_event(event)
        except Exception:
            log.exception("event listener %r failed on %s", listener, event.type)
