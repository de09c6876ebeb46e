"""JSON-directory checkpoint store: plain files, for offline use and inspection.

Layout under ``directory`` (the ``location`` of a ``CheckpointConfig``)::

    <UTC time>_<id>.json             one checkpoint (the only ``.json`` files)
    index.runs                       {run_id: {"updated_at": t, "status": s}}
    index.lock                       flock: writers of index.runs
    runs/<run>/meta.run              {"info": RunInfo, "history": [[seq, id, file]],
                                      "activations": {...}, "pins": {...}}
    runs/<run>/run.lock              flock: commits and edits of this run

Checkpoint files are the only ``.json`` files and their names start with the time they were
made, so, as with CrewAI's ``<timestamp>_<uuid>.json`` files,
``sorted(Path(location).rglob("*.json"))[-1]`` is the newest checkpoint.

``<run>`` is the run id percent-encoded (dots too), so any id is a safe file name.
Every file is written to a temp file and moved into place (``os.replace``);
``meta.run`` is the commit point: a checkpoint file it does not list (left by a crash
mid-commit) is not part of the run. Locks are ``fcntl.flock``, safe across threads and
processes (order: run, then index). ``activations`` maps an activation to
``[attempt, checkpoint id, seq]``; ``pins`` maps a checkpoint id to the forks pointing to it.

A directory written by the first layout (``index.json``, ``runs/<run>/meta.json`` and
``runs/<run>/<seq>-<id>.json``) is migrated when a provider opens it.

CrewAI's provider face is here too: :meth:`JsonProvider.checkpoint` writes a blob as
``<location>/<branch>/<time>_<uuid8>_p-<parent>.json``, :meth:`prune` with ``max_keep=``
prunes a branch, :meth:`extract_id` reads a checkpoint id from a path.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload
from urllib.parse import quote

from runner.errors import CheckpointNotFound, RunNotFound, StoreError, StoreUnavailable
from runner.store._common import (
    check_activation,
    conflict,
    decode_info,
    encode,
    forked,
    resolve_codec,
    resolve_max,
    run_info_after,
    run_info_updated,
    sealed_info,
)
from runner.store._files import (
    file_name,
    flocked,
    load_checkpoint,
    old_checkpoint_files,
    read_json,
    store_io,
    write_atomic,
)
from runner.store.codec import Codec
from runner.store.models import Checkpoint, RunInfo, RunStatus
from runner.store.pending import PendingFeedbackStore

INDEX = "index.runs"
META = "meta.run"
OLD_INDEX = "index.json"
OLD_META = "meta.json"


class JsonProvider(PendingFeedbackStore):
    """Checkpoint store in a directory of JSON files.

    ``JsonProvider()`` without a directory takes its location from the
    ``CheckpointConfig`` it is given to (CrewAI's way to make one).

    ``codec`` seals the payloads of the checkpoint files and ``meta.run`` files it writes,
    as the Redis store seals them (default: ``RUNNER_ENCRYPTION_KEYS``'s, if set; see
    :mod:`runner.store.codec`): a sealed file is still JSON, its ids, statuses, times and
    step names clear, its payloads in one ``"sealed"`` value. The files of CrewAI's provider
    face (:meth:`checkpoint`) are the caller's text, kept as given.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        max_checkpoints: int | None = None,
        codec: Codec | None = None,
    ) -> None:
        self._max_given = max_checkpoints
        self._codec_given = codec
        self.codec = resolve_codec(codec)
        """Seals and opens payloads (``None``: written clear; a sealed one read is an
        :class:`~runner.errors.EncryptionKeyError` naming its key)."""
        self.max_checkpoints = resolve_max(max_checkpoints)
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self._open()

    def __repr__(self) -> str:
        where = "" if self.directory is None else repr(str(self.directory))
        return f"JsonProvider({where})"

    def bind(self, location: str | os.PathLike[str]) -> JsonProvider:
        """This provider, or (made without a directory) one at ``location``."""
        if self.directory is not None:
            return self
        return JsonProvider(location, max_checkpoints=self._max_given, codec=self._codec_given)

    @staticmethod
    def root_of(path: Path) -> Path | None:
        """The store directory holding checkpoint file ``path`` (either layout), if any."""
        for parent in path.parents if path.is_file() else ():
            if (parent / "runs").is_dir():
                return parent
        return None

    # --- protocol --------------------------------------------------------------------------

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
        for path in self._root().glob(f"*_{glob.escape(checkpoint_id)}.json"):
            found = load_checkpoint(path, self.codec)
            meta = self._meta(found.run_id) if found is not None else None
            if found is not None and meta and any(e[1] == found.id for e in meta["history"]):
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
        entries = list(reversed(meta["history"])) if meta else []
        start = max(offset, 0)
        root = self._root()
        loaded = (
            load_checkpoint(root / e[2], self.codec, run_id)
            for e in entries[start : start + max(limit, 0)]
        )
        return [cp for cp in loaded if cp is not None]

    @store_io
    def runs(
        self, *, limit: int = 50, offset: int = 0, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """Runs by last update, newest first, optionally only one status."""
        wanted = RunStatus(status).value if status else None
        index = read_json(self._root() / INDEX) or {}
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
            (run_dir / META).unlink()
            self._index(run_id, None)
            for entry in meta["history"]:
                (self._root() / entry[2]).unlink(missing_ok=True)
            for path in run_dir.iterdir():
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # a commit may be recreating the run
                run_dir.rmdir()
        info = meta["info"]
        if info.parent_run_id and info.parent_checkpoint_id:  # release what the fork pinned
            self._pin(info.parent_run_id, info.parent_checkpoint_id, run_id, pin=False)
        return True

    @store_io
    def put_run(self, info: RunInfo, checkpoints: Sequence[Checkpoint]) -> None:
        """Replace the run's copy here by ``info`` and ``checkpoints`` (ids and seqs kept):
        the files first, then ``meta.run`` replaced (the commit point), then the files of
        an earlier copy that are not in this one. What an archive write is."""
        run_dir = self._dir(info.run_id)
        with flocked(run_dir / "run.lock", create=True):
            before = self._meta(info.run_id)
            history = []
            for cp in checkpoints:
                name = file_name(cp)
                write_atomic(self._root() / name, encode(cp, self.codec))
                history.append([cp.seq, cp.id, name])
            activations = {
                cp.activation: [cp.attempt, cp.id, cp.seq] for cp in checkpoints if cp.activation
            }
            pins = before["pins"] if before else {}
            meta = {"info": info, "history": history, "activations": activations, "pins": pins}
            self._save_meta(info.run_id, meta)
            kept = {entry[2] for entry in history}
            for entry in before["history"] if before else []:
                if entry[2] not in kept:
                    (self._root() / entry[2]).unlink(missing_ok=True)

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
        """Delete all but the newest ``keep`` (at least 1) checkpoints of a run; fork points
        are kept. Returns the ids deleted (or that would be, with ``dry_run``), oldest
        first; none for an unknown run.

        CrewAI's form, ``prune(location, max_keep=n, branch="main")``, deletes all but the
        ``n`` newest blob files of a branch written by :meth:`checkpoint` and returns how many.
        """
        if max_keep is not None or branch is not None:
            kept = max_keep if max_keep is not None else keep
            return _prune_branch(run_id, kept if kept is not None else 0, branch or "main")
        return self._prune_run(run_id, keep if keep is not None else 1, dry_run=dry_run)

    @store_io
    def _prune_run(self, run_id: str, keep: int, *, dry_run: bool) -> list[str]:
        with flocked(self._dir(run_id) / "run.lock"):
            meta = self._meta(run_id)
            if meta is None:
                return []
            doomed = self._prunable(meta, max(keep, 1))
            if not dry_run:
                self._drop(run_id, meta, doomed)
            return [e[1] for e in doomed]

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

    # --- CrewAI's provider face ------------------------------------------------------------

    def checkpoint(
        self,
        data: str,
        location: str | os.PathLike[str] | None = None,
        *,
        parent_id: str | None = None,
        branch: str = "main",
    ) -> str:
        """Write ``data`` (JSON text) as ``<location>/<branch>/<time>_<uuid8>_p-<parent>.json``
        and return the path (CrewAI's ``JsonProvider.checkpoint``)."""
        base = Path(location) if location is not None else self._root()
        target = _branch_dir(base, branch)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = target / f"{stamp}_{uuid.uuid4().hex[:8]}_p-{parent_id or 'none'}.json"
        target.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        return str(path)

    def from_checkpoint(self, location: str | os.PathLike[str]) -> str:
        """The JSON text of a checkpoint file (CrewAI's ``from_checkpoint``)."""
        return Path(location).read_text(encoding="utf-8")

    @staticmethod
    def extract_id(location: str | os.PathLike[str]) -> str:
        """The checkpoint id in a checkpoint file's path: CrewAI's ``<time>_<uuid8>`` for
        its ``..._p-<parent>.json`` files, the runner's checkpoint id for its own."""
        stem = Path(location).stem
        cut = stem.find("_p-")
        if cut != -1:
            return stem[:cut]
        return stem.split("_", 1)[-1]

    # --- helpers ---------------------------------------------------------------------------

    def _root(self) -> Path:
        if self.directory is None:
            raise StoreUnavailable(
                "JsonProvider() has no directory: give one, or give the provider to a "
                "CheckpointConfig(location=...)",
                path=None,
            )
        return self.directory

    @store_io
    def _open(self) -> None:
        (self._root() / "runs").mkdir(parents=True, exist_ok=True)
        if (self._root() / OLD_INDEX).exists():
            self._migrate()

    def _commit(self, cp: Checkpoint, expected_seq: int | None, keep: int) -> Checkpoint:
        """Commit under the run lock; ``meta.run`` replaced is the commit point."""
        meta = self._meta(cp.run_id) or {
            "info": None,
            "history": [],
            "activations": {},
            "pins": {},
        }
        info: RunInfo | None = meta["info"]
        if cp.activation is not None and cp.activation in meta["activations"]:
            attempt, first_id, first_seq = meta["activations"][cp.activation]
            check_activation(cp, attempt, first_id)
            name = next((e[2] for e in meta["history"] if e[1] == first_id), None)
            first = load_checkpoint(self._root() / name, self.codec, cp.run_id) if name else None
            return first or cp.model_copy(update={"id": first_id, "seq": first_seq})
        current = info.seq if info else 0
        if expected_seq is not None and expected_seq != current:
            raise conflict(cp.run_id, expected_seq, current)
        stored = cp.model_copy(update={"seq": current + 1})
        name = file_name(stored)
        write_atomic(self._root() / name, encode(stored, self.codec))
        meta["history"].append([stored.seq, stored.id, name])
        if cp.activation is not None:
            meta["activations"][cp.activation] = [cp.attempt, stored.id, stored.seq]
        meta["info"] = run_info_after(stored, info)
        doomed = self._prunable(meta, keep) if keep > 0 else []
        self._drop(cp.run_id, meta, doomed)
        return stored

    def _prunable(self, meta: dict[str, Any], keep: int) -> list[list[Any]]:
        """History entries beyond the newest ``keep``, oldest first, fork points excepted."""
        old = meta["history"][:-keep] if keep > 0 else []
        return [e for e in old if e[1] not in meta["pins"]]

    def _drop(self, run_id: str, meta: dict[str, Any], doomed: list[list[Any]]) -> None:
        """Save ``meta`` without ``doomed`` (the commit point), then delete their files."""
        gone = {e[1] for e in doomed}
        meta["history"] = [e for e in meta["history"] if e[1] not in gone]
        self._save_meta(run_id, meta)
        for entry in doomed:
            (self._root() / entry[2]).unlink(missing_ok=True)

    def _pin(self, run_id: str, checkpoint_id: str, child: str, *, pin: bool) -> bool:
        """Record (or release) that fork ``child`` points to a checkpoint; ``False`` if gone."""
        with flocked(self._dir(run_id) / "run.lock"):
            meta = self._meta(run_id)
            if meta is None:
                return False
            children: list[str] = meta["pins"].setdefault(checkpoint_id, [])
            if pin:
                if not any(e[1] == checkpoint_id for e in meta["history"]):
                    return False
                children.append(child)
            elif child in children:
                children.remove(child)
            if not children:
                del meta["pins"][checkpoint_id]
            write_atomic(self._dir(run_id) / META, _meta_json(meta, self.codec))
            return True

    def _dir(self, run_id: str) -> Path:
        return self._root() / "runs" / quote(run_id, safe="").replace(".", "%2E")

    def _meta(self, run_id: str) -> dict[str, Any] | None:
        return self._meta_at(self._dir(run_id))

    def _meta_at(self, run_dir: Path) -> dict[str, Any] | None:
        data = read_json(run_dir / META)
        if data is None:
            return None
        data = data if isinstance(data, dict) else {}
        info = decode_info(data.get("info") or {}, run_dir.name, str(run_dir), self.codec)
        return {"history": [], "activations": {}, "pins": {}, **data, "info": info}

    def _save_meta(self, run_id: str, meta: dict[str, Any]) -> None:
        """Replace ``meta.run`` (the commit point), then update the run index."""
        write_atomic(self._dir(run_id) / META, _meta_json(meta, self.codec))
        self._index(run_id, meta["info"])

    def _index(self, run_id: str, info: RunInfo | None) -> None:
        with flocked(self._root() / "index.lock", create=True):
            index = read_json(self._root() / INDEX) or {}
            if info is None:
                index.pop(run_id, None)
            else:
                index[run_id] = {"updated_at": info.updated_at, "status": info.status.value}
            write_atomic(self._root() / INDEX, json.dumps(index))

    def _migrate(self) -> None:
        """Move a directory of the first layout to this one, run by run (each under its
        lock, so it is safe while other processes open it too), then the index."""
        for run_dir in sorted((self._root() / "runs").iterdir()):
            if run_dir.is_dir():
                with flocked(run_dir / "run.lock"):
                    self._migrate_run(run_dir)
        with flocked(self._root() / "index.lock", create=True):
            old = self._root() / OLD_INDEX
            index = read_json(old)
            if index is not None:
                write_atomic(self._root() / INDEX, json.dumps(index))
                old.unlink(missing_ok=True)

    def _migrate_run(self, run_dir: Path) -> None:
        old = read_json(run_dir / OLD_META)
        if old is None:
            return
        meta = self._meta_at(run_dir)
        moves: list[tuple[Path, str]] = []
        if meta is None:  # the list of files is written first, so a crash here resumes
            info = decode_info(old.get("info") or {}, run_dir.name, str(run_dir))
            history = []
            for path in old_checkpoint_files(run_dir, info.seq):
                found = load_checkpoint(path, self.codec)
                if found is not None:
                    name = file_name(found)
                    history.append([found.seq, found.id, name])
                    moves.append((path, name))
            meta = {**old, "info": info, "history": history}
            write_atomic(run_dir / META, _meta_json(meta, self.codec))
        else:
            by_id = {e[1]: e[2] for e in meta["history"]}
            for path in old_checkpoint_files(run_dir, meta["info"].seq):
                ident = path.stem.split("-", 1)[-1]
                if ident in by_id:
                    moves.append((path, by_id[ident]))
        for path, name in moves:
            os.replace(path, self._root() / name)
        for leftover in run_dir.glob("*.json"):  # the old meta and uncommitted files
            leftover.unlink(missing_ok=True)


def _meta_json(meta: dict[str, Any], codec: Codec | None) -> str:
    return json.dumps({**meta, "info": sealed_info(meta["info"], codec).model_dump(mode="json")})


def _branch_dir(base: Path, branch: str) -> Path:
    """``base/branch``; ``ValueError`` if the branch name leads out of ``base``."""
    target = (base / branch).resolve()
    root = base.resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"branch name escapes checkpoint directory: {branch!r}")
    return base / branch


def _prune_branch(location: str, max_keep: int, branch: str) -> int:
    """CrewAI's prune: keep the ``max_keep`` newest (by mtime) ``.json`` files of a branch."""
    files = sorted(_branch_dir(Path(location), branch).glob("*.json"), key=os.path.getmtime)
    doomed = files if max_keep <= 0 else files[:-max_keep]
    for path in doomed:
        path.unlink(missing_ok=True)
    return len(doomed)
