"""Flows and a crew whose ``llm`` is a model name (CrewAI's ``llm="gpt-4o-mini"``), for
``tests/test_llm_names.py``. The test workers import this module (allow-list), so at import
it registers, as an application's module would, a fake client under :data:`EDITOR`; and
under the name in the environment variable :data:`LATE_ENV` when it is set (a worker
started after the user "added the registration", for the fix-then-resume test).
:data:`LATE` (``"gpt-4o-mini"``) is registered nowhere else.

The fake clients make no network call: :func:`editor` approves a review saying "ship it";
:class:`Writer` answers a task's prompt with its first line and the pid of its process.
"""

from __future__ import annotations

import os

from runner import Flow, FlowState, human_feedback, listen, register_llm, start
from runner.crew import Agent, Crew, Task

from .dist import executed

EDITOR = "llm-names-editor"
"""Registered at import in every process (the test's and the workers')."""

LATE = "gpt-4o-mini"
"""Registered only where :data:`LATE_ENV` names it."""

LATE_ENV = "RUNNER_TEST_LATE_LLM"

WRITER = "llm-names-writer"
"""The crew agent's client, registered at import."""


def editor(prompt: str) -> str:
    """Collapses a review: "ship it" approves, anything else rejects."""
    return "approved" if "ship it" in prompt else "rejected"


class Writer:
    """A CrewAI-shaped client (``.call``); says in which process it ran."""

    def call(self, prompt: str) -> str:
        return f"{prompt.splitlines()[0]} [pid {os.getpid()}]"


register_llm(EDITOR, editor)
register_llm(WRITER, Writer())
if os.environ.get(LATE_ENV):
    register_llm(os.environ[LATE_ENV], editor)


class Piece(FlowState):
    topic: str = ""
    verdict: str = ""


class _Reviewed(Flow[Piece]):
    """draft -> review (a person reviews the draft) -> publish | shelve."""

    @start()
    def draft(self) -> str:
        executed(self.state.id, "draft")
        return f"draft on {self.state.topic}"

    def _review(self, draft: str) -> str:
        executed(self.state.id, "review")
        return draft.upper()

    @listen("approved")
    def publish(self, text: str) -> str:
        executed(self.state.id, "publish")
        self.state.verdict = "published"
        return f"published {text}"

    @listen("rejected")
    def shelve(self) -> str:
        executed(self.state.id, "shelve")
        self.state.verdict = "shelved"
        return "shelved"


class ReviewByEditor(_Reviewed):
    """The review's answer is collapsed by the client registered as :data:`EDITOR`."""

    @listen("draft")
    @human_feedback(message="Publish?", emit=["approved", "rejected"], llm=EDITOR)
    def review(self, draft: str) -> str:
        return self._review(draft)


class ReviewByLate(_Reviewed):
    """The same, by the name :data:`LATE`, which the test workers do not register."""

    @listen("draft")
    @human_feedback(message="Publish?", emit=["approved", "rejected"], llm=LATE)
    def review(self, draft: str) -> str:
        return self._review(draft)


writer = Agent(role="Writer", goal="write", backstory="A writer.", llm=WRITER)
unhired = Agent(role="Ghost", goal="write", backstory="Nobody registered me.", llm=LATE)

named_crew = Crew(
    agents=[writer],
    tasks=[Task("Write about {topic}", "a line", agent=writer, name="write")],
    name="llm_names_crew",
)
ghost_crew = Crew(
    agents=[unhired],
    tasks=[Task("Ghostwrite about {topic}", "a line", agent=unhired, name="ghostwrite")],
    name="llm_names_ghost_crew",
)


class Host(FlowState):
    topic: str = ""
    text: str = ""


class CrewByName(Flow[Host]):
    """Runs :data:`named_crew` (on workers: as a child run) and keeps its text."""

    @start()
    def stage(self) -> object:
        return self.run_crew(named_crew, {"topic": self.state.topic})

    @listen(stage)
    def keep(self, crew_output: dict[str, object]) -> str:
        self.state.text = str(crew_output["raw"])
        return self.state.text


class GhostCrewByName(Flow[Host]):
    """Runs :data:`ghost_crew`, whose agent's name is registered nowhere."""

    @start()
    def stage(self) -> object:
        return self.run_crew(ghost_crew, {"topic": self.state.topic})
