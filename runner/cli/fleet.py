"""``runner workers``: the deployment's live workers and its queues (see the README's
Deployment section, "Workers and queues")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from runner.views import duration

from ._app import commands
from ._session import FLAG, BadUsage, console, print_json, session

if TYPE_CHECKING:
    from runner.distributed.fleet import Fleet

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.", metavar=FLAG)]


@app.command()
def workers(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            help="How long to wait for the workers' answers to each question.",
        ),
    ] = 1.0,
) -> None:
    """List the live workers and the queues of this deployment.

    Each worker: the queues it consumes, its pool and concurrency, its busy slots (steps
    running now), its last heartbeat (its last word in Redis, every recovery interval) and
    its versions. Each queue: the messages waiting in it, the age of the oldest (on Redis;
    RabbitMQ does not show it without taking the message) and the live workers consuming it.
    """
    if timeout <= 0:
        raise BadUsage("--timeout must be more than 0 seconds")
    from runner.distributed.fleet import survey

    found = survey(session(ctx).rt, timeout=timeout)
    if as_json:
        print_json(found.as_json())
        return
    from rich.table import Table  # a view only

    out = console()
    if not found.workers:
        typer.echo(f"no live worker ({found.broker} broker)")
    else:
        table = Table(show_edge=False, header_style="bold", pad_edge=False)
        for column in ("worker", "queues", "pool", "busy", "heartbeat", "version"):
            table.add_column(column, overflow="fold")
        for w in found.workers:
            slots = "-" if w.concurrency is None else str(w.concurrency)
            busy = "no answer" if w.busy is None else f"{w.busy}/{slots}"
            pool = "-" if w.pool is None else f"{w.pool} ({slots})"
            heard = "-" if w.heartbeat_age is None else f"{duration(w.heartbeat_age)} ago"
            version = f"runner {w.runner_version or '?'}, celery {w.celery_version or '?'}"
            names = ", ".join(_label(found, q) for q in w.queues) or "-"
            table.add_row(w.name, names, pool, busy, heard, version)
        out.print(table)
    for w in found.gone:
        age = "-" if w.heartbeat_age is None else duration(w.heartbeat_age)
        typer.echo(f"gone: {w.name} (last heartbeat {age} ago)")
    typer.echo("")
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for column in ("queue", "broker queue", "depth", "oldest", "consumers"):
        table.add_column(column, overflow="fold")
    for q in found.queues:
        depth = "?" if q.depth is None else str(q.depth)
        oldest = _oldest(q.depth, q.oldest_seconds)
        consumers = ", ".join(q.consumers) or "none: no live worker consumes it"
        table.add_row(q.name, q.queue, depth, oldest, consumers)
    out.print(table)
    if any(q.depth and q.oldest_seconds is None for q in found.queues):
        typer.echo(f"oldest: {found.oldest_age}")


def _label(found: Fleet, queue: str) -> str:
    """A queue's name in ``RUNNER_WORKER_QUEUES`` terms (``default``, ``gpu``)."""
    return next((q.name for q in found.queues if q.queue == queue), queue)


def _oldest(depth: int | None, age: float | None) -> str:
    if not depth:
        return "-"
    return "n/a" if age is None else duration(age)
