"""Flows of ``tests/test_retention.py`` and ``bench/footprint.py``: runs that end each way.

``Report`` is the footprint flow: five steps, two state fields of about 2 KB each.
"""

from __future__ import annotations

from runner import Flow, FlowState, listen, retention, start

TEXT = "lorem ipsum dolor sit amet " * 76  # about 2 KB


class ReportState(FlowState):
    outline: str = ""
    draft: str = ""
    fail: bool = False
    pause: bool = False


class Report(Flow[ReportState]):
    """plan -> research -> outline -> write -> review; fails or pauses at ``review`` if told."""

    @start()
    def plan(self) -> str:
        return "plan"

    @listen(plan)
    def research(self) -> str:
        self.state.outline = TEXT
        return "research"

    @listen(research)
    def outline_it(self) -> str:
        return "outline"

    @listen(outline_it)
    def write(self) -> str:
        self.state.draft = TEXT.upper()
        return "write"

    @listen(write)
    def review(self) -> str:
        if self.state.fail:
            raise RuntimeError("the reviewer is away")
        if self.state.pause:
            self.pause("waiting for the editor")
        return "done"


@retention(succeeded="1h")
class ShortLived(Report):
    """The same flow, its successes kept one hour whatever the deployment says."""


class KeptLong(Report):
    """The same flow, its failures kept a week (a class attribute)."""

    retention = {"failed": "7d"}


@retention(succeeded="0s")
class Ephemeral(Report):
    """The same flow, its successes gone at the workers' next recovery pass."""
