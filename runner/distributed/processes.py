"""Worker processes started and stopped by this process (demo, benchmarks, tests).

Production workers are started by the operator (``celery -A runner.worker worker``);
this is for tools that need a worker of their own and must leave nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # `runner dev` imports this module; only a worker's probe needs Celery
    from celery import Celery

WORKER_COMMAND = "runner.distributed.worker_command"
"""The module (``python -m``) that starts a worker: ``celery -A APP worker`` without Celery's
umbrella command (:func:`runner.distributed.broker.run_worker_command`)."""


def exec_celery_worker(app_module: str, options: Sequence[str]) -> NoReturn:
    """Become Celery's own ``celery -A app_module worker OPTIONS``, umbrella command and all
    (where :data:`WORKER_COMMAND` cannot do without it)."""
    argv = [sys.executable, "-m", "celery", "-A", app_module, "worker", *options]
    os.execv(sys.executable, argv)


def children(pid: int) -> list[int]:
    """Pids of the direct children of ``pid`` (a prefork worker's pool processes)."""
    try:
        found = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
        ).stdout
    except FileNotFoundError:
        return []
    return [int(child) for child in found.split()]


class WorkerProcess:
    """One ``celery -A <app_module> worker`` subprocess with its own environment.

    Usable as a context manager: started on entry (without waiting for it), stopped
    on exit.
    """

    def __init__(
        self,
        env: dict[str, str],
        *,
        app_module: str = "runner.worker",
        concurrency: int = 2,
        pool: str = "prefork",
        log: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stop_timeout: float = 15.0,
        loglevel: str = "warning",
        wrapper: list[str] | None = None,
    ) -> None:
        """``wrapper``: a command the worker runs under (e.g. ``ip netns exec NAME``)."""
        self.env = {**os.environ, **env}
        self.app_module = app_module
        self.concurrency = concurrency
        self.pool = pool
        self.log = Path(log) if log else None
        self.cwd = Path(cwd) if cwd else Path.cwd()
        self.stop_timeout = stop_timeout
        self.loglevel = loglevel
        self.wrapper = list(wrapper or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.name = f"w-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, app: Celery | None = None, timeout: float = 30.0) -> WorkerProcess:
        """Start the worker; with ``app``, wait until it answers a ping."""
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        args = [*self.wrapper, sys.executable, "-m", WORKER_COMMAND, self.app_module]
        args += ["-P", self.pool, "-c", str(self.concurrency), "-n", self.name]
        args += ["--without-gossip", "--without-mingle", "-l", self.loglevel]
        self.proc = subprocess.Popen(
            args, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT
        )
        if not isinstance(out, int):
            out.close()
        if app is not None:
            self.wait_ready(app, timeout)
        return self

    def wait_ready(self, app: Celery, timeout: float = 30.0) -> None:
        """Block until this worker (by name) answers a ping, or raise ``RuntimeError``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early; see {self.log or 'its output'}")
            if app.control.ping([self.name], timeout=0.5):
                return
        raise RuntimeError(f"worker not ready within {timeout}s; see {self.log or 'its output'}")

    def children(self) -> list[int]:
        """Pids of the worker's pool processes."""
        return [] if self.proc is None else children(self.proc.pid)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the worker and its pool processes at once (a crash)."""
        if self.proc is None:
            return
        for pid in [*self.children(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM); SIGKILL whatever is left after ``stop_timeout``."""
        if self.proc is None:
            return
        pool = self.children()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        for pid in pool:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
