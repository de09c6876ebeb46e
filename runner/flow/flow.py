"""The ``Flow`` base class: CrewAI's authoring surface and its entry points.

``kickoff`` runs a flow in this process (see :mod:`runner.flow.local`);
``submit`` runs it on Celery workers (see :mod:`runner.celery`). Both go through
the same orchestrator and checkpoints, so either can resume the other's runs.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from runner.checkpointing import CheckpointConfig, Sink, sink_for
from runner.errors import DefinitionError, InvalidInputs
from runner.flow.graph import FlowGraph, compile_graph
from runner.flow.state import dump_state
from runner.flow.steps import current_state, json_copy

StateT = TypeVar("StateT", bound=BaseModel | dict[str, Any])

_STATE_TYPE_ATTR = "__runner_state_type__"
_UNKNOWN: Any = object()


class Flow(Generic[StateT]):
    """Subclass with ``@start``/``@listen``/``@router`` methods over a state.

    The state is the generic parameter (``Flow[MyState]``, a ``FlowState``
    subclass) or ``initial_state`` (a model class, a model, or a dict).
    """

    initial_state: ClassVar[Any] = None
    name: ClassVar[str | None] = None
    checkpoint: ClassVar[CheckpointConfig | bool | None] = None

    def __init__(
        self,
        persistence: Any = None,
        checkpoint: CheckpointConfig | bool | None = None,
        listeners: list[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._persistence = persistence
        self._checkpoint = checkpoint if checkpoint is not None else type(self).checkpoint
        self._listeners = list(listeners or [])
        self._restore: CheckpointConfig | str | None = None
        self._state_json: dict[str, Any] | None = None
        self._state_obj: Any = None
        self._fresh_id = False
        """The state's id was made up for this object (no run can have it yet)."""
        self._state = self._initial_state()
        for key, value in kwargs.items():
            setattr(self, key, value)

    # -- state -----------------------------------------------------------------------------

    @property
    def state(self) -> StateT:
        """The state: inside a running method its own copy, else the flow's."""
        step_state = current_state.get(None)
        return step_state if step_state is not None else self._state

    @property
    def _state(self) -> Any:
        """The flow's state object, built from the latest committed JSON when first read."""
        pending = self._state_json
        if pending is not None:
            self._state_obj = self._state_from_json(pending)
            self._state_json = None
        return self._state_obj

    @_state.setter
    def _state(self, value: Any) -> None:
        self._state_obj = value
        self._state_json = None

    @property
    def flow_id(self) -> str:
        """The run id: the state's ``id``."""
        return str(_get_id(self._state))

    @classmethod
    def flow_name(cls) -> str:
        """Display name: ``name`` or the class name."""
        return cls.name or cls.__name__

    @classmethod
    def flow_path(cls) -> str:
        """Import path ``pkg.mod:Class``."""
        return f"{cls.__module__}:{cls.__qualname__}"

    @classmethod
    def graph(cls) -> FlowGraph:
        """The compiled graph of this flow class."""
        return compile_graph(cls)

    @classmethod
    def state_type(cls) -> type[BaseModel] | None:
        """The pydantic state model, or ``None`` for dict state (found once per class)."""
        found = cls.__dict__.get(_STATE_TYPE_ATTR, _UNKNOWN)
        if found is _UNKNOWN or found[0] is not cls.initial_state:
            found = (cls.initial_state, cls._find_state_type())
            setattr(cls, _STATE_TYPE_ATTR, found)
        return found[1]

    @classmethod
    def _find_state_type(cls) -> type[BaseModel] | None:
        init = cls.initial_state
        if isinstance(init, type) and issubclass(init, BaseModel):
            return init
        if isinstance(init, BaseModel):
            return type(init)
        if isinstance(init, dict):
            return None
        for klass in cls.__mro__:
            for base in getattr(klass, "__orig_bases__", ()):
                if get_origin(base) is Flow:
                    args = get_args(base)
                    if args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
                        return args[0]
        return None

    def _initial_state(self) -> Any:
        init = type(self).initial_state
        model = type(self).state_type()
        if isinstance(init, BaseModel):
            state: Any = init.model_copy(deep=True)
        elif isinstance(init, dict):
            state = copy.deepcopy(init)
        elif isinstance(init, type) and issubclass(init, dict):
            state = init()
        elif model is not None:
            state = model()
        else:
            state = {}
        if isinstance(state, dict):
            self._fresh_id = "id" not in state
            state.setdefault("id", str(uuid.uuid4()))
        elif "id" not in type(state).model_fields:
            raise DefinitionError(
                f"state model {type(state).__name__} has no 'id' field; subclass FlowState",
                flow=type(self).__name__,
            )
        else:
            made_here = not isinstance(init, BaseModel) and "id" not in state.model_fields_set
            factory = type(state).model_fields["id"].default_factory
            self._fresh_id = made_here and factory is not None
        return state

    def _state_from_json(self, data: dict[str, Any]) -> Any:
        """A state object made from JSON ``data``; it shares no list or dict with ``data``."""
        model = type(self).state_type()
        fresh = json_copy(data)
        if model is None:
            kind = type(self._state_obj)
            return fresh if kind is dict or not issubclass(kind, dict) else kind(fresh)
        try:
            return model.model_validate(fresh)
        except ValidationError as exc:
            raise InvalidInputs(_one_line(exc), flow=type(self).__name__) from None

    def _apply_inputs(self, base: dict[str, Any], inputs: dict[str, Any]) -> Any:
        """``base`` state (JSON) with ``inputs`` on top, validated."""
        return self._state_from_json({**base, **inputs})

    def _set_state(self, data: dict[str, Any]) -> None:
        """Make committed JSON ``data`` the flow's state (built into an object when read)."""
        self._state_json = data

    def _dump(self) -> dict[str, Any]:
        if self._state_json is not None:
            return json_copy(self._state_json)
        return dump_state(self._state)

    def _sink(self) -> Sink:
        return sink_for(type(self), self._persistence, self._checkpoint)

    def run_crew(self, crew: Any, inputs: dict[str, Any] | None = None) -> Any:
        """Run ``crew`` as a child run of this method; return it as the method's output.

        In process the crew runs inline; on workers it is a child run and this method
        completes when the child succeeds, without a worker waiting for it.
        """
        run_as_child = getattr(crew, "run_as_child", None)
        if not callable(run_as_child):
            raise DefinitionError(f"run_crew takes a Crew, not {crew!r}")
        return run_as_child(self, inputs)

    def pause(self, reason: str = "waiting for input") -> None:
        """Pause the run here; ``resume`` with inputs re-runs this method."""
        from runner.errors import PauseRun

        raise PauseRun(reason)

    # -- in-process entry points -----------------------------------------------------------

    def kickoff(
        self,
        inputs: dict[str, Any] | None = None,
        from_checkpoint: CheckpointConfig | str | None = None,
        restore_from_state_id: str | None = None,
        strict: bool = False,
    ) -> Any:
        """Run the flow in this process and return the last method's output."""
        from runner.flow.local import kickoff

        if from_checkpoint is not None and restore_from_state_id is not None:
            raise ValueError(
                "pass either from_checkpoint or restore_from_state_id, not both: "
                "from_checkpoint resumes a checkpoint, restore_from_state_id forks a state"
            )
        restore = from_checkpoint if from_checkpoint is not None else self._restore
        self._restore = None
        return kickoff(self, dict(inputs or {}), restore, restore_from_state_id, strict)

    async def kickoff_async(
        self,
        inputs: dict[str, Any] | None = None,
        from_checkpoint: CheckpointConfig | str | None = None,
        restore_from_state_id: str | None = None,
        strict: bool = False,
    ) -> Any:
        """``kickoff`` without blocking the event loop."""
        return await asyncio.to_thread(
            self.kickoff, inputs, from_checkpoint, restore_from_state_id, strict
        )

    akickoff = kickoff_async

    @classmethod
    def submit(cls, inputs: dict[str, Any] | None = None) -> Any:
        """Run this flow on Celery workers; returns a :class:`RunHandle`."""
        from runner.distributed.client import submit

        return submit(cls, inputs)

    @classmethod
    def from_checkpoint(cls, config: CheckpointConfig | str | Path, **kwargs: Any) -> Flow[Any]:
        """A flow that, on ``kickoff()``, restores ``config`` and skips completed methods."""
        flow = cls(**kwargs)
        restore = config if isinstance(config, CheckpointConfig) else str(config)
        if isinstance(restore, CheckpointConfig) and flow._checkpoint is None:
            flow._checkpoint = restore
        flow._restore = restore
        return flow


def _get_id(state: Any) -> Any:
    return state["id"] if isinstance(state, dict) else state.id


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "state"
        parts.append(f"{where}: {err['msg']}")
    return "invalid inputs: " + "; ".join(parts)
