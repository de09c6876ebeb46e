"""Typed records the checkpoint stores read and write.

Everything here is JSON: state and outputs are dumped with ``mode="json"`` before
they reach a record, so a store never sees a Python object it cannot write.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runner import ids


class RunStatus(StrEnum):
    """Where a run is in its life."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CORRUPT = "corrupt"
    """Quarantined: its data cannot be read (set on the run's metadata by recovery)."""

    @property
    def finished(self) -> bool:
        """True when nothing more will run without a resume (or, if corrupt, a repair)."""
        return self in (
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
            RunStatus.CORRUPT,
        )


class StepError(BaseModel):
    """The error that failed a step."""

    type: str
    """Exception class name."""
    message: str
    """``str(exception)``."""
    traceback: str = ""
    """Formatted traceback, when one was available."""
    attempts: int = 1
    """How many attempts of the step were made."""

    @classmethod
    def from_exception(cls, exc: BaseException, attempts: int = 1) -> StepError:
        """Describe ``exc`` with its formatted traceback."""
        import traceback as tb

        text = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type=type(exc).__name__, message=str(exc), traceback=text, attempts=attempts)


class Lineage(BaseModel):
    """Where a forked run came from."""

    parent_run_id: str
    """The run that was forked."""
    parent_checkpoint_id: str
    """The checkpoint of the parent the fork started from."""
    branch: str | None = None
    """A label the user gave the fork."""


class ParentLink(BaseModel):
    """A child run's link to the parent activation waiting on it."""

    run_id: str
    activation: str


class ChildLink(BaseModel):
    """A parent activation's link to the child run it started (e.g. a crew)."""

    run_id: str
    flow: str
    """Import path of the child."""
    name: str
    """The child's flow name (the workers' registry key)."""
    waiting: bool = True
    """True until the activation commits with the child's output."""
    before: dict[str, Any] = Field(default_factory=dict)
    """State fields the method changed before it started the child: their old values."""
    after: dict[str, Any] = Field(default_factory=dict)
    """... and their new values (applied when the activation commits)."""


class RunMeta(BaseModel):
    """What the engine keeps about a run beside its state and record, in every checkpoint."""

    model_config = ConfigDict(extra="ignore")

    name: str | None = None
    """The flow's display name: the prefix of its Celery task names, the workers' registry key."""
    epoch: int = 0
    """Bumped by every resume and restart: an attempt from an earlier epoch commits nothing."""
    ready: list[str] = Field(default_factory=list)
    """Activations this checkpoint made ready (to dispatch after the commit)."""
    parent: ParentLink | None = None
    """Set on a child run."""
    children: dict[str, ChildLink] = Field(default_factory=dict)
    """Activation id -> the child run it started."""
    resumed_from: str | None = None
    """The checkpoint a resume continued from."""
    forked_from: str | None = None
    """The checkpoint a fork started from."""
    pause_reason: str | None = None
    """Why the run waits for a human."""
    conflicts: list[str] = Field(default_factory=list)
    """State fields this commit overwrote that a parallel step had also written."""


class Checkpoint(BaseModel):
    """One durable snapshot of a run, written when a step or the run changes."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(default_factory=ids.checkpoint_id)
    """Time-sortable id, unique across runs."""
    run_id: str
    """The run this checkpoint belongs to (the flow state's ``id``)."""
    seq: int = 0
    """Position in the run's history, assigned by the store (1, 2, 3, ... gapless)."""
    event: str
    """What happened: ``run_started``, ``method_finished``, ``method_failed``, ..."""
    step: str | None = None
    """The flow method or crew task the event is about."""
    activation: str | None = None
    """Idempotency key of a step commit (``method#n``); one commit per activation."""
    attempt: str | None = None
    """Token of the attempt that committed (fencing of late duplicate attempts)."""
    status: RunStatus = RunStatus.RUNNING
    """Run status as of this checkpoint."""
    state: dict[str, Any] = Field(default_factory=dict)
    """The flow state, JSON."""
    completed: list[str] = Field(default_factory=list)
    """Completed step activations, in commit order."""
    outputs: dict[str, Any] = Field(default_factory=dict)
    """Latest output of each completed step, JSON."""
    in_flight: list[str] = Field(default_factory=list)
    """Activations dispatched or ready but not yet committed."""
    record: dict[str, Any] = Field(default_factory=dict)
    """The orchestrator's bookkeeping (router outcomes, join progress, counters)."""
    flow: str | None = None
    """Import path of the flow or crew, ``pkg.mod:Class``."""
    fingerprint: str | None = None
    """Fingerprint of the flow's graph when the checkpoint was written."""
    lineage: Lineage | None = None
    """Set on runs created by a fork."""
    created_at: float = Field(default_factory=time.time)
    """Unix time the checkpoint was made."""
    error: StepError | None = None
    """The error, when the event is a failure."""
    meta: RunMeta = Field(default_factory=RunMeta)
    """What the engine keeps about the run: name, epoch, ready steps, parent/children."""
    worker: str | None = None
    """Host name of the worker (or process) that ran the step of this checkpoint."""
    duration: float | None = None
    """Seconds the step's method ran (its last attempt)."""
    attempts: int | None = None
    """Attempts the step took (1 = first try)."""


class RunInfo(BaseModel):
    """A run's metadata: the fields of its metadata hash."""

    run_id: str
    status: RunStatus = RunStatus.PENDING
    flow: str | None = None
    """Import path of the flow or crew."""
    name: str | None = None
    """Display name of the flow or crew."""
    latest: str | None = None
    """Id of the newest checkpoint."""
    seq: int = 0
    """Sequence number of the newest checkpoint."""
    event: str | None = None
    """Event of the newest checkpoint."""
    step: str | None = None
    """Step of the newest checkpoint."""
    created_at: float = 0.0
    updated_at: float = 0.0
    parent_run_id: str | None = None
    parent_checkpoint_id: str | None = None
    branch: str | None = None
    error: str | None = None
    """``Type: message`` of the last failure."""
