"""PostgreSQL archive store: finished runs kept off Redis (``RUNNER_ARCHIVE=postgresql://...``).

It implements the read side of :class:`~runner.store.base.CheckpointStore` (``get``,
``latest``, ``history``, ``runs``, ``run``) plus what archiving needs: :meth:`put_run`
(replace a run's copy in one transaction), ``update_run`` and ``delete_run``. It is not a
store runs execute in: ``commit``, ``fork`` and ``prune`` raise :class:`StoreError` telling
to restore the run into Redis (``runner restore RUN``) first.

Tables (created if missing; JSON kept as text, as the SQLite store keeps it):

* ``runner_runs``: one row per run, its :class:`RunInfo` as JSON plus ``status`` and
  ``updated_at`` for listing;
* ``runner_checkpoints``: one row per checkpoint, ``(run_id, seq)`` unique.

Needs the ``archive`` extra (``psycopg``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from runner.embedded import mask_url
from runner.errors import CheckpointNotFound, RunNotFound, StoreError, StoreUnavailable
from runner.store._common import (
    decode,
    decode_info,
    encode,
    encode_info,
    resolve_codec,
    run_info_updated,
)
from runner.store.codec import Codec
from runner.store.models import Checkpoint, RunInfo, RunStatus

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runner_runs (
    run_id     TEXT PRIMARY KEY,
    status     TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    info       TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS runner_runs_by_update ON runner_runs (updated_at)",
    """CREATE TABLE IF NOT EXISTS runner_checkpoints (
    id     TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    data   TEXT NOT NULL,
    UNIQUE (run_id, seq))""",
)


def is_postgres_url(location: str) -> bool:
    """``location`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return location.startswith(("postgresql://", "postgres://"))


class PostgresProvider:
    """Archived runs in a PostgreSQL database (one connection, guarded by a lock)."""

    max_checkpoints = 0
    """An archive keeps every checkpoint it is given."""

    def __init__(self, url: str, *, codec: Codec | None = None) -> None:
        """``codec`` seals the payloads of the runs archived here, as the Redis store seals
        them (default: ``RUNNER_ENCRYPTION_KEYS``'s, if set)."""
        self.codec = resolve_codec(codec)
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                "a postgresql:// archive needs psycopg: pip install 'celery-flows[archive]'"
            ) from None
        self.url = url
        self._errors: tuple[type[Exception], ...] = (psycopg.Error,)
        self._lock = threading.RLock()
        try:
            self._db: Any = psycopg.connect(url, autocommit=True, connect_timeout=5)
            with self._db.transaction():
                for statement in _SCHEMA:
                    self._db.execute(statement)
        except psycopg.Error as exc:
            raise self._unavailable(exc) from None

    def __repr__(self) -> str:
        return f"PostgresProvider({mask_url(self.url)!r})"

    # -- what archiving needs ---------------------------------------------------------------

    def put_run(self, info: RunInfo, checkpoints: Sequence[Checkpoint]) -> None:
        """Replace the run's copy by ``info`` and ``checkpoints`` (ids and seqs kept), in
        one transaction: once this returns, the archive write is confirmed."""
        with self._tx() as db:
            db.execute("DELETE FROM runner_checkpoints WHERE run_id = %s", (info.run_id,))
            db.execute("DELETE FROM runner_runs WHERE run_id = %s", (info.run_id,))
            with db.cursor() as cur:
                cur.executemany(
                    "INSERT INTO runner_checkpoints (id, run_id, seq, data)"
                    " VALUES (%s, %s, %s, %s)",
                    [(cp.id, cp.run_id, cp.seq, encode(cp, self.codec)) for cp in checkpoints],
                )
            db.execute(
                "INSERT INTO runner_runs (run_id, status, updated_at, info)"
                " VALUES (%s, %s, %s, %s)",
                (info.run_id, info.status.value, info.updated_at, encode_info(info, self.codec)),
            )

    def update_run(self, run_id: str, **fields: Any) -> RunInfo:
        """Set metadata fields of an archived run (``RunNotFound`` if none)."""
        with self._tx() as db:
            info = self._info(db, run_id)
            if info is None:
                raise RunNotFound(f"no run {run_id} in the archive", run_id=run_id)
            info = run_info_updated(info, fields)
            db.execute(
                "UPDATE runner_runs SET status = %s, updated_at = %s, info = %s WHERE run_id = %s",
                (info.status.value, info.updated_at, encode_info(info, self.codec), run_id),
            )
            return info

    def delete_run(self, run_id: str) -> bool:
        """Remove an archived run; ``False`` if it was not there."""
        with self._tx() as db:
            db.execute("DELETE FROM runner_checkpoints WHERE run_id = %s", (run_id,))
            gone = db.execute("DELETE FROM runner_runs WHERE run_id = %s", (run_id,))
            return bool(gone.rowcount)

    # -- reads ------------------------------------------------------------------------------

    def get(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint with this id; :class:`CheckpointNotFound` if none."""
        with self._tx() as db:
            row = db.execute(
                "SELECT data, run_id FROM runner_checkpoints WHERE id = %s", (checkpoint_id,)
            ).fetchone()
        if row is None:
            raise CheckpointNotFound(
                f"no checkpoint {checkpoint_id} in the archive", checkpoint_id=checkpoint_id
            )
        return decode(row[0], checkpoint_id, "PostgreSQL", self.codec, row[1])

    def latest(self, run_id: str) -> Checkpoint | None:
        """The run's newest checkpoint, or ``None``."""
        found = self.history(run_id, limit=1)
        return found[0] if found else None

    def history(self, run_id: str, *, limit: int = 50, offset: int = 0) -> list[Checkpoint]:
        """The run's checkpoints, newest first."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT id, data FROM runner_checkpoints WHERE run_id = %s"
                " ORDER BY seq DESC LIMIT %s OFFSET %s",
                (run_id, max(limit, 0), max(offset, 0)),
            ).fetchall()
        return [decode(data, cid, "PostgreSQL", self.codec, run_id) for cid, data in rows]

    def runs(
        self, *, limit: int = 50, offset: int = 0, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """Archived runs by last update, newest first."""
        where, args = ("WHERE status = %s", [RunStatus(status).value]) if status else ("", [])
        with self._tx() as db:
            rows = db.execute(
                f"SELECT run_id, info FROM runner_runs {where}"
                " ORDER BY updated_at DESC, run_id DESC LIMIT %s OFFSET %s",
                (*args, max(limit, 0), max(offset, 0)),
            ).fetchall()
        return [decode_info(info, run_id, "PostgreSQL", self.codec) for run_id, info in rows]

    def run(self, run_id: str) -> RunInfo | None:
        """An archived run's metadata, or ``None``."""
        with self._tx() as db:
            return self._info(db, run_id)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    # -- not a store runs execute in --------------------------------------------------------

    def commit(self, checkpoint: Checkpoint, **_: Any) -> NoReturn:
        """Refused: an archived run is restored into Redis to go on."""
        self._read_only(checkpoint.run_id)

    def fork(self, checkpoint_id: str, **_: Any) -> NoReturn:
        """Refused: an archived run is restored into Redis to be forked."""
        self._read_only(self.get(checkpoint_id).run_id)

    def prune(self, run_id: str, keep: int, *, dry_run: bool = False) -> list[str]:
        """Nothing: an archive keeps every checkpoint it was given."""
        return []

    def _read_only(self, run_id: str) -> NoReturn:
        raise StoreError(
            f"run {run_id} is archived in PostgreSQL: `runner restore {run_id}` brings it "
            "back into Redis, where it can be resumed or forked",
            run_id=run_id,
        )

    # -- helpers ----------------------------------------------------------------------------

    def _info(self, db: Any, run_id: str) -> RunInfo | None:
        row = db.execute("SELECT info FROM runner_runs WHERE run_id = %s", (run_id,)).fetchone()
        return None if row is None else decode_info(row[0], run_id, "PostgreSQL", self.codec)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        """One transaction under the lock; database errors become :class:`StoreUnavailable`."""
        with self._lock:
            try:
                with self._db.transaction():
                    yield self._db
            except self._errors as exc:
                raise self._unavailable(exc) from None

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(
            f"PostgreSQL archive {mask_url(self.url)}: {str(exc).strip().splitlines()[0]}",
            url=mask_url(self.url),
        )
