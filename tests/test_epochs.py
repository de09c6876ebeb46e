"""How a run's metadata carries into a new epoch is stated once (:mod:`runner.flow.epochs`)
for every ``RunMeta`` field, and the transitions that open an epoch (restart, resume,
answer) follow it. In process, no Redis."""

from __future__ import annotations

from typing import Any

import pytest

from runner.flow import epochs
from runner.flow import transition as tr
from runner.flow.epochs import Carry, Opening
from runner.flow.graph import compile_graph
from runner.store.models import (
    Answer,
    Awaiting,
    ChildLink,
    ParentLink,
    RunMeta,
    RunStatus,
    RunUsage,
)
from tests.flows.results import PlainEnd


def test_every_run_meta_field_states_how_it_carries_into_each_kind_of_new_epoch() -> None:
    assert set(epochs.RULES) == set(RunMeta.model_fields)
    assert all(len(rules) == len(Opening) for rules in epochs.RULES.values())


def full_meta() -> RunMeta:
    """Metadata with every field away from its default."""
    awaiting = Awaiting(kind="feedback", method="write", activation="write#1", message="ok?")
    values: dict[str, Any] = {
        "name": "PlainEnd",
        "epoch": 3,
        "ready": ["write#1"],
        "parent": ParentLink(run_id="parent", activation="step#1"),
        "children": {"write#1": ChildLink(run_id="child", flow="x:C", name="C")},
        "resumed_from": "c-resumed",
        "forked_from": "c-forked",
        "pause_reason": "waiting",
        "conflicts": ["topic"],
        "trigger_payload": {"from": "webhook"},
        "submitted": "digest",
        "not_before": 1.0,
        "deadline": 2.0,
        "priority": 7,
        "cancel_reason": "deadline",
        "sleeps": {"write#1": [3.0]},
        "awaiting": awaiting,
        "answers": {"write#1": [Answer(text="no", awaited=awaiting)]},
        "feedback": [{"feedback": "no"}],
        "reviews": {"write#1": awaiting},
        "usage": RunUsage(),
        "opener": "gather#1",
        "opened_at": 4.0,
        "upgrades": ["v1 -> v2"],
        "patches": {"write#1": {"new-prompt": False}},
        "pinned": "v1",
    }
    meta = RunMeta(**values)
    default = RunMeta()
    assert all(getattr(meta, f) != getattr(default, f) for f in RunMeta.model_fields)
    return meta


def carried_as_stated(before: RunMeta, after: RunMeta, opening: Opening) -> None:
    """Every field kept or reset as :data:`epochs.RULES` says (those set are the opening's)."""
    default = RunMeta()
    for field in RunMeta.model_fields:
        rule = epochs.rule(field, opening)
        if rule is Carry.KEEP and field not in ("opener", "opened_at"):
            assert getattr(after, field) == getattr(before, field), field
        elif rule is Carry.RESET:
            assert getattr(after, field) == getattr(default, field), field


@pytest.fixture
def paused() -> Any:
    graph = compile_graph(PlainEnd)
    started = tr.start(graph, "run-1", {"id": "run-1"}, flow="x:PlainEnd", name="PlainEnd")
    ckpt = started.checkpoint.model_copy(update={"meta": full_meta(), "status": RunStatus.PAUSED})
    return graph, ckpt


def test_a_restart_a_resume_and_an_answer_carry_each_field_as_the_rules_state(paused) -> None:
    graph, ckpt = paused
    answer = Answer(text="yes", awaited=ckpt.meta.awaiting)

    restarted = tr.restart(graph, ckpt, dict(ckpt.state)).checkpoint.meta
    resumed = tr.resumed(ckpt, ckpt, dict(ckpt.state)).checkpoint.meta
    answered = tr.answered(ckpt, answer).checkpoint.meta

    carried_as_stated(ckpt.meta, restarted, Opening.RESTART)
    carried_as_stated(ckpt.meta, resumed, Opening.RESUME)
    carried_as_stated(ckpt.meta, answered, Opening.ANSWER)
    assert (restarted.epoch, resumed.epoch, answered.epoch) == (4, 4, 4)
    assert resumed.resumed_from == answered.resumed_from == ckpt.id
    assert answered.answers["write#1"][-1] == answer
    assert restarted.answers == {} and restarted.sleeps == {}


def test_an_opening_must_give_what_it_sets_and_nothing_else() -> None:
    with pytest.raises(TypeError, match="sets epoch"):
        epochs.carry(RunMeta(), Opening.FORK, ready=[], forked_from="c", usage=None)
    with pytest.raises(TypeError, match="does not set answers"):
        epochs.carry(
            RunMeta(), Opening.RESUME, ready=[], epoch=1, resumed_from="c", usage=None, answers={}
        )
