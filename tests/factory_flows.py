"""Flows of ``tests/test_persistence_factory.py``. At import this module sets the process's
flow persistence factory, as an application's flow module does; workers given it in their
allow-list (``RUNNER_FLOW_MODULES``) import it, and so honour the factory.

The factory's SQLite file is named by :data:`COPY_DB_ENV` (each test's own); without it the
module sets no factory (the test process imports it for the flow classes alone).
"""

from __future__ import annotations

import os

from runner import (
    Flow,
    FlowState,
    SQLiteFlowPersistence,
    listen,
    persist,
    set_flow_persistence_factory,
    start,
)

COPY_DB_ENV = "RUNNER_TEST_FACTORY_DB"
"""Where the factory's persistence keeps its states (a SQLite file)."""

_made: list[SQLiteFlowPersistence] = []


def copy_db() -> SQLiteFlowPersistence:
    """The factory: one persistence per process on the file the test named."""
    if not _made:
        _made.append(SQLiteFlowPersistence(os.environ[COPY_DB_ENV]))
    return _made[0]


if os.environ.get(COPY_DB_ENV):
    set_flow_persistence_factory(copy_db)


class Tally(FlowState):
    count: int = 0
    trail: list[str] = []


class Steps(Flow[Tally]):
    """first -> second -> third, each counting and leaving a trail."""

    def _step(self, name: str) -> str:
        self.state.count += 1
        self.state.trail.append(name)
        return f"{name}:{self.state.count}"

    @start()
    def first(self) -> str:
        return self._step("first")

    @listen(first)
    def second(self) -> str:
        return self._step("second")

    @listen(second)
    def third(self) -> str:
        return self._step("third")


@persist
class PersistedSteps(Steps):
    """Every method persisted, through the default persistence (the factory's)."""


class SecondPersisted(Steps):
    """Only ``second`` persisted."""

    @listen("first")
    @persist
    def second(self) -> str:
        return self._step("second")


class PlainSteps(Steps):
    """No ``@persist``: nothing goes to any persistence."""
