"""Redis Sentinel: ``redis+sentinel://`` for store and broker, failover without a lost commit.

On loopback: a primary, a replica and three sentinels (``redis-server --sentinel``), all
private to the test. The store follows the group's primary through redis-py's Sentinel, the
broker through kombu's ``sentinel://`` transport on the same group, and every commit waits
for one replica (``WAIT``) so a checkpoint a step reported survives the primary's death.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.distributed import broker
from runner.distributed.client import submit
from runner.embedded import ping
from runner.errors import StoreUnavailable
from runner.settings import reset_settings
from runner.store.connection import BadRedisSettings, SentinelGroup
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider
from tests._dist_support import finished, private_pool
from tests.flows.production import ProdSplit
from tests.redis_servers import (
    SERVICE,
    RedisProcess,
    free_port,
    redis_server,
    sentinel,
    short_patience,
)

pytestmark = pytest.mark.processes  # redis-servers and sentinels of its own


@contextlib.contextmanager
def sentinel_group(
    folder: Path, password: str | None = None
) -> Iterator[tuple[RedisProcess, list[RedisProcess]]]:
    """A primary, a replica in sync with it, and three sentinels that all see both; with a
    ``password``, the data nodes require it (the sentinels themselves do not)."""
    auth = ["--requirepass", password, "--masterauth", password] if password else []
    with contextlib.ExitStack() as stack:
        primary = stack.enter_context(redis_server(folder, *auth))
        replica = stack.enter_context(
            redis_server(folder, *auth, "--replicaof", "127.0.0.1", str(primary.port))
        )
        sentinels = [
            stack.enter_context(sentinel(folder, primary.port, password=password)) for _ in range(3)
        ]
        deadline = time.monotonic() + 15
        while not _ready(replica, sentinels, password):
            assert time.monotonic() < deadline, "the Sentinel group did not settle"
            time.sleep(0.1)
        yield primary, sentinels


def _ready(replica: RedisProcess, sentinels: list[RedisProcess], password: str | None) -> bool:
    node = redis.Redis(port=replica.port, password=password)
    if node.info("replication")["master_link_status"] != "up":
        return False
    for node in sentinels:
        master = redis.Redis(port=node.port).sentinel_master(SERVICE)
        if master["num-slaves"] < 1 or master["num-other-sentinels"] < 2:
            return False
    return True


def sentinel_url(sentinels: list[RedisProcess]) -> str:
    hosts = ",".join(f"127.0.0.1:{node.port}" for node in sentinels)
    return f"redis+sentinel://{hosts}/{SERVICE}/0"


def primary_port(sentinels: list[RedisProcess]) -> int:
    """The port of the primary the sentinels name now."""
    _host, port = redis.Redis(port=sentinels[0].port).sentinel_get_master_addr_by_name(SERVICE)
    return int(port)


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    reset_settings()
    yield
    reset_settings()


def test_a_commit_waits_for_a_replica_and_is_refused_without_one_until_one_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    monkeypatch.setenv("RUNNER_REDIS_WAIT_REPLICAS", "1")
    monkeypatch.setenv("RUNNER_REDIS_WAIT_TIMEOUT", "0.3")
    reset_settings()
    with redis_server(tmp_path) as primary:
        with short_patience(0):  # a producer would wait RUNNER_STORE_RETRY for a replica
            store = RedisProvider(f"redis://127.0.0.1:{primary.port}/0", prefix="wait-test")
        first = Checkpoint(
            run_id="r1",
            event="method_execution_finished",
            step="root",
            activation="root#1",
            attempt="attempt-1",
            state={"n": 1},
        )
        with pytest.raises(StoreUnavailable, match="reached 0 of 1 Redis replicas"):
            store.commit(first)  # written on the primary, but no replica confirms it
        with redis_server(tmp_path, "--replicaof", "127.0.0.1", str(primary.port)):
            deadline = time.monotonic() + 10
            while True:  # the same commit again (idempotent) until the replica confirms it
                try:
                    done = store.commit(first)
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline
            # Committed once, however often it was sent: the step's activation is its key.
            assert done.seq == 1 and [c.id for c in store.history("r1")] == [first.id]
        store.close()


def test_a_bad_sentinel_url_or_a_group_without_primary_is_one_clear_line(
    fresh_settings: None,
) -> None:
    with pytest.raises(BadRedisSettings, match="SERVICE/DB"):
        ping("redis+sentinel://127.0.0.1:26379")  # no service named
    with pytest.raises(StoreUnavailable) as caught:
        ping(f"redis+sentinel://127.0.0.1:{free_port()}/{SERVICE}/0")
    assert str(caught.value).endswith(f"no sentinel answered with a primary for {SERVICE!r}")


@pytest.mark.slow
def test_a_stream_of_runs_survives_the_primary_dying_mid_run(
    worker_env: dict[str, str], tmp_path: Path, fresh_settings: None
) -> None:
    with sentinel_group(tmp_path) as (primary, sentinels), contextlib.ExitStack() as stack:
        url = sentinel_url(sentinels)
        with private_pool(worker_env, str(tmp_path), RUNNER_REDIS_URL=url) as (pool, rt, _):
            assert rt.app.conf.broker_url.startswith("sentinel://127.0.0.1:")
            assert rt.store.wait_replicas == 1  # on by default with Sentinel
            # kombu may reach another primary than the store's commit script during a
            # failover: steps are sent after their commit, never inside it.
            assert not rt.sends_in_commit
            pool.start(concurrency=2)
            handles = [submit(ProdSplit, {"pause": 0.15}, rt=rt) for _ in range(12)]
            time.sleep(2.0)  # some runs done, others mid-step
            running = [h for h in handles if h.status() is RunStatus.RUNNING]
            primary.kill()
            print(f"primary killed with {len(running)} of {len(handles)} runs running")
            assert running
            deadline = time.monotonic() + 20
            while primary_port(sentinels) == primary.port:
                assert time.monotonic() < deadline, "Sentinel did not promote the replica"
                time.sleep(0.1)
            # The dead primary's machine comes back as a replica of the new one, so commits
            # have a replica to wait for again.
            stack.enter_context(
                redis_server(
                    tmp_path,
                    *("--replicaof", "127.0.0.1", str(primary_port(sentinels))),
                    port=primary.port,
                )
            )
            for handle in handles:
                assert handle.result(timeout=40) == ["a", "b", "c"]
            for handle in handles:
                commits = Counter(c.step for c in finished(rt, handle.run_id))
                assert commits == dict.fromkeys(("root", "a", "b", "c", "join"), 1)


@pytest.mark.slow
def test_a_step_message_a_failover_lost_is_sent_again_by_recovery(
    worker_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_settings: None,
) -> None:
    # A group whose nodes require a password, given as a setting (not in the URL).
    secret = {"RUNNER_REDIS_PASSWORD": "s3cret-sentinel-group"}
    with sentinel_group(tmp_path, secret["RUNNER_REDIS_PASSWORD"]) as (_primary, sentinels):
        url = sentinel_url(sentinels)
        monkeypatch.setenv("RUNNER_REDIS_PASSWORD", secret["RUNNER_REDIS_PASSWORD"])
        reset_settings()
        with private_pool(worker_env, str(tmp_path), RUNNER_REDIS_URL=url, **secret) as (
            pool,
            rt,
            _,
        ):
            handle = submit(ProdSplit, rt=rt)  # committed (and replicated), then queued
            queue = broker.Layout.of(rt.app).queue_keys(rt.settings.queue)
            client = broker.broker_client(rt.app)
            assert broker.queue_length(rt.app, rt.settings.queue) == 1
            # What a failover loses: a message pushed to the old primary that never reached
            # the replica Sentinel promotes. Its step stays marked sent, with no lease.
            client.delete(*queue)
            pool.start()
            # Recovery reads kombu's queues and unacked messages on the group's primary.
            assert handle.result(timeout=30) == ["a", "b", "c"]
            commits = Counter(c.step for c in finished(rt, handle.run_id))
            assert commits == dict.fromkeys(("root", "a", "b", "c", "join"), 1)
        # The password may be in the URL instead; without either, the group's primary refuses.
        monkeypatch.delenv("RUNNER_REDIS_PASSWORD")
        reset_settings()
        with pytest.raises(StoreUnavailable, match="authenticated"):
            ping(url)
        ping(url.replace("://", f"://:{secret['RUNNER_REDIS_PASSWORD']}@", 1))


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_the_compose_sentinel_profile_resolves_to_a_group_the_workers_reach() -> None:
    root = Path(__file__).resolve().parents[1]
    secrets = {"REDIS_PASSWORD": "0123abcd", "FLOWER_BASIC_AUTH": "a:b", "RUNNER_UI_TOKEN": "t"}
    resolved = subprocess.run(
        ["docker-compose", "--project-directory", str(root), "-f", "compose.yaml", "config"],
        cwd=root,
        env={**os.environ, **secrets},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    body = ("\n" + resolved).split("\nservices:\n", 1)[1].split("\nvolumes:\n", 1)[0]
    blocks = re.split(r"^  (\w[\w-]*):\n", "\n" + body, flags=re.M)[1:]
    services = dict(zip(blocks[::2], blocks[1::2], strict=True))
    members = ("redis-replica", "sentinel-1", "sentinel-2", "sentinel-3", "worker-ha")
    for name in members:
        assert "- sentinel" in services[name], name  # in the profile only
    assert "--replicaof redis 6379" in services["redis-replica"]
    url = re.search(r"RUNNER_REDIS_URL: (\S+)", services["worker-ha"])
    assert url is not None
    group = SentinelGroup.parse(url.group(1))
    assert group.service == "runner-primary" and len(group.sentinels) == 3
    assert {host for host, _ in group.sentinels} == {"sentinel-1", "sentinel-2", "sentinel-3"}
    # The password reaches the workers as a setting, never inside the URL.
    assert "0123abcd" not in url.group(1)
    assert "RUNNER_REDIS_PASSWORD: 0123abcd" in services["worker-ha"]
