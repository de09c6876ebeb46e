"""What a run did, step by step, child runs included: the rows of ``steps``, ``--wait`` and
``watch``.

Read from the checkpoint history alone: a step commit says which activation finished, on
which worker, after how many attempts and how long; a failure or pause checkpoint names its
step; the latest checkpoint's in-flight activations are what runs now; its
``meta.links.children`` links the activations that started child runs (crews), whose steps are
listed under them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from runner.errors import DefinitionError
from runner.flow.loading import load_flow
from runner.ids import activation_of_key, method_of, split_activation
from runner.settings import get_settings
from runner.store.base import DeploymentStore
from runner.store.models import (
    FLOW_PAUSED,
    METHOD_FAILED,
    METHOD_FINISHED,
    Checkpoint,
    RunStatus,
)
from runner.views import step_states

from ._session import History, Reader

HISTORY_LIMIT = 10_000
"""Checkpoints read per run (a run keeps at most ``RUNNER_MAX_CHECKPOINTS``)."""

DONE, FAILED, PAUSED, PENDING = "done", "failed", "paused", "pending"


@dataclass
class StepRow:
    """One activation of a step (a flow method or a crew task)."""

    run_id: str
    depth: int
    """0 for the run asked about, 1 for its child runs, and so on."""
    step: str
    """The activation (``write#1``), or the method when a checkpoint names only that."""
    outcome: str
    """``done``, ``failed``, ``paused``, ``running``, ``waiting`` (in flight, held back by a
    limit, a queue nobody consumes, a worker of a version, a sleep or a delayed start:
    :attr:`waits_for`; :func:`runner.views.step_states` decides) or
    ``pending`` (in flight, run stopped)."""
    attempts: int | None = None
    worker: str | None = None
    started: float | None = None
    duration: float | None = None
    checkpoint: str | None = None
    error: str | None = None
    child_run: str | None = None
    """The child run this activation started, if any."""
    waits_for: str | None = None
    """What a waiting step waits for."""
    usage: dict[str, int] | None = None
    """The tokens the step spent (its checkpoint's ``usage``), a child run's included."""

    def as_json(self) -> dict[str, Any]:
        """The row as JSON values."""
        return asdict(self)


def history(reader: History, run_id: str) -> list[Checkpoint]:
    """Every kept checkpoint of the run, oldest first."""
    return list(reversed(reader.store.history(run_id, limit=HISTORY_LIMIT)))


def step_rows(reader: Any, run_id: str, depth: int = 0) -> list[StepRow]:
    """The run's activations in commit order, each child run's rows right after its step."""
    ckpts = history(reader, run_id)
    if not ckpts:
        return []
    latest = ckpts[-1]
    rows = [row for ckpt in ckpts if (row := _row(run_id, depth, ckpt)) is not None]
    # A failure or pause checkpoint names the method; the activation it stopped is still in
    # flight (a resume runs it again), so name that, as the step's other rows do.
    in_flight = [activation_of_key(act) for act in latest.in_flight]
    waiting = {method_of(act): act for act in in_flight}
    for row in rows:
        if (
            row.outcome in (FAILED, PAUSED)
            and split_activation(row.step) is None
            and row.step in waiting
        ):
            row.step = waiting[row.step]
    # An in-flight step runs now; in a stopped run it is what a resume runs, shown once:
    # by its failure or pause row if it has one.
    running = latest.status is RunStatus.RUNNING
    stopped = {row.step for row in rows if row.outcome in (FAILED, PAUSED)}
    # What a step waits for is the deployment's to say (a --location store has no limits).
    held = waits(reader, latest) if isinstance(reader.store, DeploymentStore) else {}
    shown = step_states(latest, held)
    for act in in_flight:
        if running or act not in stopped:
            state = shown.get(act)
            outcome = state.state if state is not None else PENDING
            why = state.waits_for if state is not None else None
            rows.append(StepRow(run_id, depth, act, outcome, waits_for=why))
    out: list[StepRow] = []
    links = {
        activation_of_key(act): link.run_id for act, link in latest.meta.links.children.items()
    }
    for i, row in enumerate(rows):
        out.append(row)
        child = links.get(row.step)
        later = any(r.step == row.step for r in rows[i + 1 :])
        if child is not None and not later:
            row.child_run = child
            out += step_rows(reader, child, depth + 1)
    return out


def waits(reader: Reader, latest: Checkpoint) -> dict[str, str]:
    """In-flight step -> what it waits for (a limit, a queue nobody consumes)."""
    # Imported here: of the commands that show progress only `status` asks what steps wait for.
    from runner.distributed.waiting import waits_of

    return waits_of(reader.store, get_settings(), latest, getattr(reader, "app", None))


def _row(run_id: str, depth: int, ckpt: Checkpoint) -> StepRow | None:
    started = ckpt.created_at - ckpt.duration if ckpt.duration is not None else None
    common: dict[str, Any] = {
        "attempts": ckpt.attempts,
        "worker": ckpt.worker,
        "started": started,
        "duration": ckpt.duration,
        "checkpoint": ckpt.id,
        "usage": ckpt.usage.model_dump() if ckpt.usage is not None else None,
    }
    if ckpt.event == METHOD_FINISHED and ckpt.activation:
        return StepRow(run_id, depth, activation_of_key(ckpt.activation), DONE, **common)
    if ckpt.event == METHOD_FAILED and ckpt.step:
        error = ckpt.error
        if error is not None and common["attempts"] is None:
            common["attempts"] = error.attempts
        text = f"{error.type}: {error.message}" if error else None
        return StepRow(run_id, depth, ckpt.step, FAILED, error=text, **common)
    if ckpt.event == FLOW_PAUSED and ckpt.step:
        return StepRow(
            run_id, depth, ckpt.step, PAUSED, error=ckpt.meta.human.pause_reason, **common
        )
    return None


def total_steps(reader: Reader, run_id: str) -> int | None:
    """Methods of the run's flow plus, recursively, those of its child runs so far (``None``
    if a flow does not import here)."""
    latest = reader.store.latest(run_id)
    if latest is None or not latest.flow:
        return None
    try:
        total = len(load_flow(latest.flow).graph().methods)
    except DefinitionError:
        return None
    for link in latest.meta.links.children.values():
        inner = total_steps(reader, link.run_id)
        if inner is None:
            return None
        total += inner
    return total
