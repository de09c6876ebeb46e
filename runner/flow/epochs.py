"""How a run's metadata carries into a new epoch: the one table of rules.

A restart (``kickoff(inputs={"id": X})``, CrewAI's resume), a resume, an answer and a fork
each open a new epoch (a fork: the first of a new run). Each :class:`RunMeta` field then
either carries over (``KEEP``), goes back to its default (``RESET``: it belonged to the epoch
that ended), or is given by the transition that opens the epoch (``SET``: its number, its
ready steps, what it resumed or forked from, its usage). :data:`RULES` states it for every
field, of the top level and of each group (:data:`~runner.store.models.META_GROUPS`; a group
whose fields all carry alike states it once), and :func:`carry` applies it;
``tests/test_epochs.py`` checks that every field has exactly one rule, so a new field (or a
group's new field) must say how it carries.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from runner.store.models import GROUP_OF, META_GROUPS, RunMeta


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
    # field or group:   (restart, resume, answer, fork)
    "name": (KEEP, KEEP, KEEP, KEEP),
    "epoch": (SET, SET, SET, SET),
    "ready": (SET, SET, SET, SET),
    # A paused or failed run going on from where it stands (an answer, a resume of its
    # latest checkpoint) lets a parallel step still running go on (its lease is live); a
    # restart, a fork or a rewinding resume runs every step again in the new epoch.
    "carried": (RESET, SET, SET, RESET),
    "resumed_from": (KEEP, SET, SET, RESET),
    "forked_from": (KEEP, KEEP, KEEP, SET),
    # The source run's merge conflicts are not the fork's.
    "conflicts": (KEEP, KEEP, KEEP, RESET),
    "trigger_payload": (KEEP, KEEP, KEEP, KEEP),
    "cancel_reason": (KEEP, KEEP, KEEP, KEEP),
    "usage": (SET, SET, SET, SET),
    # Set on every epoch's opening checkpoint by ``transition.with_record``, from ``ready``.
    "opener": (KEEP, KEEP, KEEP, KEEP),
    "opened_at": (KEEP, KEEP, KEEP, KEEP),
    # What submit asked (its digest, delayed start, deadline, priority) holds for the run.
    "scheduling": (KEEP, KEEP, KEEP, KEEP),
    # A child stays its parent's, and a parent keeps its children, whatever reopens either.
    "links": (KEEP, KEEP, KEEP, KEEP),
    # A pause ends with the epoch it paused (a restart's first step may pause again).
    "human.pause_reason": (KEEP, RESET, RESET, RESET),
    # A restart's activations begin again at #1: what earlier ones were answered or
    # reviewed is not theirs. A resume's re-run steps replay them.
    "human.awaiting": (RESET, RESET, RESET, RESET),
    "human.answers": (RESET, KEEP, SET, KEEP),
    "human.feedback": (RESET, KEEP, KEEP, KEEP),
    "human.reviews": (RESET, KEEP, KEEP, KEEP),
    # An activation's sleeps and patch decisions (runner.flow.patches) are its own: a
    # restart's activations begin again at #1; a resume's re-run steps replay them.
    "replay": (RESET, KEEP, KEEP, KEEP),
    # The version a run started on pins it (RUNNER_VERSION_POLICY=pinned); a restart starts
    # it again on the code restarting it. A fork keeps it; moving a run to new code on
    # purpose (fork --map) sets it (runner.flow.versions).
    "versions.pinned": (SET, KEEP, KEEP, KEEP),
    # The state's own history: whoever continues it, the upgrades it went through stay told
    # (the opening that upgrades it adds its entry; runner.flow.versions).
    "versions.upgrades": (KEEP, KEEP, KEEP, KEEP),
}
"""Each :class:`RunMeta` top-level field, each group whose fields all carry alike
(``"links"``), and each field of the other groups (``"human.awaiting"``) -> its rule for
each :class:`Opening`, in the order the enum lists them. Every field has exactly one."""


def paths() -> list[str]:
    """Every field of :class:`RunMeta` as :func:`rule` names it: ``"name"`` at the top
    level, ``"group.field"`` in a group."""
    top = [f for f in RunMeta.model_fields if f not in META_GROUPS]
    return [*top, *(f"{GROUP_OF[f]}.{f}" for f in GROUP_OF)]


def rule(field: str, opening: Opening) -> Carry:
    """How ``field`` (a top-level field, ``"group.field"`` or a grouped field's plain name)
    carries into an epoch ``opening`` opens: its own rule, else its group's."""
    group = GROUP_OF.get(field)
    if group is not None:
        field = f"{group}.{field}"
    rules = RULES.get(field) or RULES[field.partition(".")[0]]
    return rules[list(Opening).index(opening)]


def carry(meta: RunMeta, opening: Opening, **values: Any) -> RunMeta:
    """``meta`` as the first checkpoint of an epoch ``opening`` opens has it: ``values`` for
    the fields the opening sets (each of them given by its plain name, no other), the
    defaults for those it resets, the rest kept. A ``TypeError`` names a field missing or
    given wrongly."""
    update: dict[str, Any] = {}
    for path in paths():
        group, _, field = path.rpartition(".")
        found = rule(path, opening)
        if found is SET:
            if field not in values:
                raise TypeError(f"a {opening} sets {field}: give it")
            update[field] = values.pop(field)
        elif found is RESET:
            model = META_GROUPS[group] if group else RunMeta
            update[field] = model.model_fields[field].get_default(call_default_factory=True)
    if values:
        raise TypeError(f"a {opening} does not set {', '.join(sorted(values))}")
    return meta.updated(**update)
