"""Patches for changed logic: ``self.patched("change-id")`` and ``self.deprecate_patch``.

A method whose logic changes under runs that wait inside it (a pause at ``ask``, a durable
sleep, a review) branches on whether the run reached that point first on code that has the
change, as Temporal's ``workflow.patched()`` and DBOS's ``DBOS.patch()`` do:

* a step re-running what an earlier attempt already passed (before the ``ask`` whose answer
  it now replays, or the sleep whose wake-up it reached) finds no decision recorded there:
  the code that passed it had no patch, so ``patched`` is ``False``;
* past that point, and in a step reached first on code that has the patch, it is ``True``;
* a decision, once made, is recorded in the run (``RunMeta.replay.patches``, per activation, with
  the checkpoint the step commits when it pauses or sleeps), so every later re-run, on
  whichever code, a resume and a replay decide the same.

``deprecate_patch`` replaces ``patched`` once no waiting run needs the old branch
(``runner check-deploy`` names those that do): it returns ``True`` and records it, as
DBOS's does, so code still calling ``patched`` for that id decides alike.
"""

from __future__ import annotations

from typing import Any

from runner.flow.context import StepContext, step_context
from runner.flow.input_provider import ASK
from runner.store.models import RunMeta


def replaying(ctx: StepContext) -> bool:
    """Whether the step is re-running code an earlier attempt of it already passed: it has
    not yet reached its last recorded answer (to an ``ask``) or its last recorded sleep."""
    asked = [a for a in ctx.answers.recorded if getattr(a.awaited, "kind", None) == ASK]
    return ctx.answers.calls < len(asked) or ctx.sleeps.calls < len(ctx.sleeps.recorded)


def patched(flow: Any, change_id: str) -> bool:
    """See :meth:`runner.flow.flow.Flow.patched`."""
    _check(change_id)
    ctx = step_context()
    if ctx is None or ctx.flow is not flow:
        return True  # outside a step: the flow used as a plain object runs the new code
    patches = ctx.patches
    if change_id in patches.recorded:
        return patches.recorded[change_id]
    if change_id not in patches.decided:
        patches.decided[change_id] = not replaying(ctx)
    return patches.decided[change_id]


def deprecate(flow: Any, change_id: str) -> bool:
    """See :meth:`runner.flow.flow.Flow.deprecate_patch`."""
    _check(change_id)
    ctx = step_context()
    if ctx is not None and ctx.flow is flow and change_id not in ctx.patches.recorded:
        ctx.patches.decided.setdefault(change_id, True)
    return True


def recorded_in(meta: RunMeta, activation_id: str, decided: dict[str, bool]) -> RunMeta:
    """``meta`` with ``decided`` added to ``activation_id``'s recorded patch decisions."""
    if not decided:
        return meta
    mine = {**meta.replay.patches.get(activation_id, {}), **decided}
    return meta.updated(patches={**meta.replay.patches, activation_id: mine})


def _check(change_id: str) -> None:
    if not isinstance(change_id, str) or not change_id:
        raise ValueError(f"a patch's change id is a non-empty string, not {change_id!r}")
