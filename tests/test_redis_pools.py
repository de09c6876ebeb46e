"""redis-py's pool internals, used in one place (runner/store/pools.py): a pool rebuilt for
a forked process is like the one it replaces, plain or Sentinel, and a client given without
a URL is named by its pool. Marked ``redis_internals``: ``make test-latest`` runs them on the
newest redis-py before pyproject's bound is raised."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from runner.store import pools

pytestmark = pytest.mark.redis_internals


def test_a_rebuilt_pool_is_a_new_pool_with_the_same_settings(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, max_connections=7, socket_timeout=3)
    before = client.connection_pool
    client.ping()
    pools.fresh_pool(client)
    after = client.connection_pool
    assert after is not before and type(after) is type(before)
    assert after.max_connections == 7
    assert after.connection_class is before.connection_class
    settings = ("host", "port", "db", "socket_timeout")
    assert [after.connection_kwargs[k] for k in settings] == [
        before.connection_kwargs[k] for k in settings
    ]
    assert client.ping()  # the new pool connects
    client.close()


def test_a_rebuilt_sentinel_pool_finds_the_same_group_afresh() -> None:
    # No sentinel runs here: a Sentinel pool connects only when a command is sent.
    sentinel = Sentinel([("127.0.0.1", 1)], socket_timeout=0.1)
    client = sentinel.master_for("mymaster", db=3, max_connections=5)
    before = client.connection_pool
    pools.fresh_pool(client)
    after = client.connection_pool
    assert isinstance(after, SentinelConnectionPool) and after is not before
    assert (after.service_name, after.is_master) == ("mymaster", True)
    assert after.sentinel_manager is sentinel
    assert after.max_connections == 5
    assert after.connection_kwargs["db"] == 3
    assert after.connection_class is before.connection_class


def test_a_client_is_named_by_its_pool(redis_url: str) -> None:
    client = redis.Redis(host="127.0.0.1", port=6379, db=11)
    assert pools.client_url(client) == "redis://127.0.0.1:6379/11"
    unix = redis.Redis(unix_socket_path="/tmp/r.sock", db=2)
    assert pools.client_url(unix) == "unix:///tmp/r.sock?db=2"
