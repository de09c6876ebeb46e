"""A research pipeline: four stages, each a crew of three tasks, run as one flow.

    scope -> research -> analysis -> report

Each stage is a crew (:class:`runner.Crew`) run by a flow method with ``self.run_crew``: in
process the crew runs inline; on workers it is a child run whose tasks are Celery tasks
(``research_analysis.identify_gaps``, ...), and the method continues when it finishes. Every
task is a checkpoint, so a run that fails in stage 3 resumes at the failed task, not at the
start of stage 3 or of the pipeline.

**The agents are stand-ins.** :class:`FakeLLM` is a deterministic fake: it sleeps a little
and echoes the task; it calls no model and no network. To use a real model, pass any LLM
client as ``llm``: a callable ``llm(prompt) -> str``, or an object with ``.call(prompt)``
(CrewAI's ``LLM``) or ``.invoke(prompt)`` (LangChain chat models)::

    from langchain_openai import ChatOpenAI
    writer = Agent("Report writer", "...", "...", llm=ChatOpenAI(model="gpt-4o-mini"))

Environment:

* ``RESEARCH_SLEEP`` -- seconds each fake LLM call takes (default 0.2).
* ``RESEARCH_FAIL_ONCE=stage3`` -- the second task of that stage fails on its first attempt
  in each run (a marker file per run and task in ``RESEARCH_MARKER_DIR``, default
  ``<tmp>/runner-research``; on several machines point it at a shared directory).
* ``RESEARCH_COUNTS_KEY`` -- if set, every fake LLM call increments the task's field of
  this Redis hash (``make demo`` uses it to show which tasks ran how often).
* ``RESEARCH_CHECKPOINTS`` -- checkpoint directory of in-process runs (default
  ``.checkpoints``).

Run it::

    python -m examples.research "solid-state batteries"            # in process
    RESEARCH_FAIL_ONCE=stage3 python -m examples.research "bees"   # fails in stage 3 ...
    python -m examples.research --resume RUN_ID                    # ... and resumes there
    python -m examples.research --submit "bees"                    # on Celery workers
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runner import Agent, CheckpointConfig, Crew, Flow, FlowState, Task, listen, start
from runner.crew import current_task

STAGES = ("stage1", "stage2", "stage3", "stage4")


class PlannedFailure(RuntimeError):
    """The failure ``RESEARCH_FAIL_ONCE`` asks for (once per run); resume the run."""


class FakeLLM:
    """A deterministic stand-in for an LLM client (no model, no network): sleeps
    ``RESEARCH_SLEEP`` seconds and answers with the task it was given.

    Replace it with a real client: ``Agent(..., llm=my_client)``.
    """

    def __init__(self, stage: str, flaky_task: str | None = None) -> None:
        self.stage = stage
        self.flaky_task = flaky_task

    def __call__(self, prompt: str) -> str:
        _count_call()
        time.sleep(float(os.environ.get("RESEARCH_SLEEP", "0.2")))
        self._maybe_fail()
        task = next(
            (
                line.removeprefix("Current Task: ")
                for line in prompt.splitlines()
                if line.startswith("Current Task: ")
            ),
            "?",
        )
        context = prompt.partition("This is the context you're working with:\n")[2]
        return f"[{self.stage}, fake LLM] {task} (built on {len(context)} chars of context)"

    def _maybe_fail(self) -> None:
        if os.environ.get("RESEARCH_FAIL_ONCE") != self.stage:
            return
        running = current_task.get()
        if running.name != self.flaky_task:
            return
        folder = Path(os.environ.get("RESEARCH_MARKER_DIR") or tempfile.gettempdir())
        if not os.environ.get("RESEARCH_MARKER_DIR"):
            folder = folder / "runner-research"
        folder.mkdir(parents=True, exist_ok=True)
        try:  # creating the marker is atomic: exactly one attempt per run fails
            os.close(os.open(folder / f"{running.run_id}-{running.name}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        raise PlannedFailure(
            f"planned failure of {self.stage}/{running.name} (RESEARCH_FAIL_ONCE); resume the run"
        )


def _count_call() -> None:
    key = os.environ.get("RESEARCH_COUNTS_KEY")
    if not key:
        return
    import redis

    from runner.settings import get_settings

    client = redis.Redis.from_url(get_settings().redis_url or "redis://127.0.0.1:6379/0")
    try:
        client.hincrby(key, current_task.get().name, 1)
    finally:
        client.close()


def stage_crew(name: str, stage: str, role: str, tasks: list[tuple[str, str, str]]) -> Crew:
    """A crew of one stand-in agent doing three tasks; the second one is the flaky one."""
    agent = Agent(
        role=role,
        goal=f"Do the {stage} work on {{topic}} well",
        backstory=f"An experienced {role.lower()}.",
        llm=FakeLLM(stage, flaky_task=tasks[1][0]),
    )
    return Crew(
        agents=[agent],
        tasks=[Task(desc, expected, agent=agent, name=task) for task, desc, expected in tasks],
        name=name,
    )


scope = stage_crew(
    "research_scope",
    "stage1",
    "Research lead",
    [
        ("clarify_question", "Turn {topic} into one precise research question", "a question"),
        ("list_subtopics", "List the subtopics the question needs", "3-5 subtopics"),
        ("plan_sources", "Plan which kinds of sources to consult", "a source plan"),
    ],
)
research = stage_crew(
    "research_sources",
    "stage2",
    "Researcher",
    [
        ("find_sources", "Find sources on {topic} following this plan: {brief}", "sources"),
        ("extract_facts", "Extract the key facts from the sources", "a fact list"),
        ("rate_sources", "Rate how reliable each source is", "ratings"),
    ],
)
analysis = stage_crew(
    "research_analysis",
    "stage3",
    "Analyst",
    [
        ("compare_findings", "Compare the findings on {topic}: {brief}", "a comparison"),
        ("identify_gaps", "Identify what the findings leave open", "open questions"),
        ("draw_conclusions", "Draw conclusions from the analysis", "conclusions"),
    ],
)
report = stage_crew(
    "research_report",
    "stage4",
    "Report writer",
    [
        ("outline_report", "Outline a report on {topic} from: {brief}", "an outline"),
        ("write_report", "Write the report from the outline", "a report"),
        ("edit_report", "Edit the report for clarity", "the final report"),
    ],
)


class ResearchState(FlowState):
    """The topic; each stage's result reaches the next as its method argument."""

    topic: str = ""


class ResearchFlow(Flow[ResearchState]):
    """Four stages, each a crew run as a child run; one checkpoint per task."""

    checkpoint = CheckpointConfig(location=os.environ.get("RESEARCH_CHECKPOINTS", ".checkpoints"))

    @start()
    def stage1(self) -> Any:
        return self.run_crew(scope, {"topic": self.state.topic})

    @listen(stage1)
    def stage2(self, scoped: dict[str, Any]) -> Any:
        return self.run_crew(research, {"topic": self.state.topic, "brief": scoped["raw"]})

    @listen(stage2)
    def stage3(self, found: dict[str, Any]) -> Any:
        return self.run_crew(analysis, {"topic": self.state.topic, "brief": found["raw"]})

    @listen(stage3)
    def stage4(self, analysed: dict[str, Any]) -> Any:
        return self.run_crew(report, {"topic": self.state.topic, "brief": analysed["raw"]})


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.research [--submit] TOPIC`` or ``--resume RUN_ID``."""
    parser = argparse.ArgumentParser(prog="python -m examples.research")
    parser.add_argument("topic", nargs="?", default="solid-state batteries")
    parser.add_argument("--submit", action="store_true", help="run on the Celery workers")
    parser.add_argument("--resume", metavar="RUN_ID", help="resume a failed in-process run")
    args = parser.parse_args(argv)
    if args.submit:
        handle = ResearchFlow.submit({"topic": args.topic})
        print(f"submitted run {handle.run_id}; waiting ...")
        print(handle.result(timeout=600)["raw"])
        return 0
    if args.resume:
        config = CheckpointConfig(
            location=ResearchFlow.checkpoint.location, restore_from=args.resume
        )
        flow = ResearchFlow.from_checkpoint(config)
    else:
        flow = ResearchFlow()
    try:
        out = flow.kickoff(None if args.resume else {"topic": args.topic})
    except PlannedFailure as exc:
        print(f"{exc}\n  python -m examples.research --resume {flow.flow_id}", file=sys.stderr)
        return 1
    print(out["raw"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
