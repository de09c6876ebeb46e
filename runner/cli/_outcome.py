"""Following a run: ``--wait`` of submit, resume and fork, and ``watch``.

On a terminal the run's steps (crew tasks in child runs included, with attempts and
durations) update live until it stops, then a summary; piped, only the run id and how it
ended; with ``--json``, one JSON object for scripts (``watch --json``: JSON lines).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

import typer

from runner.errors import RunNotFound, RunTimeout
from runner.store.models import Checkpoint, RunInfo, RunStatus
from runner.views import pause_reason, short_ids

from . import progress, refs
from ._session import FAILED, OK, History, Reader, console, print_json

# The client and the flow core are imported by the functions that use them: `runner runs`
# imports this module (through runs) and needs neither.
if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from runner.distributed.client import RunHandle

POLL = 0.1
"""Seconds between status polls while waiting without a live view."""
LIVE_POLL = 0.25
"""Seconds between refreshes of a live view."""


def exit_code_of(status: RunStatus) -> int:
    """``0`` for a run that succeeded or waits for input, ``1`` for failed, cancelled or
    corrupt (quarantined)."""
    return FAILED if status in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CORRUPT) else OK


def stopped(status: RunStatus) -> bool:
    """True once nothing runs without a resume (finished, or paused for input)."""
    return status.finished or status is RunStatus.PAUSED


def run_now(reader: History, run_id: str) -> tuple[RunInfo, Checkpoint]:
    """The run's metadata and latest checkpoint (``RunNotFound`` if it does not exist)."""
    info, latest = reader.store.run(run_id), reader.store.latest(run_id)
    if info is None or latest is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    return info, latest


def outcome(reader: History, run_id: str) -> dict[str, Any]:
    """How the run stands now, as JSON: status, step, result, error, pause or cancel reason."""
    from runner.distributed.client import failure

    info, latest = run_now(reader, run_id)
    why = failure(reader.store, latest)
    return {
        "run_id": run_id,
        "status": info.status.value,
        "step": why.step,
        "result": result_now(info, latest),
        "error": why.error.model_dump(mode="json") if why.error is not None else None,
        "pause_reason": pause_reason(info.status, latest),
        "cancel_reason": cancel_reason(info, latest),
    }


def cancel_reason(info: RunInfo, latest: Checkpoint) -> str | None:
    """Why a cancelled run was cancelled (``its deadline passed (...)``, a parent's cancel),
    as its cancel recorded it; ``None`` when by hand or not cancelled."""
    return latest.meta.cancel_reason if info.status is RunStatus.CANCELLED else None


def result_now(info: RunInfo, latest: Checkpoint) -> Any:
    """The run's result as JSON (:func:`runner.flow.results.result_json`; ``None`` unless it
    succeeded), its flow imported when it can be."""
    from runner.flow import results

    if info.status is not RunStatus.SUCCEEDED:
        return None
    return results.result_json(info.status, latest, results.flow_class_of(latest))


def progress_view(reader: Reader, run_id: str) -> tuple[RunInfo, RenderableType]:
    """The run now, and its live view (steps, child runs' steps, progress, last error)."""
    from runner.distributed.client import failure

    from . import render  # rich: a view only (see render)

    info, latest = run_now(reader, run_id)
    rows = progress.step_rows(reader, run_id)
    shown = short_ids([r.checkpoint for r in rows if r.checkpoint], refs.MIN_CHECKPOINT)
    total = progress.total_steps(reader, run_id)
    error = failure(reader.store, latest).error
    return info, render.progress_view(info, latest, rows, total, error, shown)


def watch_live(
    reader: Reader, run_id: str, out: Console, *, timeout: float | None, interval: float
) -> tuple[RunInfo, RenderableType]:
    """Redraw the run's view on ``out`` (a terminal) until it stops; the last view."""
    from rich.live import Live

    deadline = None if timeout is None else time.monotonic() + timeout
    live = Live(console=out, auto_refresh=False) if out.is_terminal else None
    with live or contextlib.nullcontext():
        while True:
            info, view = progress_view(reader, run_id)
            if live is not None:
                live.update(view, refresh=True)
            if stopped(info.status):
                return info, view
            if deadline is not None and time.monotonic() > deadline:
                raise RunTimeout(
                    f"run {run_id} still {info.status.value} after {timeout}s", run_id=run_id
                )
            time.sleep(interval)


def follow(
    reader: Reader, handle: RunHandle, *, wait: bool, timeout: float | None, as_json: bool
) -> None:
    """Print the run id; with ``wait``, follow the run and print how it ended (exit code)."""
    if not wait:
        if as_json:
            print_json({"run_id": handle.run_id, "status": handle.status().value})
        else:
            typer.echo(handle.run_id)
        return
    out = console()
    if as_json:
        try:
            status = handle.wait(timeout, interval=POLL)
        except RunTimeout:
            print_json(outcome(reader, handle.run_id))
            raise
        print_json(outcome(reader, handle.run_id))
        raise typer.Exit(exit_code_of(status))
    typer.echo(handle.run_id)
    if out.is_terminal:
        info, _view = watch_live(reader, handle.run_id, out, timeout=timeout, interval=LIVE_POLL)
        status = info.status
    else:
        status = handle.wait(timeout, interval=POLL)
    say(reader, handle.run_id)
    raise typer.Exit(exit_code_of(status))


def say(reader: History, run_id: str) -> None:
    """How the run ended, in one line (errors on stderr): the last line of ``watch`` and
    of ``--wait``."""
    from runner.distributed.client import failure
    from runner.distributed.engine import ended

    info, latest = run_now(reader, run_id)
    if info.status is RunStatus.SUCCEEDED:
        result = result_now(info, latest)
        typer.echo(f"succeeded: {result if isinstance(result, str) else json.dumps(result)}")
    elif info.status is RunStatus.PAUSED:
        reason = pause_reason(info.status, latest) or "waiting for input"
        typer.echo(f"paused at {latest.step}: {reason}")
    elif info.status is RunStatus.CANCELLED:
        why = cancel_reason(info, latest)
        typer.echo(f"error: run {run_id} was cancelled{f': {why}' if why else ''}", err=True)
    else:
        why = ended(f"run {run_id}", info.status, failure(reader.store, latest))
        typer.echo(f"error: {why}", err=True)
