"""CrewAI's ``FlowPersistence`` face over any checkpoint store.

CrewAI's ``@persist`` calls ``save_state`` after each flow method and
``load_state`` when a flow is kicked off with an existing state id. Here each
save is a checkpoint (event ``method_finished``) of the run named by the flow's
state id, so the states CrewAI code saves are the runner's history too.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from runner.store.base import CheckpointStore
from runner.store.models import Checkpoint
from runner.store.pending import (
    PendingFeedbackContext,
    clear_pending,
    load_pending,
    save_pending,
    state_json,
)
from runner.store.sqlite import SqliteProvider

if TYPE_CHECKING:
    from runner.store.redis import RedisProvider

DB_FILENAME = "flow_states.db"
"""File name of the SQLite database, as CrewAI's."""


REGISTERED: dict[str, type[FlowPersistence]] = {}
"""Every subclass of :class:`FlowPersistence` by class name (the last one defined wins)."""


def declared_fields(cls: type) -> set[str]:
    """The settings a class and its bases declare: annotated, not ``ClassVar``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        for name, hint in vars(klass).get("__annotations__", {}).items():
            if "ClassVar" not in str(hint) and not name.startswith("_"):
                names.add(name)
    return names


def store_of(persistence: Any) -> CheckpointStore | None:
    """The checkpoint store a persistence is built on (ours keep whole checkpoints there),
    or ``None`` for a backend that keeps states its own way. Only a real store counts: a
    CrewAI-style backend may well have a setting named ``store`` (a string, say)."""
    store = getattr(persistence, "store", None)
    return store if isinstance(store, CheckpointStore) else None


def default_db_path() -> Path:
    """``flow_states.db`` in the runner's data directory (``$XDG_DATA_HOME/runner``)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "runner" / DB_FILENAME


class FlowPersistence(ABC):
    """Where ``@persist`` keeps flow states (CrewAI's interface).

    CrewAI's base is a pydantic model, so a backend of its own declares its settings as
    annotated class attributes with defaults and is built with them as keywords
    (``MyBackend(store="x")``); a subclass without an ``__init__`` of its own takes them
    here the same way.
    """

    persistence_type: str = "base"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # By class name, as CrewAI registers them: a definition names its backend so
        # (``persistence: {persistence_type: MyBackend, ...its fields}``).
        REGISTERED[cls.__name__] = cls

    def __init__(self, **fields: Any) -> None:
        known = declared_fields(type(self))
        unknown = sorted(set(fields) - known)
        if unknown:
            raise TypeError(
                f"{type(self).__name__}() got unexpected keyword arguments: {', '.join(unknown)}"
            )
        for name, value in fields.items():
            setattr(self, name, value)

    @abstractmethod
    def init_db(self) -> None:
        """Create whatever storage the backend needs (idempotent)."""

    @abstractmethod
    def save_state(
        self, flow_uuid: str, method_name: str, state_data: dict[str, Any] | BaseModel
    ) -> None:
        """Record the flow's state after ``method_name`` finished."""

    @abstractmethod
    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        """The most recently saved state of ``flow_uuid``, or ``None``."""

    # A run paused for a person's review (``@human_feedback``); CrewAI's defaults, which a
    # backend of its own overrides to keep the review.

    def save_pending_feedback(
        self,
        flow_uuid: str,
        context: PendingFeedbackContext,
        state_data: dict[str, Any] | BaseModel,
    ) -> None:
        """Keep the state of a run paused for ``context``'s review (here: only the state)."""
        self.save_state(flow_uuid, context.method_name, state_data)

    def load_pending_feedback(
        self, flow_uuid: str
    ) -> tuple[dict[str, Any], PendingFeedbackContext] | None:
        """The state and review run ``flow_uuid`` waits on, or ``None`` (here: none kept)."""
        return None

    def clear_pending_feedback(self, flow_uuid: str) -> None:
        """Stop run ``flow_uuid`` waiting for a review (here: nothing kept to clear)."""
        return None


class StorePersistence(FlowPersistence):
    """:class:`FlowPersistence` over any :class:`CheckpointStore`."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store

    def init_db(self) -> None:
        """Nothing to do: a store creates its storage when opened."""

    def save_state(
        self, flow_uuid: str, method_name: str, state_data: dict[str, Any] | BaseModel
    ) -> None:
        """Commit the state as a ``method_finished`` checkpoint of run ``flow_uuid``."""
        checkpoint = Checkpoint(
            run_id=flow_uuid,
            event="method_finished",
            step=method_name,
            state=state_json(flow_uuid, state_data),
        )
        self.store.commit(checkpoint)

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        """The state of the run's latest checkpoint, or ``None`` for an unknown run."""
        latest = self.store.latest(flow_uuid)
        return None if latest is None else latest.state

    def save_pending_feedback(
        self,
        flow_uuid: str,
        context: PendingFeedbackContext,
        state_data: dict[str, Any] | BaseModel,
    ) -> None:
        """Commit a checkpoint of run ``flow_uuid`` paused for ``context``'s review."""
        save_pending(self.store, flow_uuid, context, state_data)

    def load_pending_feedback(
        self, flow_uuid: str
    ) -> tuple[dict[str, Any], PendingFeedbackContext] | None:
        """The state and review of the run's latest checkpoint, if it waits on one."""
        return load_pending(self.store, flow_uuid)

    def clear_pending_feedback(self, flow_uuid: str) -> None:
        """Stop the run waiting for its review (it stays paused)."""
        clear_pending(self.store, flow_uuid)

    def close(self) -> None:
        """Close the underlying store."""
        self.store.close()

    def __enter__(self) -> StorePersistence:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SQLiteFlowPersistence(StorePersistence):
    """Flow states in a SQLite file (default: ``flow_states.db`` in the data directory)."""

    def __init__(self, db_path: str | os.PathLike[str] | None = None) -> None:
        path = Path(db_path) if db_path is not None else default_db_path()
        if db_path is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.db_path = str(path)
        super().__init__(SqliteProvider(path))


class RedisFlowPersistence(StorePersistence):
    """Flow states in Redis, the same history the workers write.

    ``provider`` wraps an existing :class:`RedisProvider`; otherwise one is made from
    ``url``, ``prefix`` and ``max_checkpoints``, each ``None`` meaning the settings' value
    (``RUNNER_REDIS_URL``, ``RUNNER_PREFIX``, ``RUNNER_MAX_CHECKPOINTS``), as every other
    part of the runner reads them, so ``@persist`` writes where the workers and CLI look.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str | None = None,
        max_checkpoints: int | None = None,
        provider: RedisProvider | None = None,
    ) -> None:
        if provider is None:
            from runner.store.redis import RedisProvider

            provider = RedisProvider(url, prefix=prefix, max_checkpoints=max_checkpoints)
        super().__init__(provider)
