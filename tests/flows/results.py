"""Flows whose runs end in each way a run's result is made: a plain last step, a router, a
step a person reviewed (``@human_feedback`` answered at once by a provider), and a crew
run as a child. The result tests (``tests/test_one_result.py``) run them in process and on
the test workers, which import this module (allow-list)."""

from __future__ import annotations

import os
import time
from typing import Any

from runner import Flow, FlowState, human_feedback, listen, router, start
from runner.crew import Crew, Task, TaskInput


class Topic(FlowState):
    topic: str = "bees"


class Approver:
    """A reviewer who answers at once, in process and on a worker alike."""

    def request_feedback(self, context: Any, flow: Any) -> str:
        return f"fine: {context.method_output['title']}"


def summarise(task: TaskInput) -> str:
    """A crew task's work: a line about the topic it was given."""
    return f"summary of {task.inputs['topic']}"


summary_crew = Crew(
    tasks=[Task("Summarise {topic}", "a line", name="summarise", fn=summarise)],
    name="results_summary_crew",
)


class PlainEnd(Flow[Topic]):
    """gather -> write: the run's result is what ``write`` returned."""

    @start()
    def gather(self) -> str:
        return f"notes on {self.state.topic}"

    @listen(gather)
    def write(self, notes: str) -> dict[str, Any]:
        return {"title": self.state.topic, "body": notes, "words": 3}


class RouterEnd(Flow[Topic]):
    """gather -> decide (a router whose label nobody listens to): the run ends there."""

    @start()
    def gather(self) -> str:
        return f"notes on {self.state.topic}"

    @router(gather)
    def decide(self) -> str:
        return "shelved"


class ReviewedEnd(Flow[Topic]):
    """gather -> write, which a person reviews (no ``emit``): the run's result is the
    review (a ``HumanFeedbackResult``), as ``write``'s listeners would receive it."""

    @start()
    def gather(self) -> str:
        return f"notes on {self.state.topic}"

    @listen(gather)
    @human_feedback(message="Publish this?", provider=Approver())
    def write(self, notes: str) -> dict[str, Any]:
        return {"title": self.state.topic, "body": notes}


class CrewEnd(Flow[Topic]):
    """gather -> delegate, which runs :data:`summary_crew` as a child run: the run's result
    is the crew's output."""

    @start()
    def gather(self) -> str:
        return f"notes on {self.state.topic}"

    @listen(gather)
    def delegate(self, notes: str) -> Any:
        return self.run_crew(summary_crew, {"topic": notes})


class Gate(FlowState):
    topic: str = "bees"
    gate: str = ""
    """A file ``hold`` waits for (in process), or ``"sleep"``: ``hold`` sleeps durably."""


class Held(Flow[Gate]):
    """gather -> hold -> write: ``hold`` waits for the file ``gate`` names (polling, up to a
    minute), or sleeps durably for ten minutes when ``gate`` is ``"sleep"`` (on workers: the
    run stays running and holds no worker) -> write fails unless the topic is ``"fixed"``."""

    @start()
    def gather(self) -> str:
        return f"notes on {self.state.topic}"

    @listen(gather)
    def hold(self, notes: str) -> str:
        if self.state.gate == "sleep":
            self.sleep(600)
        elif self.state.gate:
            deadline = time.monotonic() + 60
            while not os.path.exists(self.state.gate) and time.monotonic() < deadline:
                time.sleep(0.05)
        return notes

    @listen(hold)
    def write(self, notes: str) -> str:
        if self.state.topic != "fixed":
            raise RuntimeError(f"cannot write about {self.state.topic}")
        return f"written from {notes}"
