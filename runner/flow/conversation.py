"""Conversational flows (CrewAI's ``conversational = True``): chat turns over a flow.

A conversational flow's state holds the conversation (``messages``; :class:`ConversationState`
by default, CrewAI's older :class:`ChatState` also works). One *turn* is one run of the flow
for the same session id (``state.id``): the user's message is appended to the state before
the run's first checkpoint (:func:`open_turn`), the built-in start router
``route_conversation`` picks a route (``route_turn``, intents, else ``converse``), and the
route's listener answers (``append_assistant_message``). Because the message is in the
state the turn's first checkpoint holds, a turn is as durable as any run: in process each
turn restarts the session's run (CrewAI's ``kickoff(inputs={"id": ...})``); on workers each
turn is a new epoch of the same run (``RunHandle.turn``, :mod:`runner.distributed.turns`),
so the history survives any worker.

What the user calls (CrewAI's names): ``handle_turn(message, session_id=)``,
``stream_turn(...)`` (the turn's :class:`~runner.flow.streaming.StreamFrame` objects), ``chat()``
(a terminal loop ending on :data:`EXIT_COMMANDS`), ``route_turn(context)`` (override to route),
``append_assistant_message``, ``append_message``, ``conversation_messages``,
``receive_user_message``, ``classify_intent``. ``ConversationConfig(default_intents=...,
intent_llm=...)`` classifies each message into an intent (the route); an LLM given by name
resolves as every LLM name does (:mod:`runner.flow.llm`).

LLM calls are CrewAI's: a client whose ``.call`` takes chat messages (CrewAI's ``LLM``, any
``BaseLLM``) is called ``call(messages=[...])`` (the router also passes ``response_format``);
any other client (``.call(prompt)``, ``.invoke``, a callable, a name registered for one) is
given the messages as one prompt, a ``role: content`` line each
(:func:`~runner.flow.llm.call_chat`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict, TypeVar, cast
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, create_model

from runner.errors import InvalidInputs
from runner.flow import events, streaming
from runner.flow.conditions import leaves
from runner.flow.decorators import CONVERSATIONAL_ONLY, listen, router, start
from runner.flow.llm import call_chat, llm_problem

log = logging.getLogger(__name__)

EXIT_COMMANDS: tuple[str, ...] = ("exit", "quit")
"""What ends ``chat()`` and ``runner chat`` (any case), as in CrewAI; so does end of input."""

USER_MESSAGE = "user_message"
"""The kickoff/submit input that carries a turn's message (CrewAI's ``ConversationalInputs``)."""

BUILTIN_ROUTES: tuple[str, ...] = ("converse", "end")
INTERNAL_ROUTES: tuple[str, ...] = ("answer_from_history",)
ENDED_REPLY = "Conversation ended."
FROM_HISTORY_PROMPT = (
    "Answer the user's latest message from the conversation history alone, when it holds "
    "the answer (a follow-up, a summary, a clarification)."
)
NO_LLM_REPLY = "I can continue the conversation once an LLM is configured."
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant in an ongoing conversation. Keep the earlier turns in mind, "
    "answer from what was already said where you can, be clear and brief, and ask when the "
    "user's request is unclear."
)
"""The ``converse`` route's system prompt when the config sets none (CrewAI gives one too);
``system_prompt=""`` sends none."""
ROUTER_INSTRUCTION = (
    "Choose exactly one route from the list above for the latest user message. Prefer "
    "'converse' for follow-ups, summaries and clarifications of earlier turns, even on a "
    "topic a custom route handled before; take a custom route only for a fresh request "
    "for what it does."
)

Role = Literal["user", "assistant", "system", "tool"]
F = TypeVar("F", bound=Callable[..., Any])


def conversational_only(fn: F) -> F:
    """Make ``fn`` a step only of conversational flows."""
    setattr(fn, CONVERSATIONAL_ONLY, True)
    return fn


# -- the state shapes ----------------------------------------------------------------------


class ConversationMessage(BaseModel):
    """One message of the history a user sees."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    role: Role
    content: str | list[dict[str, Any]] | None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    files: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class AgentMessage(BaseModel):
    """An agent's private message or scratch result."""

    role: str = "assistant"
    content: Any
    metadata: dict[str, Any] = Field(default_factory=dict)


class ConversationEvent(BaseModel):
    """Something that happened in a turn, apart from the messages the user sees."""

    type: str
    payload: dict[str, Any] = Field(default_factory=dict)
    agent_name: str | None = None
    visibility: Literal["private", "public"] = "private"
    message_index: int | None = None
    """Where in ``messages`` it happened: the index of the latest message then (the turn's
    user message), so a turn can tell its own events from earlier ones."""


class ConversationState(BaseModel):
    """The state of a conversational flow (the default when the flow declares none)."""

    id: str = Field(default_factory=lambda: str(uuid4()))
    messages: list[ConversationMessage] = Field(default_factory=list)
    current_user_message: str | None = None
    last_user_message: str | None = None
    last_intent: str | None = None
    ended: bool = False
    events: list[ConversationEvent] = Field(default_factory=list)
    agent_threads: dict[str, list[AgentMessage]] = Field(default_factory=dict)
    session_ready: bool = False


class ChatState(BaseModel):
    """CrewAI's earlier state shape for multi-turn flows (``crewai.flow.conversation``)."""

    id: str = Field(default_factory=lambda: str(uuid4()))
    messages: list[dict[str, Any]] = Field(default_factory=list)
    last_user_message: str | None = None
    last_intent: str | None = None
    session_ready: bool = False


class ConversationalInputs(TypedDict, total=False):
    """The kickoff/submit inputs of a turn (CrewAI's): the session's ``id`` and the
    ``user_message``."""

    id: str
    user_message: str | dict[str, Any]
    last_intent: str


# -- configuration -------------------------------------------------------------------------


@dataclass
class RouterConfig:
    """The LLM router of a conversational flow: which route a message takes. ``llm``
    (else the config's ``intent_llm``, else its ``llm``) is asked to name one of the routes
    (the flow's listened-to labels, or ``routes``, and the built-in ones): a system message
    (``prompt``, then the route catalog, each route with its description) and a user
    message (the router context as JSON). A client taking chat messages is also given
    ``response_format`` (default: a model with one ``intent_field``); the intent is read
    from the reply (a model, a dict, JSON or the bare label). A reply naming no route, or a
    failing call, takes ``fallback_intent``."""

    prompt: str | None = None
    response_format: type[BaseModel] | None = None
    llm: Any | None = None
    routes: Sequence[str] | None = None
    route_descriptions: dict[str, str] | None = None
    default_intent: str | None = "converse"
    fallback_intent: str | None = "converse"
    intent_field: str = "intent"


@dataclass
class ConversationConfig:
    """A conversational flow's settings (CrewAI's ``crewai.experimental.ConversationConfig``):
    set as the class's ``conversational_config``, or decorate the class with it (which also
    sets ``conversational = True``). LLMs are clients or names (:mod:`runner.flow.llm`)."""

    system_prompt: str | None = None
    llm: Any | None = None
    router: RouterConfig | None = None
    answer_from_history_prompt: str | None = None
    default_intents: Sequence[str] | None = None
    intent_llm: Any | None = None
    answer_from_history_llm: Any | None = None
    visible_agent_outputs: Sequence[str] | Literal["all"] | None = None
    defer_trace_finalization: bool = True

    def __call__(self, flow_cls: type[Any]) -> type[Any]:
        flow_cls.conversational_config = self
        flow_cls.conversational = True
        return flow_cls


@dataclass
class ConversationalConfig:
    """CrewAI's earlier class-level defaults (``crewai.flow.conversation``): intents and
    the terminal loop's prompt and exit commands."""

    default_intents: Sequence[str] | None = None
    intent_llm: Any | None = None
    interactive_prompt: str = "You: "
    interactive_timeout: float | None = None
    exit_commands: Sequence[str] = field(default_factory=lambda: EXIT_COMMANDS)
    defer_trace_finalization: bool = True


# -- pure helpers over a state's JSON --------------------------------------------------------


def is_conversational(flow_cls: Any) -> bool:
    """Whether ``flow_cls`` is a conversational flow."""
    return bool(getattr(flow_cls, "conversational", False))


def refuse_unless_conversational(flow_cls: Any, what: str) -> None:
    """:class:`InvalidInputs` naming ``what`` when ``flow_cls`` is no conversational flow."""
    if not is_conversational(flow_cls):
        # A method's refusal reads as CrewAI's ("Flow.chat() is only available on ...").
        subject = f"Flow.{what}" if what.endswith("()") else what
        raise InvalidInputs(
            f"{subject} is only available on conversational flows; "
            f"{flow_cls.flow_name()} is not one (set conversational = True on it)",
            flow=flow_cls.flow_name(),
        )


def message_text(message: Any) -> str:
    """A user message as text (a ``{"content": ...}`` dict gives its content)."""
    if isinstance(message, str):
        return message
    if isinstance(message, Mapping) and message.get("content") is not None:
        return str(message["content"])
    return str(message)


def intent_of(reply: Any, field_name: str = "intent") -> str | None:
    """The route a router's reply names: its ``field_name`` (a model's attribute, a dict's
    key, a JSON object's key), else a text reply itself; an enum gives its value."""
    if isinstance(reply, str):
        try:
            parsed = json.loads(reply)
        except ValueError:
            value: Any = reply.strip()
        else:
            value = parsed.get(field_name) if isinstance(parsed, dict) else reply.strip()
    elif isinstance(reply, Mapping):
        value = reply.get(field_name)
    else:
        value = getattr(reply, field_name, None)
    if value is None:
        return None
    return str(value.value) if isinstance(value, Enum) else str(value)


def reply_text(result: Any) -> str:
    """A turn's result as the text shown (a crew output's ``raw``)."""
    raw = getattr(result, "raw", None)
    if isinstance(raw, str):
        return raw
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    return "" if result is None else str(result)


def _fields(flow_cls: Any) -> set[str] | None:
    model = flow_cls.state_type()
    return None if model is None else set(model.model_fields)


def _set(state: dict[str, Any], fields: set[str] | None, name: str, value: Any) -> None:
    if fields is None or name in fields:
        state[name] = value


def answered(messages: Sequence[Any]) -> bool:
    """Whether an assistant message follows the last user message."""
    for message in reversed(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role == "assistant":
            return True
        if role == "user":
            return False
    return False


def route_labels(flow_cls: Any) -> set[str]:
    """The labels a turn's routing produces (none of them is a reply)."""
    return {*BUILTIN_ROUTES, *INTERNAL_ROUTES, "conversation", "route_to_flow"} | set(
        custom_routes(flow_cls.graph())
    )


def custom_routes(graph: Any) -> list[str]:
    """The labels a conversational flow's own listeners listen to (beyond the built-ins)."""
    found: set[str] = set()
    for spec in graph.methods.values():
        if spec.condition is not None and not spec.is_router:
            found.update(leaf for leaf in leaves(spec.condition) if leaf not in graph.methods)
    return sorted(found - set(BUILTIN_ROUTES) - set(INTERNAL_ROUTES))


def is_public_reply(flow_cls: Any, result: Any, state: Mapping[str, Any]) -> bool:
    """Whether a turn's result is something to say: text (or a crew output's ``raw``) that is
    no route label and not an agent result this turn recorded as private (a handler that
    records its scratch work privately and returns it keeps it private; a different
    summary it returns is still said)."""
    raw = getattr(result, "raw", None)
    text = result if isinstance(result, str) else raw if isinstance(raw, str) else None
    if text is None:
        return False
    if text in route_labels(flow_cls) or text == state.get("last_intent"):
        return False
    return text not in private_results(state)


def private_results(state: Mapping[str, Any]) -> set[str]:
    """The contents of the agent results recorded as private since the latest user message
    (this turn's), from a state's ``events`` and ``messages`` (models or their JSON)."""
    messages = state.get("messages") or []
    turn = max((i for i, m in enumerate(messages) if _field(m, "role") == "user"), default=-1)
    found: set[str] = set()
    for event in state.get("events") or []:
        index = _field(event, "message_index")
        if (
            _field(event, "type") == "agent_result"
            and _field(event, "visibility") == "private"
            and index is not None
            and index >= turn
        ):
            found.add(str((_field(event, "payload") or {}).get("content")))
    return found


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def open_turn(
    flow_cls: Any, state: dict[str, Any], message: Any, previous_result: Any = None
) -> dict[str, Any]:
    """``state`` (JSON) as a turn with ``message`` opens: the message appended to its
    ``messages``, ``current_user_message`` / ``last_user_message`` set, ``last_intent``
    kept (each turn is routed afresh all the same). ``previous_result``: what the session's previous
    turn returned; when that turn's handler said nothing itself, it becomes the assistant
    reply of that turn first (as CrewAI's ``handle_turn`` promotes it), so the history is
    the same whoever runs the turns. ``last_intent`` keeps the previous turn's route until
    this turn's router replaces it: the router context shows it (it is never replayed as
    this turn's route)."""
    text = message_text(message)
    if not text.strip():
        raise InvalidInputs("a turn's message is empty")
    opened = dict(state)
    fields = _fields(flow_cls)
    messages = list(opened.get("messages") or [])
    if (
        previous_result is not None
        and messages
        and not answered(messages)
        and is_public_reply(flow_cls, previous_result, opened)
    ):
        messages.append(_message("assistant", reply_text(previous_result)))
    messages.append(_message("user", text))
    opened["messages"] = messages
    _set(opened, fields, "current_user_message", text)
    _set(opened, fields, "last_user_message", text)
    return opened


def _message(role: Role, content: str) -> dict[str, Any]:
    return {"role": role, "content": content}


def transcript(messages: Sequence[Any]) -> str:
    """Messages as ``role: content`` lines (what an LLM prompt of the history holds)."""
    lines = []
    for message in messages:
        data = message.model_dump() if isinstance(message, BaseModel) else dict(message)
        lines.append(f"{data.get('role', 'user')}: {data.get('content', '')}")
    return "\n".join(lines)


def as_llm_message(message: Any) -> dict[str, Any]:
    """A stored message as CrewAI's ``LLMMessage`` dict (no ``metadata``, no ``None``)."""
    if isinstance(message, BaseModel):
        data = message.model_dump(exclude_none=True)
    elif isinstance(message, Mapping):
        data = {k: v for k, v in message.items() if v is not None}
    else:
        data = {"role": "user", "content": str(message)}
    data.pop("metadata", None)
    return data


def normalize_kickoff_inputs(
    inputs: Mapping[str, Any] | None,
    *,
    user_message: str | dict[str, Any] | None = None,
    session_id: str | None = None,
) -> dict[str, Any] | None:
    """A turn's kickoff inputs (CrewAI's helper): ``inputs`` with the session as ``id`` and
    the message as ``user_message`` when given; ``None`` when nothing at all is given (a
    stateless kickoff keeps no inputs)."""
    if inputs is None and user_message is None and session_id is None:
        return None
    merged = dict(inputs or {})
    if session_id is not None:
        merged["id"] = session_id
    if user_message is not None:
        merged[USER_MESSAGE] = user_message
    return merged


def get_conversation_messages(flow: Any) -> list[Any]:
    """The history a flow's state holds (``messages`` of a dict or model state), as stored;
    an empty list when its state keeps none."""
    state = flow.state
    messages = (
        state.get("messages") if isinstance(state, dict) else getattr(state, "messages", None)
    )
    return messages if isinstance(messages, list) else []


def append_message(flow: Any, role: Role, content: str, **extra: Any) -> None:
    """Append a message to a flow's history (CrewAI's function form of
    :meth:`ConversationalFlow.append_message`)."""
    flow.append_message(role, content, **extra)


@dataclass
class Turn:
    """A turn an in-process ``handle_turn`` is running: its message and per-turn intents."""

    message: Any
    intents: Sequence[str] | None = None
    intent_llm: Any = None


# -- the flow's conversational surface -------------------------------------------------------


class ConversationalFlow:
    """The conversational methods of every ``Flow`` (CrewAI composes them the same way);
    the built-in steps are steps only of a flow with ``conversational = True``."""

    conversational: ClassVar[bool] = False
    defer_trace_finalization: bool = False
    """CrewAI's flag to close a session's trace once, at ``finalize_session_traces()``. A
    run's events here are final when each turn ends, so it changes nothing but is kept."""
    conversational_config: ClassVar[ConversationConfig | ConversationalConfig | None] = None
    builtin_routes: ClassVar[tuple[str, ...]] = BUILTIN_ROUTES
    internal_routes: ClassVar[tuple[str, ...]] = INTERNAL_ROUTES
    builtin_route_descriptions: ClassVar[dict[str, str]] = {
        "converse": (
            "Ordinary chat: greetings, follow-ups, summaries and clarifications of what "
            "was said, answered from the conversation."
        ),
        "end": "The user is done and wants to end the conversation.",
    }
    """What the router's catalog says of each built-in route (override to reword)."""

    if TYPE_CHECKING:
        state: Any
        _state: Any
        _turn: Turn | None
        _streaming: bool
        _listeners: list[Any]

        @property
        def flow_id(self) -> str: ...

        @classmethod
        def flow_name(cls) -> str: ...

        def kickoff(
            self,
            inputs: dict[str, Any] | None = None,
            from_checkpoint: Any = None,
            restore_from_state_id: str | None = None,
            strict: bool = False,
        ) -> Any: ...

        @classmethod
        def graph(cls) -> Any: ...

        @classmethod
        def flow_definition(cls) -> Any: ...

        def _collapse_to_outcome(self, feedback: str, outcomes: Any, llm: Any) -> str: ...

    # -- the built-in graph: a start router and its three listeners -------------------------

    @start()
    @router()
    @conversational_only
    def route_conversation(self) -> str:
        """Route the turn: ``route_turn``'s label, else the intent the message was
        classified into, else ``converse``. It runs after the flow's own starts (see
        :func:`runner.flow.graph`'s ordering), and calls ``conversation_start`` unless the
        flow made that a start step of its own (then it ran already, once)."""
        if "conversation_start" not in type(self).graph().methods:
            self.conversation_start()
        label = self._pick_route()
        self._state_set("last_intent", label)
        return label

    @listen("converse")
    @conversational_only
    def converse_turn(self) -> str:
        """Answer from the history with the conversation's LLM."""
        llm = self._conversation_llm()
        if llm is None:
            content = NO_LLM_REPLY
        else:
            messages: list[dict[str, Any]] = []
            system = self.resolved_system_prompt()
            if system:
                messages.append({"role": "system", "content": system})
            messages.extend(self.conversation_messages)
            content = reply_text(call_chat(llm, messages, stream=True))
        self.append_assistant_message(content)
        return content

    @listen("end")
    @conversational_only
    def end_conversation(self) -> str:
        """End the conversation (``state.ended``)."""
        self._state_set("ended", True)
        self.append_assistant_message(ENDED_REPLY)
        return ENDED_REPLY

    @listen("answer_from_history")
    @conversational_only
    def answer_from_history_turn(self) -> str | None:
        """Answer from the history alone with ``answer_from_history_llm`` (the route
        ``can_answer_from_history`` picks)."""
        llm = self._config_value("answer_from_history_llm")
        if llm is None:
            return None
        prompt = self._config_value("answer_from_history_prompt") or FROM_HISTORY_PROMPT
        messages = [
            {"role": "system", "content": prompt},
            *self.build_agent_context("answer_from_history"),
        ]
        content = reply_text(call_chat(llm, messages, stream=True))
        self.append_assistant_message(content)
        return content

    def can_answer_from_history(self, context: dict[str, Any]) -> bool:
        """Whether ``answer_from_history_llm`` (when configured) finds the turn answerable
        from the history alone, without the flow's routes."""
        llm = self._config_value("answer_from_history_llm")
        if llm is None or len(self.conversation_messages) < 2:
            return False
        prompt = self._config_value("answer_from_history_prompt") or FROM_HISTORY_PROMPT
        feedback = (
            f"{prompt}\n\nCurrent user message: {context.get('current_user_message')}\n\n"
            f"Message history:\n{transcript(self.conversation_messages)}"
        )
        outcomes = ("answer_from_history", "route_to_flow")
        return self._collapse_to_outcome(feedback, outcomes, llm) == "answer_from_history"

    def conversation_start(self) -> str | None:
        """The turn's user message (override to prepare a turn)."""
        return cast(str | None, self._state_get("current_user_message"))

    def route_turn(self, context: dict[str, Any]) -> str | None:
        """The route of this turn, or ``None`` to fall through to intents and ``converse``.
        Override it to route in code; by default the LLM router (``ConversationConfig.router``,
        or a default one when the flow listens to routes of its own and no intents are
        configured) decides."""
        config = self.conversational_config
        if not isinstance(config, ConversationConfig):
            return None
        router_config = config.router
        if router_config is None:
            if config.default_intents or not custom_routes(type(self).graph()):
                return None
            router_config = RouterConfig()
        return self._route_with(router_config, context)

    def build_router_context(self) -> dict[str, Any]:
        """What ``route_turn`` is given about the turn (and the LLM router, as JSON): the
        message, the history, the previous turn's route (``last_intent``) and, with a
        :class:`ConversationState`, its events."""
        recorded = self._state_get("events")
        return {
            "system_prompt": self.resolved_system_prompt(),
            "current_user_message": self._state_get("current_user_message"),
            "message_history": self.conversation_messages,
            "events": [e.model_dump() if isinstance(e, BaseModel) else e for e in recorded or []],
            "last_intent": self._state_get("last_intent"),
        }

    def resolved_system_prompt(self) -> str | None:
        """The conversation's system prompt: the config's, :data:`DEFAULT_SYSTEM_PROMPT`
        when it sets none, nothing when it sets ``""``."""
        given = self._config_value("system_prompt")
        return DEFAULT_SYSTEM_PROMPT if given is None else given or None

    def build_agent_context(self, agent_name: str) -> list[dict[str, Any]]:
        """The messages an agent (or a direct LLM call) named ``agent_name`` is given: the
        history, then that agent's own thread."""
        messages = list(self.conversation_messages)
        threads = self._state_get("agent_threads") or {}
        for item in threads.get(agent_name, []):
            data = item.model_dump() if isinstance(item, BaseModel) else dict(item)
            messages.append(
                {"role": data.get("role", "assistant"), "content": reply_text(data.get("content"))}
            )
        return messages

    def _pick_route(self) -> str:
        context = self.build_router_context()
        intent = self._classified_intent()
        routed = self.route_turn(context)
        if routed:
            return routed
        if intent:
            return intent
        if self.can_answer_from_history(context):
            return "answer_from_history"
        return "converse"

    def _classified_intent(self) -> str | None:
        turn = getattr(self, "_turn", None)
        intents = turn.intents if turn is not None else None
        llm = turn.intent_llm if turn is not None else None
        intents = intents or self._config_value("default_intents")
        llm = llm or self._config_value("intent_llm")
        if not intents:
            return None
        if llm is None:
            raise InvalidInputs("intent_llm is required when intents are given")
        text = self._state_get("current_user_message") or ""
        return self.classify_intent(text, intents, llm=llm, context=self.conversation_messages)

    def router_routes(self, config: RouterConfig | None = None) -> set[str]:
        """The routes the LLM router may name: ``config.routes`` (else the labels the flow's
        own listeners listen to) and the built-in routes."""
        given = set(config.routes or ()) if config is not None else set()
        return (given or set(custom_routes(type(self).graph()))) | set(BUILTIN_ROUTES)

    def route_catalog(self, config: RouterConfig | None = None) -> dict[str, str]:
        """Each route the router may name, with what it is for: ``route_descriptions``,
        else a built-in route's own description, else the first line of the docstring of
        the listener that handles it (empty without one)."""
        graph = type(self).graph()
        handlers: dict[str, str] = {}
        for spec in graph.methods.values():
            if spec.condition is not None and not spec.is_router:
                for leaf in sorted(leaves(spec.condition)):
                    handlers.setdefault(leaf, spec.name)
        given = (config.route_descriptions if config is not None else None) or {}
        catalog: dict[str, str] = {}
        for label in sorted(self.router_routes(config)):
            if label in given:
                catalog[label] = given[label]
            elif label in self.builtin_route_descriptions:
                catalog[label] = self.builtin_route_descriptions[label]
            else:
                catalog[label] = self._handler_description(handlers.get(label))
        return catalog

    def _handler_description(self, handler: str | None) -> str:
        """A route's description from its handler: the definition's ``description`` (what
        a declaration says), else the first line of the method's docstring; ``""``."""
        if handler is None:
            return ""
        declared = type(self).flow_definition().methods.get(handler)
        text = declared.description if declared is not None else None
        if not text:
            method = getattr(type(self), handler, None)
            text = method.__doc__ if method is not None else None
        return text.strip().split("\n", 1)[0].strip() if text else ""

    def router_messages(
        self, config: RouterConfig, context: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The chat messages the LLM router is given: a system message (the config's
        ``prompt``, then the route catalog and how to choose) and the turn's context as
        JSON (with ``available_routes``)."""
        catalog = self.route_catalog(config)
        lines = "\n".join(
            f"- {label}: {text}" if text else f"- {label}" for label, text in catalog.items()
        )
        system = (
            f"{config.prompt}\n\n" if config.prompt else ""
        ) + f"Routes:\n{lines}\n\n{ROUTER_INSTRUCTION}"
        payload = {**context, "available_routes": sorted(catalog)}
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": json.dumps(payload, default=str)},
        ]

    def router_response_format(self, config: RouterConfig) -> type[BaseModel]:
        """The structured answer the router asks for: ``config.response_format``, else a
        ``ConversationRoute`` model with one string field, ``intent_field``."""
        if config.response_format is not None:
            return config.response_format
        routes = ", ".join(sorted(self.router_routes(config)))
        fields: dict[str, Any] = {
            config.intent_field: (str, Field(description=f"One of: {routes}"))
        }
        return cast(type[BaseModel], create_model("ConversationRoute", **fields))

    def _route_with(self, config: RouterConfig, context: dict[str, Any]) -> str | None:
        llm = config.llm or self._config_value("intent_llm") or self._config_value("llm")
        if llm is None:
            return config.default_intent
        fallback = config.fallback_intent or config.default_intent
        try:
            reply = call_chat(
                llm,
                self.router_messages(config, context),
                response_format=self.router_response_format(config),
            )
        except Exception as exc:  # a failing router falls back, as CrewAI's does
            log.warning("the conversation router failed (%s); taking the fallback route", exc)
            return fallback
        routes = self.router_routes(config)
        intent = intent_of(reply, config.intent_field)
        if intent is None:
            return fallback
        if intent in routes:
            return intent
        from runner.flow.human_feedback import match_outcome

        # A client answering in prose (no structured output) may still name one route.
        return (match_outcome(intent, sorted(routes)) if isinstance(reply, str) else None) or (
            fallback
        )

    # -- history ---------------------------------------------------------------------------

    @property
    def conversation_messages(self) -> list[dict[str, Any]]:
        """The history as CrewAI's ``LLMMessage`` dicts."""
        return [as_llm_message(m) for m in self._state_get("messages") or []]

    def append_message(self, role: Role, content: str, **extra: Any) -> None:
        """Append a message to the history."""
        message: dict[str, Any] = {"role": role, "content": content}
        for key in ("tool_call_id", "name", "tool_calls", "files"):
            if key in extra:
                message[key] = extra[key]
        self._history().append(self._as_stored(message))

    def append_assistant_message(
        self, content: str, *, metadata: dict[str, Any] | None = None
    ) -> None:
        """Append the assistant's reply of this turn (what the user sees)."""
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if metadata:
            message["metadata"] = metadata
        self._history().append(self._as_stored(message))

    def append_agent_result(
        self,
        agent_name: str,
        result: Any,
        *,
        visibility: Literal["private", "public"] = "private",
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Record an agent's result; a public one (or one of ``visible_agent_outputs``)
        is also the assistant's reply."""
        content = reply_text(result)
        visible = self._config_value("visible_agent_outputs")
        if visible == "all" or (visible is not None and agent_name in visible):
            visibility = "public"
        state = self.state
        if isinstance(state, ConversationState):
            state.events.append(
                ConversationEvent(
                    type="agent_result",
                    agent_name=agent_name,
                    visibility=visibility,
                    payload={"content": content, **(metadata or {})},
                    message_index=len(state.messages) - 1 if state.messages else None,
                )
            )
            state.agent_threads.setdefault(agent_name, []).append(
                AgentMessage(content=content, metadata=metadata or {})
            )
        if visibility == "public":
            self.append_assistant_message(content)

    def receive_user_message(
        self, text: str, *, outcomes: Sequence[str] | None = None, llm: Any = None
    ) -> str:
        """Append a user message (and classify it into one of ``outcomes`` with ``llm``):
        the intent, else the text."""
        self.append_message("user", text)
        self._state_set("current_user_message", text)
        self._state_set("last_user_message", text)
        if outcomes and llm is not None:
            intent = self.classify_intent(
                text, outcomes, llm=llm, context=self.conversation_messages
            )
            self._state_set("last_intent", intent)
            return intent
        return text

    def classify_intent(
        self,
        text: str,
        outcomes: Sequence[str],
        *,
        llm: Any,
        context: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The one of ``outcomes`` ``llm`` reads ``text`` (in the light of ``context``) as,
        through the flow's ``_collapse_to_outcome`` (as ``@human_feedback`` outcomes are)."""
        feedback = f"{transcript(context)}\n\nLatest user message: {text}" if context else text
        return self._collapse_to_outcome(feedback, tuple(outcomes), llm)

    # -- turns -----------------------------------------------------------------------------

    def handle_turn(
        self,
        message: str,
        *,
        session_id: str | None = None,
        intents: Sequence[str] | None = None,
        intent_llm: Any = None,
        **kickoff_kwargs: Any,
    ) -> Any:
        """Run one turn with the user's ``message`` in this process and return its result:
        a run of the session ``session_id`` (default: this flow's state id), its history
        loaded from the flow's persistence when it keeps one, the message appended. A
        returned text the handler did not append itself becomes the assistant's reply."""
        refuse_unless_conversational(type(self), "handle_turn()")
        from runner.flow.human_feedback import HumanFeedbackPending

        sid = session_id or self.flow_id
        self._tell_turn(events.TURN_STARTED, sid)
        self._turn = Turn(message, intents, intent_llm)
        try:
            result = self.kickoff(inputs={"id": sid}, **kickoff_kwargs)
        except HumanFeedbackPending:
            raise  # paused for a review: the turn goes on when it is answered
        except Exception as exc:
            self._tell_turn(events.TURN_FAILED, sid, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._turn = None
        messages = self._state_get("messages") or []
        state = {
            "last_intent": self._state_get("last_intent"),
            "messages": messages,
            "events": self._state_get("events") or [],
        }
        if (
            result is not None
            and not answered([as_llm_message(m) for m in messages])
            and is_public_reply(type(self), result, state)
        ):
            self.append_assistant_message(reply_text(result))
        self._tell_turn(events.TURN_COMPLETED, sid)
        return result

    def _tell_turn(self, kind: str, session_id: str, error: str | None = None) -> None:
        events.tell(
            kind,
            session_id,
            type(self).flow_name(),
            self._listeners,
            error=error,
            data={"session_id": session_id},
        )

    def stream_turn(
        self,
        message: str,
        *,
        session_id: str | None = None,
        intents: Sequence[str] | None = None,
        intent_llm: Any = None,
        **kickoff_kwargs: Any,
    ) -> streaming.FlowStreamSession:
        """``handle_turn`` as a stream session: iterate it for the turn's frames (the
        turn's and the run's lifecycle frames, its steps' chunks, the LLM's tokens), then
        ``.result``; a turn paused for a review has the pending review as its result."""
        refuse_unless_conversational(type(self), "stream_turn()")
        from runner.flow.human_feedback import HumanFeedbackPending

        def run() -> Any:
            self._streaming = True
            try:
                return self.handle_turn(
                    message,
                    session_id=session_id,
                    intents=intents,
                    intent_llm=intent_llm,
                    **kickoff_kwargs,
                )
            except HumanFeedbackPending as pending:
                return pending
            finally:
                self._streaming = False

        return streaming.FlowStreamSession(self, run)

    def chat(
        self,
        *,
        session_id: str | None = None,
        prompt: str = "\nYou: ",
        assistant_prefix: str = "\nAssistant: ",
        exit_commands: Sequence[str] = EXIT_COMMANDS,
        input_fn: Callable[[str], str] = input,
        output_fn: Callable[[str], None] = print,
        skip_empty: bool = True,
        defer_trace_finalization: bool = True,
        **handle_turn_kwargs: Any,
    ) -> None:
        """A terminal chat over ``handle_turn``: ends on an exit command (any case), end of
        input or Ctrl-C, then calls ``finalize_session_traces()`` (CrewAI's session end).
        ``defer_trace_finalization`` sets the flow's flag of that name for the session and
        restores it after."""
        refuse_unless_conversational(type(self), "chat()")
        previous = getattr(self, "defer_trace_finalization", False)
        if defer_trace_finalization:
            self.defer_trace_finalization = True
        try:
            chat_loop(
                lambda text: self.handle_turn(text, session_id=session_id, **handle_turn_kwargs),
                prompt=prompt,
                assistant_prefix=assistant_prefix,
                exit_commands=exit_commands,
                input_fn=input_fn,
                output_fn=output_fn,
                skip_empty=skip_empty,
            )
        finally:
            self.finalize_session_traces()
            if defer_trace_finalization:
                self.defer_trace_finalization = previous

    def finalize_session_traces(self) -> None:
        """CrewAI closes a deferred trace batch here; a run's events are sent per turn here,
        so there is nothing left to close."""

    # -- state access for dict and model states ----------------------------------------------

    def _state_get(self, name: str) -> Any:
        state = self.state
        if isinstance(state, dict):
            return state.get(name)
        return getattr(state, name, None)

    def _state_set(self, name: str, value: Any) -> None:
        state = self.state
        if isinstance(state, dict):
            state[name] = value
        elif name in type(state).model_fields:
            setattr(state, name, value)

    def _history(self) -> list[Any]:
        state = self.state
        if isinstance(state, dict):
            return cast(list[Any], state.setdefault("messages", []))
        messages = getattr(state, "messages", None)
        if messages is None:
            raise InvalidInputs(f"{type(state).__name__} has no messages field to hold the history")
        return cast(list[Any], messages)

    def _as_stored(self, message: dict[str, Any]) -> Any:
        state = self.state
        if isinstance(state, BaseModel):
            annotation = type(state).model_fields["messages"].annotation
            if annotation is not None and ConversationMessage in getattr(
                annotation, "__args__", ()
            ):
                return ConversationMessage(**message)
        return message

    def _config_value(self, name: str) -> Any:
        return getattr(self.conversational_config, name, None)

    def _conversation_llm(self) -> Any:
        for name in ("llm", "answer_from_history_llm", "intent_llm"):
            found = self._config_value(name)
            if found is not None:
                return found
        router_config = self._config_value("router")
        return getattr(router_config, "llm", None)


def chat_loop(
    take_turn: Callable[[str], Any],
    *,
    prompt: str = "\nYou: ",
    assistant_prefix: str = "\nAssistant: ",
    exit_commands: Sequence[str] = EXIT_COMMANDS,
    input_fn: Callable[[str], str] = input,
    output_fn: Callable[[str], None] = print,
    skip_empty: bool = True,
) -> None:
    """The terminal loop of ``chat()`` and ``runner chat``: read a line, end on an exit
    command (any case), end of input or Ctrl-C, else print the turn's reply."""
    ends = {command.lower() for command in exit_commands}
    while True:
        try:
            text = input_fn(prompt).strip()
        except (EOFError, KeyboardInterrupt):
            output_fn("")
            return
        if text.lower() in ends:
            return
        if skip_empty and not text:
            continue
        output_fn(f"{assistant_prefix}{reply_text(take_turn(text))}")


# -- the definition's ``conversational`` block ------------------------------------------------

_BLOCK_KEYS = {
    "enabled",
    "system_prompt",
    "llm",
    "router",
    "answer_from_history_prompt",
    "default_intents",
    "intent_llm",
    "answer_from_history_llm",
    "visible_agent_outputs",
    "defer_trace_finalization",
    "builtin_routes",
    "internal_routes",
}
_ROUTER_KEYS = {f.name for f in dataclass_fields(RouterConfig)} | {"response_format"}


def config_from_block(block: Mapping[str, Any] | BaseModel) -> ConversationConfig | None:
    """The :class:`ConversationConfig` a definition's ``conversational`` block (CrewAI's
    ``FlowConversationalDefinition``) declares, ``None`` when it says ``enabled: false``.
    LLMs are names or CrewAI's settings mappings (``{"model": ..., "max_tokens": ...}``),
    each process resolving them when it calls (:mod:`runner.flow.llm`); anything else is
    refused here, not at a turn's first call. The built-in routes
    are this runner's (``converse``, ``end``), so a block may only restate them. A key it
    does not know is a :class:`~runner.errors.DefinitionError` naming its path."""
    from runner.errors import DefinitionError

    if isinstance(block, BaseModel):  # a loaded definition's FlowConversationalDefinition
        block = block.model_dump(exclude_none=True)

    def bad(where: str, why: str) -> DefinitionError:
        return DefinitionError(f"conversational.{where}: {why}", field=f"conversational.{where}")

    for key in block:
        if key not in _BLOCK_KEYS:
            raise bad(key, f"unknown key (known: {', '.join(sorted(_BLOCK_KEYS))})")
    if not block.get("enabled", True):
        return None
    for key, builtin in (("builtin_routes", BUILTIN_ROUTES), ("internal_routes", INTERNAL_ROUTES)):
        given = block.get(key)
        if given is not None and sorted(given) != sorted(builtin):
            raise bad(key, f"the built-in routes here are {list(builtin)}, not {list(given)}")
    router_block = block.get("router")
    router_config = None
    for key in ("llm", "intent_llm", "answer_from_history_llm"):
        if block.get(key) is not None and (problem := llm_problem(block[key])) is not None:
            raise bad(key, problem)
    if router_block is not None:
        if not isinstance(router_block, Mapping):
            raise bad("router", "must be a mapping")
        for key in router_block:
            if key not in _ROUTER_KEYS:
                raise bad(f"router.{key}", "unknown key")
        given = router_block.get("llm")
        if given is not None and (problem := llm_problem(given)) is not None:
            raise bad("router.llm", problem)
        if router_block.get("response_format") is not None:
            # As CrewAI does for a declaration: no model class can be given in data.
            log.warning(
                "ignoring conversational.router.response_format: a declaration has no class"
            )
        router_config = RouterConfig(
            **{k: v for k, v in router_block.items() if k != "response_format"}
        )
    return ConversationConfig(
        system_prompt=block.get("system_prompt"),
        llm=block.get("llm"),
        router=router_config,
        answer_from_history_prompt=block.get("answer_from_history_prompt"),
        default_intents=block.get("default_intents"),
        intent_llm=block.get("intent_llm"),
        answer_from_history_llm=block.get("answer_from_history_llm"),
        visible_agent_outputs=block.get("visible_agent_outputs"),
        defer_trace_finalization=bool(block.get("defer_trace_finalization", True)),
    )


def block_of(flow_cls: Any) -> dict[str, Any] | None:
    """A conversational class's ``conversational`` block for its definition (``None`` for
    other flows): its config's values that are data (an LLM client given as an object is
    left out: only its name could be written down)."""
    if not is_conversational(flow_cls):
        return None
    config = flow_cls.conversational_config
    block: dict[str, Any] = {"enabled": True}
    if config is None:
        return block
    for item in dataclass_fields(config):
        value = getattr(config, item.name)
        if isinstance(value, RouterConfig):
            value = {
                f.name: getattr(value, f.name)
                for f in dataclass_fields(value)
                if _is_data(getattr(value, f.name))
            }
        elif isinstance(value, tuple):
            value = list(value)
        if value is not None and item.name in _BLOCK_KEYS and _is_data(value):
            block[item.name] = value
    return block


def _is_data(value: Any) -> bool:
    if isinstance(value, str | int | float | bool) or value is None:
        return True
    if isinstance(value, list | tuple):
        return all(_is_data(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_data(v) for k, v in value.items())
    return False
