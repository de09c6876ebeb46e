"""Flows of the flow-control tests (routing, concurrency and rate limits); the test workers
import this module (allow-list). Each limited method notes when it started (and ended) in a
list shared by the runs of one ``group``, read back by the tests."""

from __future__ import annotations

import json
import os
import time

from celery import current_task

from runner import Flow, FlowState, listen, start

from .dist import client


class Job(FlowState):
    """One job of a group: how long its step takes, and where its steps ran."""

    group: str = ""
    seconds: float = 0.0
    prepared_on: str = ""
    embedded_on: str = ""


def note(group: str, what: str, **data: object) -> None:
    """Append an event of ``group`` (a JSON line) to its list."""
    event = {**data, "pid": os.getpid(), "at": time.time()}
    client().rpush(f"fc-test:{group}:{what}", json.dumps(event))


def notes(group: str, what: str) -> list[dict[str, object]]:
    """The events of ``group`` (read from a test)."""
    return [json.loads(raw) for raw in client().lrange(f"fc-test:{group}:{what}", 0, -1)]


class RoutedFlow(Flow[Job]):
    """A step on the default queue, then one on the deployment's ``gpu`` queue."""

    @start()
    def prepare(self) -> None:
        self.state.prepared_on = str(current_task.request.hostname)

    @listen(prepare, queue="gpu")
    def embed(self) -> None:
        self.state.embedded_on = str(current_task.request.hostname)


class GpuFlow(Flow[Job]):
    """Its first step on the deployment's ``gpu`` queue, then one on the default queue."""

    @start(queue="gpu")
    def embed(self) -> None:
        self.state.embedded_on = str(current_task.request.hostname)

    @listen(embed)
    def report(self) -> None:
        self.state.prepared_on = str(current_task.request.hostname)


class RatedFlow(Flow[Job]):
    """One step that may start five times a second across the deployment."""

    @start(rate_limit="5/s")
    def call(self) -> None:
        note(self.state.group, "starts", run=self.state.id)


class NarrowFlow(Flow[Job]):
    """One step of which two attempts may run at once across the deployment."""

    @start(concurrency=2)
    def work(self) -> None:
        note(self.state.group, "began", run=self.state.id)
        time.sleep(self.state.seconds)
        note(self.state.group, "ended", run=self.state.id)


class QuickFlow(Flow[Job]):
    """One unlimited step."""

    @start()
    def ping(self) -> str:
        return "pong"
