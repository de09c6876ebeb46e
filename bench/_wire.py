"""Counting what a redis-py client sends: bytes and commands, per client."""

from __future__ import annotations

from typing import Any

import redis


class CountingConnection(redis.Connection):
    """A connection that adds what it sends to a :class:`Wire`."""

    def __init__(self, *args: Any, wire: Wire, **kwargs: Any) -> None:
        self.wire = wire
        super().__init__(*args, **kwargs)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        wire = self.wire
        parts = [command] if isinstance(command, bytes | str | memoryview) else command
        wire.bytes += sum(len(part) for part in parts)
        wire.sends += 1
        super().send_packed_command(command, check_health)


class Wire:
    """Bytes and packed sends (one per command or pipeline) of one counted client."""

    def __init__(self) -> None:
        self.bytes = 0
        self.sends = 0

    def reset(self) -> None:
        self.bytes = self.sends = 0


def counted_client(url: str) -> tuple[redis.Redis, Wire]:
    """A client on ``url`` whose every send is counted, and its counter."""
    wire = Wire()
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    pool.connection_kwargs["wire"] = wire
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # closed with the client, as from_url's is
    return client, wire
