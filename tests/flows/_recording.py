"""What the parity flows share (a module the workers import without registering it as
flows, its name starting with ``_``): attempt counts, a barrier and an event recorder, all
in Redis, so whichever process runs a step or tells an event, the test sees it."""

from __future__ import annotations

import json
import os
import time
from typing import Any, ClassVar, TypeVar

import redis
from pydantic import BaseModel

from runner import EventListener, Flow, FlowEvent

StateT = TypeVar("StateT", bound=BaseModel | dict[str, Any])

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"])
    return _client


def attempts(tag: str, step: str) -> int:
    """Count one more attempt of ``step`` in the run tagged ``tag``; the count so far."""
    return int(_redis().hincrby(f"parity-tests:{tag}", step, 1))


def meet(tag: str, name: str, parties: int, timeout: float = 20.0) -> None:
    """Wait until ``parties`` steps of the run tagged ``tag`` reached barrier ``name``."""
    key = f"parity-barrier:{tag}:{name}"
    _redis().incr(key)
    deadline = time.monotonic() + timeout
    while int(_redis().get(key) or 0) < parties:
        assert time.monotonic() < deadline, f"barrier {name}: the other steps never came"
        time.sleep(0.01)


def after(tag: str, name: str, grace: float = 0.3, timeout: float = 20.0) -> None:
    """Wait until a step of the run tagged ``tag`` reached barrier ``name`` (see :func:`meet`),
    then ``grace`` seconds more (time for that step's commit)."""
    key = f"parity-barrier:{tag}:{name}"
    deadline = time.monotonic() + timeout
    while not int(_redis().get(key) or 0):
        assert time.monotonic() < deadline, f"barrier {name}: the other step never came"
        time.sleep(0.01)
    time.sleep(grace)


class Recorder(EventListener):
    """Keeps each event's type and method in Redis, in the order they are told, by run."""

    def on_event(self, event: FlowEvent) -> None:
        """Append ``[type, method]`` to the run's list."""
        _redis().rpush(f"parity-events:{event.run_id}", json.dumps([event.type, event.method]))


def recorded(run_id: str) -> list[tuple[str, str | None]]:
    """The events told for ``run_id`` so far: (type, method) in the order they were told."""
    return [tuple(json.loads(raw)) for raw in _redis().lrange(f"parity-events:{run_id}", 0, -1)]


class Recorded(Flow[StateT]):
    """Base of flows whose objects tell a :class:`Recorder` (on workers too: each attempt
    makes its flow object there): ``class F(Recorded[MyState])``; ``recorder``, the class."""

    recorder: ClassVar[type[Recorder]] = Recorder

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(listeners=[self.recorder()], **kwargs)
