"""The one module that reaches inside redis-py's connection pools.

Written against **redis-py 8.1**; ``pyproject.toml`` bounds ``redis`` below the next minor
for this module's sake, and ``make test-latest`` runs the tests marked ``redis_internals``
(and the broker suite) on the newest release before the bound is raised. What it reads:

* a pool's ``connection_kwargs``, ``connection_class`` and ``max_connections`` (and a
  Sentinel pool's ``service_name``, ``sentinel_manager``, ``is_master`` and
  ``check_connection``), to build a pool like it (:func:`fresh_pool`);
* a client's ``connection_pool.connection_kwargs`` and a cluster client's
  ``get_default_node()``, to name where it is connected (:func:`client_url`).

Should a release change them, :func:`fresh_pool` says so in one WARNING naming the version
and falls back to the pool's public ``reset()`` (which keeps a lock held at the fork).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

log = logging.getLogger("runner.store")

WRITTEN_AGAINST = "8.1"
"""The redis-py minor release whose pool internals this module was written against."""


def fresh_pool(client: Any) -> None:
    """Give ``client`` a new connection pool with the same settings: in a forked child, where
    the parent's pool may be locked by one of its threads at the fork and redis-py would then
    wait for ever. A cluster client's nodes are left as they are."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return
    try:
        client.connection_pool = _like(pool)
    except (AttributeError, TypeError) as exc:
        log.warning(
            "redis-py %s: cannot rebuild a connection pool in a forked process as written "
            "for %s (%s); resetting it instead",
            redis.__version__,
            WRITTEN_AGAINST,
            exc,
        )
        pool.reset()


def _like(pool: Any) -> Any:
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    if isinstance(pool, SentinelConnectionPool):  # the same group's primary, found afresh
        return SentinelConnectionPool(
            pool.service_name,
            pool.sentinel_manager,
            is_master=pool.is_master,
            check_connection=pool.check_connection,
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            **kwargs,
        )
    return type(pool)(
        connection_class=pool.connection_class,
        max_connections=pool.max_connections,
        **kwargs,
    )


def client_url(client: redis.Redis | RedisCluster) -> str:
    """Where ``client`` connects, as a URL without credentials."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()
        return f"redis+cluster://{node.host}:{node.port}"
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
