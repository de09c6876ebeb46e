"""A worker's thread pool never exhausts the store's Redis connections: a worker
``-P threads -c N`` with N above the pool's size runs more Redis calls at once than the pool
has connections, and the extra callers wait for one instead of failing with redis-py's
"Too many connections" (bench/threads.py, 200 threads, hit it at redis-py's default of 100)."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import redis

from runner.store import connection
from runner.store.redis import RedisProvider


def test_more_threads_than_connections_take_turns(redis_url: str, prefix: str) -> None:
    store = RedisProvider(redis_url, prefix=prefix, patient=True)  # as a worker makes it
    threads = connection.POOL_SIZE + 50  # -c 150: more steps at once than connections
    ready = threading.Barrier(threads)

    def step(i: int) -> object:
        ready.wait()
        # Holds its connection for 0.5 s (an empty list's BLPOP times out), as a burst of
        # steps all in their Redis round trips at once does.
        return store.client.blpop([f"{prefix}:empty:{i}:{uuid.uuid4().hex}"], timeout=0.5)

    try:
        with ThreadPoolExecutor(threads) as pool:
            replies = list(pool.map(step, range(threads)))
        assert replies == [None] * threads  # every call answered, none refused
        pool_of = store.client.connection_pool
        assert isinstance(pool_of, redis.BlockingConnectionPool)
        assert pool_of.max_connections == connection.POOL_SIZE  # bounded all the same
    finally:
        store.close()
