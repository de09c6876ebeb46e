"""``runner schedule add|list|pause|resume|remove``: flows started on a cron expression or
every N seconds by the workers (see :mod:`runner.distributed.schedules`)."""

from __future__ import annotations

from typing import Annotated

import typer

from runner.errors import InvalidInputs
from runner.flow.rates import priority_problem
from runner.store.base import DeploymentStore
from runner.views import when

from ._app import commands
from ._session import FLAG, console, load_inputs, parse_duration, print_json, session

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""

schedule_app = typer.Typer(
    help="Start a flow on a cron expression or every N seconds (fired by the workers).",
    no_args_is_help=True,
)
app.add_typer(schedule_app, name="schedule")

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.", metavar=FLAG)]


@schedule_app.command("add")
def add(
    ctx: typer.Context,
    name: NameArg,
    flow: Annotated[str, typer.Argument(metavar="FLOW", help="pkg.mod:FlowClass")],
    cron: Annotated[
        str | None,
        typer.Option("--cron", metavar="EXPR", help='Five cron fields, in UTC: "0 3 * * *".'),
    ] = None,
    every: Annotated[
        str | None, typer.Option("--every", metavar="PERIOD", help="30s, 5m, 2h, 1d.")
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", metavar="KEY=VALUE", help="A state field (repeatable)."),
    ] = None,
    catch_up: Annotated[
        bool,
        typer.Option(
            "--catch-up",
            help="Fire every tick missed while no worker ran (else only the latest).",
            metavar=FLAG,
        ),
    ] = False,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            metavar="0-9",
            help="Each tick's run's priority, 0 (lowest) to 9 (highest); default: each "
            "method's priority=, else 5.",
        ),
    ] = None,
) -> None:
    """Add schedule NAME: start FLOW at each tick; each tick's run is `NAME-<UTC time>`."""
    if priority is not None and (problem := priority_problem(priority, "--priority")):
        raise InvalidInputs(problem, priority=priority)
    # Only `add` loads the flow (with the client and the flow core): `list` reads alone.
    from runner.distributed import client
    from runner.store.schedules import make_schedule

    flow_cls = client.load_flow(flow)
    client.check_importable(flow_cls)
    values = load_inputs(inputs, None, flow_cls.state_type())
    client.check_fields(flow_cls, values)
    # As submit does: a schedule of a flow the workers will not run would fail every tick.
    client.check_allowed(flow_cls, session(ctx).rt)
    period = None if every is None else parse_duration(every)
    schedule = make_schedule(
        name,
        flow_cls.flow_path(),
        values,
        cron=cron,
        every=period,
        catch_up=catch_up,
        priority=priority,
    )
    store = session(ctx).reader.store
    store.add_schedule(schedule)
    typer.echo(f"added schedule {name} ({schedule.describe()}), next tick {_next(store, name)}")


@schedule_app.command("list")
def list_(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the schedules: flow, when, next tick, catch-up, priority, paused."""
    # The schedule model (and cronsim) when a command reads one: not for `runner --help`.
    from runner.store.schedules import schedule_json

    store = session(ctx).reader.store
    found = store.schedules()
    if as_json:
        print_json([schedule_json(s, store.next_tick(s.name)) for s in found])
        return
    if not found:
        typer.echo("no schedules")
        return
    from rich.table import Table  # a view only

    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for column in ("name", "flow", "when", "next tick", "catch-up", "priority", "state"):
        table.add_column(column, overflow="fold")
    for s in found:
        table.add_row(
            s.name,
            s.flow,
            s.describe(),
            _next(store, s.name),
            "yes" if s.catch_up else "no",
            "-" if s.priority is None else str(s.priority),
            "paused" if s.paused else "active",
        )
    console().print(table)


@schedule_app.command("pause")
def pause(ctx: typer.Context, name: NameArg) -> None:
    """Stop firing NAME until it is resumed."""
    session(ctx).reader.store.pause_schedule(name, True)
    typer.echo(f"paused schedule {name}")


@schedule_app.command("resume")
def resume(ctx: typer.Context, name: NameArg) -> None:
    """Fire NAME again, from its next tick (or every tick missed, with --catch-up)."""
    store = session(ctx).reader.store
    store.pause_schedule(name, False)
    typer.echo(f"resumed schedule {name}, next tick {_next(store, name)}")


@schedule_app.command("remove")
def remove(ctx: typer.Context, name: NameArg) -> None:
    """Delete NAME; the runs it started stay."""
    session(ctx).reader.store.remove_schedule(name)
    typer.echo(f"removed schedule {name}")


def _next(store: DeploymentStore, name: str) -> str:
    return when(store.next_tick(name))
