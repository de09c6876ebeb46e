"""JSON-directory checkpoint store: plain files, for offline use and inspection.

Layout under ``directory``::

    index.json                       {run_id: {"updated_at": t, "status": s}}
    index.lock                       flock: writers of index.json
    runs/<run>/meta.json             {"info": RunInfo, "activations": {...}, "pins": {...}}
    runs/<run>/run.lock              flock: commits and edits of this run
    runs/<run>/<seq:010d>-<id>.json  one checkpoint

``<run>`` is the run id percent-encoded (dots too), so any id is a safe file name.
Every file is written to a temp file and moved into place (``os.replace``);
``meta.json`` is the commit point: a checkpoint file beyond the meta's seq (left
by a crash mid-commit) is invisible and replaced by the next commit. Locks are
``fcntl.flock``, safe across threads and processes (order: run, then index).
``activations`` maps an activation to ``[attempt, checkpoint id, seq]``; ``pins``
maps a checkpoint id to the forks pointing to it. ``get`` searches every run.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from runner.errors import CheckpointNotFound, RunNotFound, StoreError
from runner.store._common import (
    check_activation,
    conflict,
    decode_info,
    encode,
    forked,
    resolve_max,
    run_info_after,
    run_info_updated,
)
from runner.store._files import (
    SEQ_DIGITS,
    checkpoint_files,
    file_name,
    flocked,
    id_of,
    load_checkpoint,
    read_json,
    store_io,
    write_atomic,
)
from runner.store.models import Checkpoint, RunInfo, RunStatus


class JsonProvider:
    """Checkpoint store in a directory of JSON files."""

    @store_io
    def __init__(self, directory: str | os.PathLike[str], *, max_checkpoints: int | None = None):
        self.directory = Path(directory)
        self.max_checkpoints = resolve_max(max_checkpoints)
        (self.directory / "runs").mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"JsonProvider({str(self.directory)!r})"

    @store_io
    def commit(
        self,
        checkpoint: Checkpoint,
        *,
        expected_seq: int | None = None,
        max_checkpoints: int | None = None,
    ) -> Checkpoint:
        """Write ``checkpoint`` as the run's next one; return it with ``seq`` set."""
        keep = self.max_checkpoints if max_checkpoints is None else max_checkpoints
        with flocked(self._dir(checkpoint.run_id) / "run.lock", create=True):
            return self._commit(checkpoint, expected_seq, keep)

    @store_io
    def get(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint with this id; :class:`CheckpointNotFound` if none."""
        suffix = f"-{checkpoint_id}.json"
        for run_dir in (self.directory / "runs").iterdir():
            meta = self._meta_at(run_dir)
            for path in checkpoint_files(run_dir, meta["info"].seq if meta else 0):
                if path.name.endswith(suffix) and (found := load_checkpoint(path)):
                    return found
        raise CheckpointNotFound(
            f"no checkpoint {checkpoint_id} in {self.directory}", checkpoint_id=checkpoint_id
        )

    def latest(self, run_id: str) -> Checkpoint | None:
        """The run's newest checkpoint, or ``None`` for an unknown run."""
        found = self.history(run_id, limit=1)
        return found[0] if found else None

    @store_io
    def history(self, run_id: str, *, limit: int = 50, offset: int = 0) -> list[Checkpoint]:
        """The run's checkpoints, newest first, ``limit`` from ``offset``."""
        meta = self._meta(run_id)
        files = checkpoint_files(self._dir(run_id), meta["info"].seq) if meta else []
        start = max(offset, 0)
        loaded = (load_checkpoint(path) for path in files[start : start + max(limit, 0)])
        return [cp for cp in loaded if cp is not None]

    @store_io
    def runs(
        self, *, limit: int = 50, offset: int = 0, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """Runs by last update, newest first, optionally only one status."""
        wanted = RunStatus(status).value if status else None
        index = read_json(self.directory / "index.json") or {}
        order = sorted(
            (
                (entry["updated_at"], run_id)
                for run_id, entry in index.items()
                if wanted is None or entry["status"] == wanted
            ),
            reverse=True,
        )
        start = max(offset, 0)
        metas = (self._meta(run_id) for _, run_id in order[start : start + max(limit, 0)])
        return [meta["info"] for meta in metas if meta is not None]

    @store_io
    def run(self, run_id: str) -> RunInfo | None:
        """A run's metadata, or ``None`` for an unknown run."""
        meta = self._meta(run_id)
        return None if meta is None else meta["info"]

    @store_io
    def update_run(self, run_id: str, **fields: Any) -> RunInfo:
        """Set metadata fields (e.g. ``status``) of an existing run; bumps ``updated_at``."""
        with flocked(self._dir(run_id) / "run.lock"):
            meta = self._meta(run_id)
            if meta is None:
                raise RunNotFound(f"no run {run_id} in {self.directory}", run_id=run_id)
            meta["info"] = run_info_updated(meta["info"], fields)
            self._save_meta(run_id, meta)
            return meta["info"]

    @store_io
    def delete_run(self, run_id: str) -> bool:
        """Remove a run and all its checkpoints; ``False`` if it did not exist."""
        run_dir = self._dir(run_id)
        with flocked(run_dir / "run.lock"):
            meta = self._meta(run_id)
            if meta is None:
                return False
            (run_dir / "meta.json").unlink()
            self._index(run_id, None)
            for path in run_dir.iterdir():
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # a commit may be recreating the run
                run_dir.rmdir()
        info = meta["info"]
        if info.parent_run_id and info.parent_checkpoint_id:  # release what the fork pinned
            self._pin(info.parent_run_id, info.parent_checkpoint_id, run_id, pin=False)
        return True

    @store_io
    def prune(self, run_id: str, keep: int, *, dry_run: bool = False) -> list[str]:
        """Delete all but the newest ``keep`` (at least 1) checkpoints; fork points are kept.

        Returns the ids deleted (or that would be, with ``dry_run``), oldest
        first; none for an unknown run.
        """
        with flocked(self._dir(run_id) / "run.lock"):
            meta = self._meta(run_id)
            return self._prune(run_id, meta, max(keep, 1), dry_run=dry_run) if meta else []

    @store_io
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
        source = self.get(checkpoint_id)
        if not self._pin(source.run_id, source.id, new_run_id, pin=True):
            raise CheckpointNotFound(
                f"checkpoint {checkpoint_id} was just deleted", checkpoint_id=checkpoint_id
            )
        try:
            return self.commit(forked(source, new_run_id, branch, state), expected_seq=0)
        except StoreError:
            self._pin(source.run_id, source.id, new_run_id, pin=False)
            raise

    def close(self) -> None:
        """Nothing to release: files are opened per call."""

    # --- helpers ---------------------------------------------------------------------------

    def _commit(self, cp: Checkpoint, expected_seq: int | None, keep: int) -> Checkpoint:
        """Commit under the run lock; ``meta.json`` replaced last is the commit point."""
        meta = self._meta(cp.run_id) or {"info": None, "activations": {}, "pins": {}}
        info: RunInfo | None = meta["info"]
        if cp.activation is not None and cp.activation in meta["activations"]:
            attempt, first_id, first_seq = meta["activations"][cp.activation]
            check_activation(cp, attempt, first_id)
            first = load_checkpoint(self._dir(cp.run_id) / file_name(first_seq, first_id))
            return first or cp.model_copy(update={"id": first_id, "seq": first_seq})
        current = info.seq if info else 0
        if expected_seq is not None and expected_seq != current:
            raise conflict(cp.run_id, expected_seq, current)
        stored = cp.model_copy(update={"seq": current + 1})
        run_dir = self._dir(cp.run_id)
        for orphan in run_dir.glob(f"{stored.seq:0{SEQ_DIGITS}d}-*.json"):
            orphan.unlink()
        write_atomic(run_dir / file_name(stored.seq, stored.id), encode(stored))
        if cp.activation is not None:
            meta["activations"][cp.activation] = [cp.attempt, stored.id, stored.seq]
        meta["info"] = run_info_after(stored, info)
        self._save_meta(cp.run_id, meta)
        if keep > 0:
            self._prune(cp.run_id, meta, keep, dry_run=False)
        return stored

    def _prune(self, run_id: str, meta: dict[str, Any], keep: int, *, dry_run: bool) -> list[str]:
        old = reversed(checkpoint_files(self._dir(run_id), meta["info"].seq)[keep:])
        doomed = [path for path in old if id_of(path) not in meta["pins"]]
        if not dry_run:
            for path in doomed:
                path.unlink(missing_ok=True)
        return [id_of(path) for path in doomed]

    def _pin(self, run_id: str, checkpoint_id: str, child: str, *, pin: bool) -> bool:
        """Record (or release) that fork ``child`` points to a checkpoint; ``False`` if gone."""
        with flocked(self._dir(run_id) / "run.lock"):
            meta = self._meta(run_id)
            if meta is None:
                return False
            children: list[str] = meta["pins"].setdefault(checkpoint_id, [])
            if pin:
                files = checkpoint_files(self._dir(run_id), meta["info"].seq)
                if not any(id_of(path) == checkpoint_id for path in files):
                    return False
                children.append(child)
            elif child in children:
                children.remove(child)
            if not children:
                del meta["pins"][checkpoint_id]
            write_atomic(self._dir(run_id) / "meta.json", _meta_json(meta))
            return True

    def _dir(self, run_id: str) -> Path:
        return self.directory / "runs" / quote(run_id, safe="").replace(".", "%2E")

    def _meta(self, run_id: str) -> dict[str, Any] | None:
        return self._meta_at(self._dir(run_id))

    def _meta_at(self, run_dir: Path) -> dict[str, Any] | None:
        data = read_json(run_dir / "meta.json")
        if data is None:
            return None
        data = data if isinstance(data, dict) else {}
        return {**data, "info": decode_info(data.get("info") or {}, run_dir.name, str(run_dir))}

    def _save_meta(self, run_id: str, meta: dict[str, Any]) -> None:
        """Replace ``meta.json`` (the commit point), then update the run index."""
        write_atomic(self._dir(run_id) / "meta.json", _meta_json(meta))
        self._index(run_id, meta["info"])

    def _index(self, run_id: str, info: RunInfo | None) -> None:
        with flocked(self.directory / "index.lock", create=True):
            index = read_json(self.directory / "index.json") or {}
            if info is None:
                index.pop(run_id, None)
            else:
                index[run_id] = {"updated_at": info.updated_at, "status": info.status.value}
            write_atomic(self.directory / "index.json", json.dumps(index))


def _meta_json(meta: dict[str, Any]) -> str:
    return json.dumps({**meta, "info": meta["info"].model_dump(mode="json")})
