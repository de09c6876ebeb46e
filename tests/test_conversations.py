"""Conversational flows in process (CrewAI's ``conversational = True``): each turn a run of the
session, the history in the state, persisted between flow objects; intents, ``route_turn``,
the reply a handler returns without appending it, ``stream_turn`` frames, ``chat()``'s exit
commands. The LLMs are the deterministic stand-ins of :mod:`tests.flows.conversations`."""

from __future__ import annotations

from pathlib import Path

import pytest

import runner
from runner import SQLiteFlowPersistence
from runner.errors import InvalidInputs
from runner.flow import conversation
from tests.flows.conversations import Chat, Helpdesk, Legacy, NotAChat, Routed, StreamingChat


def test_the_names_crewai_users_import_come_from_runner_and_its_conversation_module() -> None:
    names = (
        "ChatState",
        "ConversationConfig",
        "ConversationMessage",
        "ConversationState",
        "ConversationalConfig",
        "ConversationalInputs",
        "RouterConfig",
    )
    for name in names:
        assert getattr(runner, name) is getattr(conversation, name)
        assert name in runner.__all__
    assert conversation.EXIT_COMMANDS == ("exit", "quit")
    # The built-in steps belong to conversational flows only.
    builtins = {
        "route_conversation",
        "converse_turn",
        "end_conversation",
        "answer_from_history_turn",
    }
    assert set(Chat.graph().methods) == builtins
    assert set(NotAChat.graph().methods) == {"only"}
    assert Chat.state_type().__name__ == "ConversationState"  # type: ignore[union-attr]


def test_each_turn_is_a_run_of_the_session_and_the_history_is_persisted(tmp_path: Path) -> None:
    db = str(tmp_path / "chat.db")
    first = Chat(persistence=SQLiteFlowPersistence(db))
    session = first.flow_id
    assert first.handle_turn("hello") == "#1: hello"
    for n, text in enumerate(["how are you", "tell me more", "why", "bye now"], start=2):
        # A new flow object each turn: the history comes from the persistence, by session id.
        again = Chat(persistence=SQLiteFlowPersistence(db))
        assert again.handle_turn(text, session_id=session) == f"#{n}: {text}"
    assert again.state.id == session
    roles = [m["role"] for m in again.conversation_messages]
    assert roles == ["user", "assistant"] * 5
    assert again.state.last_user_message == "bye now"
    assert again.state.last_intent == "converse"


def test_intents_route_each_turn_and_a_returned_text_becomes_the_reply(tmp_path: Path) -> None:
    db = str(tmp_path / "desk.db")
    desk = Helpdesk(persistence=SQLiteFlowPersistence(db))
    session = desk.flow_id
    assert desk.handle_turn("hello there") == "nice to chat about 'hello there'"
    assert desk.state.last_intent == "chitchat"
    later = Helpdesk(persistence=SQLiteFlowPersistence(db))
    assert later.handle_turn("any rain today?", session_id=session).startswith("sunny (turn 2")
    assert later.handle_turn("bye") == conversation.ENDED_REPLY
    assert later.state.ended is True
    said = [(m["role"], m["content"]) for m in later.conversation_messages]
    assert said[:2] == [("user", "hello there"), ("assistant", "nice to chat about 'hello there'")]
    assert said[-2:] == [("user", "bye"), ("assistant", conversation.ENDED_REPLY)]
    assert len(said) == 6  # the promoted reply of turn 1 is there once, not twice


def test_route_turn_overridden_in_code_routes_and_falls_through_to_converse() -> None:
    flow = Routed()
    assert flow.handle_turn("!deploy") == "ran deploy"
    assert flow.handle_turn("and now?") == "#2: and now?"


def test_chat_state_and_a_kickoff_with_user_message_are_turns_too() -> None:
    flow = Legacy()
    assert flow.kickoff(inputs={"user_message": "first"}) == "#1: first"
    assert flow.handle_turn("second") == "#2: second"
    assert flow.state.messages[-1] == {"role": "assistant", "content": "#2: second"}


def test_a_turn_to_a_flow_that_is_not_conversational_or_with_no_text_is_refused() -> None:
    with pytest.raises(InvalidInputs, match=r"only available on conversational flows; NotAChat"):
        NotAChat().handle_turn("hi")
    with pytest.raises(InvalidInputs, match="empty"):
        Chat().handle_turn("   ")


def test_stream_turn_yields_the_turns_frames_and_the_llms_tokens() -> None:
    session = StreamingChat().stream_turn("stream me")
    frames = list(session)
    tokens = [f.content for f in frames if f.type == "llm_stream_chunk"]
    assert tokens == ["#1:", " stream", " me"]
    kinds = [f.type for f in frames]
    assert kinds[:2] == ["conversation_turn_started", "flow_started"]
    assert kinds[-2:] == ["flow_finished", "conversation_turn_completed"]
    assert frames[0].data["session_id"] == frames[-1].data["session_id"]
    assert session.result == "#1: stream me"


def test_chat_ends_on_exit_commands_in_any_case_and_at_end_of_input() -> None:
    lines = iter(["hi", "", "again", "QUIT", "never read"])
    shown: list[str] = []
    Chat().chat(input_fn=lambda _prompt: next(lines), output_fn=shown.append)
    assert shown == ["\nAssistant: #1: hi", "\nAssistant: #2: again"]

    def ended(_prompt: str) -> str:
        raise EOFError

    shown.clear()
    Chat().chat(input_fn=ended, output_fn=shown.append)
    assert shown == [""]


DECLARED = {
    "name": "DeclaredChat",
    "conversational": {"llm": "conversations-echo", "system_prompt": "be brief"},
    "methods": {},
}


def test_a_definitions_conversational_block_makes_a_conversational_flow_and_back() -> None:
    flow = runner.Flow.from_declaration(DECLARED)
    assert type(flow).conversational is True
    assert flow.handle_turn("hi") == "#1: hi"
    assert flow.handle_turn("again") == "#2: again"
    # A conversational class's definition carries its config as data (LLMs by name).
    block = Helpdesk.flow_definition().conversational
    assert block is not None and block.enabled is True
    assert block.model_dump(exclude_none=True) == {
        "enabled": True,
        "llm": "conversations-echo",
        "default_intents": ["weather", "chitchat", "end"],
        "intent_llm": "conversations-intents",
        "defer_trace_finalization": True,
        "builtin_routes": ["converse", "end"],
        "internal_routes": ["answer_from_history"],
    }
    # As data it goes round: the definition's JSON makes the same conversational flow.
    again = runner.Flow.from_declaration(Helpdesk.flow_definition().to_json())
    assert type(again).conversational_config.default_intents == ["weather", "chitchat", "end"]
    assert NotAChat.flow_definition().conversational is None
    off = runner.Flow.from_declaration({**DECLARED, "conversational": {"enabled": False}})
    assert type(off).conversational is False


def test_a_bad_conversational_block_is_one_line_naming_its_path() -> None:
    from runner.errors import DefinitionError

    with pytest.raises(DefinitionError, match=r"conversational\.lm: unknown key"):
        runner.Flow.from_declaration({**DECLARED, "conversational": {"lm": "x"}})
    with pytest.raises(DefinitionError, match=r"conversational\.builtin_routes: the built-in"):
        runner.Flow.from_declaration({**DECLARED, "conversational": {"builtin_routes": ["x"]}})


def test_a_turn_the_history_answers_takes_the_answer_from_history_route() -> None:
    from tests.flows.conversations import Recalling

    flow = Recalling()
    assert flow.handle_turn("hello") == "#1: hello"  # one message: nothing to recall yet
    assert flow.handle_turn("say that again") == "you first said 'hello'"
    assert flow.state.last_intent == "answer_from_history"
    assert flow.handle_turn("new topic") == "#3: new topic"
    assert "answer_from_history_turn" in Recalling.graph().methods
