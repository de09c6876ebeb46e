"""A conversational turn on the workers: the run's next epoch, with the user's message.

A conversational flow's run holds its conversation in its state. :func:`take_turn` opens a
new epoch of the same run (:func:`runner.flow.plans.plan_turn` decides whether it may and
with what state) whose first checkpoint already holds the message, and sends the run's
starts: whichever worker runs them reads the history from the run's checkpoints, so a
conversation outlives any worker. ``RunHandle.turn``, ``runner chat`` and the console's
``POST /api/runs/{id}/turns`` all come here.
"""

from __future__ import annotations

from typing import Any

from runner.errors import RunNotFound
from runner.flow import plans
from runner.flow.loading import load_flow
from runner.store.models import Checkpoint

from .engine import Runtime, commit_on_latest, dispatch_ready


def take_turn(rt: Runtime, run_id: str, message: Any) -> Checkpoint:
    """Give run ``run_id`` the user's ``message`` as its next turn and send its starts; the
    checkpoint that opens the turn. Refusals are :func:`~runner.flow.plans.plan_turn`'s."""
    latest = rt.store.latest(run_id)
    if latest is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    flow_cls = load_flow(str(latest.flow))
    plan = plans.plan_turn(flow_cls(), latest, message)
    done = commit_on_latest(rt, run_id, plan.opening, first=latest)
    assert done is not None
    ckpt, opened = done
    dispatch_ready(rt, flow_cls, ckpt, opened.ready)
    return ckpt
