"""Crews (and a flow of crews) the crew tests run in process and on the test workers.

Every task is ``fn``-backed by :func:`work`, which counts its executions in Redis under the
run's ``tag`` input and fails once (the first attempt only) when the ``fail_once`` input
names it. Each task's result names the task and the result it built on, so a test can
read which context a task saw: ``t03(t02(t01(bees)))``.
"""

from __future__ import annotations

import os
from typing import Any

import redis

from runner import Flow, FlowState, listen, start
from runner.crew import Crew, Task, TaskInput

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"])
    return _client


def _key(tag: str, kind: str) -> str:
    return f"crew-tests:{tag}:{kind}"


def work(task: TaskInput) -> str:
    """Count this execution; fail the first attempt of the ``fail_once`` task."""
    tag = task.inputs["tag"]
    _redis().hincrby(_key(tag, "runs"), task.name, 1)
    if task.inputs.get("fail_once") == task.name and _redis().hsetnx(
        _key(tag, "failed"), task.name, 1
    ):
        raise RuntimeError(f"planned failure of {task.name}")
    before = task.context[-1].raw if task.context else task.inputs["topic"]
    return f"{task.name}({before})"


def counts(tag: str) -> dict[str, int]:
    """Task name -> times :func:`work` ran it for runs tagged ``tag``."""
    raw = _redis().hgetall(_key(tag, "runs"))
    return {k.decode(): int(v) for k, v in raw.items()}


def make_crew(name: str, tasks: list[str], **options: Any) -> Crew:
    """A crew of ``fn`` tasks named ``tasks``, each building on the one before."""
    return Crew(
        tasks=[Task(f"Step {t} on {{topic}}", "a line", name=t, fn=work) for t in tasks],
        name=name,
        **options,
    )


twelve = make_crew("crew_twelve", [f"t{i:02d}" for i in range(1, 13)])
"""Four crews' worth of tasks in one crew: the workers test resumes it at task 8."""

crew_a = make_crew("crew_a", ["a1", "a2", "a3"])
crew_b = make_crew("crew_b", ["b1", "b2", "b3"])
crew_c = make_crew("crew_c", ["c1", "c2", "c3"])
crew_d = make_crew("crew_d", ["d1", "d2", "d3"])


class PipelineState(FlowState):
    """The flow's inputs; crews' outputs flow from method to method."""

    topic: str = ""
    tag: str = ""
    fail_once: str = ""


class CrewPipeline(Flow[PipelineState]):
    """Four stages, each a crew of three tasks; a stage's topic is the previous result."""

    def _inputs(self, topic: str) -> dict[str, Any]:
        return {"topic": topic, "tag": self.state.tag, "fail_once": self.state.fail_once}

    @start()
    def stage1(self) -> Any:
        return self.run_crew(crew_a, self._inputs(self.state.topic))

    @listen(stage1)
    def stage2(self, previous: dict[str, Any]) -> Any:
        return self.run_crew(crew_b, self._inputs(previous["raw"]))

    @listen(stage2)
    def stage3(self, previous: dict[str, Any]) -> Any:
        return self.run_crew(crew_c, self._inputs(previous["raw"]))

    @listen(stage3)
    def stage4(self, previous: dict[str, Any]) -> Any:
        return self.run_crew(crew_d, self._inputs(previous["raw"]))


class HostState(FlowState):
    topic: str = ""
    tag: str = ""
    fail_once: str = ""
    notes: str = ""
    summary: str = ""


class HostFlow(Flow[HostState]):
    """Writes a note, runs crew_a as a child, then summarises the crew's output."""

    @start()
    def stage(self) -> Any:
        self.state.notes = "written before the crew"
        inputs = {"topic": self.state.topic, "tag": self.state.tag}
        return self.run_crew(crew_a, {**inputs, "fail_once": self.state.fail_once})

    @listen(stage)
    def finish(self, crew_output: dict[str, Any]) -> str:
        self.state.summary = crew_output["raw"]
        return "done"
