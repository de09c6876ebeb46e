"""How a run's metadata carries into a new epoch: the one table of rules.

A restart (``kickoff(inputs={"id": X})``, CrewAI's resume), a resume, an answer and a fork
each open a new epoch (a fork: the first of a new run). Each :class:`RunMeta` field then
either carries over (``KEEP``), goes back to its default (``RESET``: it belonged to the epoch
that ended), or is given by the transition that opens the epoch (``SET``: its number, its
ready steps, what it resumed or forked from, its usage). :data:`RULES` states it for every
field, and :func:`carry` applies it; ``tests/test_epochs.py`` checks that every field of
``RunMeta`` has its rule, so a new field must say how it carries.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from runner.store.models import RunMeta


class Opening(StrEnum):
    """What opens a new epoch."""

    RESTART = "restart"
    """``kickoff(inputs={"id": X})``: the run starts again from its starts."""
    RESUME = "resume"
    """``resume``: the run goes on from a checkpoint (its latest or an older one)."""
    ANSWER = "answer"
    """An answer to what the run awaits: it goes on from where it paused."""
    FORK = "fork"
    """``fork``: a new run starts from a checkpoint of another."""


class Carry(StrEnum):
    """What becomes of a field in the new epoch."""

    KEEP = "keep"
    RESET = "reset"
    SET = "set"


KEEP, RESET, SET = Carry.KEEP, Carry.RESET, Carry.SET

RULES: dict[str, tuple[Carry, Carry, Carry, Carry]] = {
    # field:            (restart, resume, answer, fork)
    "name": (KEEP, KEEP, KEEP, KEEP),
    "epoch": (SET, SET, SET, SET),
    "ready": (SET, SET, SET, SET),
    "parent": (KEEP, KEEP, KEEP, KEEP),
    "children": (KEEP, KEEP, KEEP, KEEP),
    "resumed_from": (KEEP, SET, SET, RESET),
    "forked_from": (KEEP, KEEP, KEEP, SET),
    # A pause ends with the epoch it paused (a restart's first step may pause again).
    "pause_reason": (KEEP, RESET, RESET, RESET),
    # The source run's merge conflicts are not the fork's.
    "conflicts": (KEEP, KEEP, KEEP, RESET),
    "trigger_payload": (KEEP, KEEP, KEEP, KEEP),
    "submitted": (KEEP, KEEP, KEEP, KEEP),
    "not_before": (KEEP, KEEP, KEEP, KEEP),
    "deadline": (KEEP, KEEP, KEEP, KEEP),
    "priority": (KEEP, KEEP, KEEP, KEEP),
    "cancel_reason": (KEEP, KEEP, KEEP, KEEP),
    # A restart's activations begin again at #1: what earlier ones slept, were answered or
    # reviewed is not theirs. A resume's re-run steps replay them.
    "sleeps": (RESET, KEEP, KEEP, KEEP),
    "awaiting": (RESET, RESET, RESET, RESET),
    "answers": (RESET, KEEP, SET, KEEP),
    "feedback": (RESET, KEEP, KEEP, KEEP),
    "reviews": (RESET, KEEP, KEEP, KEEP),
    # The version a run started on pins it (RUNNER_VERSION_POLICY=pinned); a restart starts
    # it again on the code restarting it. A fork keeps it; moving a run to new code on
    # purpose (fork --map) sets it (runner.flow.versions).
    "pinned": (SET, KEEP, KEEP, KEEP),
    # Patch decisions are the activation's, as its sleeps (runner.flow.patches).
    "patches": (RESET, KEEP, KEEP, KEEP),
    "usage": (SET, SET, SET, SET),
    # Set on every epoch's opening checkpoint by ``transition.with_record``, from ``ready``.
    "opener": (KEEP, KEEP, KEEP, KEEP),
    "opened_at": (KEEP, KEEP, KEEP, KEEP),
    # The state's own history: whoever continues it, the upgrades it went through stay told
    # (the opening that upgrades it adds its entry; runner.flow.versions).
    "upgrades": (KEEP, KEEP, KEEP, KEEP),
}
"""Field -> its rule for each :class:`Opening`, in the order the enum lists them."""


def rule(field: str, opening: Opening) -> Carry:
    """How ``field`` carries into an epoch ``opening`` opens."""
    return RULES[field][list(Opening).index(opening)]


def carry(meta: RunMeta, opening: Opening, **values: Any) -> RunMeta:
    """``meta`` as the first checkpoint of an epoch ``opening`` opens has it: ``values`` for
    the fields the opening sets (each of them given, no other), the defaults for those it
    resets, the rest kept. A ``TypeError`` names a field missing or given wrongly."""
    update: dict[str, Any] = {}
    for field in RULES:
        found = rule(field, opening)
        if found is SET:
            if field not in values:
                raise TypeError(f"a {opening} sets {field}: give it")
            update[field] = values.pop(field)
        elif found is RESET:
            update[field] = RunMeta.model_fields[field].get_default(call_default_factory=True)
    if values:
        raise TypeError(f"a {opening} does not set {', '.join(sorted(values))}")
    return meta.model_copy(update=update)
