"""Conversational flows (``conversational = True``) for ``tests/test_conversations*.py``; the
test workers import this module (allow-list), so the stand-in LLMs it registers by name at
import are known in every process. The stand-ins make no network call and are
deterministic: each reply says how many user messages the prompt's history holds, which
turns a lost history into a wrong reply."""

from __future__ import annotations

import os

from runner import (
    ChatState,
    ConversationConfig,
    ConversationState,
    Flow,
    listen,
    register_llm,
    start,
)

ECHO = "conversations-echo"
"""The conversation LLM, by name."""

INTENTS = "conversations-intents"
"""The intent classifier, by name."""


class Echo:
    """A CrewAI-shaped client (``.call``): ``"#N: <last user message>"``, N the user
    messages in the prompt's history, and the pid of the process that called it."""

    def call(self, prompt: str) -> str:
        users = [line for line in prompt.splitlines() if line.startswith("user: ")]
        last = users[-1][len("user: ") :] if users else ""
        return f"#{len(users)}: {last}"


class StreamingEcho(Echo):
    """:class:`Echo` that also streams its reply word by word (``.stream``)."""

    def stream(self, prompt: str):
        words = self.call(prompt).split(" ")
        for index, word in enumerate(words):
            yield word if index == 0 else f" {word}"


def classify(prompt: str) -> str:
    """Reads the latest user message: the weather, a goodbye, else chitchat."""
    latest = prompt.rpartition("Latest user message:")[2].strip().splitlines()[0].lower()
    if "bye" in latest:
        return "end"
    return "weather" if "weather" in latest or "rain" in latest else "chitchat"


register_llm(ECHO, Echo())
register_llm("conversations-streaming", StreamingEcho())
register_llm(INTENTS, classify)


class Chat(Flow):
    """The built-in graph only: every turn is ``converse`` with :data:`ECHO`."""

    conversational = True
    conversational_config = ConversationConfig(llm=ECHO)


@ConversationConfig(llm="conversations-streaming")
class StreamingChat(Flow):
    """A chat whose LLM streams its tokens (decorated: the config opts it in)."""


@ConversationConfig(default_intents=["weather", "chitchat", "end"], intent_llm=INTENTS, llm=ECHO)
class Helpdesk(Flow):
    """Intents route each turn: ``weather`` answers itself, ``chitchat`` returns a text the
    runner makes the reply, ``end`` is the built-in goodbye."""

    @listen("weather")
    def forecast(self) -> str:
        reply = f"sunny (turn {len(self.conversation_messages) // 2 + 1}, pid {os.getpid()})"
        self.append_assistant_message(reply)
        return reply

    @listen("chitchat")
    def small_talk(self) -> str:
        return f"nice to chat about {self.state.current_user_message!r}"


class Routed(Flow):
    """``route_turn`` overridden in code: a message starting with ``!`` is a command."""

    conversational = True
    conversational_config = ConversationConfig(llm=ECHO)

    def route_turn(self, context: dict) -> str | None:
        return "command" if str(context["current_user_message"]).startswith("!") else None

    @listen("command")
    def run_command(self) -> str:
        reply = f"ran {self.state.current_user_message[1:]}"
        self.append_assistant_message(reply)
        return reply


class Legacy(Flow[ChatState]):
    """CrewAI's earlier ``ChatState`` (messages as plain dicts)."""

    conversational = True
    conversational_config = ConversationConfig(llm=ECHO)


class NotAChat(Flow):
    """A plain flow: turns to it are refused."""

    @start()
    def only(self) -> str:
        return "done"


class GatedChat(Flow):
    """A turn whose message is ``wait`` holds its step until the test opens the run's gate
    ``turn`` (:func:`tests.flows.dist.wait_gate`): a turn given meanwhile finds it running."""

    conversational = True
    conversational_config = ConversationConfig(llm=ECHO)

    def route_turn(self, context: dict) -> str | None:
        return "hold" if context["current_user_message"] == "wait" else None

    @listen("hold")
    def held(self) -> str:
        from .dist import wait_gate

        wait_gate(self.state.id, "turn")
        return "released"


def recall(prompt: str) -> str:
    """Answers from history a message asking to repeat or summarise; otherwise routes on.
    As the answerer, it quotes the first user message of the history."""
    if "Which one of these outcomes" in prompt:
        latest = prompt.partition("Current user message:")[2].strip().splitlines()[0]
        return "answer_from_history" if "again" in latest else "route_to_flow"
    users = [line for line in prompt.splitlines() if line.startswith("user: ")]
    return f"you first said {users[0][len('user: ') :]!r}"


register_llm("conversations-recall", recall)


@ConversationConfig(llm=ECHO, answer_from_history_llm="conversations-recall")
class Recalling(Flow):
    """Answers from the history when the message asks for it (``answer_from_history``)."""


class OnboardedState(ConversationState):
    profile: str = ""
    prepared: int = 0


class Onboarded(Flow[OnboardedState]):
    """Its own start prepares each turn (the profile loads on the first turn only, a
    counter moves every turn); the router runs after it, so the reply sees both."""

    conversational = True
    conversational_config = ConversationConfig(llm=ECHO)

    @start()
    def load_profile(self) -> None:
        if not self.state.session_ready:
            self.state.profile = f"loaded in turn {self.state.prepared + 1}"
            self.state.session_ready = True
        self.state.prepared += 1

    def route_turn(self, context: dict) -> str | None:
        return "answer" if self.state.prepared else None

    @listen("answer")
    def give_answer(self) -> str:
        reply = f"{self.state.profile}; prepared {self.state.prepared}"
        self.append_assistant_message(reply)
        return reply
