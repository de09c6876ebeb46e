"""Pending human feedback in a store: CrewAI's ``save/load/clear_pending_feedback``.

A run waiting for a person's review of a method's output is simply its latest checkpoint
paused with ``meta.human.awaiting`` of kind ``feedback`` (written by the step that paused, in
process or on a worker): nothing else is kept. :class:`PendingFeedbackContext` is CrewAI's
view of that checkpoint; saving one (what CrewAI's providers may do themselves) writes such
a checkpoint, loading reads it back, clearing turns it into a plain pause.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from runner import ids
from runner.errors import NotSerializable
from runner.store.base import CheckpointStore
from runner.store.models import (
    FLOW_PAUSED,
    Awaiting,
    Checkpoint,
    ExecutionRecord,
    RunMeta,
    RunStatus,
)

FEEDBACK = "feedback"
"""``Awaiting.kind`` of a review by ``@human_feedback``."""

PENDING_CLEARED = "pending_feedback_cleared"
"""Event of the checkpoint :func:`clear_pending` writes."""


@dataclass
class PendingFeedbackContext:
    """What a run paused for review waits on (CrewAI's fields): which run and method, the
    output under review, the message, the labels the answer is collapsed to."""

    flow_id: str
    """The run id (the state's ``id``)."""
    flow_class: str
    """The flow's import path."""
    method_name: str
    """The method whose output is under review."""
    method_output: Any
    """That output (JSON once kept)."""
    message: str
    """What the reviewer is asked."""
    emit: list[str] | None = None
    """The outcome labels, when the answer routes the flow."""
    default_outcome: str | None = None
    """The outcome of an empty answer."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Anything the decorator passed on for the reviewer's system (a channel, an assignee)."""
    llm: dict[str, Any] | str | None = None
    """CrewAI's serialized LLM; here the decorator's ``llm`` (on the flow class) collapses."""
    requested_at: datetime = field(default_factory=datetime.now)
    """When the review was asked for."""
    execution_uuid: str | None = None
    """CrewAI's trace id; kept as given."""

    def to_dict(self) -> dict[str, Any]:
        """The context as JSON (an output that is not JSON becomes its nearest JSON form)."""
        return {
            "flow_id": self.flow_id,
            "flow_class": self.flow_class,
            "method_name": self.method_name,
            "method_output": json_safe(self.method_output),
            "message": self.message,
            "emit": self.emit,
            "default_outcome": self.default_outcome,
            "metadata": json_safe(self.metadata),
            "llm": self.llm,
            "requested_at": self.requested_at.isoformat(),
            "execution_uuid": self.execution_uuid,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PendingFeedbackContext:
        """The context :meth:`to_dict` gave."""
        asked = data.get("requested_at")
        return cls(
            flow_id=data["flow_id"],
            flow_class=data["flow_class"],
            method_name=data["method_name"],
            method_output=data.get("method_output"),
            message=data.get("message", ""),
            emit=data.get("emit"),
            default_outcome=data.get("default_outcome"),
            metadata=data.get("metadata") or {},
            llm=data.get("llm"),
            requested_at=datetime.fromisoformat(asked)
            if isinstance(asked, str)
            else datetime.now(),
            execution_uuid=data.get("execution_uuid"),
        )

    def awaiting(self, activation: str = "") -> Awaiting:
        """The checkpoint's record of this review (``activation``: the step that waits)."""
        return Awaiting(
            kind=FEEDBACK,
            message=self.message,
            activation=activation,
            method=self.method_name,
            output=json_safe(self.method_output),
            emit=list(self.emit) if self.emit is not None else None,
            default_outcome=self.default_outcome,
            metadata=json_safe(self.metadata),
            asked_at=self.requested_at.timestamp(),
        )

    @classmethod
    def of(cls, ckpt: Checkpoint) -> PendingFeedbackContext | None:
        """The review ``ckpt`` waits on, or ``None`` if it does not wait on one."""
        waiting = ckpt.meta.human.awaiting
        if ckpt.status is not RunStatus.PAUSED or waiting is None or waiting.kind != FEEDBACK:
            return None
        return cls(
            flow_id=ckpt.run_id,
            flow_class=ckpt.flow or "",
            method_name=waiting.method,
            method_output=waiting.output,
            message=waiting.message,
            emit=waiting.emit,
            default_outcome=waiting.default_outcome,
            metadata=dict(waiting.metadata),
            requested_at=datetime.fromtimestamp(waiting.asked_at),
        )


def json_safe(value: Any) -> Any:
    """``value`` as JSON: models and dataclasses dumped, anything else as its ``str``."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    try:
        return to_jsonable_python(value)
    except Exception:  # an object with no JSON form: shown to the reviewer as text
        return str(value)


def pending_checkpoint(
    latest: Checkpoint | None, context: PendingFeedbackContext, state: dict[str, Any]
) -> Checkpoint:
    """A checkpoint of run ``context.flow_id`` paused for ``context``'s review, onto its
    ``latest`` checkpoint if any: the reviewed method's activation in flight (the one
    already in flight, else a new one), so that answering it commits that method."""
    method = context.method_name
    record = latest.record.model_copy(deep=True) if latest is not None else ExecutionRecord()
    activation = next((a for a in record.in_flight if ids.method_of(a) == method), None)
    if activation is None:
        n = record.dispatched.get(method, 0) + 1
        activation = ids.activation_id(method, n)
        record.dispatched[method] = n
        record.in_flight.append(activation)
        record.triggers[activation] = None
    meta = latest.meta if latest is not None else RunMeta(name=context.flow_class)
    meta = meta.updated(
        ready=[], awaiting=context.awaiting(activation), pause_reason=context.message
    )
    base = latest if latest is not None else Checkpoint(run_id=context.flow_id, event=FLOW_PAUSED)
    return base.model_copy(
        update={
            "id": ids.checkpoint_id(),
            "seq": 0,
            "event": FLOW_PAUSED,
            "step": method,
            "activation": None,
            "attempt": None,
            "status": RunStatus.PAUSED,
            "state": dict(state),
            "record": record,
            "flow": base.flow or context.flow_class,
            "error": None,
            "meta": meta,
            "created_at": context.requested_at.timestamp(),
        }
    )


def state_json(flow_uuid: str, state: Any) -> dict[str, Any]:
    """A flow's state (a dict or a pydantic model) as a JSON dict, for a checkpoint or a
    pending review; :class:`NotSerializable` if it cannot be one: a state is restored from
    it, so a value is never kept as its ``str``."""
    try:
        if isinstance(state, BaseModel):
            return state.model_dump(mode="json")
        if isinstance(state, dict):
            data = to_jsonable_python(state)
            if isinstance(data, dict):
                return data
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise NotSerializable(
            f"state of flow {flow_uuid} is not JSON: {exc}", run_id=flow_uuid
        ) from None
    raise NotSerializable(
        f"state of flow {flow_uuid} must be a dict or a pydantic model, not {type(state).__name__}",
        run_id=flow_uuid,
    )


def save_pending(
    store: CheckpointStore, flow_uuid: str, context: PendingFeedbackContext, state: Any
) -> None:
    """Write a checkpoint of run ``flow_uuid`` paused for ``context``'s review."""
    data = state_json(flow_uuid, state)
    store.commit(pending_checkpoint(store.latest(flow_uuid), context, data))


def load_pending(
    store: CheckpointStore, flow_uuid: str
) -> tuple[dict[str, Any], PendingFeedbackContext] | None:
    """The state and review run ``flow_uuid`` waits on, or ``None`` if it waits on none."""
    latest = store.latest(flow_uuid)
    context = None if latest is None else PendingFeedbackContext.of(latest)
    if latest is None or context is None:
        return None
    return dict(latest.state), context


def clear_pending(store: CheckpointStore, flow_uuid: str) -> None:
    """Stop run ``flow_uuid`` waiting for its review (it stays paused: a resume re-runs the
    reviewed method); nothing if it waits on none."""
    latest = store.latest(flow_uuid)
    if latest is None or PendingFeedbackContext.of(latest) is None:
        return
    meta = latest.meta.updated(ready=[], awaiting=None)
    store.commit(
        latest.model_copy(
            update={
                "id": ids.checkpoint_id(),
                "seq": 0,
                "event": PENDING_CLEARED,
                "activation": None,
                "attempt": None,
                "meta": meta,
            }
        )
    )


class PendingFeedbackStore:
    """``save/load/clear_pending_feedback`` for a checkpoint store (each provider has them)."""

    def save_pending_feedback(
        self, flow_uuid: str, context: PendingFeedbackContext, state_data: Any
    ) -> None:
        """Keep run ``flow_uuid`` paused for ``context``'s review, with ``state_data``."""
        save_pending(self, flow_uuid, context, state_data)  # type: ignore[arg-type]

    def load_pending_feedback(
        self, flow_uuid: str
    ) -> tuple[dict[str, Any], PendingFeedbackContext] | None:
        """The state and review run ``flow_uuid`` waits on, or ``None``."""
        return load_pending(self, flow_uuid)  # type: ignore[arg-type]

    def clear_pending_feedback(self, flow_uuid: str) -> None:
        """Stop run ``flow_uuid`` waiting for a review (it stays paused)."""
        clear_pending(self, flow_uuid)  # type: ignore[arg-type]
