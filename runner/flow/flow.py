"""The ``Flow`` base class: CrewAI's authoring surface and its entry points.

``kickoff`` runs a flow in this process (see :mod:`runner.flow.local`);
``submit`` runs it on Celery workers (see :mod:`runner.distributed`). Both go through
the same orchestrator and checkpoints, so either can resume the other's runs. The
executors sit above the flow core, which does not import them: the package plugs them in
(:data:`runner.flow.executors.EXECUTORS`, set by ``runner/__init__.py``, which any import of
a flow runs first).

The engine's seam: what the executors and crews do to a flow object goes through the
functions at the end of this module (:func:`apply_inputs`, :func:`state_json`,
:func:`listeners_of`, :func:`bind_trigger_payload`, :func:`checkpoint_store`) and the
:meth:`Flow.checkpoint_sink` hook, never through its private members.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, NoReturn, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from runner.checkpointing import (
    CheckpointConfig,
    Sink,
    load_restore_point,
    restore_sink,
    sink_for,
)
from runner.errors import DefinitionError, InvalidInputs
from runner.flow import conversation, streaming, usage
from runner.flow import human_feedback as reviewing
from runner.flow import input_provider as asking
from runner.flow import patches as patching
from runner.flow.attempt import json_copy, to_json
from runner.flow.context import step_context, warn_unhonoured
from runner.flow.conversation import ConversationalFlow, ConversationState
from runner.flow.definition import FlowConversationalDefinition, FlowDefinition, class_definition
from runner.flow.events import EventListener
from runner.flow.executors import EXECUTORS
from runner.flow.graph import (
    TRIGGER_PAYLOAD,
    FlowGraph,
    compile_graph,
    methods_definition,
    unknown_trigger,
)
from runner.flow.state import dump_state, jsonable, with_id
from runner.store.base import CheckpointStore
from runner.store.models import UsageMetrics
from runner.store.persistence import store_of

StateT = TypeVar("StateT", bound=BaseModel | dict[str, Any])

_STATE_TYPE_ATTR = "__runner_state_type__"
_STATE_PARAM_ATTR = "__runner_state_param__"
_PARAMETRIZED_ATTR = "__runner_parametrized__"
_UNKNOWN: Any = object()


EARLY = 2.0
"""Seconds a step woken before its recorded wake-up time sleeps the rest in place (the
clocks of two workers may differ a little); woken earlier, it waits for the wake-up again."""


class Flow(ConversationalFlow, Generic[StateT]):
    """Subclass with ``@start``/``@listen``/``@router`` methods over a state.

    The state is the generic parameter (``Flow[MyState]``: a pydantic model, given an
    ``id`` field if it has none, or ``dict``) or ``initial_state`` (a model class, a model,
    or a dict). ``Flow[MyState]`` is a real subclass of ``Flow``, so ``type(name,
    (Flow[MyState],), namespace)`` and ``types.new_class`` work as a class statement does.
    """

    initial_state: ClassVar[Any] = None
    name: ClassVar[str | None] = None
    checkpoint: ClassVar[CheckpointConfig | bool | None] = None
    strict: ClassVar[bool] = False
    input_provider: ClassVar[Any] = None
    """Where ``ask`` sends its questions (an :class:`~runner.flow.input_provider.InputProvider`;
    also settable per flow object); ``None``: ``flow_config.input_provider``, else the console
    in process and a durable pause on workers."""
    stream: ClassVar[bool] = False
    """CrewAI's switch: ``kickoff()`` returns a stream session of the run's frames (see
    :mod:`runner.flow.streaming`) instead of the result, ``kickoff_async()`` an async one.
    Every run's steps stream with ``self.stream_chunk`` whatever it says."""
    run_deadline: ClassVar[float | None] = None
    """Seconds a run on workers may take before it is cancelled (``submit(deadline=)``
    overrides it); ``None``: no deadline."""
    """Refuse (rather than warn about) a listener of a trigger nothing emits."""

    def __class_getitem__(cls, item: Any) -> Any:
        if isinstance(item, TypeVar) or (isinstance(item, tuple) and len(item) != 1):
            return super().__class_getitem__(item)  # type: ignore[misc]
        return _parametrized(cls, item[0] if isinstance(item, tuple) else item)

    def __init__(
        self,
        persistence: Any = None,
        checkpoint: CheckpointConfig | bool | None = None,
        listeners: list[Any] | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> None:
        if strict if strict is not None else type(self).strict:
            graph = compile_graph(type(self), warn=False)
            if graph.unknown_triggers:
                raise unknown_trigger(graph)
        self._persistence = persistence
        self._checkpoint = checkpoint if checkpoint is not None else type(self).checkpoint
        self._listeners = list(listeners or [])
        self._pending_restore: CheckpointConfig | str | None = None
        self._state_json: dict[str, Any] | None = None
        self._state_obj: Any = None
        self._fresh_id = False
        """The state's id was made up for this object (no run can have it yet)."""
        self._method_outputs: list[Any] = []
        self._usage = UsageMetrics()
        self._transient = False
        """The current in-process run keeps no checkpoints (see :meth:`_dump_state`)."""
        self._input_history: list[dict[str, Any]] = []
        """What ``ask`` asked and was answered, in order (CrewAI's record of them)."""
        self.human_feedback_history: list[reviewing.HumanFeedbackResult] = []
        """The ``@human_feedback`` reviews this flow object saw, in order (CrewAI's)."""
        self.last_human_feedback: reviewing.HumanFeedbackResult | None = None
        """The latest of them."""
        self._feedback_pending: reviewing.HumanFeedbackPending | None = None
        """What a provider raised to pause the current in-process run (kickoff returns it)."""
        self._feedback_checkpoint: Any = None
        self._turn: conversation.Turn | None = None
        """The conversational turn the current in-process run opens (``handle_turn``, or a
        kickoff's ``user_message`` input): its message goes into the state it starts from."""
        self._streaming = False
        """The checkpoint paused for a review that :meth:`resume` answers."""
        init = kwargs.pop("initial_state", type(self).initial_state)
        self._model = _model_of(init) if init is not type(self).initial_state else None
        self._state = self._initial_state(init)
        for key, value in kwargs.items():
            setattr(self, key, value)

    # -- state -----------------------------------------------------------------------------

    @property
    def state(self) -> StateT:
        """The state: inside a running method its own copy, else the flow's."""
        ctx = step_context()
        return ctx.state if ctx is not None and ctx.state is not None else self._state

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
    def flow_definition(cls) -> FlowDefinition:
        """This flow as data (CrewAI's ``FlowDefinition``, ``schema: crewai.flow/v1``): its
        methods with their start/listen/router conditions and emits, its state schema with
        defaults and its config; ``.to_yaml()`` / ``.to_json()`` serialise it. The graph,
        ``runner graph`` and the fingerprint derive from its methods part."""
        found = class_definition(cls, methods_definition(cls))
        block = conversation.block_of(cls)
        if found.conversational is None and block is not None:
            made = FlowConversationalDefinition.model_validate(block)
            found = found.model_copy(update={"conversational": made})
        return found

    def plot(self, filename: str = "crewai_flow.html", show: bool = True) -> str:
        """Write this flow's picture as an HTML page (CrewAI's ``plot``), drawn from its
        definition; open it in a browser when ``show``. Returns the page's absolute path."""
        from runner.flow.visualization import build_flow_structure, visualize_flow_structure

        return visualize_flow_structure(build_flow_structure(self), filename, show=show)

    @classmethod
    def from_declaration(
        cls,
        contents: Any = None,
        *,
        path: str | Path | None = None,
        **kwargs: Any,
    ) -> Flow[Any]:
        """A flow object made from a definition (CrewAI's): ``contents`` is a
        :class:`FlowDefinition`, a dict, YAML/JSON text or a :class:`~pathlib.Path`, or
        ``path`` names a YAML/JSON file. It runs as a class flow does, in process
        (``kickoff``) and on workers (``type(flow).submit(...)``), each method a step; the
        run records the definition. Bad input is one line naming the field's path."""
        assert EXECUTORS.declare is not None, "runner/__init__.py plugs it in"
        flow: Flow[Any] = EXECUTORS.declare(contents, path=path)(**kwargs)
        return flow

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
        found = _model_of(cls.initial_state)
        if found is not None or cls.initial_state is not None:
            return found
        for klass in cls.__mro__:
            param = klass.__dict__.get(_STATE_PARAM_ATTR, _UNKNOWN)
            if param is not _UNKNOWN:
                return _model_of(param)
            for base in klass.__dict__.get("__orig_bases__", ()):
                if get_origin(base) is Flow:
                    args = get_args(base)
                    return _model_of(args[0]) if args else None
        # A conversational flow that declares no state holds the conversation (CrewAI's).
        return _model_of(ConversationState) if conversation.is_conversational(cls) else None

    def _state_model(self) -> type[BaseModel] | None:
        """This flow's state model: from an ``initial_state`` given to it, else its class's."""
        return self._model if self._model is not None else type(self).state_type()

    def _initial_state(self, init: Any) -> Any:
        model = self._state_model()
        if isinstance(init, BaseModel):
            # A model without an id becomes its with-id subclass, sharing its values.
            copied = init.model_copy(deep=True)
            state: Any = copied if type(copied) is model else model(**dict(copied))  # type: ignore[misc]
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
        else:
            made_here = not isinstance(init, BaseModel) and "id" not in state.model_fields_set
            factory = type(state).model_fields["id"].default_factory
            self._fresh_id = made_here and factory is not None
        return state

    def _state_from_json(self, data: dict[str, Any]) -> Any:
        """A state object made from JSON ``data``; it shares no list or dict with ``data``."""
        model = self._state_model()
        fresh = json_copy(data)
        if model is None:
            kind = type(self._state_obj)
            return fresh if kind is dict or not issubclass(kind, dict) else kind(fresh)
        try:
            return model.model_validate(fresh)
        except ValidationError as exc:
            raise InvalidInputs(
                f"Invalid inputs: {_one_line(exc)}", flow=type(self).__name__
            ) from None

    def _set_state(self, data: dict[str, Any]) -> None:
        """Make committed JSON ``data`` the flow's state (built into an object when read)."""
        self._state_json = data

    def _dump(self) -> dict[str, Any]:
        if self._state_json is not None:
            return json_copy(self._state_json)
        return self._dump_state(self._state)

    def _dump_state(self, state: Any) -> dict[str, Any]:
        """``state`` as JSON; a value with no JSON form is an error (naming its field) only
        when the run keeps checkpoints, as in CrewAI, where only persisting needs JSON."""
        return dump_state(state, strict=not self._transient)

    def _output_json(self, value: Any, method: str) -> Any:
        """A method's output as JSON, by the rule of :meth:`_dump_state`: an output with no
        JSON form is an error only when the run keeps checkpoints; a run that keeps none
        (in process, nothing persisting) passes the object on as it is, as CrewAI does."""
        if self._transient:
            return jsonable(value, strict=False)
        return to_json(value, method)

    def _sink(self) -> Sink:
        return type(self).checkpoint_sink(self._checkpoint, self._persistence)

    @classmethod
    def checkpoint_sink(cls, checkpoint: CheckpointConfig | bool | None, persistence: Any) -> Sink:
        """Where a run of this class writes its checkpoints: the flow object's ``checkpoint``
        config (the one it was given, else the class's) and ``persistence``; a checkpoint
        config wins over ``@persist``. Override it to write elsewhere (a crew's flow does)."""
        return sink_for(cls, persistence, checkpoint)

    # -- what the methods returned -----------------------------------------------------------

    @property
    def method_outputs(self) -> list[Any]:
        """The outputs of the methods the last kickoff ran, in the order they finished."""
        return list(self._method_outputs)

    @property
    def usage_metrics(self) -> UsageMetrics:
        """What LLM calls spent in this flow's last kickoff or resume (a copy; CrewAI's).

        Summed over its steps and the runs they ran (crews): what the ``Agent`` and
        ``runner.record_usage`` recorded. Inside a running step it includes what that step
        recorded so far. On workers a run's sums are in its checkpoints (``meta.usage``)."""
        spent = self._usage.model_copy()
        ctx = step_context()
        live = usage.running_spend() if ctx is not None and ctx.runs(self) else None
        if live is not None:
            spent.add_usage_metrics(live)
        return spent

    def _record_output(self, method: str, output: Any) -> None:
        """Told by the in-process run each time ``method`` finished with ``output``."""
        self._method_outputs.append(reviewing.as_output(getattr(type(self), method, None), output))

    def _step_argument(self, activation: Any, arg: Any) -> Any:
        """What a step taking an argument receives: its trigger's committed output, as the
        trigger gave it (a reviewed method's ``HumanFeedbackResult``)."""
        trigger = activation.trigger
        if trigger is None or trigger not in type(self).graph().methods:
            return arg
        return reviewing.as_output(getattr(type(self), trigger, None), arg)

    def run_crew(self, crew: Any, inputs: dict[str, Any] | None = None) -> Any:
        """Run ``crew`` as a child run of this method; return it as the method's output.

        In process the crew runs inline; on workers it is a child run and this method
        completes when the child succeeds, without a worker waiting for it.
        """
        run_as_child = getattr(crew, "run_as_child", None)
        if not callable(run_as_child):
            raise DefinitionError(f"run_crew takes a Crew, not {crew!r}")
        return run_as_child(self, inputs)

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the new branch of the change ``change_id``: ``True`` when
        the run reaches this point first on code that has the patch, ``False`` when the step
        re-runs code it passed before without it (before the ``ask`` or sleep it paused at).
        The decision is recorded in the run, so every later re-run decides the same
        (:mod:`runner.flow.patches`; Temporal's ``workflow.patched``)."""
        return patching.patched(self, change_id)

    def deprecate_patch(self, change_id: str) -> bool:
        """Say that ``change_id``'s old branch is gone (no waiting run needs it any more;
        ``runner check-deploy`` tells): returns ``True``, recorded as ``patched`` would."""
        return patching.deprecate(self, change_id)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; on workers, durably and holding no worker.

        On workers the step commits its state so far and stops; the run records the
        wake-up time, and after it the step runs again on whichever worker is alive,
        **from the start of the method**, this call (the method's same, N-th, sleep) now
        returning at once. So the code before a sleep runs again after it: keep it
        idempotent, or sleep first. In process (``kickoff``) it simply sleeps.
        """
        wake_at = self._wake_time(seconds)
        if wake_at is not None:
            time.sleep(max(wake_at - time.time(), 0.0))

    async def asleep(self, seconds: float) -> None:
        """``sleep`` for async methods: durable on workers, ``asyncio.sleep`` in process."""
        wake_at = self._wake_time(seconds)
        if wake_at is not None:
            await asyncio.sleep(max(wake_at - time.time(), 0.0))

    def _wake_time(self, seconds: float) -> float | None:
        """When the sleep ends if it is to be slept here (in process, or a recorded sleep
        about to end), ``None`` for a recorded sleep that is over, else
        :class:`~runner.errors.SleepRun` (the step stops here)."""
        from runner.errors import SleepRun

        if not seconds >= 0:
            raise ValueError(f"sleep takes seconds >= 0, not {seconds!r}")
        ctx = step_context()
        if ctx is None or not ctx.on_worker:
            return time.time() + seconds
        sleeps = ctx.sleeps
        index = sleeps.calls
        sleeps.calls += 1
        if index < len(sleeps.recorded):
            left = sleeps.recorded[index] - time.time()
            if left <= EARLY:
                return None if left <= 0 else sleeps.recorded[index]
            raise SleepRun(sleeps.recorded[index], index)  # woken early: sleep on till then
        raise SleepRun(time.time() + seconds, index)

    def ask(
        self,
        message: str,
        timeout: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str | None:
        """Ask a person ``message`` and return the answer (``None``: none within ``timeout``
        seconds, or none at all). In process the flow's input provider asks (the console by
        default); on workers, without a provider of the flow's, the run pauses durably until
        it is answered (or ``timeout`` passes) and the method then runs again from its start,
        this N-th ``ask`` returning the N-th answer: see :mod:`runner.flow.input_provider`."""
        return asking.ask(self, message, timeout, metadata)

    def _resolve_input_provider(self) -> asking.InputProvider:
        """The provider ``ask`` uses in process (CrewAI's resolution order)."""
        return asking.resolve_provider(self) or asking.ConsoleProvider()

    # -- @human_feedback: a run paused for a person's review ---------------------------------

    @property
    def pending_feedback(self) -> reviewing.PendingFeedbackContext | None:
        """The review this flow object's run waits on (after a pause or ``from_pending``)."""
        ckpt = self._feedback_checkpoint
        return None if ckpt is None else reviewing.PendingFeedbackContext.of(ckpt)

    @property
    def persistence(self) -> Any:
        """The persistence this flow object was given (or took for a pause; CrewAI's)."""
        return self._persistence

    @classmethod
    def from_pending(
        cls, flow_id: str, persistence: Any = None, *, definition: Any = None, **kwargs: Any
    ) -> Flow[Any]:
        """A flow holding run ``flow_id``, paused for a review, with its state: ``resume``
        it with the feedback. ``persistence`` is where it was kept (default: the flow's
        checkpoint store, else the default persistence); a run that waits for no review
        is :class:`~runner.errors.NoPendingFeedback` (a ``ValueError``). ``definition``
        (CrewAI's): the run is of the flow made from that definition."""
        if definition is not None:
            assert EXECUTORS.declare is not None, "runner/__init__.py plugs it in"
            declared: Any = EXECUTORS.declare(definition)
            return declared.from_pending(flow_id, persistence, **kwargs)
        flow = cls(persistence=persistence, **kwargs)
        found, kept_in = reviewing.find_pending(flow_id, persistence, flow._sink().store)
        if flow._persistence is None and flow._sink().store is None:
            flow._persistence = kept_in  # the run goes on where it was kept
        flow._set_state(found.state)
        flow._feedback_checkpoint = found
        return flow

    def resume(self, feedback: str = "") -> Any:
        """Answer the review the run waits on with ``feedback`` and run the flow on in this
        process: the reviewed method does not run again; its result (and, with ``emit``, the
        label ``feedback`` comes to) decides what runs next. Returns what ``kickoff`` would:
        the last output, or a new :class:`~runner.flow.human_feedback.HumanFeedbackPending`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._answer_review(feedback)
        raise RuntimeError(
            "resume() cannot be called from within an async context; "
            "use 'await flow.resume_async(feedback)'"
        )

    async def resume_async(self, feedback: str = "") -> Any:
        """``resume`` without blocking the event loop."""
        return await asyncio.to_thread(self._answer_review, feedback)

    def _answer_review(self, feedback: str) -> Any:
        paused = self._feedback_checkpoint
        if paused is None or paused.meta.human.awaiting is None:
            raise reviewing.NoPendingFeedback(
                "No pending feedback context: this flow waits for no review "
                "(use Flow.from_pending(flow_id, persistence))"
            )
        self._feedback_checkpoint = None
        reviewing.check_still_pending(self._sink().store, paused)
        if self._persistence is not None and store_of(self._persistence) is None:
            self._persistence.clear_pending_feedback(paused.run_id)  # a CrewAI-style backend
        warn_unhonoured(type(self), self.graph(), stacklevel=4)
        self._method_outputs = []
        self._usage = UsageMetrics()
        self._transient = not self._sink().persists
        given = reviewing.Answer(text=feedback, awaited=paused.meta.human.awaiting)
        assert EXECUTORS.answer_in_process is not None, "runner/__init__.py plugs it in"
        try:
            return EXECUTORS.answer_in_process(self, paused, given)
        finally:
            self._transient = False

    def _request_human_feedback(
        self,
        message: str,
        output: Any,
        metadata: dict[str, Any] | None = None,
        emit: Any = None,
        method_name: str = "",
    ) -> str:
        """Ask on the terminal for feedback on ``output`` (a review with no provider, in
        process)."""
        context = reviewing.PendingFeedbackContext(
            flow_id=self.flow_id,
            flow_class=self.flow_path(),
            method_name=method_name,
            method_output=output,
            message=message,
            emit=list(emit) if emit is not None else None,
            metadata=dict(metadata or {}),
        )
        return asking.ConsoleProvider().request_feedback(context, self)

    def _collapse_to_outcome(self, feedback: str, outcomes: Any, llm: Any) -> str:
        """The one of ``outcomes`` that ``llm`` reads ``feedback`` as."""
        return reviewing.collapse(feedback, list(outcomes), llm)

    def stream_chunk(self, content: Any, channel: str = "tokens") -> None:
        """Append ``content`` (text or JSON) to this run's live stream on ``channel`` (e.g.
        ``"tokens"``, ``"progress"``); readers see it while the step runs (see
        :mod:`runner.flow.streaming`). Does nothing outside a step."""
        streaming.stream_chunk(content, channel)

    def stream_from(self, chunks: Any, channel: str = "tokens") -> str:
        """Stream every chunk of an iterator (an LLM's ``stream=True`` answer, LangChain's
        ``.stream``, any iterator of text) and return the full text."""
        return streaming.stream_from(chunks, channel)

    def pause(self, reason: str = "waiting for input") -> NoReturn:
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
        """Run the flow in this process and return the last method's output.

        ``from_checkpoint`` is a :class:`CheckpointConfig`, a checkpoint file (or SQLite
        ``<file>#<id>``), or a checkpoint or run id in the flow's store.
        """
        if from_checkpoint is not None and restore_from_state_id is not None:
            raise ValueError(
                "pass either from_checkpoint or restore_from_state_id, not both: "
                "from_checkpoint resumes a checkpoint, restore_from_state_id forks a state"
            )
        restore = (
            _restore_point(from_checkpoint)
            if from_checkpoint is not None
            else self._pending_restore
        )
        self._pending_restore = None
        if type(self).stream and not getattr(self, "_streaming", False):
            return self._stream_session(
                streaming.FlowStreamSession, inputs, restore, restore_from_state_id, strict
            )
        inputs = dict(inputs or {})
        own_turn = (
            self._turn is None
            and conversation.USER_MESSAGE in inputs
            and conversation.is_conversational(type(self))
        )
        if own_turn:
            # CrewAI's kickoff(inputs={"user_message": ...}) runs a turn with that message.
            self._turn = conversation.Turn(inputs.pop(conversation.USER_MESSAGE))
        bind_trigger_payload(self, inputs)
        warn_unhonoured(type(self), self.graph())
        self._method_outputs = []
        self._usage = UsageMetrics()
        self._transient = restore is None and not self._sink().persists
        assert EXECUTORS.in_process is not None, "runner/__init__.py plugs in the executors"
        try:
            return EXECUTORS.in_process(self, inputs, restore, restore_from_state_id, strict)
        finally:
            self._transient = False
            if own_turn:
                self._turn = None

    def _stream_session(
        self,
        session: type[streaming.FlowStreamSession],
        inputs: dict[str, Any] | None,
        restore: Any,
        restore_from_state_id: str | None,
        strict: bool,
    ) -> streaming.FlowStreamSession:
        def run() -> Any:
            self._streaming = True
            self._pending_restore = restore
            try:
                return self.kickoff(inputs, None, restore_from_state_id, strict)
            finally:
                self._streaming = False

        return session(self, run)

    async def kickoff_async(
        self,
        inputs: dict[str, Any] | None = None,
        from_checkpoint: CheckpointConfig | str | None = None,
        restore_from_state_id: str | None = None,
        strict: bool = False,
    ) -> Any:
        """``kickoff`` without blocking the event loop."""
        if type(self).stream and not getattr(self, "_streaming", False):
            if from_checkpoint is not None and restore_from_state_id is not None:
                return self.kickoff(inputs, from_checkpoint, restore_from_state_id, strict)
            restore = (
                _restore_point(from_checkpoint)
                if from_checkpoint is not None
                else self._pending_restore
            )
            self._pending_restore = None
            return self._stream_session(
                streaming.AsyncFlowStreamSession, inputs, restore, restore_from_state_id, strict
            )
        return await asyncio.to_thread(
            self.kickoff, inputs, from_checkpoint, restore_from_state_id, strict
        )

    akickoff = kickoff_async

    @classmethod
    def submit(cls, inputs: dict[str, Any] | None = None, **options: Any) -> Any:
        """Run this flow on Celery workers; returns a :class:`RunHandle`. ``options`` are
        :func:`runner.submit`'s (``id``, ``if_exists``)."""
        assert EXECUTORS.on_workers is not None, "runner/__init__.py plugs in the executors"
        return EXECUTORS.on_workers(cls, inputs, **options)

    @classmethod
    def from_checkpoint(
        cls, config: CheckpointConfig | str | Path, *, definition: Any = None, **kwargs: Any
    ) -> Flow[Any]:
        """A flow holding the state of the checkpoint ``config`` names (its id and fields,
        to inspect before resuming, as in CrewAI) that, on ``kickoff()``, resumes that
        checkpoint's run, skipping completed methods. A missing checkpoint is
        :class:`~runner.errors.CheckpointNotFound` here, not at the kickoff. ``definition``
        (CrewAI's): the run is of the flow made from that definition."""
        if definition is not None:
            assert EXECUTORS.declare is not None, "runner/__init__.py plugs it in"
            declared: Any = EXECUTORS.declare(definition)
            return declared.from_checkpoint(config, **kwargs)
        flow = cls(**kwargs)
        restore = _restore_point(config)
        if isinstance(restore, CheckpointConfig) and flow._checkpoint is None:
            flow._checkpoint = restore
        flow._set_state(load_restore_point(restore_sink(flow._sink(), restore), restore).state)
        flow._pending_restore = restore
        return flow


_parametrized_lock = threading.Lock()


def _parametrized(cls: type, param: Any) -> type:
    """``cls[param]`` as a real subclass of ``cls`` carrying the state type (made once)."""
    with _parametrized_lock:
        made: dict[Any, type] = cls.__dict__.get(_PARAMETRIZED_ATTR) or {}
        if _PARAMETRIZED_ATTR not in cls.__dict__:
            setattr(cls, _PARAMETRIZED_ATTR, made)
        try:
            found = made.get(param)
        except TypeError:  # an unhashable parameter: made anew each time
            found = None
        if found is None:
            label = getattr(param, "__name__", repr(param))
            found = type(
                f"{cls.__name__}[{label}]",
                (cls,),
                {
                    "__module__": cls.__module__,
                    "__qualname__": f"{cls.__qualname__}[{label}]",
                    "__doc__": cls.__doc__,
                    _STATE_PARAM_ATTR: param,
                },
            )
            with contextlib.suppress(TypeError):
                made[param] = found
        return found


def _model_of(state: Any) -> type[BaseModel] | None:
    """The state model a state parameter or ``initial_state`` names (with an ``id``), if any."""
    if isinstance(state, type) and issubclass(state, BaseModel):
        return with_id(state)
    if isinstance(state, BaseModel):
        return with_id(type(state))
    return None


def _restore_point(ref: CheckpointConfig | str | Path) -> CheckpointConfig | str:
    """A restore reference as ``kickoff`` takes it: a checkpoint file (or SQLite
    ``<file>#<id>``) becomes a config that also knows where the run's history is."""
    if isinstance(ref, CheckpointConfig):
        return ref
    text = str(ref)
    if Path(text).is_file() or Path(text.rpartition("#")[0]).is_file():
        return CheckpointConfig(restore_from=text)
    return text


def _get_id(state: Any) -> Any:
    return state["id"] if isinstance(state, dict) else state.id


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "state"
        parts.append(f"{where}: {err['msg']}")
    return "invalid inputs: " + "; ".join(parts)


# -- the engine's seam: what executors and crews do to a flow object --------------------------


def apply_inputs(
    flow: Flow[Any], inputs: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Make ``base`` (JSON; by default the flow's state) with ``inputs`` on top the flow's
    state, validated by its model (:class:`~runner.errors.InvalidInputs`); return it as
    JSON. The one way inputs reach a state: a kickoff, a resume, a submit, a fork."""
    start = flow._dump() if base is None else base
    flow._state = flow._state_from_json({**start, **inputs})
    return flow._dump()


def state_json(flow: Flow[Any]) -> dict[str, Any]:
    """The flow's state as JSON (a copy)."""
    return flow._dump()


def set_usage_metrics(flow: Flow[Any], spent: UsageMetrics) -> None:
    """Tell the flow object what its run spent since its latest start or resume."""
    flow._usage = spent


def listeners_of(flow: Flow[Any]) -> list[EventListener]:
    """The event listeners the flow object was given."""
    return flow._listeners


def checkpoint_store(flow: Flow[Any]) -> CheckpointStore | None:
    """The store the flow object's runs write full checkpoints to, or ``None``."""
    return flow._sink().store


def bind_trigger_payload(flow: Flow[Any], inputs: dict[str, Any]) -> None:
    """Take ``crewai_trigger_payload`` out of ``inputs`` (it is not state) and hand it to
    the flow's methods declaring a parameter of that name, as CrewAI does; ``None`` when
    the inputs have none."""
    given = TRIGGER_PAYLOAD in inputs
    payload = inputs.pop(TRIGGER_PAYLOAD, None)
    for spec in type(flow).graph().methods.values():
        if not spec.trigger_payload:
            continue
        if given:
            bound = getattr(type(flow), spec.name).__get__(flow)
            flow.__dict__[spec.name] = functools.partial(bound, **{TRIGGER_PAYLOAD: payload})
        else:
            flow.__dict__.pop(spec.name, None)
