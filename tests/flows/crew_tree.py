"""A flow whose step runs a crew of slow tasks, for the tests that cancel a run's whole tree
(the test workers import this module: allow-list).

Each task counts its executions with :func:`tests.flows.dist.executed` under the crew run's
id (the child run) and its name; the task named by the ``slow`` input crawls for ``seconds``
on its first execution only, so a cancel catches it running and a resume runs it quickly.
The flow's methods count theirs under the parent run's id.
"""

from __future__ import annotations

import time
from typing import Any

from runner import Flow, FlowState, and_, listen, start
from runner.crew import Crew, Task, TaskInput

from .dist import executed


def crawl_once(task: TaskInput) -> str:
    """Count this execution; crawl on the first execution of the ``slow`` task."""
    if executed(task.run_id, task.name) == 1 and task.inputs.get("slow") == task.name:
        end = time.monotonic() + float(task.inputs.get("seconds", 60))
        while time.monotonic() < end:
            time.sleep(0.1)
    before = task.context[-1].raw if task.context else task.inputs["topic"]
    return f"{task.name}({before})"


slow_crew = Crew(
    tasks=[
        Task(f"Step {t} on {{topic}}", "a line", name=t, fn=crawl_once) for t in ("s1", "s2", "s3")
    ],
    name="slow_crew",
)


class TreeState(FlowState):
    """The topic, the task that crawls, for how long; the crew's result (or results)."""

    topic: str = "bees"
    slow: str = "s2"
    seconds: float = 60.0
    summary: str = ""


class CrewTree(Flow[TreeState]):
    """``stage`` runs :data:`slow_crew` as a child run; ``finish`` keeps its result."""

    @start()
    def stage(self) -> Any:
        executed(self.state.id, "stage")
        inputs = {"topic": self.state.topic, "slow": self.state.slow, "seconds": self.state.seconds}
        return self.run_crew(slow_crew, inputs)

    @listen(stage)
    def finish(self, crew_output: dict[str, Any]) -> str:
        executed(self.state.id, "finish")
        self.state.summary = crew_output["raw"]
        return self.state.summary


class CrewPair(Flow[TreeState]):
    """``left`` and ``right`` each run :data:`slow_crew` as a child run, in parallel;
    ``finish`` keeps both results."""

    def _crew(self, method: str, topic: str) -> Any:
        executed(self.state.id, method)
        inputs = {"topic": topic, "slow": self.state.slow, "seconds": self.state.seconds}
        return self.run_crew(slow_crew, inputs)

    @start()
    def left(self) -> Any:
        return self._crew("left", self.state.topic)

    @start()
    def right(self) -> Any:
        return self._crew("right", f"{self.state.topic}!")

    @listen(and_(left, right))
    def finish(self) -> str:
        executed(self.state.id, "finish")
        self.state.summary = "both crews done"
        return self.state.summary
