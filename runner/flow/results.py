"""A run's result, decided once.

What ``kickoff()`` returns, what ``RunHandle.result()`` returns, what ``runner submit
--wait`` and ``runner status`` print, what the console and its API show and what a parent
step receives from its child run all come from :func:`run_result` (or its JSON form,
:func:`result_json`), so they are the same value for the same run.
"""

from __future__ import annotations

import inspect
from typing import Any

from runner.errors import RunnerError
from runner.flow import human_feedback as reviewing
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.attempt import to_json
from runner.flow.loading import load_flow
from runner.store.models import Checkpoint, RunStatus


def run_result(latest: Checkpoint, flow_cls: Any = None) -> Any:
    """The result of the run whose latest checkpoint is ``latest``: the output of its last
    committed step as its method gave it (the :class:`~runner.flow.human_feedback.
    HumanFeedbackResult` of a reviewed method without ``emit``), or for a flow class that
    says what its runs give (``result_of(state)``: a crew's output) that. ``flow_cls`` is
    the run's flow class, ``None`` where it cannot be imported (the stored output as is)."""
    # A class method, so a flow's own step that happens to be named so is not taken for it.
    if isinstance(inspect.getattr_static(flow_cls, "result_of", None), classmethod):
        return flow_cls.result_of(latest.state)
    record = tr.record_of(latest)
    last = orch.last_method(record)
    method = None if flow_cls is None or last is None else getattr(flow_cls, last, None)
    return reviewing.as_output(method, orch.last_output(record))


def result_json(status: RunStatus, latest: Checkpoint, flow_cls: Any = None) -> Any:
    """:func:`run_result` as JSON (what the CLI prints and the API returns), for a run that
    succeeded; ``None`` for any other."""
    if status is not RunStatus.SUCCEEDED:
        return None
    return to_json(run_result(latest, flow_cls), f"the result of run {latest.run_id}")


def flow_class_of(latest: Checkpoint) -> Any:
    """The flow class ``latest``'s run records, or ``None`` when it does not import here
    (a producer or console without the flow's module: its result is the stored output)."""
    if not latest.flow:
        return None
    try:
        return load_flow(str(latest.flow))
    except RunnerError:
        return None
