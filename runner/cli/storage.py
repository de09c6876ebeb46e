"""The store as data: ``runner rekey`` (encryption at rest) and ``runner store`` (its memory)."""

from __future__ import annotations

from typing import Annotated

import typer

from runner.errors import StoreError

from ._app import commands
from ._session import FLAG, console, print_json, session
from .runs import JsonOpt

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""


@app.command()
def rekey(
    ctx: typer.Context,
    batch: Annotated[
        int,
        typer.Option("--batch", min=1, max=10000, metavar="N", help="Runs (and fields) a batch."),
    ] = 100,
    batches: Annotated[
        int | None,
        typer.Option(
            "--batches",
            min=1,
            metavar="N",
            help="Stop after N batches (the next rekey goes on from there).",
            show_default=False,
        ),
    ] = None,
    new_key: Annotated[
        bool,
        typer.Option("--new-key", help="Only print a fresh key (base64) and exit.", metavar=FLAG),
    ] = False,
    location: Annotated[
        str | None,
        typer.Option(
            "--location",
            metavar="WHERE",
            help="Re-encrypt the runs of this archive (RUNNER_ARCHIVE: a SQLite file, a JSON "
            "directory or a postgresql:// URL) instead of Redis.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-encrypt every stored run to the first key of RUNNER_ENCRYPTION_KEYS.

    Rotation: put the new key first and keep the old one after it
    (`RUNNER_ENCRYPTION_KEYS=k2:NEW,k1:OLD`) on every process, run `runner rekey`, then
    drop the old key. Runs written before encryption was turned on are encrypted too. It
    works in batches of N runs, each field written only if unchanged since it was read, so
    it runs beside the workers; stopped (a crash, --batches), the next `runner rekey` goes
    on where it stopped.

    With --location, the runs of an archive are re-encrypted instead, each replaced whole in
    one write; stopped, it is run again from the start.
    """
    if new_key:
        from runner.store.codec import new_key as fresh

        typer.echo(fresh())
        return
    if location is not None:
        _rekey_archive(ctx, location, batch, batches, as_json)
        return
    from runner.store.redis import RedisProvider
    from runner.store.rekey import rekey as rekey_store

    store = session(ctx).reader.store
    if not isinstance(store, RedisProvider):
        raise StoreError("runner rekey needs the Redis store")
    done = rekey_store(store, batch=batch, batches=batches)
    if as_json:
        print_json(vars(done))
        return
    went = "went on from where the last rekey stopped: " if done.resumed else ""
    left = "" if done.done else "; stopped before the end: run `runner rekey` again to go on"
    console().print(
        f"{went}{done.runs} run(s) gone through, {done.values} value(s) re-encrypted "
        f"to key {done.key_id!r}{left}"
    )


def _rekey_archive(
    ctx: typer.Context, location: str, batch: int, batches: int | None, as_json: bool
) -> None:
    """``runner rekey --location``: every archived run re-sealed with the first key."""
    from runner.store import codec as codecs
    from runner.store.archive import open_archive, rekey_archive

    codec = codecs.of_settings(session(ctx).settings())
    if codec is None:
        raise StoreError("runner rekey needs RUNNER_ENCRYPTION_KEYS: there is no key to encrypt to")
    archive = open_archive(location, codec)
    try:
        runs, done = rekey_archive(archive, batch=batch, batches=batches)
    finally:
        archive.close()
    if as_json:
        print_json({"key_id": codec.kid, "location": location, "runs": runs, "done": done})
        return
    left = "" if done else "; stopped before the end: run it again (it starts over)"
    console().print(
        f"{runs} archived run(s) re-encrypted to key {codec.kid!r}{left}", highlight=False
    )


@app.command("store")
def store_memory(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Show the store's memory: used, limit, free and high-water mark.

    Past the high-water mark a submit is refused (StoreFull): RUNNER_STORE_HIGH_WATER of
    Redis's maxmemory, or of RUNNER_STORE_MAX_BYTES when lower. Exit 1 when a server is
    past it.

    Run Redis with `--maxmemory-policy noeviction`: any other policy evicts keys (a run's
    history, a lease, a queued step) when memory runs out.
    """
    from runner.store.memory import NOEVICTION, size

    found = session(ctx).reader.store.memory()
    full = [m for m in found if m.high_water is not None and m.used > m.high_water]
    if as_json:
        print_json([{**m.as_json(), "full": m in full} for m in found])
    elif not found:
        console().print(
            "memory unknown: this Redis user may not run INFO (add +info to its ACL rule)"
        )
    for m in [] if as_json else found:
        limit = "no limit" if m.limit is None else f"limit {size(m.limit)}"
        free = "" if m.free is None else f", free {size(m.free)}"
        mark = "" if m.high_water is None else f", high-water {size(m.high_water)}"
        state = ": FULL (submits refused)" if m in full else ""
        console().print(f"{m.store}: used {size(m.used)}, {limit}{free}{mark}{state}")
        if m.policy != NOEVICTION:
            console().print(
                f"  warning: maxmemory-policy is {m.policy}, not noeviction: Redis may evict "
                f"runs' keys when full"
            )
    if full:
        raise typer.Exit(1)
