"""Flows of the workers-and-queues tests (``tests/test_fleet.py``); the test workers import
this module (allow-list)."""

from __future__ import annotations

import time
from pathlib import Path

from runner import Flow, FlowState, start


class Nap(FlowState):
    """How long the step sleeps."""

    seconds: float = 0.0
    release: str = ""
    """A file whose appearance ends the nap early: a test holds a slot exactly as long as it
    looks, however slow the machine (the workers run on the test's machine)."""


class OvernightFlow(Flow[Nap]):
    """One step on the deployment's ``overnight`` queue, which the tests' workers never
    consume: its messages wait there."""

    @start(queue="overnight")
    def work(self) -> None:
        time.sleep(self.state.seconds)


class DozeFlow(Flow[Nap]):
    """One step on the default queue that holds a worker's slot for ``seconds``."""

    @start()
    def nap(self) -> None:
        until = time.monotonic() + self.state.seconds
        release = Path(self.state.release) if self.state.release else None
        while time.monotonic() < until and not (release and release.exists()):
            time.sleep(0.05)
