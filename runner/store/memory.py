"""A store that says "full" first: its memory, its limit and the high-water mark of submits.

The limit is Redis's ``maxmemory`` (``INFO memory``), or ``RUNNER_STORE_MAX_BYTES`` when set
and lower; ``RUNNER_STORE_HIGH_WATER`` (default 0.9) of it is the high-water mark. A submit
that would take the store past it is refused (:class:`~runner.errors.StoreFull`), so the
memory above it is left to the runs already running: their commits go on.

What Redis does at the limit itself (``maxmemory-policy noeviction``, measured on Redis 7 by
``tests/test_store_full.py``): a command that may grow memory (``SET``, ``HSET``, ``ZADD``,
...) is refused with an ``OOM`` error while ``used_memory`` is over ``maxmemory``; a Lua
script is judged by the memory when it starts: over the limit then, its first such command
fails before it has written anything (a commit script reads first, so nothing of the commit
is written); under it, the script runs to its end even if it crosses the limit on the way.
A commit is one script, so it is written whole or not at all. Any other policy evicts keys
(a run's history, its lease, a queued step) to make room: the runner needs ``noeviction``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from redis.exceptions import NoPermissionError

from runner.errors import StoreFull

NOEVICTION = "noeviction"


class StoreMemory(NamedTuple):
    """One Redis server's memory as the store sees it."""

    store: str
    """The server (its password-masked URL, or ``host:port`` of a Cluster node)."""
    used: int
    """``used_memory`` in bytes."""
    limit: int | None
    """The limit in bytes (``maxmemory`` or ``RUNNER_STORE_MAX_BYTES``); ``None``: none."""
    high_water: int | None
    """Past this many bytes a submit is refused."""
    policy: str
    """``maxmemory-policy`` (``noeviction`` is the one to run with)."""

    @property
    def free(self) -> int | None:
        """Bytes left below the limit."""
        return None if self.limit is None else max(self.limit - self.used, 0)

    def as_json(self) -> dict[str, Any]:
        """Every field, and ``free``."""
        return {**self._asdict(), "free": self.free}


def of_info(store: str, info: dict[str, Any], max_bytes: int | None, high: float) -> StoreMemory:
    """The :class:`StoreMemory` of a server's ``INFO memory`` reply."""
    limits = [n for n in (int(info.get("maxmemory") or 0), max_bytes or 0) if n > 0]
    limit = min(limits) if limits else None
    return StoreMemory(
        store=store,
        used=int(info.get("used_memory") or 0),
        limit=limit,
        high_water=None if limit is None else int(limit * high),
        policy=str(info.get("maxmemory_policy") or "?"),
    )


def read(client: Any, cluster: bool, url: str, max_bytes: int | None, high: float) -> list[Any]:
    """Each server's :class:`StoreMemory` (one ``INFO memory`` each; every primary of a
    Cluster); none when the Redis user may not run ``INFO`` (an ACL rule without ``+info``):
    then no submit is refused for memory."""
    try:
        return _read(client, cluster, url, max_bytes, high)
    except NoPermissionError:
        return []


def _read(client: Any, cluster: bool, url: str, max_bytes: int | None, high: float) -> list[Any]:
    if not cluster:
        return [of_info(url, client.info("memory"), max_bytes, high)]
    replies = client.info("memory", target_nodes=client.PRIMARIES)
    return [of_info(str(node), info, max_bytes, high) for node, info in sorted(replies.items())]


def check_room(found: list[StoreMemory], incoming: int, high: float) -> None:
    """:class:`StoreFull` if ``incoming`` more bytes take a server past its high-water mark."""
    for memory in found:
        if memory.high_water is not None and memory.used + incoming > memory.high_water:
            assert memory.limit is not None
            raise StoreFull(
                f"the store is full: Redis at {memory.store} uses {size(memory.used)} of its "
                f"{size(memory.limit)} limit, past the {high:.0%} high-water mark "
                f"(RUNNER_STORE_HIGH_WATER): new runs are refused, running ones go on; free "
                f"memory (runner prune) or raise the limit",
                store=memory.store,
                used=memory.used,
                limit=memory.limit,
            )


def size(n: int) -> str:
    """``n`` bytes for people: ``812.4 MB``."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
