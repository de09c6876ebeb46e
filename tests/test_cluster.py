"""The store on a real Redis Cluster: the whole conformance suite, and one slot per script.

A module fixture starts three ``redis-server --cluster-enabled yes`` masters on free
loopback ports (data in a temporary directory), joins them with ``redis-cli --cluster
create`` and stops them afterwards (:func:`bench._cluster.local_cluster`, shared with the
benchmark). Every test of :mod:`tests.test_store_conformance` that takes a store runs here
again against a :class:`RedisProvider` built on ``redis.cluster.RedisCluster``; Redis
Cluster refuses a script whose keys span two slots (``CROSSSLOT``), so passing them shows
that every script stays in one slot. Skipped with a reason when ``redis-server`` or
``redis-cli`` is not installed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

import tests.test_store_conformance as conformance
from bench._cluster import cluster_tools, local_cluster
from examples.fanout import FanoutFlow
from examples.linear import LinearFlow
from runner import ids
from runner.distributed.app import make_app
from runner.distributed.client import submit
from runner.errors import StoreError, StoreUnavailable
from runner.settings import RunnerSettings
from runner.store.base import CommitRequest
from runner.store.keys import CLUSTER_SHARDS
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider
from tests._dist_support import private_pool

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not cluster_tools(),
        reason="redis-server and redis-cli are needed to start a local cluster",
    ),
]

MASTERS = 3


@pytest.fixture(scope="module")
def cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """Ports of three running, joined cluster masters; stopped afterwards."""
    with local_cluster(MASTERS, tmp_path_factory.mktemp("cluster")) as ports:
        yield ports


def _cluster_store(ports: list[int], prefix: str, **kwargs: Any) -> RedisProvider:
    client = RedisCluster(host="127.0.0.1", port=ports[0])
    return RedisProvider(client=client, prefix=prefix, **kwargs)


@pytest.fixture
def open_store(cluster_nodes: list[int], prefix: str) -> Iterator[Callable[..., RedisProvider]]:
    """Opens cluster stores on one prefix, closing them afterwards."""
    opened: list[RedisProvider] = []

    def opener(**kwargs: Any) -> RedisProvider:
        store = _cluster_store(cluster_nodes, prefix, **kwargs)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Callable[..., RedisProvider]) -> RedisProvider:
    return open_store(max_checkpoints=0)


@pytest.fixture
def open_coord(open_store: Callable[..., RedisProvider]) -> Callable[..., RedisProvider]:
    return open_store


@pytest.fixture
def coord_store(open_store: Callable[..., RedisProvider]) -> RedisProvider:
    return open_store(max_checkpoints=0)


def _takes_a_store(fn: Any) -> bool:
    return bool(
        {"store", "open_store", "coord_store", "open_coord"} & set(inspect.signature(fn).parameters)
    )


# The conformance suite, collected here again with this module's cluster fixtures.
for _name, _test in vars(conformance).items():
    if _name.startswith("test_") and callable(_test) and _takes_a_store(_test):
        globals()[_name] = _test


def test_a_cluster_store_spreads_runs_over_the_masters_and_finds_them_all(store):
    runs = [ids.run_id() for _ in range(40)]
    made = {run: store.commit(Checkpoint(run_id=run, event="flow_started")) for run in runs}

    slots = {store.client.keyslot(store.keys.meta(run)) for run in runs}
    nodes = {store.client.get_node_from_key(store.keys.meta(run)).name for run in runs}
    assert len(slots) > 1 and len(nodes) == MASTERS
    assert {info.run_id for info in store.runs(limit=100)} == set(runs)
    for first in made.values():
        assert store.get(first.id) == first
    assert store.keys.shards == CLUSTER_SHARDS


def test_the_cluster_url_scheme_builds_a_cluster_client(cluster_nodes, prefix):
    store = RedisProvider(f"redis+cluster://127.0.0.1:{cluster_nodes[1]}", prefix=prefix)
    try:
        assert isinstance(store.client, RedisCluster)
        first = store.commit(Checkpoint(run_id=ids.run_id(), event="flow_started"))
        assert store.latest(first.run_id) == first
        assert "redis+cluster://127.0.0.1" in store.url
    finally:
        store.close()


def test_flows_run_on_workers_with_their_checkpoints_on_the_cluster(
    cluster_nodes, worker_env, redis_url, tmp_path
):
    # The broker stays a plain Redis (kombu has no Cluster transport); checkpoints, markers,
    # leases and stop notices go to the cluster.
    overrides = {
        "RUNNER_REDIS_URL": f"redis+cluster://127.0.0.1:{cluster_nodes[0]}",
        "RUNNER_BROKER_URL": redis_url,
    }
    with private_pool(worker_env, str(tmp_path), **overrides) as (pool, rt, _):
        assert isinstance(rt.store.client, RedisCluster)
        assert not rt.sends_in_commit  # the steps are sent after their commit, to the broker
        pool.start()
        linear = submit(LinearFlow, rt=rt)
        fanout = submit(FanoutFlow, rt=rt)
        assert linear.result(timeout=60) == 19
        assert fanout.wait(timeout=60) is RunStatus.SUCCEEDED
        assert linear.latest().state["counter"] == 20
        assert fanout.latest().state["summary"] == "10 notes"
        # flow_started, one per step, and the run's closing flow_finished
        assert len(rt.store.history(linear.run_id, limit=100)) == 22
        for handle in (linear, fanout):
            assert rt.coord.leases(handle.run_id) == {}
            assert rt.coord.dispatched(handle.run_id) == {}
            assert handle.run_id not in rt.coord.active_runs()


def test_a_commit_on_a_cluster_takes_no_outbox_and_writes_nothing(store):
    first = store.commit(Checkpoint(run_id="r", event="flow_started"))
    with pytest.raises(StoreError, match="Cluster"):
        store.commit_request(
            CommitRequest(
                Checkpoint(run_id="r", event="x"),
                expected_seq=first.seq,
                outbox=[("lpush", "queue", "message")],
            )
        )
    assert store.latest("r") == first


def test_checkpoints_on_a_cluster_without_a_broker_of_their_own_are_refused(cluster_nodes):
    url = f"redis+cluster://127.0.0.1:{cluster_nodes[0]}"
    with pytest.raises(StoreUnavailable, match="RUNNER_BROKER_URL"):
        make_app(RunnerSettings(redis_url=url))


def test_retention_and_archive_work_on_a_cluster(store, tmp_path):
    # Each retention script touches one run's keys and its shard's index entries: Cluster
    # would refuse one spanning two slots (CROSSSLOT).
    from runner import CheckpointConfig
    from runner.distributed.retention import close_archives, collect
    from runner.store.archive import open_archive, restore_run
    from tests.flows.retained import Report

    runs = []
    for _ in range(6):
        flow = Report(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))
        flow.kickoff()
        runs.append(str(flow.state.id))
    assert len({store.keys.shard(run) for run in runs}) > 1
    assert store.pin_run(runs[0], True)
    where = str(tmp_path / "archive.db")
    settings = RunnerSettings(prefix=store.keys.prefix, retention="succeeded=0s", archive=where)
    try:
        done = collect(store, settings)
    finally:
        close_archives()
    assert sorted(done.expired) == sorted(runs[1:]) == sorted(done.archived)
    assert store.run(runs[0]) is not None and all(store.run(r) is None for r in runs[1:])
    archive = open_archive(where)
    try:
        assert restore_run(archive, store, runs[1]).status is RunStatus.SUCCEEDED
    finally:
        archive.close()
    assert store.latest(runs[1]).status is RunStatus.SUCCEEDED
