"""``self.ask`` in process, as CrewAI has it: the flow's input provider (the flow object's,
its class's, ``flow_config``'s, else the console) answers each question in order; a timeout,
a provider error or no console give ``None``; every question and answer is told to the
event listeners and kept in ``_input_history``; the state so far is saved to the flow's own
persistence before it waits. (On workers: tests/test_ask_workers.py.)"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import (
    ConsoleProvider,
    Flow,
    FlowConfig,
    FlowPersistence,
    FlowState,
    InputProvider,
    InputResponse,
    flow_config,
    listen,
    start,
)
from runner.flow import events as ev
from tests._flow_support import Recorder


class Scripted:
    """Answers from a list, in order (``None`` once it runs out); keeps what it was asked."""

    def __init__(self, *answers: str | InputResponse | None) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, dict[str, Any] | None]] = []
        self.lock = threading.Lock()

    def request_input(
        self, message: str, flow: Any, metadata: dict[str, Any] | None = None
    ) -> str | InputResponse | None:
        with self.lock:
            self.asked.append((message, metadata))
            return self.answers.pop(0) if self.answers else None


@pytest.fixture
def global_provider() -> Iterator[FlowConfig]:
    """``flow_config`` with its input provider put back after the test."""
    before = flow_config.input_provider
    yield flow_config
    flow_config.input_provider = before


class Survey(FlowState):
    topic: str = ""
    depth: str = ""


class SurveyFlow(Flow[Survey]):
    @start()
    def gather(self) -> dict[str, Any]:
        self.state.topic = self.ask("Topic?") or ""
        depth = self.ask("Depth?") if self.state.topic == "AI" else "general"
        self.state.depth = depth or ""
        return {"topic": self.state.topic, "depth": self.state.depth, "more": self.ask("More?")}

    @listen(gather)
    def report(self, found: dict[str, Any]) -> str:
        return f"{found['topic']}/{found['depth']}/{found['more']!r}"


def test_each_ask_returns_the_providers_next_answer_and_the_flow_goes_on() -> None:
    provider = Scripted("AI", "deep", "")
    flow = SurveyFlow(input_provider=provider)
    assert flow.kickoff() == "AI/deep/''"  # Enter alone is "", not None
    assert [m for m, _ in provider.asked] == ["Topic?", "Depth?", "More?"]
    assert (flow.state.topic, flow.state.depth) == ("AI", "deep")
    other = Scripted("cooking", None)
    assert SurveyFlow(input_provider=other).kickoff() == "cooking/general/None"
    assert [m for m, _ in other.asked] == ["Topic?", "More?"]


def test_the_provider_is_the_flow_objects_then_its_classes_then_flow_configs_then_the_console(
    global_provider: FlowConfig,
) -> None:
    class Asking(Flow[dict[str, Any]]):
        @start()
        def one(self) -> str | None:
            return self.ask("Q?")

    class Named(Asking):
        input_provider = Scripted("from the class")

    global_provider.input_provider = Scripted("from flow_config")
    assert Named(input_provider=Scripted("from the object")).kickoff() == "from the object"
    assert Named().kickoff() == "from the class"
    assert Asking().kickoff() == "from flow_config"
    assert global_provider.input_provider.asked == [("Q?", None)]  # type: ignore[attr-defined]
    global_provider.input_provider = None
    assert isinstance(Asking()._resolve_input_provider(), ConsoleProvider)
    assert isinstance(ConsoleProvider(), InputProvider)
    assert isinstance(Scripted(), InputProvider)


class Tagged(Flow[dict[str, Any]]):
    @start()
    def begin(self) -> str:
        return "go"

    @listen(begin)
    def ask_alice(self) -> str | None:
        return self.ask("Question A?", metadata={"user": "alice"})

    @listen(begin)
    async def ask_bob(self) -> str | None:
        return self.ask("Question B?", metadata={"user": "bob"})


class Routed:
    """Answers each person by the ``user`` the question names, after a pause (so the two
    parallel questions overlap)."""

    def request_input(
        self, message: str, flow: Any, metadata: dict[str, Any] | None = None
    ) -> InputResponse:
        time.sleep(0.05)
        user = (metadata or {}).get("user", "?")
        return InputResponse(text=f"{message} {user} says yes", metadata={"responded_by": user})


def test_parallel_questions_keep_their_own_metadata_in_the_history_and_the_events() -> None:
    recorder = Recorder()
    flow = Tagged(input_provider=Routed(), listeners=[recorder])
    flow.kickoff()
    by_user = {e["metadata"]["user"]: e for e in flow._input_history}
    assert by_user["alice"]["response"] == "Question A? alice says yes"
    assert by_user["alice"]["response_metadata"] == {"responded_by": "alice"}
    assert by_user["alice"]["method_name"] == "ask_alice"
    assert by_user["bob"]["response"] == "Question B? bob says yes"  # an async method too
    assert by_user["bob"]["method_name"] == "ask_bob"
    asked = {e.method: e.data for e in recorder.of(ev.INPUT_REQUESTED)}
    assert asked["ask_alice"] == {"message": "Question A?", "metadata": {"user": "alice"}}
    got = {e.method: e for e in recorder.of(ev.INPUT_RECEIVED)}
    assert got["ask_bob"].data["response"] == "Question B? bob says yes"
    assert got["ask_bob"].data["response_metadata"] == {"responded_by": "bob"}
    assert got["ask_bob"].run_id == flow.flow_id
    types = recorder.types()
    assert types[0] == ev.FLOW_STARTED and types[-1] == ev.FLOW_FINISHED


class TwoArgs:
    """A provider that takes no metadata (CrewAI accepts one)."""

    def request_input(self, message: str, flow: Any) -> str:
        return message.upper()


class Slow:
    def request_input(self, message: str, flow: Any, metadata: Any = None) -> str:
        time.sleep(5)
        return "too late"


class Chat(Flow[dict[str, Any]]):
    @start()
    def talk(self) -> list[str]:
        heard = []
        while (said := self.ask("You:", timeout=self.state.get("timeout", 0.2))) is not None:
            heard.append(said)
        return heard


def test_a_timeout_gives_none_at_once_and_ends_a_conversation() -> None:
    assert Chat(input_provider=Scripted("hi", "bye")).kickoff() == ["hi", "bye"]
    began = time.monotonic()
    flow = Chat(input_provider=Slow())
    assert flow.kickoff() == []
    assert time.monotonic() - began < 2  # the provider's 5 s are not waited for
    assert [e["response"] for e in flow._input_history] == [None]


def test_a_provider_without_a_metadata_parameter_is_asked_with_two_arguments() -> None:
    class Once(Flow[dict[str, Any]]):
        @start()
        def one(self) -> str | None:
            return self.ask("loud?")

    assert Once(input_provider=TwoArgs()).kickoff() == "LOUD?"


def test_a_failing_provider_gives_none_and_says_why_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def request_input(self, message: str, flow: Any, metadata: Any = None) -> str:
            raise ConnectionError("slack is down")

    class Once(Flow[dict[str, Any]]):
        @start()
        def one(self) -> str | None:
            return self.ask("anyone?")

    with caplog.at_level(logging.WARNING, logger="runner.flow"):
        assert Once(input_provider=Broken()).kickoff() is None
    (record,) = [r for r in caplog.records if "input provider" in r.getMessage()]
    assert record.getMessage() == (
        "input provider Broken failed (ConnectionError: slack is down); ask returns None"
    )


def test_a_timeout_that_is_not_a_number_of_seconds_is_refused() -> None:
    class Bad(Flow[dict[str, Any]]):
        @start()
        def one(self) -> str | None:
            return self.ask("Q?", timeout=-1)

    with pytest.raises(ValueError, match="ask takes timeout=None or seconds >= 0, not -1"):
        Bad(input_provider=Scripted("x")).kickoff()


class Saving(FlowPersistence):
    """A persistence of the user's own: keeps every state it is given, with the method."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, str, dict[str, Any]]] = []

    def init_db(self) -> None:
        return None

    def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None:
        self.saved.append((flow_uuid, method_name, dict(state_data)))

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        found = [s for f, _, s in self.saved if f == flow_uuid]
        return found[-1] if found else None


def test_the_state_so_far_is_saved_to_the_flows_persistence_before_each_question() -> None:
    persistence = Saving()
    flow = SurveyFlow(persistence=persistence, input_provider=Scripted("AI", "deep", "no"))
    flow.kickoff()
    asks = [s for _, m, s in persistence.saved if m == "_ask_checkpoint"]
    assert [(s["topic"], s["depth"]) for s in asks] == [("", ""), ("AI", ""), ("AI", "deep")]
    assert {f for f, _, _ in persistence.saved} == {flow.flow_id}
    assert [m for _, m, _ in persistence.saved][-2:] == ["gather", "report"]


CONSOLE_FLOW = """
from runner import ConsoleProvider, Flow, start

class Console(Flow[dict]):
    @start()
    def one(self):
        return [self.ask("Your colour?"), self.ask("Your size?")]

class Terse(Flow[dict]):
    input_provider = ConsoleProvider(verbose=False)

    @start()
    def one(self):
        return self.ask("Name?")

print("result", Console().kickoff(), Terse().kickoff())
"""


@pytest.mark.processes
def test_on_the_console_the_question_is_printed_and_the_answer_read_stripped(
    tmp_path: Path,
) -> None:
    script = tmp_path / "console_flow.py"
    script.write_text(textwrap.dedent(CONSOLE_FLOW))
    done = subprocess.run(
        [sys.executable, str(script)],
        input="  teal  \n\nAna\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\nYour colour?\n" in out and ">>> " in out and "Name? " in out
    assert out.rstrip().endswith("result ['teal', ''] Ana")


@pytest.mark.processes
def test_with_no_console_the_answer_is_none(tmp_path: Path) -> None:
    script = tmp_path / "console_flow.py"
    script.write_text(textwrap.dedent(CONSOLE_FLOW))
    done = subprocess.run(
        [sys.executable, str(script)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("result [None, None] None")
    assert "input provider ConsoleProvider failed (EOFError" in done.stderr
