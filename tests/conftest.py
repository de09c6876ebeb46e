"""Fixtures shared by every test: a real Redis on a database of the tests' own.

The Redis is chosen once per session: ``RUNNER_TEST_REDIS_URL`` if set, else the local server on
127.0.0.1:6379 if it answers, else a private :class:`~runner.embedded.EmbeddedRedis`. Tests use
database ``RUNNER_TEST_DB`` (default 11), never 0; under pytest-xdist worker ``gwN`` uses
database ``RUNNER_TEST_DB + N`` (``make test``: 10-14, five processes from 10), so the workers'
default prefixes, broker queues, Celery events and kombu's ``unacked`` hash never meet. A
database is flushed when a session (or xdist worker) starts, unless another session is still
using it (sessions register in :data:`SESSIONS_KEY` of that database). Code under test finds it
through ``RUNNER_REDIS_URL``; other ``RUNNER_*`` variables of the developer's shell are hidden,
so tests see the documented defaults.

Tiers (markers, README "Running the tests"): a test that uses the session's Celery workers
(``worker_pool``, ``rt``, ``cli``, ``task_events``) is marked ``workers`` here; one that starts
workers of its own or any other process is marked ``workers`` or ``processes`` in its module, and
:func:`_guard_processes` fails an unmarked test that starts a process, so ``make check``
(``-m "not workers and not processes and not slow and not chaos"``) stays free of them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from runner.distributed.processes import WorkerProcess
from runner.embedded import EmbeddedRedis, ping
from runner.errors import StoreUnavailable
from runner.settings import reset_settings

LOCAL_REDIS_URL = "redis://127.0.0.1:6379"
DEFAULT_TEST_DB = 11
SESSIONS_KEY = "runner-tests:sessions"
SESSION_TTL = 4 * 3600  # a crashed session stops others flushing for at most this long

# KEYS[1] sessions zset; ARGV[1] session id, ARGV[2] ttl. Drops expired sessions, flushes the
# database if no other session is live, then registers this one: one step, so no session can
# register between another's check and its flush.
_CLAIM_DB = """
local now = tonumber(redis.call('TIME')[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local flushed = 0
if redis.call('ZCARD', KEYS[1]) == 0 then
    redis.call('FLUSHDB')
    flushed = 1
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return flushed
"""


# Tests stop `runner dev`, the quick start and embedded servers with SIGINT, as Ctrl-C in a
# terminal would. A shell without job control starts a background command (`make test &`,
# `nohup make test &`) with SIGINT ignored, and every process the suite starts would inherit
# that: none would stop. A handler, unlike SIG_IGN, is not inherited across exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# --- Redis ----------------------------------------------------------------------------------


def url_with_db(url: str, db: int) -> str:
    """``url`` pointed at database ``db``, unless it already names one."""
    parts = urlsplit(url)
    if parts.scheme == "unix" or parts.path.strip("/"):
        return url
    return urlunsplit(parts._replace(path=f"/{db}"))


def _choose_redis(stack: contextlib.ExitStack, db: int) -> str:
    explicit = os.environ.get("RUNNER_TEST_REDIS_URL")
    if explicit:
        url = url_with_db(explicit, db)
        ping(url)
        return url
    with contextlib.suppress(StoreUnavailable):
        url = url_with_db(LOCAL_REDIS_URL, db)
        ping(url, timeout=0.5)
        return url
    server = stack.enter_context(EmbeddedRedis())
    return f"redis://127.0.0.1:{server.port}/{db}"


def xdist_worker_index() -> int:
    """``N`` on pytest-xdist's worker ``gwN``; 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


MAX_DB = 15
"""The highest database of a Redis with the default ``databases 16``."""


def session_db() -> int:
    """This session's database: ``RUNNER_TEST_DB`` (default 11) plus the xdist worker index."""
    base = int(os.environ.get("RUNNER_TEST_DB", DEFAULT_TEST_DB))
    db = base + xdist_worker_index()
    if db > MAX_DB:
        pytest.exit(
            f"xdist worker {os.environ.get('PYTEST_XDIST_WORKER')} would use Redis DB {db} "
            f"(RUNNER_TEST_DB={base} + its index); use fewer workers (-n) or a lower "
            "RUNNER_TEST_DB (never 0)",
            4,
        )
    return db


@pytest.fixture(scope="session", autouse=True)
def redis_url() -> Iterator[str]:
    """URL of the test database, flushed at session start and exported as RUNNER_REDIS_URL."""
    db = session_db()
    with contextlib.ExitStack() as stack:
        with processes_allowed():  # an EmbeddedRedis when no Redis answers
            url = _choose_redis(stack, db)
        client = stack.enter_context(contextlib.closing(redis.Redis.from_url(url)))
        if client.connection_pool.connection_kwargs.get("db", 0) == 0:
            pytest.exit(f"refusing to run tests on Redis DB 0 ({url}); use another DB", 4)
        session = uuid.uuid4().hex
        client.eval(_CLAIM_DB, 1, SESSIONS_KEY, session, SESSION_TTL)
        stack.callback(client.zrem, SESSIONS_KEY, session)
        stack.callback(reset_settings)  # runs after the environment is restored
        env = stack.enter_context(pytest.MonkeyPatch.context())
        for name in list(os.environ):
            if name.startswith("RUNNER_") and not name.startswith("RUNNER_TEST_"):
                env.delenv(name)
        # Output goes to a pipe, as in a serial run: xdist's workers inherit COLUMNS=80,
        # which would make the CLI's tables wrap at 80 columns instead of its pipe width.
        for name in ("COLUMNS", "LINES"):
            env.delenv(name, raising=False)
        env.setenv("RUNNER_REDIS_URL", url)
        reset_settings()
        yield url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client (bytes responses) on the test database, closed after the test."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


# --- keys -----------------------------------------------------------------------------------


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses, e.g. ``t-1a2b3c4d``."""
    return f"t-{uuid.uuid4().hex[:8]}"


# --- Celery workers -------------------------------------------------------------------------

WORKER_MODULES = ("examples.fanout", "examples.linear")


def flow_modules() -> str:
    """Every module the test workers import: the examples and ``tests/flows/*.py``."""
    here = os.path.dirname(__file__)
    found = list(WORKER_MODULES)
    examples = os.path.join(os.path.dirname(here), "examples")
    for folder, package in ((examples, "examples"), (os.path.join(here, "flows"), "tests.flows")):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py") and not name.startswith("_"):
                module = f"{package}.{name[:-3]}"
                if module not in found and module != "examples.demo":
                    found.append(module)
    return ",".join(found)


@pytest.fixture(scope="session")
def worker_env(redis_url: str) -> dict[str, str]:
    """Environment of the test workers and their producer: own prefix and queue, short leases."""
    session = uuid.uuid4().hex[:8]
    return {
        "RUNNER_REDIS_URL": redis_url,
        "RUNNER_PREFIX": f"tw-{session}",
        "RUNNER_QUEUE": f"tq-{session}",
        "RUNNER_FLOW_MODULES": flow_modules(),
        "RUNNER_LEASE_SECONDS": "2",
        "RUNNER_RECOVERY_INTERVAL": "0.5",
        "RUNNER_RETRY_BACKOFF": "0.05",
    }


class WorkerPool:
    """Subprocess Celery workers (``celery -A workers worker``) that tests can kill."""

    def __init__(self, env: dict[str, str], logdir: str) -> None:
        self.env = dict(env)
        self.logdir = logdir
        self.workers: list[WorkerProcess] = []

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        """The worker processes started so far."""
        return [w.proc for w in self.workers if w.proc is not None]

    def start(self, concurrency: int = 2, pool: str = "prefork") -> subprocess.Popen[bytes]:
        """Start one worker and wait until it answers a ping."""
        (proc,) = self.start_many(1, concurrency=concurrency, pool=pool)
        return proc

    def start_many(
        self, count: int, concurrency: int = 2, pool: str = "prefork"
    ) -> list[subprocess.Popen[bytes]]:
        """Start ``count`` workers at once, then wait until each answers a ping (one start-up's
        wait for all of them)."""
        from runner.distributed.app import make_app
        from runner.settings import RunnerSettings

        started = []
        for _ in range(count):
            log = os.path.join(self.logdir, f"worker-{len(self.workers)}.log")
            worker = WorkerProcess(
                self.env, concurrency=concurrency, pool=pool, log=log, stop_timeout=10
            )
            self.workers.append(worker)
            worker.start()
            started.append(worker)
        app = make_app(RunnerSettings(**_settings_kwargs({**os.environ, **self.env})))
        try:
            for worker in started:
                # A start-up takes 2-3 s; 60 s leaves room for a machine running many suites.
                worker.wait_ready(app, timeout=60)
        finally:
            app.close()
        return [worker.proc for worker in started if worker.proc is not None]

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Kill a worker and its pool processes at once (a crash)."""
        next(w for w in self.workers if w.proc is proc).kill(sig)

    def discard(self) -> None:
        """Kill every worker and its pool processes at once, for a pool whose test is over: an
        idle prefork worker's warm shutdown takes about 2 s (its event loop notices SIGTERM at
        its next poll, then its pool processes at theirs), which a teardown need not wait."""
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.kill()

    def stop_all(self) -> None:
        """Stop every worker still running (SIGTERM to all, then wait; SIGKILL leftovers)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for worker in self.workers:
            worker.stop()


def _settings_kwargs(env: dict[str, str]) -> dict[str, Any]:
    fields = {
        "redis_url",
        "prefix",
        "queue",
        "flow_modules",
        "lease_seconds",
        "recovery_interval",
        "retry_backoff",
        "broker_url",
    }
    out: dict[str, Any] = {}
    for name in fields:
        value = env.get(f"RUNNER_{name.upper()}")
        if value is not None:
            out[name] = value.split(",") if name == "flow_modules" else value
    return out


@pytest.fixture(scope="session")
def worker_pool(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    """A pool of subprocess workers; one is started for the session."""
    pool = WorkerPool(worker_env, str(tmp_path_factory.mktemp("workers")))
    pool.start()
    yield pool
    pool.discard()


@pytest.fixture
def rt(worker_env: dict[str, str], worker_pool: WorkerPool) -> Iterator[Any]:
    """The producer runtime of the test workers (their prefix and queue), made current.

    At teardown it cancels (stopping their attempts) the runs the test left running: the
    session's workers are shared by the file's later tests, and a step crawling on in their
    pool would slow those down or take the pool process a test needs (two steps meeting at
    a barrier)."""
    from runner.distributed.app import make_app
    from runner.distributed.cancel import cancel_run
    from runner.distributed.client import set_runtime
    from runner.distributed.engine import Runtime
    from runner.errors import RunnerError
    from runner.settings import RunnerSettings

    settings = RunnerSettings(**_settings_kwargs(worker_env))
    runtime = Runtime.create(make_app(settings), settings)
    set_runtime(runtime)
    before = set(runtime.coord.active_runs())
    yield runtime
    for run_id in set(runtime.coord.active_runs()) - before:
        with contextlib.suppress(RunnerError):
            cancel_run(runtime, run_id, "left running by a test")
    set_runtime(None)
    runtime.close()


@contextlib.contextmanager
def capture_events(app: Any) -> Iterator[list[dict[str, Any]]]:
    """Every Celery event on ``app``'s broker while the block runs (what Flower consumes)."""
    import threading
    import time

    seen: list[dict[str, Any]] = []
    probe = f"probe-{uuid.uuid4().hex}"
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": seen.append})
        thread = threading.Thread(
            target=lambda: receiver.capture(limit=None, timeout=None, wakeup=False), daemon=True
        )
        thread.start()
        # Subscribed once our own probe event comes back.
        deadline = time.monotonic() + 20
        with app.events.default_dispatcher() as dispatcher:
            while not any(e.get("uuid") == probe for e in seen):
                assert time.monotonic() < deadline, "the event receiver never subscribed"
                dispatcher.send("task-probe", uuid=probe)
                time.sleep(0.2)
        try:
            yield seen
        finally:
            receiver.should_stop = True
            thread.join(timeout=5)


@pytest.fixture
def task_events(rt: Any) -> Iterator[list[dict[str, Any]]]:
    """Every Celery event on the test workers' broker while the test runs."""
    with capture_events(rt.app) as seen:
        yield seen


# --- tiers: markers by what a test needs ---------------------------------------------------

WORKER_FIXTURES = frozenset({"worker_pool", "rt", "celery_session_worker"})
"""Fixtures that start Celery workers: a test using one (even through ``rt`` or ``cli``) is
marked ``workers``."""

# The files that take longest (20 s or more each on 2 cores under xdist), run first so that
# no xdist worker starts one of them when the others are nearly done: with
# --dist loadfile --no-loadscope-reorder (make test), xdist hands out whole files in collection
# order. In `--durations=0` order as measured 2026-11-28 (setup, call and teardown summed per
# file); a file missing here runs in its alphabetical place.
HEAVY_FIRST = (
    "test_dev.py",
    "test_fleet.py",
    "test_wheel.py",
    "test_producer_ride_through.py",
    "test_dev_worker.py",
    "test_archive_sealed.py",
    "test_deployments.py",
    "test_conversations_workers.py",
    "test_recovery_defaults.py",
    "test_backlog.py",
    "test_chaos.py",
    "test_limits.py",
    "test_observability.py",
    "test_redis_restart.py",
    "test_broker_conformance.py",
    "test_encryption.py",
    "test_declared_flows.py",
    "test_partition.py",
    "test_conversations_cli.py",
    "test_fork_map.py",
    "test_rolling_upgrade.py",
    "test_sentinel.py",
    "test_conversations_console.py",
    "test_cli_errors.py",
    "test_time_limits.py",
    "test_sentinel_tls.py",
    "test_tls.py",
    "test_rabbitmq.py",
    "test_priorities.py",
    "test_console_browser.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that use the session's workers; put the heaviest files first."""
    for item in items:
        if WORKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.workers)
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}

    def order(indexed: tuple[int, pytest.Item]) -> tuple[int, int]:
        index, item = indexed
        return (rank.get(item.path.name, len(rank)), index)

    items[:] = [item for _, item in sorted(enumerate(items), key=order)]


OUT_OF_CHECK = ("workers", "processes", "slow", "chaos")
"""The markers `make check` leaves out (its -m); a test with one of them may start processes."""

_allowed = [0]  # > 0 while a process may start whatever test is running
_current: list[pytest.Item | None] = [None]


@contextlib.contextmanager
def processes_allowed() -> Iterator[None]:
    """Let the block start processes, whatever the running test's markers."""
    _allowed[0] += 1
    try:
        yield
    finally:
        _allowed[0] -= 1


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Fail a test of the fast tier that starts a process (a Python audit hook: it sees every
    ``subprocess``/``os.system``/``os.posix_spawn`` call of this process)."""
    if event not in ("subprocess.Popen", "os.posix_spawn", "os.system"):
        return
    item = _current[0]
    if item is None or _allowed[0] or any(item.get_closest_marker(m) for m in OUT_OF_CHECK):
        return
    command = args[1] if event == "subprocess.Popen" else args[0]
    raise RuntimeError(
        f"{item.nodeid} starts a process ({str(command)[:100]}) but is not marked `processes`"
        " (or `workers`, `slow`): mark it so that `make check`, the fast tier, leaves it out"
    )


sys.addaudithook(_audit)


@contextlib.contextmanager
def _running(item: pytest.Item) -> Iterator[None]:
    _current[0] = item
    try:
        yield
    finally:
        _current[0] = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    """Note the test being set up for :func:`_audit`. Not teardown: the last test of a session
    (of any tier) tears the session's workers down."""
    with _running(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Note the running test for :func:`_audit`."""
    with _running(item):
        return (yield)
