"""``runner check-deploy MODULE...``: before a deploy, which waiting runs the new code could
not continue (see the README's Deploying new code). Reads only."""

from __future__ import annotations

from typing import Annotated

import typer

from ._app import commands
from ._session import FLAG, console, print_json
from .location import LocationOpt, located

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""


@app.command("check-deploy")
def check_deploy(
    ctx: typer.Context,
    modules: Annotated[
        list[str], typer.Argument(metavar="MODULE...", help="The new code's flow modules.")
    ],
    location: LocationOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON for scripts.", metavar=FLAG)
    ] = False,
) -> None:
    """Name the runs the new code (MODULE...) could not continue; exit 1 if any.

    Checks every run that may still go on (waiting, paused, sleeping, scheduled or failed)
    against the new code, importable here, and names each it could not continue, and why (a
    missing method, a condition changed under a pending step, a state that no longer loads,
    a patch a waiting step needs). Changes nothing."""
    from runner.distributed.deploy_check import check_deploy as check

    store = located(ctx, location).store
    found = check(modules, store)
    if as_json:
        print_json([f.to_dict() for f in found])
    elif not found:
        typer.echo("every waiting run can go on with the new code")
    else:
        from rich.table import Table

        table = Table(title=f"{len(found)} run(s) the new code cannot continue")
        for column in ("run", "flow", "status", "version", "problem"):
            table.add_column(column, overflow="fold")
        for f in found:
            for i, problem in enumerate(f.problems):
                first = i == 0
                table.add_row(
                    f.run_id if first else "",
                    f.flow if first else "",
                    f.status if first else "",
                    (f.version or "-") if first else "",
                    problem,
                )
        console().print(table)
    if found:
        raise typer.Exit(1)
