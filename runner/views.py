"""What the CLI and the console both show of runs, as plain values: a checkpoint diff, a
time, a duration, when a delayed run starts, how an in-flight step is shown (running or
waiting, :func:`step_states`: the one place that decides it). It sits with the store (it
reads only checkpoints), below both front ends, so neither imports the other."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runner.ids import activation_of_key, method_of
from runner.store.models import FLOW_RESUMED, Answer, Awaiting, Checkpoint, RunInfo, RunStatus


def when(ts: float | None) -> str:
    """A Unix time as local ``YYYY-mm-dd HH:MM:SS`` (``-`` if unset)."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    """``0.42s``, ``4.2s``, ``3m 05s``, ``2h 10m`` (``-`` if unknown)."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def pause_reason(status: RunStatus, latest: Checkpoint) -> str | None:
    """Why a paused run waits (its latest checkpoint's reason), or ``None`` for a run not
    paused (a reason left from an earlier pause is not shown)."""
    return latest.meta.human.pause_reason if status is RunStatus.PAUSED else None


def awaited(status: RunStatus, latest: Checkpoint) -> Awaiting | None:
    """What a paused run waits for a person to answer, or ``None`` for a run not paused
    (what an earlier pause awaited is not shown)."""
    return latest.meta.human.awaiting if status is RunStatus.PAUSED else None


def awaiting_of(status: RunStatus, latest: Checkpoint) -> dict[str, Any] | None:
    """:func:`awaited`, as JSON."""
    waiting = awaited(status, latest)
    return None if waiting is None else waiting.model_dump(mode="json")


def scheduled_until(latest: Checkpoint | RunInfo, now: float | None = None) -> float | None:
    """When a delayed run (``submit(countdown=...)``) starts, while it waits for that (at
    ``now``, default the time): it shows as ``scheduled``, and recovery leaves it alone.
    ``latest`` is the run's newest checkpoint, or its record (a listing of runs reads no
    checkpoint), which mirrors it."""
    if isinstance(latest, RunInfo):
        not_before = latest.not_before
    else:
        not_before = latest.meta.scheduling.not_before
    now = time.time() if now is None else now
    if latest.status is RunStatus.RUNNING and not_before is not None and not_before > now:
        return not_before
    return None


def start_came_due(latest: Checkpoint, now: float) -> bool:
    """Whether ``latest``'s run was held back until a time that has passed by ``now`` (a
    delayed start, no longer :func:`scheduled_until`)."""
    held = latest.meta.scheduling.not_before is not None
    return held and scheduled_until(latest, now) is None


def woken_at(latest: Checkpoint, activation_id: str) -> float | None:
    """When the latest durable sleep (``self.sleep``) of ``activation_id`` ends (or ended),
    if its method reached one."""
    recorded = latest.meta.replay.sleeps.get(activation_id)
    return recorded[-1] if recorded else None


def asleep(latest: Checkpoint, activation_id: str) -> str | None:
    """``sleeping until <UTC time>`` for an in-flight step of a running run whose durable
    sleep has not ended, else ``None``."""
    wake = woken_at(latest, activation_id)
    if latest.status is not RunStatus.RUNNING or wake is None or wake <= time.time():
        return None
    return f"sleeping until {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(wake))}"


RUNNING, WAITING = "running", "waiting"
"""How an in-flight step of a running run is shown."""


@dataclass(frozen=True)
class StepState:
    """How one in-flight step of a running run is shown, and why."""

    state: str
    """:data:`RUNNING`, or :data:`WAITING`: in flight but not running anywhere."""
    waits_for: str | None = None
    """What a waiting step waits for (as ``waits_of``, :func:`asleep` and a delayed start
    say)."""

    def line(self, step: str) -> str:
        """``step waits for limit ...``; ``step sleeping until ...``."""
        why = self.waits_for or ""
        joined = why.startswith(("waiting for ", "sleeping until ", "starts at "))
        return f"{step} {why}" if joined else f"{step} waits for {why}"


def step_states(latest: Checkpoint, waits: dict[str, str]) -> dict[str, StepState]:
    """In-flight step (``write#1``) -> how it is shown, for a running run (``{}`` otherwise):
    what ``runner status``, ``runner steps``, ``watch``/``--wait``, the console's graph and
    the API's ``methods[].state`` show.

    A step is ``waiting`` while its run's delayed start has not come, while it sleeps
    (``self.sleep``), or while ``waits`` (``runner.distributed.waiting.waits_of``; ``{}``
    where the deployment is not known, a ``--location`` store) says a limit, a queue no live
    worker consumes or a worker of a version holds it; else ``running``."""
    if latest.status is not RunStatus.RUNNING:
        return {}
    starts = scheduled_until(latest)
    found = {}
    for act in latest.in_flight:
        step = activation_of_key(act)
        why = (
            (f"starts at {when(starts)}" if starts is not None else None)
            or waits.get(step)
            or asleep(latest, step)
        )
        found[step] = StepState(WAITING, why) if why else StepState(RUNNING)
    return found


def method_state(states: dict[str, StepState], method: str) -> str:
    """How ``method`` is shown while some of its activations are in flight (``states`` from
    :func:`step_states`): ``running`` if one of them runs, ``waiting`` if all wait."""
    mine = [s.state for step, s in states.items() if method_of(step) == method]
    return WAITING if mine and all(s == WAITING for s in mine) else RUNNING


def checkpoint_diff(a: Checkpoint, b: Checkpoint) -> dict[str, Any]:
    """State changes and completed-steps difference from ``a`` to ``b`` (JSON values)."""
    added: dict[str, Any] = {}
    removed: dict[str, Any] = {}
    changed: dict[str, list[Any]] = {}
    _walk(a.state, b.state, "", added, removed, changed)
    in_a, in_b = set(a.completed), set(b.completed)
    return {
        "state": {"added": added, "removed": removed, "changed": changed},
        "completed": {
            "only_a": [act for act in a.completed if act not in in_b],
            "only_b": [act for act in b.completed if act not in in_a],
        },
    }


def _walk(
    a: dict[str, Any],
    b: dict[str, Any],
    prefix: str,
    added: dict[str, Any],
    removed: dict[str, Any],
    changed: dict[str, list[Any]],
) -> None:
    for key in [*a, *(k for k in b if k not in a)]:
        path = f"{prefix}{key}"
        if key not in b:
            removed[path] = a[key]
        elif key not in a:
            added[path] = b[key]
        elif isinstance(a[key], dict) and isinstance(b[key], dict):
            _walk(a[key], b[key], f"{path}.", added, removed, changed)
        elif a[key] != b[key]:
            changed[path] = [a[key], b[key]]


def answers_given(history: list[Checkpoint]) -> dict[str, Answer]:
    """Checkpoint id -> the answer a person gave that it records: the checkpoint that resumed
    the run with it (``history`` newest first, as the stores list it). An activation's
    answers stay in the checkpoints after it until it commits, so an answer is the one a
    resuming checkpoint holds that none before it did."""
    given: dict[str, Answer] = {}
    seen: set[tuple[str, float]] = set()
    for ckpt in reversed(history):  # oldest first
        kept = {(act, a.at): a for act, answers in ckpt.meta.human.answers.items() for a in answers}
        new = [a for key, a in kept.items() if key not in seen]
        if ckpt.event == FLOW_RESUMED and new:
            given[ckpt.id] = max(new, key=lambda a: a.at)
        seen.update(kept)
    return given


# --- short ids -------------------------------------------------------------------------------

MIN_RUN = 8
"""Shortest run prefix a table shows (a UUID's first group)."""


def short_ids(ids: list[str], minimum: int) -> dict[str, str]:
    """Each id's shortest prefix (at least ``minimum`` long) that no other id shares."""
    ordered = sorted(set(ids))
    out = {}
    for i, ident in enumerate(ordered):
        near = [ordered[j] for j in (i - 1, i + 1) if 0 <= j < len(ordered)]
        need = max((_common(ident, other) + 1 for other in near), default=0)
        out[ident] = ident[: max(minimum, need)]
    return out


def short_runs(every: list[str], run_ids: list[str], minimum: int = MIN_RUN) -> dict[str, str]:
    """How tables show ``run_ids`` among ``every`` run id there is: a root run by its unique
    prefix (two schedule runs ``ticker-20261128T0400`` and ``…T0405`` keep the tail that
    tells them apart), a descendant as that prefix followed by the rest of its id
    (``83fc81fc-research-1``). What is shown can be typed back."""
    roots: list[str] = []
    for run_id in sorted(every):  # sorted, so a parent comes right before its descendants
        if not (roots and run_id.startswith(roots[-1] + "-")):
            roots.append(run_id)
    shown = short_ids(roots, minimum)
    out = {}
    for run_id in run_ids:
        root = next((r for r in _prefixes(run_id) if r in shown), None)
        out[run_id] = shown[root] + run_id[len(root) :] if root else run_id
    return out


def _prefixes(run_id: str) -> list[str]:
    """``run_id`` and each shorter id it extends at a ``-``, longest last."""
    cuts = [m.start() for m in re.finditer("-", run_id)]
    return [run_id[:cut] for cut in cuts] + [run_id]


def _common(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
