"""Helpers of the in-process flow tests: stores to parametrise over, a call tally, an event log."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runner.flow.events import EventListener, FlowEvent
from runner.store.base import CheckpointStore
from runner.store.models import Checkpoint
from runner.store.redis import RedisProvider
from runner.store.sqlite import SqliteProvider

STORES = ["redis", "sqlite"]
"""The stores behaviours that touch a store are checked against."""


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """A Redis store under the test's own prefix, or a SQLite store in ``tmp_path``."""
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return RedisProvider(url, prefix=request.getfixturevalue("prefix"))
    return SqliteProvider(tmp_path / "checkpoints.db")


class Tally:
    """How many times each method ran, and the order they ran in (thread-safe)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.order: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, method: str) -> None:
        with self._lock:
            self.counts[method] += 1
            self.order.append(method)

    def __getitem__(self, method: str) -> int:
        return self.counts[method]


class Recorder(EventListener):
    """Keeps every event it is given (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[FlowEvent] = []
        self._lock = threading.Lock()

    def on_event(self, event: FlowEvent) -> None:
        with self._lock:
            self.events.append(event)

    def types(self) -> list[str]:
        """The event types, in delivery order."""
        return [e.type for e in self.events]

    def of(self, kind: str) -> list[FlowEvent]:
        """The events of one type."""
        return [e for e in self.events if e.type == kind]


def history(store: CheckpointStore, run_id: str) -> list[Checkpoint]:
    """Every checkpoint of a run, oldest first."""
    return list(reversed(store.history(run_id, limit=1000)))


def steps_finished(store: CheckpointStore, run_id: str) -> list[str | None]:
    """The steps of the run's ``method_execution_finished`` checkpoints, oldest first."""
    return [c.step for c in history(store, run_id) if c.event == "method_execution_finished"]


def state_of(ckpt: Checkpoint, *fields: str) -> dict[str, Any]:
    """Some fields of a checkpoint's state."""
    return {name: ckpt.state.get(name) for name in fields}
