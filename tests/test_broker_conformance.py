"""The broker conformance suite: what kombu and Celery really do, read back by runner's adapter.

Every kombu or Celery internal runner relies on is in :mod:`runner.distributed.broker`. These
tests let real kombu (in this process and in real workers) write the queues, the ``unacked``
hash and the events, on the Redis broker and on RabbitMQ, and check that the adapter reads
them as it expects, that its start-up checks pass, and that when kombu is changed (a fault
injected into kombu, :mod:`tests.kombu_faults`) runner says so in one WARNING naming kombu's
version, finishes every run, and never publishes a message before its commit.

``make test-latest`` runs this suite (``pytest -m broker``) in a virtualenv with the newest
kombu and Celery releases, so an upgrade that breaks the adapter is found here first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from celery.worker import state as worker_state
from kombu import Connection
from kombu.transport.redis import Channel as RedisChannel

from runner.distributed import broker, handoff
from runner.distributed.client import submit
from runner.distributed.engine import Runtime, task_id
from runner.distributed.processes import WORKER_COMMAND, WorkerProcess
from runner.ids import activation_key_in
from runner.store.models import RunStatus
from tests import kombu_faults
from tests._dist_support import eventually, finished, private_pool, runtime_for
from tests.conftest import capture_events
from tests.flows import dist, reliability
from tests.flows.dist import DistEcho, DistFan, DistGated, executions

pytestmark = pytest.mark.broker

AMQP = "amqp://guest:guest@127.0.0.1:5672//"
ADAPTER_WARNING = "runner's broker adapter"


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch: pytest.MonkeyPatch) -> broker.Checks:
    """This process's broker checks as in a process that just started."""
    checks = broker.Checks()
    monkeypatch.setattr(broker, "checks", checks)
    return checks


def adapter_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The adapter's WARNINGs logged in this process."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "runner.broker" and r.levelno == logging.WARNING
    ]


def logged_warnings(log: Path) -> list[str]:
    """The adapter's WARNING lines in a worker's log."""
    return [line for line in log.read_text().splitlines() if ADAPTER_WARNING in line]


@contextlib.contextmanager
def faulty_worker(
    env: dict[str, str], fault: str, logdir: Path, rt: Runtime, concurrency: int = 2
) -> Iterator[WorkerProcess]:
    """A started worker whose kombu has ``fault`` (:data:`tests.kombu_faults.FAULTS`)."""
    worker = WorkerProcess(
        {**env, "KOMBU_FAULT": fault},
        app_module="tests.kombu_faulty_worker",
        concurrency=concurrency,
        log=logdir / f"faulty-{fault}.log",
        stop_timeout=10,
    )
    worker.start(rt.app)
    try:
        yield worker
    finally:
        worker.stop()


@contextlib.contextmanager
def monitored(url: str) -> Iterator[list[tuple[str, str]]]:
    """Every command Redis runs on ``url``'s database while the block runs, in the order it
    runs them: (``lua`` for a command of a script, else ``tcp``; the command line)."""
    client = redis.Redis.from_url(url)
    db = client.connection_pool.connection_kwargs.get("db", 0)
    seen: list[tuple[str, str]] = []
    started, stop = threading.Event(), threading.Event()
    probe = f"monitor-{uuid.uuid4().hex}"

    def listen() -> None:
        with client.monitor() as monitor:
            started.set()
            for line in monitor.listen():
                if stop.is_set() and probe in line["command"]:
                    return
                if line["db"] == db:
                    seen.append((line["client_type"], line["command"]))

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    started.wait(5)
    client.ping()
    time.sleep(0.2)
    try:
        yield seen
    finally:
        stop.set()
        client.exists(probe)  # the last line the monitor reads
        thread.join(10)
        client.close()


def pushes(commands: list[tuple[str, str]], rt: Runtime, queue: str) -> list[tuple[str, str, bool]]:
    """For each message pushed onto ``queue`` (any of its priority lists): (origin, task id,
    whether its dispatch marker was written before it: whether the commit that made its step
    ready came first)."""
    # MONITOR writes a key's unprintable characters (the priority lists' separator) as \xNN.
    lists = {
        "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in key)
        for key in broker.Layout.of(rt.app).queue_keys(queue)
    }
    marked: set[tuple[str, str]] = set()
    found = []
    for origin, command in commands:
        name, _, rest = command.partition(" ")
        words = rest.split(" ")
        if (written := markers_written(command)) is not None:
            marked.update(written[1])
        elif name.upper() == "LPUSH" and words[0] in lists:
            raw = rest[len(words[0]) + 1 :]
            task = broker.task_id_of(raw) or re.search(r'"id": "([^"]+)"', raw).group(1)  # type: ignore[union-attr]
            found.append((origin, task, step_of(task) in marked))
    return found


def markers_written(command: str) -> tuple[str, list[tuple[str, str]]] | None:
    """For a command writing a run's dispatch markers: its verb (``HSETNX``, the commit that
    makes a step ready; ``HSET``, a re-send re-dating it) and the (run id, activation key)
    of each marker; ``None`` for any other command."""
    name, _, rest = command.partition(" ")
    words = rest.split(" ")
    if name.upper() not in ("HSETNX", "HSET") or not words[0].endswith(":dispatched"):
        return None
    run = words[0][words[0].index("{") + 1 : words[0].index("}")]
    return name.upper(), [(run, field) for field in words[1::2]]


def step_of(task: str) -> tuple[str, str]:
    """A step message's task id as (run id, activation key)."""
    run, epoch, act = task.rsplit(":", 2)
    return run, activation_key_in(int(epoch), act)


def restamped(commands: list[tuple[str, str]]) -> Counter[tuple[str, str]]:
    """(run id, activation key) -> how many times its dispatch marker was re-dated."""
    found: Counter[tuple[str, str]] = Counter()
    for _origin, command in commands:
        written = markers_written(command)
        if written is not None and written[0] == "HSET":
            found.update(written[1])
    return found


# --- the start-up checks on the kombu and Celery installed ----------------------------------


def test_kombu_hands_a_publish_to_the_outbox_as_the_adapter_expects(
    worker_env: dict[str, str], redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime_for(worker_env)
    try:
        assert broker.outbox_ready(rt.app)
        queue = f"conformance-{uuid.uuid4().hex}"
        with rt.app.producer_or_acquire() as producer, broker.recording(producer) as commands:
            assert commands is not None
            rt.app.send_task(
                "conformance.task", task_id=queue, producer=producer, queue=queue, declare=[]
            )
        assert commands[0][:2] == ("lpush", queue)
        assert [name for name, _, _ in commands] == ["lpush", "publish"]  # message, task-sent
        assert broker.task_id_of(commands[0][2]) == queue
        assert not redis_client.exists(queue)  # recorded, not run
    finally:
        rt.app.close()
        rt.store.close()
    assert adapter_warnings(caplog) == []
    assert not list(redis_client.scan_iter(f"{broker.PROBE_PREFIX}*"))


def test_kombu_writes_the_queues_and_unacked_hash_the_view_reads(
    worker_env: dict[str, str], redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime_for(worker_env)
    try:
        assert broker.unacked_view_ready(rt.app)
        view = broker.BrokerView(rt.app, rt.settings.lease_seconds, rt.settings.queue)
        assert view.client is not None
    finally:
        rt.app.close()
        rt.store.close()
    assert adapter_warnings(caplog) == []
    # The probe left nothing: no queue, no unacknowledged message.
    assert not list(redis_client.scan_iter(f"{broker.PROBE_PREFIX}*"))
    entries = redis_client.hvals("unacked")
    assert not [e for e in entries if broker.PROBE_PREFIX.encode() in e]


def kombus_own_create_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """kombu's ``Channel._create_client`` as released, for this test (put back after it)."""
    current = RedisChannel._create_client
    monkeypatch.setattr(
        RedisChannel, "_create_client", getattr(current, "runner_original", current)
    )


def test_a_redis_channel_keeps_the_one_client_it_built_for_its_commands(
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kombus_own_create_client(monkeypatch)
    rt = runtime_for(worker_env)
    queue = f"conformance-{uuid.uuid4().hex}"
    try:
        with rt.app.connection_for_write() as conn:
            channel = conn.default_channel
            # As released, kombu builds a client for each command it runs.
            assert channel._create_client() is not channel._create_client()
            assert broker.one_client_per_channel()
            kept = channel._create_client()
            assert kept is channel._create_client()
            assert kept.connection_pool is channel.pool
            for n in range(3):  # publishes and acknowledgements go through it
                rt.app.send_task(
                    "conformance.task", task_id=f"{queue}-{n}", queue=queue, declare=[]
                )
            assert redis_client.llen(queue) == 3
            message = channel.basic_get(queue, no_ack=False)
            assert message is not None
            message.ack()
            assert redis_client.llen(queue) == 2
            assert channel._create_client() is kept
            # Another factory (the outbox check's refusing one) gets a client of its own.
            channel.Client = broker._refusing(channel.Client)
            assert channel._create_client() is not kept
        # The outbox check, which replaces a channel's factory, still finds kombu as expected.
        assert broker.outbox_ready(rt.app)
    finally:
        redis_client.delete(queue)
        rt.app.close()
        rt.store.close()
    assert adapter_warnings(caplog) == []


def test_a_kombu_that_builds_its_clients_otherwise_keeps_its_own_way_with_one_warning(
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(*kombu_faults.FAULTS["client-with-options"])
    rt = runtime_for(worker_env)
    queue = f"conformance-{uuid.uuid4().hex}"
    try:
        assert not broker.one_client_per_channel()
        assert not broker.one_client_per_channel()  # checked once, said once
        assert RedisChannel._create_client is kombu_faults.FAULTS["client-with-options"][2]
        rt.app.send_task("conformance.task", task_id=queue, queue=queue, declare=[])
        assert redis_client.llen(queue) == 1
    finally:
        redis_client.delete(queue)
        rt.app.close()
        rt.store.close()
    [warning] = adapter_warnings(caplog)
    assert f"kombu {kombu.__version__}" in warning and "_create_client" in warning
    assert "kombu builds a Redis client for each command" in warning


def test_celerys_worker_state_has_what_the_adapter_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert broker.worker_state_readable()
    assert adapter_warnings(caplog) == []


# --- real workers, the Redis broker ---------------------------------------------------------


@pytest.mark.slow
def test_the_outbox_queues_each_step_inside_its_commit_and_flower_sees_it_sent_once(
    worker_env: dict[str, str], tmp_path: Path, redis_url: str
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        assert rt.sends_in_commit
        pool.start()
        with capture_events(rt.app) as events, monitored(redis_url) as commands:
            handles = [submit(DistFan, rt=rt) for _ in range(3)]
            assert [h.result(timeout=60) for h in handles] == [10, 10, 10]
            time.sleep(0.5)  # the last events
        queued = pushes(commands, rt, env["RUNNER_QUEUE"])
        assert len(queued) == 3 * 12  # root, ten branches, gather
        # Every message went onto the queue inside the script of the commit that made its
        # step ready (kombu built it, the commit ran its LPUSH), never before.
        assert {(origin, after) for origin, _, after in queued} == {("lua", True)}
        sent = Counter(e["uuid"] for e in events if e.get("type") == "task-sent")
        assert sent == Counter(task for _, task, _ in queued)  # one task-sent each
        assert logged_warnings(Path(pool.workers[0].log or "")) == []


@pytest.mark.slow
def test_with_the_batch_factory_looked_up_on_the_class_runs_finish_and_none_is_sent_early(
    worker_env: dict[str, str],
    tmp_path: Path,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # kombu changed in this process (the producer) and in the worker alike.
    monkeypatch.setattr(*kombu_faults.FAULTS["batch-factory-on-class"])
    runs = 12
    with private_pool(worker_env, str(tmp_path)) as (_pool, rt, env):
        with faulty_worker(env, "batch-factory-on-class", tmp_path, rt) as worker:
            with monitored(redis_url) as commands:
                handles = [submit(DistFan, rt=rt) for _ in range(runs)]
                assert [h.result(timeout=90) for h in handles] == [10] * runs
            assert handoff.flush(5.0)
            for handle in handles:
                assert rt.coord.leases(handle.run_id) == {}
        queued = pushes(commands, rt, env["RUNNER_QUEUE"])
        assert len({task for _, task, _ in queued}) == runs * 12  # every step queued
        # Each queued once, but for a recovery pass's re-send (on a loaded machine a run can
        # go a lease without a commit, and a message between a worker's pop and its record
        # looks lost): a re-send re-dates the step's marker first, so it is counted.
        again = restamped(commands)
        pushed = Counter(step_of(task) for _, task, _ in queued)
        assert pushed == Counter({step: 1 + again[step] for step in pushed})
        # Sent by kombu itself (the outbox is off), each after its commit.
        assert {(origin, after) for origin, _, after in queued} == {("tcp", True)}
        for log in (logged_warnings(Path(worker.log or "")), adapter_warnings(caplog)):
            assert len(log) == 1, log  # one per process: the worker's pool inherits it
            assert f"kombu {kombu.__version__}" in log[0]
            assert "sent after their commit" in log[0]


@pytest.mark.slow
def test_a_worker_killed_between_taking_and_acknowledging_leaves_what_the_view_reads(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        worker = pool.start(concurrency=1)
        handle = submit(DistGated, rt=rt)
        run, task = handle.run_id, task_id(handle.run_id, 0, "two#1")
        eventually(lambda: executions(redis_client, run, "two"), timeout=30)
        pool.kill(worker)  # SIGKILL while `two` waits on its gate: taken, never acknowledged

        # What kombu wrote for the message the dead worker took, read back by the view.
        view = broker.BrokerView(rt.app, 0.0, rt.settings.queue)
        taken = view.taken_long_ago()
        assert task in taken and time.time() - 60 < taken[task] < time.time()
        assert not view.lost(task, "DistGated.two")  # taken: not lost

        pool.start()  # the lease lapses, recovery re-sends `two`; the gate lets it pass
        redis_client.set(dist.key(run, "gate", "two"), 1)
        assert handle.result(timeout=60) == ["one", "two", "three"]
        assert len(finished(rt, run, "two")) == 1


@pytest.mark.slow
def test_a_worker_holding_a_retry_takes_its_lease_from_celerys_worker_state(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start(concurrency=1)
        handle = submit(reliability.FailsOnce, rt=rt)
        # The retry waits 20-40 s on the worker (Celery's scheduled requests): the worker
        # reads that it holds it and takes the receiving worker's lease for it.
        owners = rt.store.keys.owners(handle.run_id)
        receiving = f"{handoff.SOFT}recv:".encode()
        held = eventually(
            lambda: [t for t in redis_client.hvals(owners) if t.startswith(receiving)], timeout=40
        )
        assert len(held) == 1
        assert len(reliability.executions(redis_client, handle.run_id, "shaky")) == 1


def test_another_unacked_layout_leaves_recovery_to_leases_with_one_warning(
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(*kombu_faults.FAULTS["unacked-as-object"])
    rt = runtime_for(worker_env)
    queue = f"conformance-{uuid.uuid4().hex}"
    try:
        # A message kombu took (and would keep for its visibility timeout) in its new layout.
        rt.app.send_task("conformance.task", task_id=queue, queue=queue, declare=[])
        with rt.app.connection_for_read() as conn:
            message = conn.default_channel.basic_get(queue, no_ack=False)
            assert message is not None
            try:
                for _ in range(2):  # two passes: checked once
                    view = broker.BrokerView(rt.app, 0.0, rt.settings.queue)
                    assert view.client is None
                    assert view.taken_long_ago() == {}
                    assert not view.lost(queue, "conformance.task")
            finally:
                message.ack()
    finally:
        rt.app.close()
        rt.store.close()
    [warning] = adapter_warnings(caplog)
    assert f"kombu {kombu.__version__}" in warning and "unacked" in warning
    assert "recovery goes by leases only" in warning
    assert not list(redis_client.scan_iter(f"{broker.PROBE_PREFIX}*"))


@pytest.mark.slow
def test_a_worker_on_another_unacked_layout_says_so_once_and_runs_steps(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (_pool, rt, env):
        with faulty_worker(env, "unacked-as-object", tmp_path, rt) as worker:
            handles = [submit(DistEcho, {"count": n}, rt=rt) for n in range(4)]
            assert [h.result(timeout=60) for h in handles] == [2 * n for n in range(4)]
            time.sleep(1.5 * rt.settings.recovery_interval)  # a recovery pass or more
        [warning] = logged_warnings(Path(worker.log or ""))
        assert f"kombu {kombu.__version__}" in warning and "leases only" in warning


def test_an_unexpected_command_after_the_check_sends_after_the_commit_from_then_on(
    worker_env: dict[str, str],
    tmp_path: Path,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (_pool, rt, env):
        assert broker.outbox_ready(rt.app)
        # kombu changes under a running process: its batch is handed ``rpush``.
        monkeypatch.setattr(*kombu_faults.FAULTS["rpush"])
        first = submit(DistEcho, {"count": 1}, rt=rt)
        second = submit(DistEcho, {"count": 2}, rt=rt)
        # Both sent after their commit, by kombu: the queue has them, no sender lease is left.
        assert broker.queue_length(rt.app, env["RUNNER_QUEUE"]) == 2
        assert handoff.flush(5.0)
        for handle in (first, second):
            assert set(rt.coord.dispatched(handle.run_id)) == {"hello#1"}
            assert rt.coord.leases(handle.run_id) == {}
    [warning] = adapter_warnings(caplog)
    assert f"kombu {kombu.__version__}" in warning and "rpush" in warning


def test_celerys_worker_state_without_its_sets_gives_no_receiving_lease(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(worker_state, "reserved_requests")
    request = object()
    monkeypatch.setattr(worker_state, "scheduled_requests", {request})
    assert not broker.held(request)
    assert not broker.held(request)
    [warning] = adapter_warnings(caplog)
    assert "reserved_requests" in warning and "receiving worker's lease" in warning


# --- RabbitMQ -------------------------------------------------------------------------------


def _rabbit_down() -> str | None:
    try:
        with Connection(AMQP, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=0)
    except Exception as exc:  # any failure to connect means: no RabbitMQ to test against
        return f"no RabbitMQ at {AMQP}: {type(exc).__name__}: {exc}"
    return None


@pytest.mark.slow
def test_rabbitmq_gives_back_what_a_killed_worker_took_and_the_adapter_reads_nothing(
    worker_env: dict[str, str],
    tmp_path: Path,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = _rabbit_down()
    if down:
        pytest.skip(down)
    with private_pool(worker_env, str(tmp_path), RUNNER_BROKER_URL=AMQP) as (pool, rt, _env):
        try:
            assert not rt.sends_in_commit  # a broker of its own: no outbox
            worker = pool.start(concurrency=1)
            handle = submit(DistGated, rt=rt)
            run = handle.run_id
            eventually(lambda: executions(redis_client, run, "two"), timeout=30)
            pool.kill(worker, signal.SIGKILL)

            # RabbitMQ put the message the dead worker took back in the queue at once.
            def requeued() -> Any:
                with Connection(AMQP) as conn:
                    return conn.default_channel.queue_declare(rt.settings.queue, passive=True)[1]

            assert eventually(requeued, timeout=10) == 1
            view = broker.BrokerView(rt.app, 0.0, rt.settings.queue)
            assert view.client is None and view.taken_long_ago() == {}

            pool.start()
            redis_client.set(dist.key(run, "gate", "two"), 1)
            assert handle.wait(timeout=60) is RunStatus.SUCCEEDED
            assert len(finished(rt, run, "two")) == 1
            assert logged_warnings(Path(pool.workers[-1].log or "")) == []
            assert handoff.flush(5.0)  # the sender's leases of the steps sent after commits
        finally:
            pool.discard()
            with Connection(AMQP) as conn:
                conn.default_channel.queue_delete(rt.settings.queue)
    assert adapter_warnings(caplog) == []


@pytest.mark.processes
def test_the_worker_command_runs_without_celerys_umbrella_command_and_its_plugins(
    worker_env: dict[str, str],
) -> None:
    # `celery -A APP worker` first imports every `celery.commands` plugin (Flower's, a
    # dependency of runner) and `celery amqp`'s prompt_toolkit; the entry runner starts its
    # workers with runs Celery's worker command alone, with the same options.
    env = {**os.environ, **worker_env, "RUNNER_FLOW_MODULES": "tests.flows.results"}

    def imported(*argv: str) -> set[str]:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", *argv, "--help"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert "celery worker [OPTIONS]" in done.stdout and "--concurrency" in done.stdout
        lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
        return {line.rsplit("|", 1)[1].strip() for line in lines[1:]}

    def cli_only(modules: set[str]) -> set[str]:
        return {m.split(".")[0] for m in modules if m.startswith(("flower.", "prompt_toolkit"))}

    umbrella = imported("-m", "celery", "-A", "runner.worker", "worker")
    entry = imported("-m", WORKER_COMMAND, "runner.worker")
    assert cli_only(umbrella) == {"flower", "prompt_toolkit"} and "celery.bin.celery" in umbrella
    assert cli_only(entry) == set() and "celery.bin.celery" not in entry
    assert {"celery.bin.worker", "runner.distributed.worker"} <= entry  # the app was loaded
    # gevent (eventlet too) must be patched in before anything else: Celery's own entry does
    # that, so the worker starts through it (here it stops there: gevent is not installed)
    gevent = subprocess.run(
        [sys.executable, "-m", WORKER_COMMAND, "runner.worker", "-P", "gevent", "--help"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "in _patch_gevent" in gevent.stderr, gevent.stderr[-2000:]
