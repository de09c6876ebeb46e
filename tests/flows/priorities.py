"""Flows of the priority tests (tests/test_priorities.py); the test workers import this
module (allow-list). Each step notes when it started in a list shared by the runs of one
``group``, so a test reads back in which order one busy worker took them; the last two note
the priority of the message each attempt came in (as the broker has it)."""

from __future__ import annotations

import time

from celery import current_task

from runner import Flow, start

from .flow_control import Job, note, notes


class Ranked(Job):
    """A job that can fail once on purpose (``fail``), to be resumed."""

    fail: bool = False


class RankedFlow(Flow[Ranked]):
    """One step at the run's priority (or the default); a failure is not retried."""

    @start(retries=0)
    def work(self) -> None:
        if self.state.fail:
            raise RuntimeError("failing on purpose until resumed with fail=false")
        note(self.state.group, "starts", run=self.state.id)
        time.sleep(self.state.seconds)


class UrgentFlow(Flow[Job]):
    """One step whose method asks for priority 8 (runs submitted without a priority)."""

    @start(priority=8)
    def work(self) -> None:
        note(self.state.group, "starts", run=self.state.id)
        time.sleep(self.state.seconds)


def wire_priority() -> object:
    """The priority of the message the current attempt came in, in the broker's terms."""
    return (current_task.request.delivery_info or {}).get("priority")


class RetriedFlow(Flow[Job]):
    """One step that fails its first attempt and is retried."""

    @start(retries=1, retry_backoff=0.05)
    def flaky(self) -> None:
        note(self.state.group, "attempts", run=self.state.id, priority=wire_priority())
        if len(notes(self.state.group, "attempts")) == 1:
            raise RuntimeError("the first attempt fails on purpose")


class PacedFlow(Flow[Job]):
    """One step that starts once a second across the deployment (burst 1): a second run's
    step is deferred."""

    @start(rate_limit="1/s")
    def paced(self) -> None:
        note(self.state.group, "paced", run=self.state.id, priority=wire_priority())
