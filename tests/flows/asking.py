"""Flows that ask a person questions (``self.ask``); the test workers import this module
(allow-list). Each method counts its executions (:func:`tests.flows.dist.executed`)."""

from __future__ import annotations

import threading

from runner import Flow, FlowState, and_, listen, start

from .dist import barrier, executed


class Interview(FlowState):
    stage: str = ""
    name: str = ""
    colour: str = ""


class InterviewFlow(Flow[Interview]):
    """greet -> interview (two questions) -> close."""

    @start()
    def greet(self) -> str:
        executed(self.state.id, "greet")
        return "hello"

    @listen(greet)
    def interview(self) -> str:
        executed(self.state.id, "interview")
        self.state.stage = "asked for a name"  # kept in the checkpoint while it waits
        name = self.ask("your name?", metadata={"channel": "#ops"})
        self.state.name = name or "nobody"
        self.state.stage = "asked for a colour"
        colour = self.ask(f"favourite colour, {self.state.name}?")
        self.state.colour = colour or "none"
        return f"{self.state.name} likes {self.state.colour}"

    @listen(interview)
    def close(self, summary: str) -> str:
        executed(self.state.id, "close")
        return summary.upper()


class Deadline(FlowState):
    timeout: float = 1.0
    answer: str = ""


class DeadlineFlow(Flow[Deadline]):
    """One question with a timeout."""

    @start()
    def question(self) -> str:
        executed(self.state.id, "question")
        given = self.ask("proceed?", timeout=self.state.timeout)
        self.state.answer = "no answer" if given is None else given
        return self.state.answer


class Desk:
    """A provider that answers at once (a bot, a lookup): named by a flow, it is asked on
    workers too, and the run never pauses."""

    def request_input(self, message: str, flow: object, metadata: dict | None = None) -> str:
        return "Bo" if metadata else "red"


class DeskInterviewFlow(InterviewFlow):
    input_provider = Desk()


class LockedFlow(Flow[dict]):
    """Asks with metadata that has no JSON form (a lock)."""

    @start()
    def ask_with_a_lock(self) -> str | None:
        return self.ask("who holds it?", metadata={"lock": threading.Lock()})


class PanelFlow(Flow[dict]):
    """Two listeners of one start ask at the same time; a join reports both answers."""

    @start()
    def open_panel(self) -> str:
        return "go"

    @listen(open_panel)
    def ask_alice(self) -> str | None:
        barrier(self.state["id"], "panel", 2)  # both questions are put while both run
        return self.ask("alice?", metadata={"user": "alice"})

    @listen(open_panel)
    async def ask_bob(self) -> str | None:  # an async method asks the same way
        barrier(self.state["id"], "panel", 2)
        return self.ask("bob?", metadata={"user": "bob"})

    @listen(and_(ask_alice, ask_bob))
    def report(self) -> str:
        executed(self.state["id"], "report")
        return "both answered"
