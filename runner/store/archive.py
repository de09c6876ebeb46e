"""The archive: where finished runs go before Redis drops them (``RUNNER_ARCHIVE``).

A location is a SQLite file (:class:`~runner.store.sqlite.SqliteProvider`), a JSON
checkpoint directory (:class:`~runner.store.jsondir.JsonProvider`; an existing directory, or
a path ending in ``/``) or a PostgreSQL database URL
(:class:`~runner.store.postgres.PostgresProvider`). Each keeps a run whole, with its
checkpoints' ids and sequence numbers, and replaces an earlier copy of it in one write
(:meth:`Archive.put_run`), so archiving a run twice (a pass killed between the archive
write and the delete, then the next pass) leaves one copy.

:func:`archive_run` copies a run out of a store; :func:`restore_run` brings an archived run
back into one (``runner restore RUN``), where it can be resumed and forked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from runner.errors import RunNotFound, RunStateError, StoreError
from runner.store.base import CheckpointStore
from runner.store.codec import Codec
from runner.store.jsondir import JsonProvider
from runner.store.models import Checkpoint, RunInfo
from runner.store.postgres import PostgresProvider, is_postgres_url
from runner.store.sqlite import SqliteProvider

PAGE = 50
"""Checkpoints read from a store per call while copying a run."""


class Archive(Protocol):
    """The read side of a checkpoint store, plus replacing a run's copy whole."""

    def put_run(self, info: RunInfo, checkpoints: Sequence[Checkpoint]) -> None:
        """Replace the run's copy by these (ids and seqs kept); confirmed when it returns."""
        ...

    def run(self, run_id: str) -> RunInfo | None:
        """An archived run's metadata, or ``None``."""
        ...

    def history(self, run_id: str, *, limit: int = 50, offset: int = 0) -> list[Checkpoint]:
        """The run's checkpoints, newest first."""
        ...

    def runs(self, *, limit: int = 50, offset: int = 0) -> list[RunInfo]:
        """Archived runs, by last update, newest first."""
        ...

    def close(self) -> None:
        """Release connections or files."""
        ...


def open_archive(
    location: str, codec: Codec | None = None
) -> JsonProvider | SqliteProvider | PostgresProvider:
    """The archive at ``location`` (made if missing); :class:`StoreError` if it cannot be.

    ``codec`` (default: ``RUNNER_ENCRYPTION_KEYS``'s) seals what is archived as the Redis
    store seals it, and opens it when read; a run archived clear reads as it is."""
    if is_postgres_url(location):
        return PostgresProvider(location, codec=codec)
    path = Path(location).expanduser()
    if path.is_dir() or location.endswith(("/", "\\")):
        return JsonProvider(path, codec=codec)
    if not path.parent.is_dir():
        raise StoreError(f"archive {location}: no directory {path.parent}")
    return SqliteProvider(path, max_checkpoints=0, codec=codec)


def archive_run(store: CheckpointStore, archive: Archive, run_id: str) -> int | None:
    """Copy ``run_id`` from ``store`` into ``archive``; the seq the copy ends at, or ``None``
    if the run is gone or changed while it was read (left for the next pass)."""
    info = store.run(run_id)
    if info is None:
        return None
    checkpoints = whole_history(store, run_id)
    if not checkpoints or checkpoints[-1].seq != info.seq:
        return None  # committed while read: the delete would refuse this copy anyway
    archive.put_run(info, checkpoints)
    return info.seq


def restore_run(archive: Archive, store: CheckpointStore, run_id: str) -> RunInfo:
    """Commit an archived run's checkpoints, oldest first, into ``store`` under their ids,
    as a new run there (:class:`RunStateError` if ``store`` has one of that id). A history
    with gaps (pruned) is numbered afresh; ids, states and lineage are kept."""
    info = archive.run(run_id)
    if info is None:
        raise RunNotFound(f"no run {run_id} in the archive", run_id=run_id)
    if store.run(run_id) is not None:
        raise RunStateError(f"run {run_id} is in Redis already: nothing to restore", run_id=run_id)
    seq = 0
    for checkpoint in whole_history(archive, run_id):
        seq = store.commit(checkpoint, expected_seq=seq, max_checkpoints=0).seq or seq + 1
    restored = store.run(run_id)
    assert restored is not None
    return restored


def rekey_archive(
    archive: Archive, batch: int = 100, batches: int | None = None
) -> tuple[int, bool]:
    """Re-seal every run of ``archive`` with its codec's first key (``runner rekey
    --location``): each run read whole (opened with any listed key, or clear) and written
    back in one :meth:`Archive.put_run`, ``batch`` runs a page, ``batches`` pages at most
    (``None``: all). How many runs, and whether that was all of them. A run's copy is
    replaced whole or not at all, so a rekey stopped half-way is run again from the start,
    safely."""
    done, offset, pages = 0, 0, 0
    while batches is None or pages < batches:
        page = archive.runs(limit=batch, offset=offset)
        for info in page:
            archive.put_run(info, whole_history(archive, info.run_id))
        done, offset, pages = done + len(page), offset + len(page), pages + 1
        if len(page) < batch:
            return done, True
    return done, False


def whole_history(store: Archive | CheckpointStore, run_id: str) -> list[Checkpoint]:
    """Every checkpoint of ``run_id`` in ``store``, oldest first, read a page at a time."""
    found: list[Checkpoint] = []
    while True:
        page = store.history(run_id, limit=PAGE, offset=len(found))
        found += page
        if len(page) < PAGE:
            return list(reversed(found))
