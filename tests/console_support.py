"""Helpers of the console tests: workers that run :mod:`tests.console_flows`, and the
console served by uvicorn on a free loopback port, in a thread of the test process."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from runner.console import create_app
from runner.distributed import client
from runner.distributed.engine import Runtime
from runner.store.models import RunStatus
from tests._dist_support import private_pool

FLOWER = "http://flower.test:5555"
"""The Flower URL the console links to in the tests (never opened)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def console_workers(worker_env: dict[str, str], logdir: str) -> Iterator[Runtime]:
    """One worker (two processes) on a prefix and queue of its own, running the console
    test flows; yields the producer runtime on them."""
    modules = f"{worker_env['RUNNER_FLOW_MODULES']},tests.console_flows"
    with private_pool(worker_env, logdir, RUNNER_FLOW_MODULES=modules) as (pool, rt, _):
        pool.start(concurrency=2)
        yield rt


@contextlib.contextmanager
def serving(rt: Runtime, token: str | None = None) -> Iterator[str]:
    """The console on ``rt`` at a free loopback port; yields its base URL."""
    app = create_app(rt, token=token, flower_url=FLOWER)
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
