"""``--where`` / ``--ids`` on ``resume``, ``cancel``, ``fork`` and ``pin``: one action on many
runs (:mod:`runner.distributed.bulk`).

A dry run by default: it prints how many runs the selection holds and the first of them,
acts on none and exits 0; ``--yes`` acts, with a progress bar, and prints a summary (acted,
skipped with the reason, failed with its one line). Exit 1 when any run failed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from runner.views import when

from . import refs
from ._session import FAILED, FLAG, BadUsage, console, print_json, session

if TYPE_CHECKING:
    from runner.distributed.bulk import Action, Summary

WhereOpt = Annotated[
    str | None,
    typer.Option(
        "--where",
        metavar="TERMS",
        help='Act on every run the selection keeps, e.g. "flow=X status=failed since=1h" '
        "(keys: flow, status, since, until, id~, text~, version). A dry run unless --yes.",
    ),
]
IdsOpt = Annotated[
    str | None,
    typer.Option(
        "--ids",
        metavar="IDS|-",
        help="Act on these runs: ids or unique prefixes, comma- or space-separated (- reads "
        "them from stdin, one or more a line). A dry run unless --yes.",
    ),
]
ListWhereOpt = Annotated[
    str | None,
    typer.Option(
        "--where",
        metavar="TERMS",
        help='Only runs the selection keeps, e.g. "flow=X status=failed,paused since=1h" '
        "(keys: flow, status, since, until, id~, text~, version; every term must hold).",
    ),
]
YesOpt = Annotated[
    bool,
    typer.Option("--yes", "-y", help="With --where/--ids: act (default: a dry run).", metavar=FLAG),
]
RunOptArg = Annotated[
    str | None,
    typer.Argument(metavar="RUN", help="Run id, or a unique prefix of it (or --where/--ids)."),
]


def wanted(run: str | None, where: str | None, ids: str | None) -> bool:
    """Whether the command acts in bulk; :class:`BadUsage` for RUN with --where/--ids, both,
    or neither."""
    given = [name for name, value in (("--where", where), ("--ids", ids)) if value is not None]
    if len(given) > 1:
        raise BadUsage("give --where or --ids, not both")
    if given and run is not None:
        raise BadUsage(f"give RUN or {given[0]}, not both")
    if not given and run is None:
        raise BadUsage("give RUN, or --where TERMS / --ids IDS for many runs")
    return bool(given)


def only_alone(**options: object) -> None:
    """:class:`BadUsage` naming the single-run options given with --where/--ids."""
    given = [name for name, value in options.items() if value not in (None, False, [], ())]
    if given:
        names = ", ".join("--" + name.replace("_", "-") for name in given)
        raise BadUsage(f"{names} apply to one run: not with --where or --ids")


def run(
    ctx: typer.Context,
    action: Action,
    where: str | None,
    ids: str | None,
    *,
    yes: bool,
    as_json: bool,
) -> None:
    """Select the runs, then list them (dry run) or act on each with a progress bar."""
    from runner.distributed import bulk

    rt = session(ctx).rt
    # Ids as tables show them (unique prefixes) name their runs, as for one-run commands.
    named = None if ids is None else [refs.resolve_run(rt, ref) for ref in _ids(ids)]
    chosen = bulk.select(rt, where=where, ids=named)
    if not yes:
        summary = bulk.dry(action, chosen)
        if as_json:
            print_json(summary.as_json())
        else:
            _print_dry(summary)
        return
    if as_json or not chosen:
        summary = bulk.act(rt, action, chosen)
    else:
        from rich.console import Console
        from rich.progress import Progress

        # On stderr, so stdout keeps only the summary (a script may read it).
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(f"{action}", total=len(chosen))
            summary = bulk.act(rt, action, chosen, on_each=lambda _o: bar.advance(task))
    if as_json:
        print_json(summary.as_json())
    else:
        _print_summary(summary)
    if summary.count("failed"):
        raise typer.Exit(FAILED)


def _ids(text: str) -> list[str]:
    source = sys.stdin.read() if text == "-" else text
    found = [part for part in source.replace(",", " ").split() if part]
    if not found:
        raise BadUsage("--ids names no run" + (" (stdin was empty)" if text == "-" else ""))
    return found


def _print_dry(summary: Summary) -> None:
    from runner.distributed.bulk import SHOWN

    out = console()
    count = len(summary.selected)
    out.print(f"dry run: {summary.action} would act on {count} run(s)", highlight=False)
    for info in summary.selected[:SHOWN]:
        flow = info.name or info.flow or "-"
        out.print(
            f"  {info.run_id}  {flow}  {info.status.value}  {when(info.updated_at)}",
            highlight=False,
        )
    if count > SHOWN:
        out.print(f"  … {count - SHOWN} more", highlight=False)
    if count:
        out.print("pass --yes to act", highlight=False)


def _print_summary(summary: Summary) -> None:
    out = console()
    for o in summary.outcomes:
        if o.outcome == "acted":
            into = f" -> {o.result}" if o.result and o.result != o.run_id else ""
            out.print(f"  {summary.action} {o.run_id}{into}", highlight=False)
        else:
            out.print(f"  {o.outcome} {o.run_id}: {o.reason}", highlight=False)
    out.print(
        f"{summary.action}: {summary.count('acted')} acted, {summary.count('skipped')} "
        f"skipped, {summary.count('failed')} failed (of {len(summary.selected)})",
        highlight=False,
    )
