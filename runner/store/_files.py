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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from runner.errors import StoreError, StoreUnavailable
from runner.store._common import decode
from runner.store.models import Checkpoint

P = ParamSpec("P")
R = TypeVar("R")
SEQ_DIGITS = 10
"""Width of the zero-padded sequence number that starts a checkpoint file's name."""


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


def file_name(seq: int, checkpoint_id: str) -> str:
    """File name of a checkpoint: ``<seq:010d>-<id>.json``."""
    return f"{seq:0{SEQ_DIGITS}d}-{checkpoint_id}.json"


def id_of(path: Path) -> str:
    """The checkpoint id in a checkpoint file's name."""
    return path.stem.split("-", 1)[-1]


def checkpoint_files(run_dir: Path, max_seq: int) -> list[Path]:
    """Checkpoint files of a run up to ``max_seq`` (the committed ones), newest first."""
    try:
        names = sorted((n for n in os.listdir(run_dir) if n[:1].isdigit()), reverse=True)
    except FileNotFoundError:
        return []
    return [run_dir / n for n in names if int(n[:SEQ_DIGITS]) <= max_seq]


def load_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint in ``path``; ``None`` if it is gone (pruned meanwhile)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode(data, id_of(path), str(path))


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path``: a synced temp file beside it, then ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
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
