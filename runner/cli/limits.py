"""``runner limits``: each rate and concurrency limit in use, its use now, and the steps
waiting on it (see the README's Flow control)."""

from __future__ import annotations

from typing import Annotated

import typer

from ._app import commands
from ._session import FLAG, console, print_json, session

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.", metavar=FLAG)]


@app.command()
def limits(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List each limit in use: its kind, rate or slots, use now and the steps waiting on it.

    A rate's use is the starts made within its current window, of those it allows (``3 of 5
    in this second``); a concurrency limit's, the attempts holding a slot. A waiting step
    tries again when the limit lets it.
    """
    uses = session(ctx).reader.store.limit_uses()
    if as_json:
        print_json([use.as_json() for use in uses])
        return
    if not uses:
        typer.echo("no limit in use")
        return
    from rich.table import Table  # a view only

    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for column in ("limit", "kind", "set to", "in use", "waiting"):
        table.add_column(column, overflow="fold")
    for use in uses:
        waiting = ", ".join(f"{run[:8]} {step} (in {s:.1f}s)" for run, step, s in use.waiting)
        table.add_row(use.name, use.kind, use.spec, use.use, waiting or "-")
    console().print(table)
