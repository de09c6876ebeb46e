"""Giving a paused run the answer it awaits: the one delivery every way of answering uses.

``@human_feedback``'s review and ``self.ask``'s question pause a run with ``meta.human.awaiting``
(see :mod:`runner.flow.human_feedback`, :mod:`runner.flow.input_provider`). :func:`deliver`
records the answer (its text, a label chosen directly, who gave it, when) in the run's
``meta.human.answers`` and sends the step that waited again, in a new epoch. A parallel step
still running when its run paused is not sent again: its attempt goes on into that epoch. The CLI's
``resume --feedback``, ``RunHandle.resume(feedback=)``, the console and its API,
``control.answer`` and an ``ask`` timeout all come here.
"""

from __future__ import annotations

from runner.errors import RunNotFound, RunStateError
from runner.flow import plans
from runner.flow.loading import load_flow
from runner.store.models import Checkpoint

from .engine import Runtime, commit_on_latest, dispatch_ready, running_steps


def deliver(
    rt: Runtime,
    run_id: str,
    text: str | None,
    *,
    by: str | None = None,
    outcome: str | None = None,
    step: str | None = None,
) -> Checkpoint:
    """Answer what run ``run_id`` awaits with ``text`` (``outcome``: an ``emit`` label chosen
    directly instead of collapsing ``text`` to one; ``by``: who answers) and send the step
    that waited again; the checkpoint that records the answer. A run that awaits nothing is
    :class:`~runner.errors.RunStateError`; an ``outcome`` not among the labels,
    :class:`~runner.errors.InvalidInputs`.

    ``step`` (a method name or an activation id) is the step the answerer read the question
    of: when the run now awaits another one (it was answered meanwhile and asks the next),
    the answer is refused rather than given to a question its author never saw. A parallel
    step that commits while the answer is planned (its own pause leaves the run's question
    in place) does not refuse it: the answer is planned again on that commit."""
    latest = rt.store.latest(run_id)
    if latest is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    flow_cls = load_flow(str(latest.flow))
    while True:
        plan = plans.plan_answer(
            flow_cls.graph(),
            latest,
            text,
            by=by,
            outcome=outcome,
            step=step,
            flow_cls=flow_cls,
            running=running_steps(rt, latest),
        )
        try:
            done = commit_on_latest(rt, run_id, plan.opening)
            break
        except RunStateError:
            newer = rt.store.latest(run_id)
            if newer is None or not plan.still_asked(newer):
                raise
            # Each pass follows another commit of a paused part of the run: its steps
            # still running are few, and each commits once.
            latest = newer
    assert done is not None
    ckpt, went_on = done
    dispatch_ready(rt, flow_cls, ckpt, went_on.ready)
    return ckpt
