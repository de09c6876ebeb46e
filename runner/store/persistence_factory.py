"""The default flow persistence, and CrewAI's seam to replace it: one factory per process.

``set_flow_persistence_factory(factory)`` (at start-up, as CrewAI's) makes every flow
that falls back to the default persistence (``@persist`` given none, ``Flow(...)`` of such
a class) use ``factory()``; ``None`` restores the built-in default, which here is Redis
from the settings (CrewAI's is SQLite), where the workers and the CLI look.
``default_flow_persistence()`` builds the default. An explicit persistence always wins.

The factory is called where the default is needed (each in-process kickoff, once per flow
class in a worker process), so it may run more than once: return a persistence on shared
durable storage (or the same object each time).

On workers the run's checkpoints stay in the workers' Redis whatever the factory says
(leases and dispatch markers live beside them); a worker gives the factory's persistence
the user's copy of each persisted method's state (see :func:`runner.checkpointing.state_copy`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner.errors import DefinitionError

FlowPersistenceFactory = Callable[[], Any]
"""Makes a ``FlowPersistence`` (anything with ``save_state`` and ``load_state``)."""

_factory: FlowPersistenceFactory | None = None


def set_flow_persistence_factory(factory: FlowPersistenceFactory | None) -> None:
    """Make ``factory()`` the default flow persistence of this process (``None``: Redis)."""
    global _factory
    if factory is not None and not callable(factory):
        raise TypeError(
            f"set_flow_persistence_factory takes a callable returning a FlowPersistence "
            f"(or None), not {factory!r}"
        )
    _factory = factory


def flow_persistence_factory() -> FlowPersistenceFactory | None:
    """The factory set in this process, or ``None`` (the built-in default)."""
    return _factory


def default_flow_persistence() -> Any:
    """The default flow persistence: the factory's, else Redis from the settings."""
    factory = _factory
    if factory is None:
        from runner.store.persistence import RedisFlowPersistence

        return RedisFlowPersistence()
    made = factory()
    # ``is None``, never truth: a falsy persistence (an empty container) is a persistence.
    if made is None:
        raise DefinitionError(f"the flow persistence factory {factory!r} returned None")
    return made
