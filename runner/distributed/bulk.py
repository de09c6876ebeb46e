"""Bulk actions: resume, cancel, fork or pin every run of a selection
(:mod:`runner.store.selection`) or of a list of ids, for the CLI, the API and the console.

Each run goes through the single-run code path (:func:`.control.resume`,
:meth:`.client.RunHandle.cancel`, :func:`.control.fork`, :func:`.retention.pin`), so a bulk
action refuses a run exactly as the one-run command would. A refusal (the run's state does
not allow it: still running, already finished; a fork that would change nothing) counts as
*skipped* with its reason; any other error as *failed* with its one line; neither stops the
others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from runner.errors import InvalidInputs, RunnerError, RunStateError
from runner.store.models import RunInfo
from runner.store.selection import Page, Where, page_of, parse

from . import control, retention
from .client import RunHandle
from .engine import Runtime

Action = Literal["resume", "cancel", "fork", "pin"]
ACTIONS: tuple[Action, ...] = ("resume", "cancel", "fork", "pin")
SHOWN = 10
"""Runs a dry run lists (the count names them all)."""


@dataclass
class Outcome:
    """What happened to one run: ``acted`` (``result`` names the run resumed or forked
    into), ``skipped`` (refused by its state) or ``failed``, with the one-line reason."""

    run_id: str
    outcome: Literal["acted", "skipped", "failed"]
    reason: str = ""
    result: str | None = None


@dataclass
class Summary:
    """A bulk action's outcome: each run's, and the counts."""

    action: Action
    dry_run: bool
    selected: list[RunInfo]
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        """How many runs ended ``outcome`` (``acted``, ``skipped``, ``failed``)."""
        return sum(1 for o in self.outcomes if o.outcome == outcome)

    def as_json(self) -> dict[str, Any]:
        """The API's and ``--json``'s answer."""
        return {
            "action": self.action,
            "dry_run": self.dry_run,
            "count": len(self.selected),
            "runs": [
                {
                    "run_id": i.run_id,
                    "flow": i.name or i.flow,
                    "status": i.status.value,
                    "updated_at": i.updated_at,
                }
                for i in (self.selected if not self.dry_run else self.selected[:SHOWN])
            ],
            "acted": self.count("acted"),
            "skipped": self.count("skipped"),
            "failed": self.count("failed"),
            "outcomes": [o.__dict__ for o in self.outcomes],
        }


def select(
    rt: Runtime, where: str | None = None, ids: Sequence[str] | None = None
) -> list[RunInfo]:
    """The runs a bulk action means: those ``where`` keeps (every page), or the runs ``ids``
    names (an unknown id is an error before anything is done)."""
    if (where is None) == (ids is None):
        raise InvalidInputs("give a selection (where) or run ids, not both")
    if ids is not None:
        infos = []
        for run_id in dict.fromkeys(ids):
            info = rt.store.run(run_id)
            if info is None:
                raise InvalidInputs(f"no run {run_id}", run_id=run_id)
            infos.append(info)
        return infos
    chosen: Where = parse(where, time.time())
    if chosen.empty:
        raise InvalidInputs("an empty selection would act on every run: name at least one term")
    page: Page = page_of(rt.store, chosen, limit=None)
    return page.runs


def act(
    rt: Runtime,
    action: Action,
    runs: Sequence[RunInfo],
    *,
    on_each: Callable[[Outcome], None] | None = None,
) -> Summary:
    """Carry out ``action`` on each of ``runs`` in turn, telling ``on_each`` (a progress bar)
    after each one."""
    if action not in ACTIONS:
        raise InvalidInputs(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    summary = Summary(action=action, dry_run=False, selected=list(runs))
    for info in runs:
        outcome = one(rt, action, info.run_id)
        summary.outcomes.append(outcome)
        if on_each is not None:
            on_each(outcome)
    return summary


def one(rt: Runtime, action: Action, run_id: str) -> Outcome:
    """``action`` on one run, through its single-run code path."""
    try:
        result = _do(rt, action, run_id)
    except (RunStateError, control.ForkChangesNothing) as exc:
        return Outcome(run_id, "skipped", _line(exc))
    except RunnerError as exc:
        return Outcome(run_id, "failed", _line(exc))
    return Outcome(run_id, "acted", result=result)


def _do(rt: Runtime, action: Action, run_id: str) -> str | None:
    if action == "resume":
        return control.resume(run_id, rt=rt).run_id
    if action == "cancel":
        RunHandle(run_id, rt).cancel()
        return None
    if action == "fork":
        return control.fork(run_id, rt=rt).run_id
    retention.pin(rt.store, run_id, True)
    return None


def _line(exc: RunnerError) -> str:
    text = str(exc.message if hasattr(exc, "message") else exc)
    return text.splitlines()[0] if text else type(exc).__name__


def dry(action: Action, runs: Sequence[RunInfo]) -> Summary:
    """What ``action`` would act on, without acting."""
    if action not in ACTIONS:
        raise InvalidInputs(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    return Summary(action=action, dry_run=True, selected=list(runs))
