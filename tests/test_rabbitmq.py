"""Steps over RabbitMQ (``RUNNER_BROKER_URL=amqp://...``), checkpoints in Redis.

Runs against the RabbitMQ on 127.0.0.1:5672 (guest/guest) when one answers, and is skipped
with the reason otherwise. Each test has workers, a prefix and so a queue of its own; the
queue is deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from runner.distributed.client import submit
from runner.distributed.engine import Runtime
from runner.distributed.processes import children
from tests._dist_support import eventually, finished, private_pool
from tests.conftest import WorkerPool
from tests.flows import dist
from tests.flows.dist import DistFan, DistSleeper, executions

BROKER = os.environ.get("RUNNER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _rabbit_down() -> str | None:
    try:
        with Connection(BROKER, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=0)
    except Exception as exc:  # any failure to connect means: no RabbitMQ to test against
        return f"no RabbitMQ at {BROKER}: {type(exc).__name__}: {exc}"
    return None


DOWN = _rabbit_down()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(DOWN is not None, reason=DOWN or "")]


@contextlib.contextmanager
def amqp_pool(
    worker_env: dict[str, str], logdir: Path, **overrides: str
) -> Iterator[tuple[WorkerPool, Runtime]]:
    """A private pool whose steps travel over RabbitMQ; its queue is deleted on exit."""
    with private_pool(worker_env, str(logdir), RUNNER_BROKER_URL=BROKER, **overrides) as (
        pool,
        rt,
        _,
    ):
        try:
            yield pool, rt
        finally:
            pool.discard()
            with Connection(BROKER) as conn:
                conn.default_channel.queue_delete(rt.settings.queue)


def test_steps_travel_over_rabbitmq_while_checkpoints_stay_in_redis(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with amqp_pool(worker_env, tmp_path) as (pool, rt):
        assert rt.app.conf.broker_url.startswith("amqp://")
        assert rt.app.conf.result_backend == worker_env["RUNNER_REDIS_URL"]
        pool.start()
        handle = submit(DistFan, rt=rt)
        assert handle.result(timeout=60) == 10
        assert len(finished(rt, handle.run_id)) == 12  # root, ten branches, gather
        with Connection(BROKER) as conn:  # the deployment's queue is RabbitMQ's
            _name, messages, consumers = conn.default_channel.queue_declare(
                rt.settings.queue, passive=True
            )
            assert messages == 0 and consumers >= 1
        # Redis never served as this deployment's broker: kombu's Redis transport would
        # have left its queue binding there.
        assert not list(redis_client.scan_iter(f"_kombu.binding.*{rt.settings.prefix}*"))


def test_a_worker_killed_mid_step_loses_nothing_over_rabbitmq(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with amqp_pool(worker_env, tmp_path) as (pool, rt):
        worker = pool.start()
        handle = submit(DistSleeper, rt=rt)
        run = handle.run_id
        raw = eventually(lambda: redis_client.get(dist.key(run, "nap-pid")), timeout=30)
        assert int(raw) in children(worker.pid)
        pool.kill(worker)  # SIGKILL, parent and pool children, mid-`nap`

        pool.start()  # RabbitMQ requeues the unacked step at once; recovery backs it up
        assert handle.result(timeout=60) == ["first", "nap", "last"]
        assert executions(redis_client, run, "nap") >= 2
        assert len(finished(rt, run, "nap")) == 1  # committed exactly once
        assert executions(redis_client, run, "first") == executions(redis_client, run, "last") == 1
