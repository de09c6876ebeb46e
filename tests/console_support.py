"""Helpers of the console tests: workers that run :mod:`tests.console_flows`, the
console served by uvicorn on a free loopback port, in a thread of the test process, and
a real Flower process on those workers' events."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from runner.console import create_app
from runner.distributed import client
from runner.distributed.engine import Runtime
from runner.settings import RunnerSettings
from runner.store.models import RunStatus
from tests._dist_support import private_pool

FLOWER = "http://flower.test:5555"
"""The Flower URL the console links to in the tests (never opened)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def console_deployment(
    worker_env: dict[str, str], logdir: str
) -> Iterator[tuple[Runtime, dict[str, str]]]:
    """One worker (two processes) on a prefix and queue of its own, running the console
    test flows; yields the producer runtime on them and their ``RUNNER_*`` environment."""
    modules = f"{worker_env['RUNNER_FLOW_MODULES']},tests.console_flows"
    with private_pool(worker_env, logdir, RUNNER_FLOW_MODULES=modules) as (pool, rt, env):
        pool.start(concurrency=2)
        yield rt, env


@contextlib.contextmanager
def console_workers(worker_env: dict[str, str], logdir: str) -> Iterator[Runtime]:
    """:func:`console_deployment`'s runtime alone."""
    with console_deployment(worker_env, logdir) as (rt, _):
        yield rt


@contextlib.contextmanager
def flower(env: dict[str, str], logdir: str) -> Iterator[str]:
    """A real Flower (``celery -A runner.worker flower``) on the workers of ``env``, at a
    free loopback port; yields its URL once it receives the workers' events (it learns
    tasks only from events sent after that)."""
    port = _free_port()
    log = Path(logdir) / f"flower-{port}.log"
    args = [sys.executable, "-m", "celery", "-A", "runner.worker", "flower"]
    args += [f"--port={port}", "--address=127.0.0.1"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args,
            env={**os.environ, **env, "FLOWER_UNAUTHENTICATED_API": "true"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _sees_a_worker(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                said = log.read_text(errors="replace").splitlines()[-5:]
                raise AssertionError(f"Flower did not see the workers ({log}): {said}")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _sees_a_worker(url: str) -> bool:
    """True once Flower's state holds a worker, which it learns from the workers' events
    (their heartbeats): from then on it receives the task events too."""
    try:
        found = httpx.get(f"{url}/workers", params={"json": 1}, timeout=1).json()
    except (httpx.HTTPError, ValueError):
        return False
    return bool(found.get("data"))


@contextlib.contextmanager
def serving(
    rt: Runtime,
    token: str | None = None,
    flower_url: str = FLOWER,
    settings: RunnerSettings | None = None,
) -> Iterator[str]:
    """The console on ``rt`` at a free loopback port, linking to ``flower_url``, with
    ``settings`` (default: ``rt``'s); yields its base URL."""
    app = create_app(rt, settings=settings, token=token, flower_url=flower_url)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name=f"console-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the console did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def failed_review(rt: Runtime, **inputs: Any) -> str:
    """Submit a :class:`~tests.console_flows.ReviewFlow` run that fails at ``check`` (its
    draft is over the default limit); wait for it to fail; its run id."""
    handle = client.submit("tests.console_flows:ReviewFlow", inputs, rt=rt)
    assert handle.wait(timeout=15) is RunStatus.FAILED
    return handle.run_id


def snapshot(rt: Runtime) -> dict[str, tuple[int, str]]:
    """Every run of ``rt``'s prefix: its seq and status (to check that nothing changed)."""
    return {info.run_id: (info.seq, info.status.value) for info in rt.store.runs(limit=1000)}
