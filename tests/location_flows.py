"""A flow of ``tests/test_checkpoint_location.py``: run in process into a JSON directory or a
SQLite file, then inspected and resumed by ``runner ... --location`` in other processes.

Each method appends its name to the file :data:`LOG_ENV` names, so a test can tell which
methods ran, in any process; ``check`` fails while the file :data:`FAIL_ENV` names exists.
"""

from __future__ import annotations

import os
from pathlib import Path

from runner import Flow, FlowState, listen, start

LOG_ENV = "RUNNER_TEST_LOCATION_LOG"
FAIL_ENV = "RUNNER_TEST_LOCATION_FAIL"


def ran(method: str) -> None:
    """Note that ``method`` ran."""
    with open(os.environ[LOG_ENV], "a", encoding="utf-8") as fh:
        fh.write(method + "\n")


class Notes(FlowState):
    topic: str = ""
    drafts: list[str] = []
    checked: bool = False


class ThreeStages(Flow[Notes]):
    """gather -> check (fails while the fail file exists) -> publish."""

    @start()
    def gather(self) -> str:
        ran("gather")
        self.state.drafts.append(f"notes on {self.state.topic}")
        return self.state.drafts[-1]

    @listen(gather)
    def check(self, notes: str) -> str:
        ran("check")
        if Path(os.environ[FAIL_ENV]).exists():
            raise RuntimeError("the source is offline")
        self.state.checked = True
        return f"checked {notes}"

    @listen(check)
    def publish(self, checked: str) -> str:
        ran("publish")
        return f"published: {checked}"
