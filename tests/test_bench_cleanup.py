"""A benchmark deletes its own broker keys, its queues' version twins included, and nobody
else's (issue 28: ``bench/workers.py`` cleans only its own keys)."""

from __future__ import annotations

import redis
from celery import Celery

from bench._common import delete_queues
from runner.distributed.broker import Layout


def _broker_keys(client: redis.Redis, queue: str, version: str) -> list[str]:
    """What kombu leaves for a flow worker's ``queue`` and its twin of ``version``."""
    keys = []
    for name in (queue, f"{queue}@{version}"):
        keys.append(name)
        keys += [f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}"]
    for key in keys:
        client.rpush(key, "x")
    return keys


def test_a_benchmark_deletes_its_queues_and_their_version_twins_and_nothing_else(
    redis_client: redis.Redis, prefix: str
) -> None:
    ours = _broker_keys(redis_client, f"{prefix}-flows-ours", "0123abcd")
    theirs = _broker_keys(redis_client, f"{prefix}-flows-theirs", "0123abcd")
    redis_client.zadd("_kombu.binding_deadlines", {f"{prefix}-ours.pidbox": 1.0})
    redis_client.zadd("_kombu.binding_deadlines", {f"{prefix}-theirs.pidbox": 1.0})
    try:
        queue_keys = Layout.of(Celery(set_as_current=False)).queue_keys(f"{prefix}-flows-ours")
        delete_queues(redis_client, queue_keys, f"{prefix}-ours")

        assert [k for k in ours if redis_client.exists(k)] == []
        assert [k for k in theirs if not redis_client.exists(k)] == []
        deadlines = {m.decode() for m in redis_client.zrange("_kombu.binding_deadlines", 0, -1)}
        assert f"{prefix}-ours.pidbox" not in deadlines
        assert f"{prefix}-theirs.pidbox" in deadlines
    finally:
        redis_client.delete(*ours, *theirs)
        redis_client.zrem(
            "_kombu.binding_deadlines", f"{prefix}-ours.pidbox", f"{prefix}-theirs.pidbox"
        )
