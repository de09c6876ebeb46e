"""``--location``: the checkpoint commands over a store of files, as CrewAI's
``crewai checkpoint --location``.

``runner checkpoints|show|diff|prune|resume --location PATH`` read a JSON checkpoint
directory (``JsonProvider``) or a SQLite file (``SqliteProvider``, ``SQLiteFlowPersistence``)
instead of the deployment's Redis: the ``location`` of a ``CheckpointConfig`` that runs made
in process wrote. Ids and prefixes work as for Redis. ``resume --location`` continues the run
in this process, as ``kickoff(from_checkpoint=...)`` does, writing on in the same store; no
Redis and no worker is involved.

A path that is neither such a directory nor such a file is bad input: one ``error:`` line,
exit code 2, and nothing is created there.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from runner.store.jsondir import JsonProvider
from runner.store.models import RunStatus
from runner.store.postgres import PostgresProvider, is_postgres_url
from runner.store.sqlite import SqliteProvider

from . import refs
from ._outcome import exit_code_of, outcome, say
from ._session import BadUsage, History, print_json, session

LocationOpt = Annotated[
    str | None,
    typer.Option(
        "--location",
        metavar="PATH",
        help=(
            "Read a JSON checkpoint directory or a SQLite file (a CheckpointConfig's "
            "location), or an archive (RUNNER_ARCHIVE: also a postgresql:// URL), "
            "instead of Redis."
        ),
        show_default=False,
    ),
]

SQLITE_MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""
TABLES = ("runs", "checkpoints")
"""Tables of this runner's SQLite store (a CrewAI database has no ``runs``)."""


@dataclass(frozen=True)
class LocationView:
    """A store of files the checkpoint commands read through (a
    :class:`~runner.cli._session.History`)."""

    store: JsonProvider | SqliteProvider | PostgresProvider


def located(ctx: typer.Context, location: str | Path | None) -> History:
    """The runs ``--location`` names (closed when the command ends), else the deployment's
    (:attr:`~runner.cli._session.Session.reader`)."""
    if location is None:
        return session(ctx).reader
    view = open_location(location)
    ctx.call_on_close(view.store.close)
    return view


def open_location(where: str | Path) -> LocationView:
    """The store at ``where`` (a path, or a PostgreSQL archive's URL); :class:`BadUsage` if
    it is none of this runner's."""
    if isinstance(where, str) and is_postgres_url(where):
        return LocationView(PostgresProvider(where))
    location = Path(where)
    try:
        if location.is_dir():
            # A provider makes runs/ when it opens a directory: one that has none (nor the
            # first layout's index) was never a store, and is not made one here.
            if not ((location / "runs").is_dir() or (location / "index.json").is_file()):
                raise BadUsage(
                    f"--location {location} is not a checkpoint directory of this runner "
                    "(no runs/ in it)"
                )
            return LocationView(JsonProvider(location))
        if not location.exists():
            raise BadUsage(f"--location {location}: no such directory or file")
        with location.open("rb") as fh:
            is_sqlite = fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
        if not is_sqlite:
            raise BadUsage(
                f"--location {location} is neither a checkpoint directory nor a SQLite file"
            )
        missing = _missing_tables(location)
    except OSError as exc:
        raise BadUsage(f"--location {location}: {exc.strerror or exc}") from None
    if missing:
        raise BadUsage(
            f"--location {location} is a SQLite file without this runner's checkpoints "
            f"(no {', '.join(missing)} table)"
        )
    return LocationView(SqliteProvider(location))


def _missing_tables(path: Path) -> list[str]:
    """This runner's tables that the SQLite file lacks (read only: nothing is created)."""
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
            found = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as exc:
        raise BadUsage(f"--location {path} cannot be read as SQLite: {exc}") from None
    return [name for name in TABLES if name not in found]


def resume_here(
    view: History,
    run: str,
    from_checkpoint: str | None,
    texts: dict[str, str],
    *,
    as_json: bool,
) -> NoReturn:
    """``runner resume --location``: continue the run in this process; print how it ended
    as ``--wait`` does (exit 1 if it failed again)."""
    from runner.checkpointing import CheckpointConfig
    from runner.flow import plans
    from runner.flow.loading import load_flow
    from runner.flow.state import values_from_text

    run_id = refs.resolve_run(view, run)
    before = view.store.latest(run_id)
    assert before is not None, "resolve_run returns runs that have checkpoints"
    source = before if from_checkpoint is None else refs.resolve_checkpoint(view, from_checkpoint)
    before_id = before.id
    flow_cls = load_flow(str(source.flow))
    inputs = values_from_text(flow_cls.state_type(), texts)
    flow = flow_cls()
    # Refused here as the kickoff below would refuse it, and for a checkpoint of another
    # run too (a kickoff resumes the checkpoint's own run).
    plans.plan_resume(
        flow,
        source,
        inputs,
        run_id=run_id,
        info=view.store.run(run_id),
        latest=before,
        here=plans.Here(workers_share_store=False),
    )
    # The run goes on in the store it is kept in, as a restore config naming one says.
    restore = CheckpointConfig(provider=view.store, restore_from=source.id)
    try:
        flow.kickoff(inputs=inputs, from_checkpoint=restore)
    except Exception:
        latest = view.store.latest(run_id)
        if latest is None or latest.id == before_id or latest.status is not RunStatus.FAILED:
            raise  # not a failure of the resumed run (bad inputs, a changed flow): say that
    status = view.store.run(run_id)
    assert status is not None
    if as_json:
        print_json(outcome(view, run_id))
    else:
        typer.echo(run_id)
        say(view, run_id)
    raise typer.Exit(exit_code_of(status.status))
