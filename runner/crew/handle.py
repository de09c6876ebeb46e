"""``CrewRunHandle``: a crew run on the workers, whose result is a :class:`CrewOutput`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.distributed.client import RunHandle

if TYPE_CHECKING:
    from runner.crew.crew import Crew, CrewOutput


class CrewRunHandle(RunHandle):
    """A submitted, resumed or forked crew run."""

    def __init__(self, run_id: str, rt: Any = None, *, crew: Crew) -> None:
        super().__init__(run_id, rt)
        self.crew = crew

    def result(self, timeout: float | None = None) -> CrewOutput:
        """Wait, then the crew's output; raise if the run did not succeed."""
        super().result(timeout)
        return self.crew.output(self.latest().state)
