"""``runner worker``: a Celery worker of this deployment, without naming the Celery app."""

from __future__ import annotations

import os
import sys

import typer

from runner.distributed.processes import WORKER_COMMAND

from ._app import commands

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""

APP_MODULE = "runner.worker"
"""The Celery app an installed deployment runs (``celery -A runner.worker worker``)."""


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def worker(ctx: typer.Context) -> None:
    """Start a worker: `celery -A runner.worker worker ARGS...` (`runner worker --help`: Celery's).

    It runs the flows of RUNNER_FLOW_MODULES against RUNNER_REDIS_URL; without them, those of
    the `runner dev` found from this folder (with neither allow-list, it refuses to start).
    Every argument goes to Celery's worker command.
    """
    argv = [sys.executable, "-m", WORKER_COMMAND, APP_MODULE, *ctx.args]
    # Replaced rather than wrapped: signals from a process manager reach Celery directly.
    os.execv(sys.executable, argv)
