"""Following a run: ``--wait`` of submit, resume and fork, and ``watch``.

On a terminal the run's steps (crew tasks in child runs included, with attempts and
durations) update live until it stops, then a summary; piped, only the run id and how it
ended; with ``--json``, one JSON object for scripts (``watch --json``: JSON lines).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import typer
from rich.console import Console, RenderableType
from rich.live import Live

from runner.distributed.client import RunHandle
from runner.distributed.engine import Runtime
from runner.errors import RunTimeout
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.store.models import Checkpoint, RunInfo, RunStatus, StepError

from . import progress, refs, render
from ._session import FAILED, OK, console, one_line, print_json

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


def last_error(rt: Runtime, info: RunInfo, latest: Checkpoint) -> StepError | None:
    """The error that failed the run: the latest checkpoint's, or the newest in its history.

    A failed run's latest checkpoint may be a parallel branch's later commit, which
    carries no error, so a failed run's history is searched for the failure.
    """
    if latest.error is not None or info.status is not RunStatus.FAILED:
        return latest.error
    for ckpt in rt.store.history(info.run_id, limit=50):
        if ckpt.error is not None:
            return ckpt.error
    return None


def outcome(rt: Runtime, handle: RunHandle) -> dict[str, Any]:
    """How the run stands now, as JSON: status, step, result, error, pause reason."""
    info, latest = handle.info(), handle.latest()
    error = last_error(rt, info, latest)
    succeeded = info.status is RunStatus.SUCCEEDED
    return {
        "run_id": handle.run_id,
        "status": info.status.value,
        "step": info.step,
        "result": orch.last_output(tr.record_of(latest)) if succeeded else None,
        "error": error.model_dump(mode="json") if error is not None else None,
        "pause_reason": latest.meta.pause_reason if info.status is RunStatus.PAUSED else None,
    }


def progress_view(rt: Runtime, handle: RunHandle) -> tuple[RunInfo, RenderableType]:
    """The run now, and its live view (steps, child runs' steps, progress, last error)."""
    info, latest = handle.info(), handle.latest()
    rows = progress.step_rows(rt, handle.run_id)
    shown = refs.short_ids([r.checkpoint for r in rows if r.checkpoint], refs.MIN_CHECKPOINT)
    total = progress.total_steps(rt, handle.run_id)
    error = last_error(rt, info, latest)
    return info, render.progress_view(info, latest, rows, total, error, shown)


def watch_live(
    rt: Runtime, handle: RunHandle, out: Console, *, timeout: float | None, interval: float
) -> tuple[RunInfo, RenderableType]:
    """Redraw the run's view on ``out`` (a terminal) until it stops; the last view."""
    deadline = None if timeout is None else time.monotonic() + timeout
    live = Live(console=out, auto_refresh=False) if out.is_terminal else None
    with live or contextlib.nullcontext():
        while True:
            info, view = progress_view(rt, handle)
            if live is not None:
                live.update(view, refresh=True)
            if stopped(info.status):
                return info, view
            if deadline is not None and time.monotonic() > deadline:
                raise RunTimeout(
                    f"run {handle.run_id} still {info.status.value} after {timeout}s",
                    run_id=handle.run_id,
                )
            time.sleep(interval)


def follow(
    rt: Runtime, handle: RunHandle, *, wait: bool, timeout: float | None, as_json: bool
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
            print_json(outcome(rt, handle))
            raise
        print_json(outcome(rt, handle))
        raise typer.Exit(exit_code_of(status))
    typer.echo(handle.run_id)
    if out.is_terminal:
        info, _view = watch_live(rt, handle, out, timeout=timeout, interval=LIVE_POLL)
        status = info.status
    else:
        status = handle.wait(timeout, interval=POLL)
    say(outcome(rt, handle))
    raise typer.Exit(exit_code_of(status))


def say(found: dict[str, Any]) -> None:
    """How the run ended, in one line (errors on stderr)."""
    status, run = found["status"], found["run_id"]
    if status == RunStatus.SUCCEEDED:
        result = found["result"]
        typer.echo(f"succeeded: {result if isinstance(result, str) else json.dumps(result)}")
    elif status == RunStatus.PAUSED:
        typer.echo(f"paused at {found['step']}: {found['pause_reason'] or 'waiting for input'}")
    elif status == RunStatus.CANCELLED:
        typer.echo(f"error: run {run} was cancelled", err=True)
    else:
        err = found["error"]
        detail = f": {err['type']}: {one_line(err['message'])}" if err else ""
        typer.echo(f"error: run {run} {status} at {found['step']}{detail}", err=True)
