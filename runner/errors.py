"""One exception tree for the whole runner.

Every error the runner raises derives from :class:`RunnerError`. Each carries
structured fields and survives Celery's JSON serializer: ``__reduce__`` rebuilds
the exception from its keyword fields, and :meth:`RunnerError.to_dict` gives a
JSON-safe description for checkpoints and CLI ``--json`` output.
"""

from __future__ import annotations

from typing import Any


class RunnerError(Exception):
    """Root of every error the runner raises."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for key, value in fields.items():
            if key not in ("fields", "message"):  # a field may not hide the error's own
                setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe description: error type, message and fields."""
        return {"type": type(self).__name__, "message": self.message, **self.fields}


def _rebuild(cls: type[RunnerError], message: str, fields: dict[str, Any]) -> RunnerError:
    err = cls.__new__(cls)
    RunnerError.__init__(err, message, **fields)
    return err


# --- definition errors: the flow or crew as written is wrong -------------------------------


class DefinitionError(RunnerError):
    """A flow, crew or decorator is used in a way that cannot work."""


class UnknownTrigger(DefinitionError):
    """A listener names a trigger that is neither a method nor a router label (raised only
    for a strict flow; otherwise a :class:`DefinitionWarning` names it)."""


class InvalidCondition(DefinitionError, ValueError):
    """A trigger that is not a method, a name, ``or_()`` or ``and_()`` (a ``ValueError`` too,
    as CrewAI raises)."""


class SelfTrigger(DefinitionError, ValueError):
    """A method listens to itself (a ``ValueError`` too, as CrewAI raises)."""


class InvalidFeedback(DefinitionError, ValueError):
    """``@human_feedback`` given options that cannot work (a ``ValueError`` too, as CrewAI
    raises)."""


class DefinitionWarning(UserWarning):
    """A flow definition that works but is probably a mistake, e.g. a listener of a label
    no router returns (it never runs). ``Flow(strict=True)`` makes it an error."""


class IgnoredOptionWarning(DefinitionWarning):
    """A step option the executor running it does not honour: ``kickoff()`` runs a flow in
    this process, where ``time_limit``, ``rate_limit``, ``concurrency``, ``limits``,
    ``queue`` and ``priority`` (honoured on Celery workers) do nothing. Given once per flow
    class and option."""


class FlowImportError(DefinitionError):
    """A ``pkg.mod:Flow`` path does not import, or is outside the allow-list."""


class UnknownStep(DefinitionError):
    """A step name (e.g. a ``--rerun`` step) that is not a method of the flow."""


# --- store errors: checkpoints and runs ----------------------------------------------------


class StoreError(RunnerError):
    """A checkpoint store could not do what was asked."""


class StoreUnavailable(StoreError):
    """The store's backend (Redis, a file, a database) cannot be reached."""


class CheckpointNotFound(StoreError):
    """No checkpoint with the given id exists."""


class RunNotFound(StoreError):
    """No run with the given id exists."""


class CorruptCheckpoint(StoreError):
    """A stored snapshot could not be decoded into a checkpoint."""


class CommitConflict(StoreError):
    """The run advanced since the caller read it (optimistic concurrency)."""


class StaleAttempt(StoreError):
    """Another attempt of the same step already committed (fencing)."""


class NotSerializable(StoreError):
    """State or an output cannot be written as JSON."""


class EncryptionKeyError(StoreError):
    """Stored data is encrypted with a key this process lacks, or its key (by id) does not
    open it: ``key_id`` names the key (``RUNNER_ENCRYPTION_KEYS``)."""


class StoreFull(StoreError):
    """The store's memory is past its high-water mark: new runs are refused (running ones
    go on) until memory is freed or the limit raised."""


# --- run state errors: the run cannot do what was asked now ---------------------------------


class RunStateError(RunnerError):
    """A run is not in a state that allows the requested operation."""


class StateUnreadable(RunStateError):
    """A run's stored state does not load into the flow's state model as the code has it now
    (a new required field, a changed type): ``run_id``, ``field``, ``version`` (that wrote
    it) say which; the fix is a default or a ``@state_upgrade(version)`` hook."""


class RunExists(RunStateError):
    """A submit named a run that exists and is not this submission's (or was told to reject)."""


class GraphChanged(RunStateError):
    """The flow's graph changed and completed steps no longer exist."""


class RunCancelled(RunStateError):
    """The run was cancelled."""


class RunFailed(RunStateError):
    """The run ended failed; carries the failing step and its error."""


class RunTimeout(RunStateError):
    """Waiting for a run took longer than allowed."""


class NoPendingFeedback(RunStateError, ValueError):
    """A run was to be answered in process (``Flow.from_pending``, ``flow.resume``) but
    waits for no review (a ``ValueError`` too, as CrewAI raises)."""


class CycleLimitExceeded(RunStateError, RecursionError):
    """A step would run more often in one run than its ``max_calls`` allows (a runaway loop;
    a ``RecursionError`` too, as CrewAI raises)."""


class NotInFlight(RunStateError):
    """A step activation was committed that is not in flight (unknown or already committed)."""


class InvalidInputs(RunnerError, ValueError):
    """Inputs do not validate against the flow's state model (a ``ValueError`` too, as
    CrewAI raises)."""


class InvalidSettings(RunnerError):
    """A ``RUNNER_*`` variable (or the env file) holds a value the settings reject."""


class PauseRun(RunnerError):
    """Raised by a step (or ``self.pause(reason)``) to pause the run for a human.

    The step is not completed: ``resume`` with inputs re-runs it on the updated state.
    """


class AwaitInput(PauseRun):
    """Raised when a step waits for a person's answer (``@human_feedback`` with no answer
    at hand, an unanswered ``self.ask`` on workers): the run pauses with the step's state
    so far and ``awaiting`` (a :class:`runner.store.models.Awaiting`); no worker waits, and
    ``runner.distributed.control.answer`` (or the in-process resume) goes on."""

    def __init__(self, awaiting: Any) -> None:
        super().__init__(awaiting.message, kind=awaiting.kind)
        self.awaiting = awaiting


class SleepRun(RunnerError):
    """Raised by ``self.sleep(seconds)`` in a step on workers: the step commits its state so
    far and the run wakes it at ``wake_at`` (its ``index``-th sleep in the method)."""

    def __init__(self, wake_at: float, index: int) -> None:
        super().__init__(f"sleep #{index} until {wake_at}", wake_at=wake_at, index=index)
        self.wake_at = wake_at
        self.index = index


# --- step outcomes as Celery sees them -----------------------------------------------------


class StepFailed(RunnerError):
    """A step failed its run (retries spent, cycle limit, not allowed): the Celery task
    ends FAILURE with this, its message naming the run, the step and the original
    error's type and message (the original is its ``__cause__``)."""


class ChildRunFailed(RunnerError):
    """A child run ended failed or cancelled, so the parent method that started it failed."""
