"""Conversational flows as CrewAI's conversational ``Flow`` behaves (its ``RouterConfig``, its
LLM calls with chat messages, start ordering, refusals, ``chat()``'s session end, turn
events, non-JSON replies of an unpersisted turn). The LLM clients here are deterministic
stand-ins shaped as CrewAI's ``BaseLLM`` (``call(messages, response_format=...)``) that
record what they were given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

import runner
from runner import (
    ConversationConfig,
    ConversationMessage,
    ConversationState,
    Flow,
    HumanFeedbackPending,
    PendingFeedbackContext,
    RouterConfig,
    SQLiteFlowPersistence,
    human_feedback,
    listen,
    start,
)
from runner.errors import NotSerializable
from runner.flow import conversation, events
from runner.flow.conditions import leaves
from runner.flow.llm import call_chat, takes_messages
from tests.flows.conversations import ECHO


class ChatLLM:
    """CrewAI's ``BaseLLM.call`` shape: answers ``replies`` in turn (the last one again
    when they run out) and records each call's keyword arguments."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.calls: list[dict[str, Any]] = []

    def call(
        self, messages: str | list[dict[str, Any]], response_format: Any = None, **_: Any
    ) -> Any:
        self.calls.append({"messages": messages, "response_format": response_format})
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


class ModelLLM:
    """A client naming ``response_model`` (an older ``BaseLLM``), not ``response_format``."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.given: list[Any] = []

    def call(self, messages: list[dict[str, Any]], response_model: Any = None) -> Any:
        self.given.append(response_model)
        return self.reply


class Route(BaseModel):
    intent: Literal["research", "converse", "end"]


def routed_flow(router_llm: Any, chat_llm: Any = None, **router: Any) -> type[Flow[Any]]:
    @ConversationConfig(
        llm=chat_llm, router=RouterConfig(llm=router_llm, routes=["research"], **router)
    )
    class Researching(Flow[ConversationState]):
        @listen("research")
        def run_research(self) -> str:
            """Fresh web research on a topic."""
            self.append_agent_result("researcher", "researched", visibility="public")
            return "researched"

    return Researching


# -- the LLM router ----------------------------------------------------------------------------


def test_the_router_gets_a_catalog_a_json_context_and_the_response_format() -> None:
    router_llm = ChatLLM(Route(intent="research"), Route(intent="converse"))
    chat_llm = ChatLLM("a follow-up answer")
    flow = routed_flow(router_llm, chat_llm, prompt="A research desk.", response_format=Route)()
    assert flow.handle_turn("research otters") == "researched"
    assert flow.state.last_intent == "research"
    assert flow.handle_turn("tell me more") == "a follow-up answer"
    assert flow.state.last_intent == "converse"

    first, second = router_llm.calls
    assert first["response_format"] is Route
    system, user = second["messages"]
    assert system["role"] == "system" and system["content"].startswith("A research desk.\n\n")
    assert "- research: Fresh web research on a topic." in system["content"]
    assert "- converse: Ordinary chat" in system["content"]
    context = json.loads(user["content"])
    # The router sees the previous turn's route; it is never replayed as this turn's.
    assert context["last_intent"] == "research"
    assert context["current_user_message"] == "tell me more"
    assert context["available_routes"] == ["converse", "end", "research"]
    assert [m["content"] for m in context["message_history"]] == [
        "research otters",
        "researched",
        "tell me more",
    ]
    assert [m["role"] for m in flow.conversation_messages] == ["user", "assistant"] * 2


@pytest.mark.parametrize(
    ("reply", "route"),
    [
        ({"intent": "research"}, "research"),
        ('{"intent": "research"}', "research"),
        ("research", "research"),
        ("I would say: research.", "research"),  # prose naming one route
        ({"intent": "unknown"}, "end"),  # no such route: the fallback
        ({"other": "research"}, "end"),  # no intent field: the fallback
    ],
)
def test_the_routers_reply_is_read_as_crewai_reads_it(reply: Any, route: str) -> None:
    flow = routed_flow(ChatLLM(reply), ChatLLM("bye"), fallback_intent="end")()
    flow.handle_turn("something")
    assert flow.state.last_intent == route


def test_a_failing_router_takes_the_fallback_and_a_default_format_is_asked_for() -> None:
    class Broken:
        def call(self, messages: list[dict[str, Any]], **_: Any) -> Any:
            raise RuntimeError("provider down")

    flow = routed_flow(Broken(), ChatLLM("hello"))()
    assert flow.handle_turn("hi") == "hello"
    assert flow.state.last_intent == "converse"

    router_llm = ChatLLM({"intent": "research"})
    routed_flow(router_llm)().handle_turn("go")
    made = router_llm.calls[0]["response_format"]
    assert made.__name__ == "ConversationRoute"
    assert made(intent="research").intent == "research"
    assert "One of: converse, end, research" in str(made.model_json_schema())

    older = ModelLLM({"intent": "research"})
    routed_flow(older, response_format=Route)().handle_turn("go")
    assert older.given == [Route]


def test_a_router_config_in_a_definition_ignores_response_format_a_class_cannot_be_data() -> None:
    config = conversation.config_from_block(
        {"router": {"routes": ["research"], "response_format": "pkg.mod:Route"}}
    )
    assert config is not None and config.router is not None
    assert config.router.response_format is None and list(config.router.routes or []) == [
        "research"
    ]


# -- LLM calls with chat messages ------------------------------------------------------------


def test_converse_gives_a_chat_client_the_system_prompt_and_the_history_as_messages() -> None:
    chat_llm = ChatLLM("summary")

    @ConversationConfig(system_prompt="Be brief.", llm=chat_llm)
    class Brief(Flow[ConversationState]):
        pass

    flow = Brief()
    flow.state.messages = [
        ConversationMessage(role="user", content="research otters"),
        ConversationMessage(role="assistant", content="they hold hands"),
    ]
    assert flow.handle_turn("summarize") == "summary"
    assert chat_llm.calls[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "research otters"},
        {"role": "assistant", "content": "they hold hands"},
        {"role": "user", "content": "summarize"},
    ]
    assert flow.state.messages[-1].content == "summary"


def test_call_chat_gives_a_prompt_client_one_prompt_and_a_chat_client_messages() -> None:
    said = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]

    class Prompted:
        def call(self, prompt: str) -> str:
            return prompt

    class Anything:
        def call(self, prompt: str, **options: Any) -> str:  # a prompt first: not messages
            return prompt

    assert not takes_messages(Prompted()) and not takes_messages(Anything())
    assert call_chat(Prompted(), said) == "system: s\nuser: u\nassistant:"
    assert call_chat(lambda prompt: prompt.upper(), said).startswith("SYSTEM: S")
    chat = ChatLLM("ok")
    assert takes_messages(chat)
    assert call_chat(chat, said, response_format=Route) == "ok"
    assert chat.calls == [{"messages": said, "response_format": Route}]


# -- the graph: the flow's own starts run before the router ------------------------------------


class Bootstrapped(Flow[ConversationState]):
    conversational = True
    order: list[str] = []

    @start()
    def load_profile(self) -> None:
        if not self.state.session_ready:
            self.order.append("load_profile")
            self.state.session_ready = True

    @start()
    def conversation_start(self) -> str | None:
        self.order.append("conversation_start")
        return super().conversation_start()

    def route_turn(self, context: dict[str, Any]) -> str | None:
        self.order.append("route_turn")
        return "work"

    @listen("work")
    def do_work(self) -> str:
        self.append_assistant_message(f"worked on {self.state.current_user_message}")
        return "worked"


def test_the_flows_own_starts_finish_before_the_router_and_run_once_per_turn() -> None:
    graph = Bootstrapped.graph()
    assert set(graph.kickoff) == {"load_profile", "conversation_start"}
    assert set(leaves(graph.methods["route_conversation"].condition)) == {
        "load_profile",
        "conversation_start",
    }
    flow = Bootstrapped()
    flow.order = []
    flow.handle_turn("one")
    assert sorted(flow.order[:2]) == ["conversation_start", "load_profile"]
    assert flow.order[2:] == ["route_turn"]  # conversation_start is not called again
    flow.order.clear()
    flow.handle_turn("two")
    assert flow.order == ["conversation_start", "route_turn"]  # the profile is loaded once
    assert flow.state.messages[-1].content == "worked on two"
    # A flow without starts of its own: the router is its kickoff step.
    assert conversation.is_conversational(routed_flow(ChatLLM("x")))
    assert routed_flow(ChatLLM("x")).graph().kickoff == ("route_conversation",)


# -- intents, refusals, chat(), events ---------------------------------------------------------


def test_intents_are_classified_through_the_flows_collapse_to_outcome() -> None:
    @ConversationConfig(default_intents=["search", "weather"], intent_llm="never-registered")
    class Classified(Flow[ConversationState]):
        # The seam @human_feedback outcomes use too: an LLM name is resolved only there.
        def _collapse_to_outcome(self, feedback: str, outcomes: Any, llm: Any) -> str:
            assert llm == "never-registered" and tuple(outcomes) == ("search", "weather")
            return "weather" if "rain" in feedback.rpartition("Latest")[2] else "search"

        @listen("search")
        def handle_search(self) -> str:
            return "searched"

        @listen("weather")
        def handle_weather(self) -> str:
            return "sunny"

    flow = Classified()
    assert flow.handle_turn("look up otters") == "searched"
    assert flow.handle_turn("any rain?") == "sunny"
    assert flow.state.last_intent == "weather"


def test_turn_methods_of_a_flow_that_is_not_conversational_say_so_as_crewai_does() -> None:
    class Plain(Flow[ConversationState]):
        @start()
        def begin(self) -> str:
            return "begin"

    flow = Plain()
    for name, call in (
        ("handle_turn", lambda: flow.handle_turn("hi")),
        ("stream_turn", lambda: flow.stream_turn("hi")),
        ("chat", flow.chat),
    ):
        with pytest.raises(ValueError, match=rf"^Flow\.{name}\(\) is only available on conv"):
            call()


def test_chat_ends_its_session_with_finalize_session_traces_and_restores_the_flag() -> None:
    class Counted(Flow[ConversationState]):
        conversational = True
        finalized = 0

        def route_turn(self, context: dict[str, Any]) -> str | None:
            return "work"

        @listen("work")
        def do_work(self) -> str:
            assert self.defer_trace_finalization is True  # set for the session
            return f"worked: {self.state.current_user_message}"

        def finalize_session_traces(self) -> None:
            self.finalized += 1

    flow = Counted()
    lines = iter(["first", "", "second", "quit"])
    shown: list[str] = []
    flow.chat(input_fn=lambda _: next(lines), output_fn=shown.append)
    assert shown == ["\nAssistant: worked: first", "\nAssistant: worked: second"]
    assert flow.finalized == 1 and flow.defer_trace_finalization is False


class Heard(runner.EventListener):
    def __init__(self) -> None:
        self.seen: list[events.FlowEvent] = []

    def on_event(self, event: events.FlowEvent) -> None:
        if event.type.startswith("conversation_"):
            self.seen.append(event)


def test_each_turn_tells_started_then_completed_or_failed() -> None:
    class Fragile(Flow[ConversationState]):
        conversational = True

        def route_turn(self, context: dict[str, Any]) -> str | None:
            return "work"

        @listen("work")
        def do_work(self) -> str:
            if self.state.current_user_message == "break":
                raise RuntimeError("broken tool")
            return "fine"

    heard = Heard()
    flow = Fragile(listeners=[heard])
    assert flow.handle_turn("hello", session_id="s-1") == "fine"
    with pytest.raises(RuntimeError, match="broken tool"):
        flow.handle_turn("break", session_id="s-1")
    assert [(e.type, e.data["session_id"]) for e in heard.seen] == [
        (events.TURN_STARTED, "s-1"),
        (events.TURN_COMPLETED, "s-1"),
        (events.TURN_STARTED, "s-1"),
        (events.TURN_FAILED, "s-1"),
    ]
    assert heard.seen[-1].error == "RuntimeError: broken tool"


class Later:
    """A review provider that lets the run pause (someone answers elsewhere)."""

    def request_feedback(self, context: PendingFeedbackContext, flow: Any) -> str:
        raise HumanFeedbackPending(context)


class Reviewed(Flow[ConversationState]):
    conversational = True

    def route_turn(self, context: dict[str, Any]) -> str | None:
        return "draft"

    @listen("draft")
    @human_feedback(message="Approve this reply?", provider=Later())
    def write(self) -> str:
        return "a draft reply"


def test_a_streamed_turn_paused_for_a_review_has_the_pending_review_as_its_result() -> None:
    session = Reviewed().stream_turn("write to the customer")
    kinds = [frame.type for frame in session.events]
    assert isinstance(session.result, HumanFeedbackPending)
    assert session.result.context.method_name == "write"
    assert kinds[0] == "conversation_turn_started"
    assert events.TURN_FAILED not in kinds


# -- outputs that are not JSON -------------------------------------------------------------------


class RawResult:
    raw = "raw assistant output"


class Objects(Flow[ConversationState]):
    conversational = True

    def route_turn(self, context: dict[str, Any]) -> str | None:
        return "work"

    @listen("work")
    def do_work(self) -> RawResult:
        return RawResult()


def test_a_turn_that_persists_nothing_passes_a_non_json_reply_on_as_crewai_does(
    tmp_path: Path,
) -> None:
    flow = Objects()
    result = flow.handle_turn("hi")
    assert isinstance(result, RawResult)
    assert flow.state.messages[-1].content == "raw assistant output"
    # Kept in a checkpoint it must be JSON: one error naming the method.
    kept = Objects(persistence=SQLiteFlowPersistence(str(tmp_path / "o.db")))
    with pytest.raises(NotSerializable, match="output of do_work is not JSON-serializable"):
        kept.handle_turn("hi")


# -- CrewAI's module helpers (crewai.flow.conversation) -------------------------------------------


def test_the_module_helpers_merge_turn_inputs_and_read_and_write_the_history() -> None:
    assert conversation.normalize_kickoff_inputs(None) is None
    assert conversation.normalize_kickoff_inputs(
        {"foo": 1}, user_message="hello", session_id="sess-1"
    ) == {"foo": 1, "id": "sess-1", "user_message": "hello"}
    flow = routed_flow(ChatLLM("x"))()
    conversation.append_message(flow, "user", "hi")
    conversation.append_message(flow, "tool", "42", tool_call_id="t1")
    stored = conversation.get_conversation_messages(flow)
    assert [(m.role, m.content, m.tool_call_id) for m in stored] == [
        ("user", "hi", None),
        ("tool", "42", "t1"),
    ]
    assert conversation.get_conversation_messages(Flow()) == []


def test_a_stream_sessions_events_are_its_frames_sync_and_async() -> None:
    import asyncio

    class Streamed(Flow):
        stream = True

        @start()
        def go(self) -> str:
            return "done"

    session = Streamed().kickoff()
    sync_kinds = [f.type for f in session.events]
    assert sync_kinds[0] == "flow_started" and sync_kinds[-1] == "flow_finished"
    assert session.result == "done"

    async def read() -> tuple[list[str], Any]:
        later = await Streamed().kickoff_async()
        return [f.type async for f in later.events], later.result

    kinds, result = asyncio.run(read())
    assert kinds[0] == "flow_started" and kinds[-1] == "flow_finished" and result == "done"


# -- LLMs as CrewAI's settings mappings ----------------------------------------------------------


def test_an_llm_settings_mapping_resolves_by_its_model_name_and_passes_its_settings() -> None:
    from types import SimpleNamespace

    from runner.flow.llm import LiteLLMClient, call_llm, llm_problem, resolve_llm

    echo = resolve_llm(ECHO)  # registered at import of tests.flows.conversations
    assert resolve_llm({"model": ECHO, "max_tokens": 10}) is echo
    assert call_llm({"model": ECHO}, "user: hi") == "#1: hi"
    assert llm_problem({"max_tokens": 10}) == (
        "an LLM given as a mapping needs a 'model' key naming the model"
    )
    assert "expected a model name" in str(llm_problem(42))
    assert llm_problem({"model": "openai/gpt-4o-mini", "max_tokens": 4096}) is None

    completions: list[dict[str, Any]] = []

    def completion(**given: Any) -> Any:
        completions.append(given)
        message = SimpleNamespace(content="done")
        return SimpleNamespace(choices=[SimpleNamespace(message=message)], usage=None)

    client = LiteLLMClient(
        "openai/gpt-4o-mini", SimpleNamespace(completion=completion), {"max_tokens": 7}
    )
    assert client.call([{"role": "user", "content": "hi"}]) == "done"
    assert client.call("hello") == "done"
    assert completions == [
        {
            "model": "openai/gpt-4o-mini",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 7,
        },
        {
            "model": "openai/gpt-4o-mini",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 7,
        },
    ]


def test_a_declared_block_takes_an_llm_mapping_and_refuses_a_wrong_llm_when_loaded() -> None:
    import tests.flows.conversations  # noqa: F401  (registers the stand-in LLMs)
    from runner.errors import DefinitionError

    declared = {
        "name": "MappedChat",
        "conversational": {"llm": {"model": ECHO, "temperature": 0}},
        "methods": {},
    }
    flow = Flow.from_declaration(declared)
    assert flow.handle_turn("hi") == "#1: hi"
    for block, says in (
        ({"llm": {"max_tokens": 5}}, r"conversational\.llm: an LLM given as a mapping needs"),
        ({"intent_llm": 42}, r"conversational\.intent_llm: expected a model name"),
        ({"router": {"llm": ["x"]}}, r"conversational\.router\.llm: expected a model name"),
    ):
        with pytest.raises(DefinitionError, match=says):
            Flow.from_declaration({**declared, "conversational": block})


# -- the definition's conversational block as a model ---------------------------------------------


def test_the_conversational_block_of_a_definition_reads_as_crewais_model() -> None:
    from runner.flow.definition import FlowDefinition

    @ConversationConfig(
        system_prompt="Be concise.",
        llm=ECHO,
        router=RouterConfig(prompt="Pick a route.", routes=["research"], fallback_intent="end"),
        visible_agent_outputs=["researcher"],
        defer_trace_finalization=False,
    )
    class Desk(Flow):
        @listen("research")
        def do_research(self) -> str:
            return "done"

    block = Desk.flow_definition().conversational
    assert block is not None and block.enabled is True and block.llm == ECHO
    assert block.defer_trace_finalization is False
    assert block.visible_agent_outputs == ["researcher"]
    assert block.router is not None and block.router.routes == ["research"]
    assert (block.router.prompt, block.router.fallback_intent) == ("Pick a route.", "end")
    assert block.builtin_routes == ["converse", "end"]

    declared = FlowDefinition.model_validate(
        {"name": "Off", "conversational": {"enabled": False, "llm": ECHO}, "methods": {}}
    )
    assert declared.conversational is not None
    assert declared.conversational.enabled is False and declared.conversational.llm == ECHO
    assert type(Flow.from_declaration(declared)).conversational is False
    # What the block does not know is still one line naming its path.
    from runner.errors import DefinitionError

    with pytest.raises(DefinitionError, match=r"conversational\.router\.mode: unknown key"):
        Flow.from_declaration({"name": "Bad", "conversational": {"router": {"mode": "x"}}})


# -- what a turn's result becomes ------------------------------------------------------------------


class Researcher(Flow[ConversationState]):
    """Records the research privately; returns it (``keep``), a summary, or, for a
    message starting with ``again``, the text an earlier turn recorded."""

    conversational = True

    def route_turn(self, context: dict[str, Any]) -> str | None:
        return "work"

    @listen("work")
    def do_work(self) -> str:
        said = self.state.current_user_message or ""
        if said.startswith("again"):
            return "SECRET notes"  # recorded privately by an earlier turn, said now
        self.append_agent_result("researcher", "SECRET notes")
        return "SECRET notes" if said == "keep" else "Here is the summary."


def test_a_private_result_returned_stays_private_and_a_summary_is_said() -> None:
    flow = Researcher()
    flow.handle_turn("keep")
    assert [m.role for m in flow.state.messages] == ["user"]
    assert flow.state.agent_threads["researcher"][0].content == "SECRET notes"
    assert flow.state.events[0].message_index == 0
    flow.handle_turn("summarize")
    assert flow.state.messages[-1].content == "Here is the summary."
    # Judged per turn: a later turn returning that text says it.
    flow.handle_turn("again, please")
    assert flow.state.messages[-1].content == "SECRET notes"
    roles = [m.role for m in flow.state.messages]
    assert roles == ["user", "user", "assistant", "user", "assistant"]


def test_a_declared_handlers_description_reaches_the_routers_catalog() -> None:
    router_llm = ChatLLM({"intent": "orders"})
    declared = {
        "name": "DeclaredDesk",
        "conversational": {"llm": ECHO, "router": {"llm": "compat-router"}},
        "methods": {
            "track": {
                "description": "Order status questions.\nLonger text the router never sees.",
                "listen": "orders",
                "do": {"call": "expression", "expr": "'on the way'"},
            },
            "undocumented": {"listen": "misc", "do": {"call": "expression", "expr": "'?'"}},
        },
    }
    runner.register_llm("compat-router", router_llm)
    try:
        assert Flow.from_declaration(declared).handle_turn("where is my parcel?") == "on the way"
    finally:
        runner.register_llm("compat-router", None)
    catalog = router_llm.calls[0]["messages"][0]["content"]
    assert "- orders: Order status questions.\n" in catalog
    assert "- misc\n" in catalog  # no description: the bare label


def test_converse_has_a_default_system_prompt_and_an_empty_one_sends_none() -> None:
    for given, first in (
        (None, {"role": "system", "content": conversation.DEFAULT_SYSTEM_PROMPT}),
        ("", {"role": "user", "content": "hi"}),
    ):
        chat_llm = ChatLLM("hello")

        @ConversationConfig(system_prompt=given, llm=chat_llm)
        class Plain(Flow[ConversationState]):
            pass

        assert Plain().handle_turn("hi") == "hello"
        assert chat_llm.calls[0]["messages"][0] == first


def test_the_definition_guide_documents_the_conversational_block_and_its_router() -> None:
    from runner.flow.definition import (
        FlowConversationalDefinition,
        FlowConversationalRouterDefinition,
        FlowDefinition,
    )

    guide = FlowDefinition.skill()
    block = guide[guide.index("### Conversational (`conversational`)") : guide.index("## Actions")]
    for model in (FlowConversationalDefinition, FlowConversationalRouterDefinition):
        for name in model.model_fields:
            assert f"- `{name}` (" in block, name
    assert "### Conversational Router (`conversational.router`)" in block
    link = "[Conversational Router (`conversational.router`)](#conversational-router-"
    assert link in block
    # A default made by a factory shows its value.
    assert "- `builtin_routes` (optional; default `['converse', 'end']`)" in block
    assert "### Conversational" not in FlowDefinition.skill(skips=["conversational"])
