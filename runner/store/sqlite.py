"""SQLite checkpoint store: one database file, parity with CrewAI's SQLite persistence.

Tables (JSON is stored as TEXT, so SQLite 3.40 without JSONB is enough):

* ``runs``: one row per run, the :class:`RunInfo` as JSON plus ``status`` and
  ``updated_at`` columns for listing.
* ``checkpoints``: one row per snapshot, ``(run_id, seq)`` unique.
* ``activations``: the attempt that committed each step activation (fencing).
* ``pins``: checkpoints a fork points to, which pruning keeps.
* ``blobs``: what CrewAI's provider face (:meth:`SqliteProvider.checkpoint`) stores: JSON
  text with its parent id and branch, outside any run.

One connection guarded by a lock serves all threads; every write is a ``BEGIN
IMMEDIATE`` transaction, so other processes wait (busy timeout). WAL mode.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, overload

from runner.errors import CheckpointNotFound, RunNotFound, StoreError, StoreUnavailable
from runner.store._common import (
    check_activation,
    conflict,
    decode,
    decode_info,
    encode,
    encode_info,
    forked,
    resolve_codec,
    resolve_max,
    run_info_after,
    run_info_updated,
)
from runner.store.codec import Codec
from runner.store.models import Checkpoint, RunInfo, RunStatus
from runner.store.pending import PendingFeedbackStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    status     TEXT NOT NULL,
    updated_at REAL NOT NULL,
    info       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_update ON runs (updated_at);
CREATE TABLE IF NOT EXISTS checkpoints (
    id     TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    data   TEXT NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE TABLE IF NOT EXISTS activations (
    run_id        TEXT NOT NULL,
    activation    TEXT NOT NULL,
    attempt       TEXT,
    checkpoint_id TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    PRIMARY KEY (run_id, activation)
);
CREATE TABLE IF NOT EXISTS blobs (
    id         TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    parent_id  TEXT,
    branch     TEXT NOT NULL,
    data       TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pins (
    checkpoint_id TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    child_run_id  TEXT NOT NULL,
    PRIMARY KEY (checkpoint_id, child_run_id)
);
"""

_PRUNABLE = """
SELECT id FROM checkpoints AS c
WHERE c.run_id = ?1
  AND c.seq <= (SELECT MAX(seq) FROM checkpoints WHERE run_id = ?1) - ?2
  AND NOT EXISTS (SELECT 1 FROM pins AS p WHERE p.checkpoint_id = c.id)
ORDER BY c.seq
"""

_BUSY_TIMEOUT = 30.0


class SqliteProvider(PendingFeedbackStore):
    """Checkpoint store in a SQLite database file (``":memory:"`` for a private one).

    ``SqliteProvider()`` without a path is a private in-memory store when used directly, and
    takes its file from the ``CheckpointConfig`` it is given to (CrewAI's way to make one).

    ``codec`` seals the payloads of the checkpoints and runs it writes, as the Redis store
    seals them (default: ``RUNNER_ENCRYPTION_KEYS``'s, if set; see
    :mod:`runner.store.codec`); ids, sequence numbers, statuses and times stay clear. The
    blobs of CrewAI's provider face (:meth:`checkpoint`) are the caller's text, kept as given.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_checkpoints: int | None = None,
        codec: Codec | None = None,
    ) -> None:
        self._bound = path is not None
        self._max_given = max_checkpoints
        self._codec_given = codec
        self.codec = resolve_codec(codec)
        """Seals and opens payloads (``None``: written clear; a sealed one read is an
        :class:`~runner.errors.EncryptionKeyError` naming its key)."""
        self.path = os.fspath(path) if path is not None else ":memory:"
        self.max_checkpoints = resolve_max(max_checkpoints)
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        try:
            self._db = sqlite3.connect(
                self.path, timeout=_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            self.close()
            raise self._unavailable(exc) from None

    def __repr__(self) -> str:
        return f"SqliteProvider({self.path!r})"

    def bind(self, location: str | os.PathLike[str]) -> SqliteProvider:
        """This provider, or (made without a path) one on the database file ``location``."""
        if self._bound:
            return self
        return SqliteProvider(location, max_checkpoints=self._max_given, codec=self._codec_given)

    # --- protocol --------------------------------------------------------------------------

    def commit(
        self,
        checkpoint: Checkpoint,
        *,
        expected_seq: int | None = None,
        max_checkpoints: int | None = None,
    ) -> Checkpoint:
        """Write ``checkpoint`` as the run's next one; return it with ``seq`` set."""
        keep = self.max_checkpoints if max_checkpoints is None else max_checkpoints
        with self._tx(write=True) as db:
            return self._commit(db, checkpoint, expected_seq, keep)

    def get(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint with this id; :class:`CheckpointNotFound` if none."""
        with self._tx() as db:
            found = self._get(db, checkpoint_id)
        return found or self._missing(checkpoint_id)

    def latest(self, run_id: str) -> Checkpoint | None:
        """The run's newest checkpoint, or ``None`` for an unknown run."""
        found = self.history(run_id, limit=1)
        return found[0] if found else None

    def history(self, run_id: str, *, limit: int = 50, offset: int = 0) -> list[Checkpoint]:
        """The run's checkpoints, newest first, ``limit`` from ``offset``."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT id, data FROM checkpoints WHERE run_id = ? ORDER BY seq DESC"
                " LIMIT ? OFFSET ?",
                (run_id, max(limit, 0), max(offset, 0)),
            ).fetchall()
        return [decode(data, ident, self.path, self.codec, run_id) for ident, data in rows]

    def runs(
        self, *, limit: int = 50, offset: int = 0, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """Runs by last update, newest first, optionally only one status."""
        where, args = ("WHERE status = ?", [RunStatus(status).value]) if status else ("", [])
        with self._tx() as db:
            rows = db.execute(
                f"SELECT run_id, info FROM runs {where}"
                " ORDER BY updated_at DESC, run_id DESC LIMIT ? OFFSET ?",
                (*args, max(limit, 0), max(offset, 0)),
            ).fetchall()
        return [decode_info(info, run_id, self.path, self.codec) for run_id, info in rows]

    def run(self, run_id: str) -> RunInfo | None:
        """A run's metadata, or ``None`` for an unknown run."""
        with self._tx() as db:
            return self._info(db, run_id)

    def update_run(self, run_id: str, **fields: Any) -> RunInfo:
        """Set metadata fields (e.g. ``status``) of an existing run; bumps ``updated_at``."""
        with self._tx(write=True) as db:
            info = self._info(db, run_id)
            if info is None:
                raise RunNotFound(f"no run {run_id} in {self.path}", run_id=run_id)
            info = run_info_updated(info, fields)
            self._put_info(db, info)
            return info

    def delete_run(self, run_id: str) -> bool:
        """Remove a run and all its checkpoints; ``False`` if it did not exist."""
        with self._tx(write=True) as db:
            if self._info(db, run_id) is None:
                return False
            for table in ("checkpoints", "activations", "runs", "pins"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            # The run was a fork: what it pinned in its parent may be pruned again.
            db.execute("DELETE FROM pins WHERE child_run_id = ?", (run_id,))
            return True

    def put_run(self, info: RunInfo, checkpoints: Sequence[Checkpoint]) -> None:
        """Replace the run's copy here by ``info`` and ``checkpoints`` (their ids and seqs
        kept), in one transaction: what an archive write is (:mod:`runner.store.archive`)."""
        with self._tx(write=True) as db:
            for table in ("checkpoints", "activations", "runs"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (info.run_id,))
            for cp in checkpoints:
                db.execute(
                    "INSERT INTO checkpoints (id, run_id, seq, data) VALUES (?, ?, ?, ?)",
                    (cp.id, cp.run_id, cp.seq, encode(cp, self.codec)),
                )
                if cp.activation is not None:
                    db.execute(
                        "INSERT OR REPLACE INTO activations"
                        " (run_id, activation, attempt, checkpoint_id, seq) VALUES (?, ?, ?, ?, ?)",
                        (cp.run_id, cp.activation, cp.attempt, cp.id, cp.seq),
                    )
            self._put_info(db, info)

    @overload
    def prune(self, run_id: str, keep: int, *, dry_run: bool = False) -> list[str]: ...

    @overload
    def prune(self, run_id: str, *, max_keep: int, branch: str = "main") -> int: ...

    @overload
    def prune(self, run_id: str, keep: int, *, branch: str) -> int: ...

    def prune(
        self,
        run_id: str,
        keep: int | None = None,
        *,
        dry_run: bool = False,
        max_keep: int | None = None,
        branch: str | None = None,
    ) -> list[str] | int:
        """Delete all but the newest ``keep`` (at least 1) checkpoints; fork points are kept.

        Returns the ids deleted (or that would be, with ``dry_run``), oldest
        first; none for an unknown run. CrewAI's form, ``prune(db_file, max_keep=n,
        branch="main")``, keeps the ``n`` newest blobs :meth:`checkpoint` wrote on a branch
        and returns how many it deleted.
        """
        if max_keep is not None or branch is not None:
            kept = max_keep if max_keep is not None else keep
            return self._prune_blobs(run_id, kept if kept is not None else 0, branch or "main")
        keep = 1 if keep is None else keep
        with self._tx(write=not dry_run) as db:
            if self._info(db, run_id) is None:
                return []
            return self._prune(db, run_id, max(keep, 1), dry_run=dry_run)

    def fork(
        self,
        checkpoint_id: str,
        *,
        new_run_id: str,
        branch: str | None = None,
        state: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Start run ``new_run_id`` from a copy of a checkpoint, lineage recorded.

        :class:`CommitConflict` if ``new_run_id`` already exists.
        """
        with self._tx(write=True) as db:
            source = self._get(db, checkpoint_id) or self._missing(checkpoint_id)
            db.execute(
                "INSERT OR IGNORE INTO pins (checkpoint_id, run_id, child_run_id) VALUES (?, ?, ?)",
                (source.id, source.run_id, new_run_id),
            )
            copy = forked(source, new_run_id, branch, state)
            return self._commit(db, copy, 0, self.max_checkpoints)

    # --- CrewAI's provider face ----------------------------------------------------------------

    def checkpoint(
        self,
        data: str,
        location: str | os.PathLike[str] | None = None,
        *,
        parent_id: str | None = None,
        branch: str = "main",
    ) -> str:
        """Store ``data`` (JSON text) as a blob in the database at ``location`` (default: this
        store's) and return ``<file>#<id>`` (CrewAI's ``SqliteProvider.checkpoint``)."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        ident = f"{stamp}_{uuid.uuid4().hex[:8]}"
        with self._blobs(location) as (db, where):
            db.execute(
                "INSERT INTO blobs (id, created_at, parent_id, branch, data)"
                " VALUES (?, ?, ?, ?, ?)",
                (ident, time.time(), parent_id, branch, data),
            )
        return f"{where}#{ident}"

    def from_checkpoint(self, location: str) -> str:
        """The JSON text of a blob named ``<file>#<id>`` (CrewAI's ``from_checkpoint``)."""
        where, _, ident = location.rpartition("#")
        with self._blobs(where or None) as (db, _path):
            row = db.execute("SELECT data FROM blobs WHERE id = ?", (ident,)).fetchone()
        if row is None:
            raise CheckpointNotFound(f"no checkpoint {ident} in {where}", checkpoint_id=ident)
        return str(row[0])

    @staticmethod
    def extract_id(location: str) -> str:
        """The checkpoint id in ``<file>#<id>``."""
        return location.rpartition("#")[2]

    def _prune_blobs(self, location: str, max_keep: int, branch: str) -> int:
        with self._blobs(location) as (db, _path):
            cursor = db.execute(
                "DELETE FROM blobs WHERE branch = ?1 AND rowid NOT IN (SELECT rowid FROM blobs"
                " WHERE branch = ?1 ORDER BY rowid DESC LIMIT ?2)",
                (branch, max(max_keep, 0)),
            )
            return int(cursor.rowcount)

    @contextmanager
    def _blobs(
        self, location: str | os.PathLike[str] | None
    ) -> Iterator[tuple[sqlite3.Connection, str]]:
        """A transaction on the database at ``location`` (this store's when it is that or
        ``None``; another file gets a connection of its own for the call)."""
        where = self.path if location is None else os.fspath(location)
        if where == self.path:
            with self._tx(write=True) as db:
                yield db, where
            return
        try:
            other = sqlite3.connect(where, timeout=_BUSY_TIMEOUT, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite store {where}: {exc}", path=where) from None
        try:
            other.executescript(_SCHEMA)
            other.execute("BEGIN IMMEDIATE")
            yield other, where
            other.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite store {where}: {exc}", path=where) from None
        finally:
            if other.in_transaction:
                other.execute("ROLLBACK")
            other.close()

    def close(self) -> None:
        """Close the database connection (idempotent)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # --- inside a transaction ----------------------------------------------------------------

    def _commit(
        self, db: sqlite3.Connection, cp: Checkpoint, expected_seq: int | None, keep: int
    ) -> Checkpoint:
        if cp.activation is not None:
            row = db.execute(
                "SELECT attempt, checkpoint_id, seq FROM activations"
                " WHERE run_id = ? AND activation = ?",
                (cp.run_id, cp.activation),
            ).fetchone()
            if row is not None:
                check_activation(cp, row[0], row[1])
                first = self._get(db, row[1])
                # Pruned since: answer with what was committed, by id and seq.
                return first or cp.model_copy(update={"id": row[1], "seq": row[2]})
        info = self._info(db, cp.run_id)
        current = info.seq if info else 0
        if expected_seq is not None and expected_seq != current:
            raise conflict(cp.run_id, expected_seq, current)
        if db.execute("SELECT 1 FROM checkpoints WHERE id = ?", (cp.id,)).fetchone():
            raise StoreError(f"checkpoint {cp.id} is already stored", checkpoint_id=cp.id)
        stored = cp.model_copy(update={"seq": current + 1})
        db.execute(
            "INSERT INTO checkpoints (id, run_id, seq, data) VALUES (?, ?, ?, ?)",
            (stored.id, stored.run_id, stored.seq, encode(stored, self.codec)),
        )
        if cp.activation is not None:
            db.execute(
                "INSERT INTO activations (run_id, activation, attempt, checkpoint_id, seq)"
                " VALUES (?, ?, ?, ?, ?)",
                (cp.run_id, cp.activation, cp.attempt, stored.id, stored.seq),
            )
        self._put_info(db, run_info_after(stored, info))
        if keep > 0:
            self._prune(db, cp.run_id, keep, dry_run=False)
        return stored

    def _prune(self, db: sqlite3.Connection, run_id: str, keep: int, *, dry_run: bool) -> list[str]:
        doomed = [row[0] for row in db.execute(_PRUNABLE, (run_id, keep))]
        if doomed and not dry_run:
            db.executemany("DELETE FROM checkpoints WHERE id = ?", [(i,) for i in doomed])
        return doomed

    def _get(self, db: sqlite3.Connection, checkpoint_id: str) -> Checkpoint | None:
        row = db.execute(
            "SELECT data, run_id FROM checkpoints WHERE id = ?", (checkpoint_id,)
        ).fetchone()
        return None if row is None else decode(row[0], checkpoint_id, self.path, self.codec, row[1])

    def _missing(self, checkpoint_id: str) -> NoReturn:
        raise CheckpointNotFound(
            f"no checkpoint {checkpoint_id} in {self.path}", checkpoint_id=checkpoint_id
        )

    def _info(self, db: sqlite3.Connection, run_id: str) -> RunInfo | None:
        row = db.execute("SELECT info FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else decode_info(row[0], run_id, self.path, self.codec)

    def _put_info(self, db: sqlite3.Connection, info: RunInfo) -> None:
        db.execute(
            "INSERT OR REPLACE INTO runs (run_id, status, updated_at, info) VALUES (?, ?, ?, ?)",
            (info.run_id, info.status.value, info.updated_at, encode_info(info, self.codec)),
        )

    # --- connection --------------------------------------------------------------------------

    @contextmanager
    def _tx(self, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction under the lock; database errors become :class:`StoreUnavailable`."""
        with self._lock:
            db = self._db
            if db is None:
                raise StoreUnavailable(f"SQLite store {self.path} is closed", path=self.path)
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                yield db
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._unavailable(exc) from None
            finally:
                if db.in_transaction:  # the body raised: none of it happened
                    db.execute("ROLLBACK")

    def _unavailable(self, exc: sqlite3.Error) -> StoreUnavailable:
        return StoreUnavailable(f"SQLite store {self.path}: {exc}", path=self.path)
