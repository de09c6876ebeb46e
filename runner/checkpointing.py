"""CrewAI's persistence surfaces: ``@persist``, ``CheckpointConfig``, and the sinks
that decide which of a run's checkpoints reach durable storage.

* ``@persist`` (class or method) saves the state after every (or the marked)
  method through a ``FlowPersistence`` (default: the one
  ``set_flow_persistence_factory`` set, else Redis from the settings); a
  persistence built on a checkpoint store also keeps the full checkpoint, so such
  runs can later be resumed step-exactly. On workers the run's checkpoints are in
  their Redis; the persistence gets a copy of the state (:func:`state_copy`).
* ``CheckpointConfig`` writes full checkpoints to a provider on the selected
  events; for a flow the default events checkpoint after every method.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from runner.errors import CheckpointNotFound, CorruptCheckpoint, InvalidInputs
from runner.store.base import CheckpointStore
from runner.store.models import (
    FLOW_CANCELLED,
    FLOW_PAUSED,
    FLOW_RESUMED,
    FLOW_STARTED,
    METHOD_FAILED,
    METHOD_FINISHED,
    Checkpoint,
)
from runner.store.persistence import store_of
from runner.store.persistence_factory import default_flow_persistence, flow_persistence_factory

log = logging.getLogger("runner.persist")

F = TypeVar("F", bound=Callable[..., Any])

FLOW_DEFAULT_EVENTS = frozenset(
    {
        FLOW_STARTED,
        METHOD_FINISHED,
        METHOD_FAILED,
        FLOW_PAUSED,
        FLOW_RESUMED,
        FLOW_CANCELLED,
    }
)
"""A flow checkpoints when it starts, after every method, and when it stops early."""

CREW_DEFAULT_EVENTS = frozenset({"task_completed", "task_failed", "crew_kickoff_started"})


class CheckpointConfig(BaseModel):
    """Where and when checkpoints are written (CrewAI's fields and defaults).

    ``directory=`` is accepted as the older name of ``location``. A ``restore_from`` that
    names a checkpoint file (``<location>/<time>_<id>.json``) or a SQLite checkpoint
    (``<file>#<id>``) also tells where the run's history is, so ``location`` and the
    provider need not be repeated.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    location: str = "./.checkpoints"
    """A directory for ``JsonProvider``, a database file for ``SqliteProvider``."""
    on_events: list[str] | None = None
    """Events that write a checkpoint; ``["*"]`` = all; ``None`` = the kind's default."""
    provider: Any = None
    """A checkpoint store (or store class); default ``JsonProvider`` at ``location``."""
    max_checkpoints: int | None = None
    """Checkpoints kept per run; older ones are pruned after each write."""
    restore_from: str | Path | None = None
    """A checkpoint id, a run id (its latest) or a checkpoint JSON file to restore."""

    @model_validator(mode="before")
    @classmethod
    def _older_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "directory" in data:
            if "location" in data:
                raise ValueError("give location or its older name directory, not both")
            data["location"] = data.pop("directory")
        ref = data.get("restore_from")
        if isinstance(ref, str) and "#" in ref:
            db, _, ident = ref.rpartition("#")
            if Path(db).is_file():  # CrewAI's SqliteProvider location: <db file>#<id>
                data["restore_from"] = ident
                data.setdefault("location", db)
                if data.get("provider") is None:
                    from runner.store.sqlite import SqliteProvider

                    data["provider"] = SqliteProvider
        elif ref is not None and "location" not in data and data.get("provider") is None:
            from runner.store.jsondir import JsonProvider

            path = Path(ref)
            if path.is_file():  # the store holding it, else (a bare file) its directory
                data["location"] = str(JsonProvider.root_of(path) or path.parent)
        return data

    @property
    def directory(self) -> str:
        """The older name of :attr:`location`."""
        return self.location

    @property
    def names_store(self) -> bool:
        """Whether this config says where checkpoints are kept: ``location`` or ``provider``
        given (or implied by a ``restore_from`` file)."""
        return bool({"location", "provider"} & self.model_fields_set)

    @property
    def trigger_all(self) -> bool:
        """Whether every event writes a checkpoint (``on_events=["*"]``)."""
        return self.on_events is not None and "*" in self.on_events

    @property
    def trigger_events(self) -> set[str]:
        """The events named in ``on_events``; with none given, both kinds' defaults."""
        if self.on_events is None:
            return set(FLOW_DEFAULT_EVENTS | CREW_DEFAULT_EVENTS)
        return set(self.on_events)

    def events(self, kind: str = "flow") -> frozenset[str]:
        """The events that write a checkpoint for a flow or a crew."""
        if self.on_events is None:
            return FLOW_DEFAULT_EVENTS if kind == "flow" else CREW_DEFAULT_EVENTS
        if "*" in self.on_events:
            return frozenset({"*"})
        return frozenset(self.on_events)

    def store(self) -> CheckpointStore:
        """The provider this config writes to, bound to ``location``.

        A provider class is made at ``location``; a provider made without one
        (``JsonProvider()``, ``SqliteProvider()``) is bound to it.
        """
        provider = self.provider
        if provider is None:
            from runner.store.jsondir import JsonProvider

            provider = JsonProvider
        if isinstance(provider, type):
            provider = provider(self.location)
        bind = getattr(provider, "bind", None)
        if callable(bind):
            provider = bind(self.location)
        return provider


def resolve_config(value: CheckpointConfig | bool | None) -> CheckpointConfig | None:
    """CrewAI's values: ``None``/``False`` off here, ``True`` defaults, a config as is."""
    if value is True:
        return CheckpointConfig()
    if isinstance(value, CheckpointConfig):
        return value
    return None


# -- @persist --------------------------------------------------------------------------------


class FlowPersistenceLike(Protocol):
    """CrewAI's ``FlowPersistence`` face."""

    def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None: ...

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None: ...


class PersistSpec(BaseModel):
    """What ``@persist`` attached to a class or method."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    persistence: Any = None
    verbose: bool = False


PERSIST_ATTR = "__runner_persist__"


def persist(persistence: Any = None, verbose: bool = False) -> Any:
    """Persist flow state after every method (on a class) or after one method.

    Usable as ``@persist``, ``@persist()`` or ``@persist(SQLiteFlowPersistence(...))``.
    """
    if callable(persistence) and not hasattr(persistence, "save_state"):
        return persist()(persistence)

    def decorate(target: Any) -> Any:
        setattr(target, PERSIST_ATTR, PersistSpec(persistence=persistence, verbose=verbose))
        return target

    return decorate


# -- sinks: which checkpoints are written where ---------------------------------------------


def persistable(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` as it is persisted: under the state's ``id``, which a method may have changed
    (CrewAI saves under it; later checkpoints of the run follow it there)."""
    state_id = ckpt.state.get("id", ckpt.run_id)
    if not isinstance(state_id, str) or not state_id:
        raise InvalidInputs(
            f"the state id of run {ckpt.run_id} must be a non-empty string, not {state_id!r}",
            run_id=ckpt.run_id,
        )
    return ckpt if state_id == ckpt.run_id else ckpt.model_copy(update={"run_id": state_id})


class Sink:
    """No persistence: nothing is written and nothing can be restored."""

    store: CheckpointStore | None = None
    persists = False
    """Whether checkpoints are written (else state need not be JSON)."""

    def write(self, ckpt: Checkpoint) -> Checkpoint:
        """Write ``ckpt`` if its event is selected; return it (with ``seq`` if written)."""
        return ckpt

    def load_state(self, run_id: str) -> dict[str, Any] | None:
        """The latest state saved for ``run_id``."""
        return None

    def latest(self, run_id: str) -> Checkpoint | None:
        """The latest full checkpoint of ``run_id``, where the sink keeps them."""
        return None

    expected: dict[str, int] | None = None
    """Run id -> the sequence number its next commit here must follow (see :meth:`follow`)."""

    def follow(self, run_id: str, seq: int) -> None:
        """Commit ``run_id``'s next checkpoint only if the run is still at ``seq`` in the
        store, and each one after only on the one before: compare-and-set, as workers
        commit, so a run another process resumed, answered or cancelled meanwhile raises
        :class:`~runner.errors.CommitConflict` here instead of being written over."""
        if self.expected is None:
            self.expected = {}
        self.expected[run_id] = seq

    def commit_to(
        self, store: CheckpointStore, ckpt: Checkpoint, max_checkpoints: int | None = None
    ) -> Checkpoint:
        """Commit ``ckpt`` to ``store`` on the sequence :meth:`follow` set for its run (any,
        for a run not followed: one a method moved to another state id), and follow it."""
        expected = None if self.expected is None else self.expected.get(ckpt.run_id)
        written = store.commit(ckpt, expected_seq=expected, max_checkpoints=max_checkpoints)
        self.follow(written.run_id, written.seq)
        return written


class StoreSink(Sink):
    """Full checkpoints to a store on the selected events."""

    persists = True

    def __init__(
        self, store: CheckpointStore, events: frozenset[str], max_checkpoints: int | None = None
    ) -> None:
        self.store = store
        self.events = events
        self.max_checkpoints = max_checkpoints

    def write(self, ckpt: Checkpoint) -> Checkpoint:
        """Commit ``ckpt`` when its event is one of ours."""
        assert self.store is not None
        if "*" in self.events or ckpt.event in self.events:
            return self.commit_to(self.store, persistable(ckpt), self.max_checkpoints)
        return ckpt

    def load_state(self, run_id: str) -> dict[str, Any] | None:
        """State of the run's latest checkpoint."""
        latest = self.latest(run_id)
        return None if latest is None else dict(latest.state)

    def latest(self, run_id: str) -> Checkpoint | None:
        """The run's latest checkpoint in the store."""
        assert self.store is not None
        return self.store.latest(run_id)


class PersistSink(Sink):
    """``@persist``: state after every method, or after the marked methods."""

    persists = True

    def __init__(
        self, persistence: FlowPersistenceLike, methods: frozenset[str] | None, verbose: bool
    ) -> None:
        self.persistence = persistence
        self.methods = methods
        self.verbose = verbose
        self.store = store_of(persistence)

    def write(self, ckpt: Checkpoint) -> Checkpoint:
        """Save the state when a persisted method finished."""
        if ckpt.event != METHOD_FINISHED or ckpt.step is None:
            return ckpt
        if self.methods is not None and ckpt.step not in self.methods:
            return ckpt
        saved = persistable(ckpt)
        if self.verbose:
            log.info("Saving flow state to memory for ID: %s", saved.run_id)
        if self.store is not None:
            return self.commit_to(self.store, saved)
        self.persistence.save_state(saved.run_id, ckpt.step, saved.state)
        return saved

    def load_state(self, run_id: str) -> dict[str, Any] | None:
        """CrewAI's ``load_state``."""
        return self.persistence.load_state(run_id)

    def latest(self, run_id: str) -> Checkpoint | None:
        """Full checkpoints exist only when the persistence is store-backed."""
        return None if self.store is None else self.store.latest(run_id)


class WatchedSink(Sink):
    """Another sink, also telling ``on_method`` each method that finished and its output, in
    commit order (how ``Flow.method_outputs`` is kept, whatever the sink persists)."""

    def __init__(self, inner: Sink, on_method: Callable[[str, Any], None]) -> None:
        self.inner = inner
        self.on_method = on_method
        self.store = inner.store
        self.persists = inner.persists

    def follow(self, run_id: str, seq: int) -> None:
        """The inner sink's."""
        self.inner.follow(run_id, seq)

    def write(self, ckpt: Checkpoint) -> Checkpoint:
        """Hand ``ckpt`` to the inner sink, then report a finished method."""
        written = self.inner.write(ckpt)
        if ckpt.event == METHOD_FINISHED and ckpt.step is not None:
            self.on_method(ckpt.step, ckpt.outputs.get(ckpt.step))
        return written

    def load_state(self, run_id: str) -> dict[str, Any] | None:
        """The inner sink's."""
        return self.inner.load_state(run_id)

    def latest(self, run_id: str) -> Checkpoint | None:
        """The inner sink's."""
        return self.inner.latest(run_id)


# -- restoring: where a restored run is read from and goes on --------------------------------


def restore_sink(sink: Sink, restore: CheckpointConfig | str) -> Sink:
    """The sink a run restored from ``restore`` is read from and goes on in, ``sink`` being
    the flow's own: a restore config that says where its run is wins (CrewAI: its other
    fields apply to the resumed run), and a run restored by id with no store configured
    goes on where it is kept, the default store."""
    if isinstance(restore, CheckpointConfig) and (
        restore.names_store or not isinstance(sink, StoreSink)
    ):
        return StoreSink(restore.store(), restore.events("flow"), restore.max_checkpoints)
    if sink.store is None:
        return StoreSink(default_store(), FLOW_DEFAULT_EVENTS)
    return sink


def load_restore_point(sink: Sink, restore: CheckpointConfig | str) -> Checkpoint:
    """The checkpoint named by a config's ``restore_from``, an id, a run id or a file
    (:class:`~runner.errors.CheckpointNotFound` if none, :class:`~runner.errors.CorruptCheckpoint`
    if what it names is not a checkpoint of ours)."""
    ref = restore.restore_from if isinstance(restore, CheckpointConfig) else restore
    try:
        return _find_checkpoint(sink.store if sink.store is not None else default_store(), ref)
    except ValidationError:  # e.g. a file CrewAI's provider face wrote: not ours
        raise CorruptCheckpoint(
            f"{ref} is not a checkpoint of this runner", checkpoint_id=str(ref)
        ) from None


def _find_checkpoint(store: CheckpointStore, ref: str | Path | None) -> Checkpoint:
    if ref is None:
        runs = store.runs(limit=1)
        latest = store.latest(runs[0].run_id) if runs else None
        if latest is None:
            raise CheckpointNotFound("no checkpoint to restore from", checkpoint_id=None)
        return latest
    path = Path(str(ref))
    if path.suffix == ".json" and path.is_file():
        return Checkpoint.model_validate_json(path.read_bytes())
    try:
        return store.get(str(ref))
    except CheckpointNotFound:
        latest = store.latest(str(ref))
        if latest is None:
            raise
        return latest


def default_store() -> CheckpointStore:
    """The store of runs restored by id with no store configured: Redis from the settings."""
    from runner.store.redis import RedisProvider

    return RedisProvider()


default_persistence = default_flow_persistence
"""Where every fall-back to the default persistence goes (``@persist`` given none, a pending
run with no persistence named): the factory's, else Redis from the settings."""


def sink_for(flow_cls: type, instance_persistence: Any, checkpoint: Any) -> Sink:
    """Pick the sink for a flow: checkpoint config, else ``@persist``, else none."""
    config = resolve_config(checkpoint)
    if config is not None:
        return StoreSink(config.store(), config.events("flow"), config.max_checkpoints)
    spec, methods = _persist_spec(flow_cls)
    # ``is None``, never truth: a persistence may be falsy (an empty container, say).
    persistence = instance_persistence
    if persistence is None and spec is not None:
        persistence = spec.persistence
    if spec is None and persistence is None:
        return Sink()
    verbose = bool(spec and spec.verbose)
    if persistence is None:
        persistence = default_persistence()
    return PersistSink(persistence, methods, verbose)


def state_copy(flow_cls: type, own: CheckpointStore) -> Sink | None:
    """Where a worker copies the state of ``flow_cls``'s persisted methods, beyond ``own``
    (the workers' Redis, which keeps the run's checkpoints whatever the persistence):
    ``@persist``'s persistence, or the factory's for an ``@persist`` given none. ``None``
    when nothing is to be copied: no ``@persist`` (or a ``checkpoint`` config, which wins
    over it, as in process), or a persistence on ``own`` itself (the built-in default)."""
    spec, methods = _persist_spec(flow_cls)
    if spec is None or resolve_config(getattr(flow_cls, "checkpoint", None)) is not None:
        return None
    persistence = spec.persistence
    if persistence is None:
        if flow_persistence_factory() is None:
            return None  # the default is Redis from the settings: the workers' own store
        persistence = default_persistence()
    if _same_store(store_of(persistence), own):
        return None
    return PersistSink(persistence, methods, spec.verbose)


def _same_store(a: Any, b: CheckpointStore) -> bool:
    """Whether store ``a`` is ``b`` or the same Redis key space (URL and prefix)."""
    if a is None:
        return False
    if a is b:
        return True
    keys_a, keys_b = getattr(a, "keys", None), getattr(b, "keys", None)
    return (
        type(a) is type(b)
        and getattr(a, "url", None) == getattr(b, "url", None)
        and getattr(keys_a, "prefix", None) == getattr(keys_b, "prefix", None)
    )


def _persist_spec(flow_cls: type) -> tuple[PersistSpec | None, frozenset[str] | None]:
    """``@persist`` of the class (every method), else of its marked methods (those)."""
    spec: PersistSpec | None = getattr(flow_cls, PERSIST_ATTR, None)
    if spec is not None:
        return spec, None
    marked = {
        name: getattr(fn, PERSIST_ATTR)
        for name, fn in _methods(flow_cls)
        if isinstance(getattr(fn, PERSIST_ATTR, None), PersistSpec)
    }
    if not marked:
        return None, None
    return next(iter(marked.values())), frozenset(marked)


def _methods(cls: type) -> list[tuple[str, Any]]:
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if callable(value) and not name.startswith("__"):
                found[name] = value
    return list(found.items())
