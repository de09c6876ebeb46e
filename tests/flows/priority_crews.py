"""A crew whose first task asks for a priority (tests/test_priority_views.py); the test
workers import this module (allow-list). Each task notes, under the run's ``group`` input,
the priority of the message its attempt came in (as the broker has it)."""

from __future__ import annotations

from runner.crew import Crew, Task, TaskInput

from .flow_control import note
from .priorities import wire_priority


def noted(task: TaskInput) -> str:
    """Note this task's message priority."""
    note(task.inputs["group"], "tasks", task=task.name, priority=wire_priority())
    return task.name


triage_crew = Crew(
    tasks=[
        Task("Triage the ticket", name="triage", fn=noted, priority=7),
        Task("Reply to the ticket", name="reply", fn=noted),
    ],
    name="triage_crew",
)
