"""``CrewRunHandle``: a crew run on the workers, whose result is a :class:`CrewOutput`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from runner.crew.task import CrewOutput
from runner.distributed.client import RunHandle


class Outputs(Protocol):
    """What a handle needs of its crew (a :class:`~runner.crew.crew.Crew`, which makes the
    handles: a protocol, so this module does not import it)."""

    def output(self, state: Mapping[str, Any]) -> CrewOutput:
        """The crew's output from a run's state."""
        ...


class CrewRunHandle(RunHandle):
    """A submitted, resumed or forked crew run."""

    def __init__(self, run_id: str, rt: Any = None, *, crew: Outputs) -> None:
        super().__init__(run_id, rt)
        self.crew = crew

    def result(self, timeout: float | None = None) -> CrewOutput:
        """Wait, then the crew's output; raise if the run did not succeed."""
        super().result(timeout)
        return self.crew.output(self.latest().state)
