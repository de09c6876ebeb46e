"""Child runs: a flow method that runs a crew (or another flow) as a run of its own.

The method returns the child's output. In process the child runs inline. In a step on a
worker (:attr:`runner.flow.context.StepContext.on_worker`), starting a child returns a
:class:`ChildRun` marker instead: the engine links the child to the parent's in-flight
activation, starts it, and commits the activation with the child's output when the
child ends, so no worker ever waits on another task.

This module is the part both sides share: the marker and the child's run id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, model_serializer

from runner.errors import DefinitionError

CHILD_KEY = "__runner_child__"
"""The one key of a :class:`ChildRun`'s JSON form (how the engine recognises it)."""


class ChildRun(BaseModel):
    """What starting a child returns on a worker: "run this child; its output is mine"."""

    flow: str
    """Import path of the child (``module:variable`` of a crew)."""
    name: str
    """The child's flow name (the workers' registry key)."""
    inputs: dict[str, Any] = Field(default_factory=dict)
    """The child's kickoff inputs."""

    @model_serializer(mode="wrap")
    def _marked(self, handler: Any) -> dict[str, Any]:
        return {CHILD_KEY: handler(self)}

    def _not_yet(self) -> DefinitionError:
        return DefinitionError(
            f"on workers run_crew starts {self.name} as a child run and has no output yet: "
            "return it from the method and read the CrewOutput in a @listen method's argument",
            crew=self.name,
        )

    @property
    def raw(self) -> str:
        """Not available: see :meth:`_not_yet`."""
        raise self._not_yet()

    @property
    def tasks_output(self) -> list[Any]:
        """Not available: see :meth:`_not_yet`."""
        raise self._not_yet()

    def to_dict(self) -> dict[str, Any]:
        """Not available: see :meth:`_not_yet`."""
        raise self._not_yet()

    @classmethod
    def from_output(cls, output: Any) -> ChildRun | None:
        """The marker a step returned (in its JSON form), or ``None`` for any other output."""
        if isinstance(output, Mapping) and set(output) == {CHILD_KEY}:
            return cls.model_validate(output[CHILD_KEY])
        return None


def child_run_id(parent_run_id: str, activation: str) -> str:
    """The child run of a parent activation: the same on every attempt and resume."""
    return f"{parent_run_id}-{activation.replace('#', '-')}"
