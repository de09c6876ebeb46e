"""Data lifecycle: ``pin``, ``unpin``, ``gc`` and ``restore`` (retention and archive).

Finished runs leave Redis by policy (``RUNNER_RETENTION``, a flow's ``@retention``),
copied first to ``RUNNER_ARCHIVE`` if set; the workers' recovery pass does it, ``runner gc``
does one pass now. See :mod:`runner.distributed.retention`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from runner.errors import RunNotFound
from runner.store.expiry import RetainingStore
from runner.store.models import RunInfo

from . import bulk, refs
from ._app import commands
from ._session import FLAG, BadUsage, console, print_json, session

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""

# As `runner runs` spells them (that module imports this one for its expiry column).
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.", metavar=FLAG)]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="Run id, or a unique prefix of it.")]


def _retaining(store: object) -> RetainingStore:
    if not isinstance(store, RetainingStore):
        raise BadUsage("this store does not expire runs")
    return store


@app.command()
def pin(
    ctx: typer.Context,
    run: bulk.RunOptArg = None,
    where: bulk.WhereOpt = None,
    ids: bulk.IdsOpt = None,
    yes: bulk.YesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Keep a run in Redis for ever, whatever the retention policy says (`unpin` undoes it).

    With --where TERMS or --ids IDS, every run selected: a dry run listing them unless --yes.
    """
    from runner.distributed.retention import pin as pin_run

    _retaining(session(ctx).reader.store)
    if bulk.wanted(run, where, ids):
        bulk.run(ctx, "pin", where, ids, yes=yes, as_json=as_json)
        return
    assert run is not None
    run_id = refs.resolve_run(session(ctx).reader, run)
    pin_run(session(ctx).reader.store, run_id, True)
    if as_json:
        print_json({"run_id": run_id, "pinned": True})
        return
    typer.echo(f"{run_id}: pinned, kept until unpinned")


@app.command()
def unpin(ctx: typer.Context, run: RunArg) -> None:
    """Let the retention policy apply to a pinned run again, counted from its end."""
    store = _retaining(session(ctx).reader.store)
    run_id = refs.resolve_run(session(ctx).reader, run)
    if not store.pin_run(run_id, False):
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    typer.echo(f"{run_id}: unpinned, its retention applies from its end")


@app.command()
def gc(
    ctx: typer.Context,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only list the runs that would go.", metavar=FLAG)
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Expire finished runs by policy now: one retention pass, as the workers' recovery pass
    runs it (RUNNER_RETENTION, each flow's @retention; RUNNER_ARCHIVE first, if set).

    At most RUNNER_RETENTION_BATCH runs are decided and as many expired per pass. --dry-run
    lists the runs that would leave Redis and changes nothing.
    """
    from runner.distributed.retention import collect

    settings = session(ctx).settings()
    store = _retaining(session(ctx).reader.store)
    done = collect(store, settings, dry_run=dry_run)
    infos = {i.run_id: i for i in _infos(store, done.expired)}
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "expired": done.expired,
                "archived": done.archived,
                "runs": [i.model_dump(mode="json") for i in infos.values()],
            }
        )
        return
    verb = "would expire" if dry_run else "expired"
    out = console()
    for run_id in done.expired:
        info = infos.get(run_id)
        what = f"{info.name or info.flow} {info.status.value}" if info else ""
        out.print(f"{run_id} {what}".rstrip(), highlight=False)
    where = f", archived to {settings.archive}" if done.archived else ""
    out.print(f"{verb} {len(done.expired)} run(s){where}", highlight=False)


@app.command()
def restore(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The archived run's id.")],
    location: Annotated[
        str | None,
        typer.Option(
            "--location",
            metavar="WHERE",
            help="The archive (default: RUNNER_ARCHIVE): a SQLite file, a JSON directory "
            "or a postgresql:// URL.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Bring an archived run back into Redis: its checkpoints under their ids, so it can be
    resumed and forked. It expires again by policy, counted from now (`runner pin` keeps it).
    """
    # The archive's providers (SQLite, JSON, PostgreSQL) when a run is restored: not for
    # `runner --help`, which loads this module to list its commands.
    from runner.store import codec as codecs
    from runner.store.archive import open_archive, restore_run

    settings = session(ctx).settings()
    where = location or settings.archive
    if not where:
        raise BadUsage("no archive: set RUNNER_ARCHIVE or give --location")
    archive = open_archive(where, codecs.of_settings(settings))
    try:
        info = restore_run(archive, session(ctx).reader.store, run)
    finally:
        archive.close()
    typer.echo(f"{info.run_id}: restored ({info.seq} checkpoint(s), {info.status.value})")


def _infos(store: RetainingStore, run_ids: Sequence[str]) -> list[RunInfo]:
    return [info for info in (store.run(r) for r in run_ids) if info is not None]
