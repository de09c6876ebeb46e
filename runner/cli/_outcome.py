"""Waiting for a run and reporting how it ended (``--wait`` of submit, resume and fork)."""

from __future__ import annotations

import json
from typing import Any

import typer

from runner.distributed.client import RunHandle
from runner.distributed.engine import Runtime
from runner.errors import RunTimeout
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.store.models import Checkpoint, RunInfo, RunStatus, StepError

from ._session import FAILED, OK, one_line, print_json

POLL = 0.1
"""Seconds between status polls while waiting."""


def exit_code_of(status: RunStatus) -> int:
    """``0`` for a run that succeeded or waits for input, ``1`` for failed or cancelled."""
    return FAILED if status in (RunStatus.FAILED, RunStatus.CANCELLED) else OK


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
        "pause_reason": latest.meta.get("pause_reason")
        if info.status is RunStatus.PAUSED
        else None,
    }


def follow(
    rt: Runtime, handle: RunHandle, *, wait: bool, timeout: float | None, as_json: bool
) -> None:
    """Print the run id; with ``wait``, wait and print the outcome, exiting with its code."""
    if not wait:
        if as_json:
            print_json({"run_id": handle.run_id, "status": handle.status().value})
        else:
            typer.echo(handle.run_id)
        return
    if not as_json:
        typer.echo(handle.run_id)
    try:
        status = handle.wait(timeout, interval=POLL)
    except RunTimeout:
        if as_json:
            print_json(outcome(rt, handle))
        raise
    found = outcome(rt, handle)
    if as_json:
        print_json(found)
    else:
        _say(found)
    raise typer.Exit(exit_code_of(status))


def _say(found: dict[str, Any]) -> None:
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
