"""``runner check-deploy``: which stored runs the candidate code could not continue.

Loads the candidate flow modules, reads every run that may still go on (running, so
waiting, sleeping or scheduled; paused; failed; pending) and asks the pure check
(:func:`runner.flow.versions.deploy_problems`) of each whose flow the candidate defines.
It reads only: nothing in the store changes.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runner.errors import CorruptCheckpoint, FlowImportError
from runner.flow import versions
from runner.store.models import RunStatus

CHECKED = (RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.FAILED, RunStatus.PENDING)
"""The statuses of the runs a deploy may strand."""


@dataclass(frozen=True)
class Finding:
    """One run the candidate code could not continue, and why."""

    run_id: str
    flow: str
    status: str
    version: str | None
    """The version that wrote the run's latest checkpoint."""
    problems: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON of it."""
        return {
            "run_id": self.run_id,
            "flow": self.flow,
            "status": self.status,
            "version": self.version,
            "problems": list(self.problems),
        }


def candidate_flows(modules: Iterable[str]) -> dict[str, Any]:
    """Import path (``mod:Class``) -> flow class, of the flows the candidate ``modules``
    define."""
    from runner.flow.flow import Flow

    found: dict[str, Any] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise FlowImportError(f"cannot import {name}: {exc}", module=name) from None
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, Flow) and obj.__module__ == name:
                found[obj.flow_path()] = obj
    return found


def check_deploy(modules: Iterable[str], store: Any, limit: int = 100_000) -> list[Finding]:
    """The runs in ``store`` that the flows of ``modules`` could not continue (empty: the
    deploy strands none). A run of a flow the modules' namesake module lost is one too."""
    modules = list(modules)
    flows = candidate_flows(modules)
    found: list[Finding] = []
    for status in CHECKED:
        for info in store.runs(limit=limit, status=status):
            try:
                latest = store.latest(info.run_id)
            except CorruptCheckpoint as exc:
                found.append(Finding(info.run_id, str(info.flow), status.value, None, (str(exc),)))
                continue
            if latest is None or not latest.flow:
                continue
            problems = _problems(flows, modules, latest)
            if problems:
                found.append(
                    Finding(info.run_id, latest.flow, status.value, latest.version, tuple(problems))
                )
    return found


def _problems(flows: dict[str, Any], modules: list[str], latest: Any) -> list[str]:
    flow_cls = flows.get(latest.flow)
    if flow_cls is not None:
        return versions.deploy_problems(flow_cls, latest)
    if latest.flow.partition(":")[0] in modules:
        return [f"the new code has no flow {latest.flow}"]
    return []  # another module's flow: this deploy does not touch it
