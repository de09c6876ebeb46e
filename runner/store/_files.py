"""File helpers of the JSON-directory store: atomic writes, locks, checkpoint files.

They raise ``OSError``; :func:`store_io` turns it into :class:`StoreUnavailable`
at the store's edge.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from runner.errors import StoreError, StoreUnavailable
from runner.store._common import decode
from runner.store.codec import Codec
from runner.store.models import Checkpoint

P = ParamSpec("P")
R = TypeVar("R")
SEQ_DIGITS = 10
"""Width of the zero-padded sequence number that started a checkpoint file's name in the
first layout (read only to migrate it)."""


def store_io(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """Make ``OSError`` of a store method :class:`StoreUnavailable` naming ``self.directory``."""

    @functools.wraps(method)
    def wrapper(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            raise StoreUnavailable(
                f"JSON store {self.directory}: {exc.strerror or exc}", path=str(self.directory)
            ) from None

    return wrapper


def file_name(checkpoint: Checkpoint) -> str:
    """File name of a checkpoint: ``<UTC time>_<id>.json``, so names sort by time (the
    time is when the checkpoint was made, to the millisecond, like CrewAI's names)."""
    ms = int(checkpoint.created_at * 1000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(ms // 1000))
    return f"{stamp}{ms % 1000:03d}_{checkpoint.id}.json"


def id_of(path: Path) -> str:
    """The checkpoint id in a checkpoint file's name (either layout)."""
    stem = path.stem
    return stem.split("_", 1)[-1] if "_" in stem else stem.split("-", 1)[-1]


def old_checkpoint_files(run_dir: Path, max_seq: int) -> list[Path]:
    """Checkpoint files of a run in the first layout (``runs/<run>/<seq:010d>-<id>.json``)
    up to ``max_seq`` (the committed ones), oldest first."""
    try:
        names = sorted(n for n in os.listdir(run_dir) if n[:1].isdigit() and n.endswith(".json"))
    except FileNotFoundError:
        return []
    return [run_dir / n for n in names if int(n[:SEQ_DIGITS]) <= max_seq]


def load_checkpoint(
    path: Path, codec: Codec | None = None, run_id: str | None = None
) -> Checkpoint | None:
    """The checkpoint in ``path`` (a sealed one opened with ``codec``; ``run_id``: the run
    that lists it, if known); ``None`` if it is gone (pruned meanwhile)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode(data, id_of(path), str(path), codec, run_id)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path``: a synced temp file beside it, then ``os.replace``."""
    # Not ".json": an interrupted write must not look like a checkpoint file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or ``None`` if there is no such file."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise StoreError(f"{path} cannot be decoded: {exc}", path=str(path)) from None


@contextlib.contextmanager
def flocked(lock_path: Path, *, create: bool = False) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (threads and processes alike).

    With ``create`` the directory is made first. Without it, a missing directory
    means there is nothing to protect: the body runs unlocked (and finds nothing).
    After locking, the file is checked to still be the one at ``lock_path``, since
    deleting a run removes its lock file while others may wait on it.
    """
    while True:
        try:
            if create:
                lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            if create:
                continue  # the directory was removed between mkdir and open
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield
                return
        finally:
            os.close(fd)  # closing releases the lock
