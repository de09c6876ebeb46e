"""Worker processes started and stopped by this process (demo, benchmarks, tests).

Production workers are started by the operator (``celery -A workers worker``);
this is for tools that need a worker of their own and must leave nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from celery import Celery


class WorkerProcess:
    """One ``celery -A workers worker`` subprocess with its own environment."""

    def __init__(
        self,
        env: dict[str, str],
        *,
        concurrency: int = 2,
        pool: str = "prefork",
        log: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.env = {**os.environ, **env}
        self.concurrency = concurrency
        self.pool = pool
        self.log = Path(log) if log else None
        self.cwd = Path(cwd) if cwd else Path(__file__).resolve().parents[2]
        self.proc: subprocess.Popen[bytes] | None = None
        self.name = f"w-{uuid.uuid4().hex[:6]}@%h"

    def start(self, app: Celery | None = None, timeout: float = 30.0) -> WorkerProcess:
        """Start the worker; with ``app``, wait until it answers a ping."""
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        args = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-P", self.pool]
        args += ["-c", str(self.concurrency), "-n", self.name, "--without-gossip"]
        args += ["--without-mingle", "-l", "warning"]
        self.proc = subprocess.Popen(
            args, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT
        )
        if not isinstance(out, int):
            out.close()
        if app is not None:
            self.wait_ready(app, timeout)
        return self

    def wait_ready(self, app: Celery, timeout: float = 30.0) -> None:
        """Block until this worker answers a ping (or raise ``RuntimeError``)."""
        deadline = time.monotonic() + timeout
        host = self.name.split("@")[0]
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early; see {self.log or 'its output'}")
            replies = app.control.ping(timeout=0.3) or []
            if any(host in name for reply in replies for name in reply):
                return
        raise RuntimeError(f"worker not ready within {timeout}s")

    def children(self) -> list[int]:
        """Pids of the worker's pool processes."""
        if self.proc is None:
            return []
        try:
            found = subprocess.run(
                ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
            ).stdout
        except FileNotFoundError:
            return []
        return [int(pid) for pid in found.split()]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the worker and its pool processes at once (a crash)."""
        if self.proc is None:
            return
        for pid in [*self.children(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM); SIGKILL whatever is left after ``timeout``."""
        if self.proc is None:
            return
        children = self.children()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
