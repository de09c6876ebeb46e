"""Producers ride through a failover: ``submit`` waits (``RUNNER_STORE_RETRY``, with backoff)
for a Sentinel group to promote a replica, or a restarting Redis to answer again, then
succeeds; no run is created twice. Only past the bound is a call ``StoreUnavailable``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.distributed.client import RunHandle, submit
from runner.errors import StoreUnavailable
from runner.settings import reset_settings
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider
from tests._dist_support import finished, private_pool
from tests.chaos_support import RedisServer, runtime_on, start_worker
from tests.flows.production import ProdSplit
from tests.flows.reliability import ChaosRouted, expected_effects
from tests.redis_servers import RedisProcess, free_port, redis_server, sentinel
from tests.test_sentinel import _ready, primary_port, sentinel_url

RUNS = 30
RATE = 5.0  # submits a second


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    reset_settings()
    yield
    reset_settings()


@contextlib.contextmanager
def three_node_group(folder: Path) -> Iterator[tuple[RedisProcess, list[RedisProcess]]]:
    """A primary, two replicas in sync with it and three sentinels that see them all."""
    with contextlib.ExitStack() as stack:
        primary = stack.enter_context(redis_server(folder))
        replicas = [
            stack.enter_context(redis_server(folder, "--replicaof", "127.0.0.1", str(primary.port)))
            for _ in range(2)
        ]
        sentinels = [stack.enter_context(sentinel(folder, primary.port)) for _ in range(3)]
        deadline = time.monotonic() + 15
        while not all(_ready(r, sentinels, None) for r in replicas):
            assert time.monotonic() < deadline, "the Sentinel group did not settle"
            time.sleep(0.1)
        yield primary, sentinels


def paced_submits(count: int, submit_one: object, at_each: dict[int, object]) -> list[RunHandle]:
    """``count`` submits at :data:`RATE` a second (late ones go at once); ``at_each[i]`` is
    called right after the ``i``-th (1-based)."""
    handles: list[RunHandle] = []
    began = time.monotonic()
    for i in range(count):
        wait = began + i / RATE - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        sent = time.monotonic()
        handles.append(submit_one(i))  # type: ignore[operator]
        took = time.monotonic() - sent
        if took > 0.5:
            print(f"submit {i + 1} waited {took:.1f}s for Redis")
        if i + 1 in at_each:
            at_each[i + 1]()  # type: ignore[operator]
    return handles


@pytest.mark.slow
def test_thirty_submits_ride_through_a_sentinel_failover(
    worker_env: dict[str, str], tmp_path: Path, fresh_settings: None
) -> None:
    with three_node_group(tmp_path) as (primary, sentinels):
        url = sentinel_url(sentinels)
        with private_pool(worker_env, str(tmp_path), RUNNER_REDIS_URL=url) as (pool, rt, _):
            assert rt.store.wait_replicas == 1
            pool.start(concurrency=2)
            handles = paced_submits(
                RUNS,
                lambda i: submit(ProdSplit, {"pause": 0.05}, rt=rt),
                {10: primary.kill},  # SIGKILL after the 10th submit
            )
            # Every submit was accepted, and the group has a new primary.
            assert len({h.run_id for h in handles}) == RUNS
            assert primary_port(sentinels) != primary.port
            for handle in handles:
                assert handle.result(timeout=90) == ["a", "b", "c"]
            for handle in handles:
                commits = Counter(c.step for c in finished(rt, handle.run_id))
                assert commits == dict.fromkeys(("root", "a", "b", "c", "join"), 1)


@pytest.mark.slow
def test_submits_ride_through_a_plain_redis_restart(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    with RedisServer(tmp_path / "redis") as server:
        env = {
            "RUNNER_REDIS_URL": server.url,
            "RUNNER_PREFIX": f"rt-{uuid.uuid4().hex[:8]}",
            "RUNNER_QUEUE": f"rt-{uuid.uuid4().hex[:8]}",
            "RUNNER_FLOW_MODULES": "tests.flows.reliability",
        }
        rt = runtime_on(env)
        worker = start_worker(env, logs, rt)
        outage: list[float] = []

        def restart() -> None:  # stopped now, started again 3 s later
            threading.Thread(target=lambda: outage.append(server.restart(pause=3.0))).start()
            time.sleep(0.3)  # it is down before the next submit

        try:
            handles = paced_submits(
                20, lambda i: submit(ChaosRouted, {"n": i}, id=f"rt-{i}", rt=rt), {8: restart}
            )
            statuses = [h.wait(timeout=120) for h in handles]
            effects = [sorted(h.latest().state["effects"]) for h in handles]
        finally:
            worker.stop()
            rt.app.close()
            rt.store.close()
    print(f"Redis was down {outage[0]:.2f}s")
    assert outage and outage[0] >= 3.0
    assert statuses == [RunStatus.SUCCEEDED] * 20
    assert effects == [expected_effects(i) for i in range(20)]


def test_past_the_bound_a_dead_redis_is_store_unavailable(
    monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    monkeypatch.setenv("RUNNER_STORE_RETRY", "1.5")
    reset_settings()
    store = RedisProvider(f"redis://127.0.0.1:{free_port()}/0", prefix="nowhere")
    began = time.monotonic()
    with pytest.raises(StoreUnavailable, match="unreachable"):
        store.latest("any")
    assert 1.4 < time.monotonic() - began < 4
    store.close()


@pytest.mark.processes
def test_a_redis_that_comes_back_within_the_bound_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    monkeypatch.setenv("RUNNER_STORE_RETRY", "10")
    reset_settings()
    port = free_port()
    store = RedisProvider(f"redis://127.0.0.1:{port}/0", prefix="later")
    with contextlib.ExitStack() as stack:
        timer = threading.Timer(1.5, lambda: stack.enter_context(redis_server(tmp_path, port=port)))
        timer.start()
        began = time.monotonic()
        assert store.latest("any") is None  # waited for the server, then read
        assert 1.0 < time.monotonic() - began < 8
        timer.join()
    store.close()


@pytest.mark.processes
def test_a_producer_commit_short_of_its_replica_waits_for_one_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    monkeypatch.setenv("RUNNER_REDIS_WAIT_REPLICAS", "1")
    monkeypatch.setenv("RUNNER_REDIS_WAIT_TIMEOUT", "0.3")
    monkeypatch.setenv("RUNNER_STORE_RETRY", "15")
    reset_settings()
    with redis_server(tmp_path) as primary, contextlib.ExitStack() as stack:
        store = RedisProvider(f"redis://127.0.0.1:{primary.port}/0", prefix="wait-producer")
        replica = ("--replicaof", "127.0.0.1", str(primary.port))
        timer = threading.Timer(1.5, lambda: stack.enter_context(redis_server(tmp_path, *replica)))
        timer.start()
        began = time.monotonic()
        done = store.commit(Checkpoint(run_id="r1", event="flow_started", state={"n": 1}))
        assert done.seq == 1 and time.monotonic() - began > 1.0  # waited for the replica
        timer.join()
        store.close()


@pytest.mark.processes
def test_a_commit_whose_node_turned_replica_is_sent_again_to_the_primary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    """The node a commit reached answers its ``WAIT`` as a replica (here a writable replica,
    as a primary demoted by a failover that changed its mind looks for a moment): the commit
    is sent again, idempotently, once the node is a primary with a replica, never reported
    as a Redis error."""
    monkeypatch.setenv("RUNNER_REDIS_WAIT_REPLICAS", "1")
    monkeypatch.setenv("RUNNER_REDIS_WAIT_TIMEOUT", "0.3")
    monkeypatch.setenv("RUNNER_STORE_RETRY", "15")
    reset_settings()
    with (
        redis_server(tmp_path) as other,
        redis_server(
            tmp_path, "--replica-read-only", "no", "--replicaof", "127.0.0.1", str(other.port)
        ) as node,
    ):
        store = RedisProvider(f"redis://127.0.0.1:{node.port}/0", prefix="demoted")

        def swap() -> None:  # the node becomes the primary, the other its replica
            promoted = redis.Redis(port=node.port)
            promoted.execute_command("REPLICAOF", "NO", "ONE")
            redis.Redis(port=other.port).execute_command("REPLICAOF", "127.0.0.1", str(node.port))

        timer = threading.Timer(1.0, swap)
        timer.start()
        began = time.monotonic()
        done = store.commit(Checkpoint(run_id="r1", event="flow_started", state={"n": 1}))
        assert done.seq == 1 and time.monotonic() - began > 0.9
        timer.join()
        assert store.latest("r1") is not None
        store.close()


@pytest.mark.processes
def test_a_commit_on_a_node_that_stays_a_replica_is_unavailable_past_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    monkeypatch.setenv("RUNNER_REDIS_WAIT_REPLICAS", "1")
    monkeypatch.setenv("RUNNER_STORE_RETRY", "0.5")
    reset_settings()
    with (
        redis_server(tmp_path) as other,
        redis_server(
            tmp_path, "--replica-read-only", "no", "--replicaof", "127.0.0.1", str(other.port)
        ) as node,
    ):
        store = RedisProvider(f"redis://127.0.0.1:{node.port}/0", prefix="demoted")
        with pytest.raises(StoreUnavailable, match="became a replica"):
            store.commit(Checkpoint(run_id="r1", event="flow_started", state={"n": 1}))
        store.close()
