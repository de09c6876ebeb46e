"""Helpers of the distributed tests: private worker pools, history queries, polling."""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import redis

from runner.distributed.app import make_app
from runner.distributed.engine import Runtime
from runner.settings import RunnerSettings
from runner.store.models import Checkpoint, RunStatus
from tests import cli_support
from tests.conftest import WorkerPool, _settings_kwargs


def runner_cli(env: dict[str, str], *args: str, **more: str) -> subprocess.CompletedProcess[str]:
    """``runner ARGS...`` as an operator types it, on the deployment ``env`` names (``more``
    variables on top, e.g. ``COLUMNS="200"`` so a table does not fold); in this process
    (:mod:`tests.cli_support`)."""
    return cli_support.run(*args, env={**env, **more})


def eventually(check: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s: {check}")
        time.sleep(interval)


def recovery_passes(rt: Runtime, n: int = 2, timeout: float = 20.0) -> None:
    """Wait until ``n`` recovery passes of ``rt``'s deployment have begun after this call (so
    ``n - 1`` of them have run through): what recovery would do, it has done by then.

    A pass begins by taking the deployment's recovery lock for 0.9 of an interval; a pass is
    seen when the lock is there anew (its time to live jumped up, or it was gone before).
    """
    lock = rt.store.keys.lock("recover")
    client = redis.Redis.from_url(rt.settings.redis_url)
    seen, last = 0, client.pttl(lock)
    deadline = time.monotonic() + timeout
    try:
        while seen < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{seen} of {n} recovery passes in {timeout}s")
            time.sleep(0.01)
            ttl = client.pttl(lock)  # -2: no lock
            if ttl > 0 and (last < 0 or ttl > last + 20):
                seen += 1
            last = ttl
    finally:
        client.close()


def leases_lapsed(rt: Runtime, *run_ids: str, passes: int = 2, timeout: float = 20.0) -> None:
    """Wait until every lease the runs hold has lapsed or been dropped, then ``passes``
    recovery passes: a step that recovery would send again has been sent by then."""

    def lapsed() -> bool:
        now = time.time()
        return all(expiry < now for run in run_ids for expiry in rt.coord.leases(run).values())

    eventually(lapsed, timeout)
    recovery_passes(rt, passes, timeout)


def paused(handle: Any, timeout: float = 30.0) -> Checkpoint:
    """The latest checkpoint of ``handle``'s run once the run is paused."""

    def latest_paused() -> Checkpoint | None:
        latest = handle.latest()
        return latest if latest.status is RunStatus.PAUSED else None

    return eventually(latest_paused, timeout)


def history(rt: Runtime, run_id: str) -> list[Checkpoint]:
    """Every checkpoint of the run, oldest first."""
    return list(reversed(rt.store.history(run_id, limit=1000)))


def finished(rt: Runtime, run_id: str, step: str | None = None) -> list[Checkpoint]:
    """The run's ``method_execution_finished`` checkpoints (of ``step`` if given)."""
    return [
        c
        for c in history(rt, run_id)
        if c.event == "method_execution_finished" and (step is None or c.step == step)
    ]


def runtime_for(env: dict[str, str]) -> Runtime:
    """A producer runtime on the prefix and queue of ``env``."""
    settings = RunnerSettings(**_settings_kwargs(env))
    return Runtime.create(make_app(settings), settings)


@contextlib.contextmanager
def private_pool(
    worker_env: dict[str, str], logdir: str, **overrides: str
) -> Iterator[tuple[WorkerPool, Runtime, dict[str, str]]]:
    """Workers and a runtime on a prefix and queue of their own (no worker started yet).

    ``overrides`` are more ``RUNNER_*`` variables, e.g. ``RUNNER_LEASE_SECONDS="30"``.
    Every worker of the pool is stopped on exit.
    """
    token = uuid.uuid4().hex[:8]
    env = {
        **worker_env,
        "RUNNER_PREFIX": f"tp-{token}",
        "RUNNER_QUEUE": f"tpq-{token}",
        **overrides,
    }
    pool = WorkerPool(env, logdir)
    rt = runtime_for(env)
    try:
        yield pool, rt, env
    finally:
        pool.discard()
        rt.close()


def events_of(events: list[dict[str, Any]], uuid_: str) -> list[dict[str, Any]]:
    """The Celery events of one task id, in arrival order."""
    return [e for e in events if e.get("uuid") == uuid_]
