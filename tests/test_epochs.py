"""How a run's metadata carries into a new epoch is stated once (:mod:`runner.flow.epochs`)
for every ``RunMeta`` field, and the transitions that open an epoch (restart, resume,
answer) follow it. In process, no Redis."""

from __future__ import annotations

from typing import Any

import pytest

from runner import ids
from runner.errors import RunStateError
from runner.flow import epochs, lifecycle
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.epochs import Carry, Opening
from runner.flow.graph import compile_graph
from runner.store.models import (
    GROUP_OF,
    META_GROUPS,
    Answer,
    Awaiting,
    ChildLink,
    ParentLink,
    RunMeta,
    RunStatus,
    RunUsage,
)
from tests.flows.results import PlainEnd
from tests.flows.reviews import TwinReviewFlow


def test_every_run_meta_field_states_how_it_carries_into_each_kind_of_new_epoch() -> None:
    """Each field of the top level and of every group has exactly one rule: its own, or
    its group's (a group's key stands for all its fields), never both."""
    top = {f for f in RunMeta.model_fields if f not in META_GROUPS}
    grouped = {f"{GROUP_OF[f]}.{f}" for f in GROUP_OF}
    assert set(epochs.paths()) == top | grouped
    for key in epochs.RULES:
        group, dot, field = key.partition(".")
        if dot:
            assert group in META_GROUPS and field in META_GROUPS[group].model_fields, key
            assert group not in epochs.RULES, f"{key} and its group {group} both have a rule"
        else:
            assert key in top or key in META_GROUPS, key
    for path in epochs.paths():
        owners = [k for k in (path, path.partition(".")[0]) if k in epochs.RULES]
        assert len(set(owners)) == 1, f"{path}: {owners or 'no rule'}"
    assert all(len(rules) == len(Opening) for rules in epochs.RULES.values())


def test_a_group_rule_is_each_of_its_fields_rule_by_any_name() -> None:
    for opening in Opening:
        assert epochs.rule("links.parent", opening) is epochs.rule("links", opening)
        assert epochs.rule("sleeps", opening) is epochs.rule("replay.sleeps", opening)
        assert epochs.rule("answers", opening) is epochs.rule("human.answers", opening)


def full_meta() -> RunMeta:
    """Metadata with every field (of the top level and of each group) away from its
    default."""
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
        "carried": {"write#1": 2},
    }
    meta = RunMeta().updated(**values)
    default = RunMeta()
    assert all(value(meta, p) != value(default, p) for p in epochs.paths())
    return meta


def value(meta: RunMeta, path: str) -> Any:
    """The value of field ``path`` (``"name"``, ``"human.awaiting"``) of ``meta``."""
    return meta.field(path.rpartition(".")[2])


def carried_as_stated(before: RunMeta, after: RunMeta, opening: Opening) -> None:
    """Every field kept or reset as :data:`epochs.RULES` says (those set are the opening's)."""
    default = RunMeta()
    for path in epochs.paths():
        rule = epochs.rule(path, opening)
        if rule is Carry.KEEP and path not in ("opener", "opened_at"):
            assert value(after, path) == value(before, path), path
        elif rule is Carry.RESET:
            assert value(after, path) == value(default, path), path


@pytest.fixture
def paused() -> Any:
    graph = compile_graph(PlainEnd)
    started = tr.start(graph, "run-1", {"id": "run-1"}, flow="x:PlainEnd", name="PlainEnd")
    ckpt = started.checkpoint.model_copy(update={"meta": full_meta(), "status": RunStatus.PAUSED})
    return graph, ckpt


def test_a_restart_a_resume_and_an_answer_carry_each_field_as_the_rules_state(paused) -> None:
    graph, ckpt = paused
    answer = Answer(text="yes", awaited=ckpt.meta.human.awaiting)

    restarted = tr.restart(graph, ckpt, dict(ckpt.state)).checkpoint.meta
    resumed = tr.resumed(ckpt, ckpt, dict(ckpt.state)).checkpoint.meta
    answered = tr.answered(ckpt, answer).checkpoint.meta

    carried_as_stated(ckpt.meta, restarted, Opening.RESTART)
    carried_as_stated(ckpt.meta, resumed, Opening.RESUME)
    carried_as_stated(ckpt.meta, answered, Opening.ANSWER)
    assert (restarted.epoch, resumed.epoch, answered.epoch) == (4, 4, 4)
    assert resumed.resumed_from == answered.resumed_from == ckpt.id
    assert answered.human.answers["write#1"][-1] == answer
    assert restarted.human.answers == {} and restarted.replay.sleeps == {}


def test_an_opening_must_give_what_it_sets_and_nothing_else() -> None:
    with pytest.raises(TypeError, match="sets epoch"):
        epochs.carry(RunMeta(), Opening.FORK, ready=[], forked_from="c", usage=None)
    with pytest.raises(TypeError, match="does not set answers"):
        epochs.carry(
            RunMeta(),
            Opening.RESUME,
            ready=[],
            epoch=1,
            resumed_from="c",
            usage=None,
            carried={},
            answers={},
        )


def twins_paused_on_left() -> Any:
    """A TwinReviewFlow run paused by ``left``'s review while ``right`` still runs, in
    epoch 2."""
    graph = compile_graph(TwinReviewFlow)
    ckpt = tr.start(graph, "run-2", {"id": "run-2"}, flow="x:T", name="T").checkpoint
    ckpt = ckpt.model_copy(update={"meta": ckpt.meta.updated(epoch=2)})
    (begin,) = orch.pending(tr.record_of(ckpt))
    ckpt = tr.step_done(
        graph, ckpt, begin, base_state={}, new_state={}, output="kelp", label=None, reducers={}
    ).checkpoint
    left = next(a for a in orch.pending(tr.record_of(ckpt)) if a.method == "left")
    asked = Awaiting(kind="feedback", method="left", activation=left.id, message="Left ok?")
    paused = tr.step_awaiting(ckpt, left, asked, base_state={}, new_state={}, reducers={})
    return graph, paused.checkpoint


def test_a_step_pausing_a_run_that_already_asks_leaves_its_question_asked() -> None:
    """``right``'s review comes while the run asks ``left``'s: the run still asks ``left``'s
    (its reason too), ``right``'s waits in ``meta.human.reviews``, and the answer to ``left``
    sends both again: ``right`` then asks its own without running its method again."""
    _graph, paused = twins_paused_on_left()
    asked = paused.meta.human.awaiting
    right = next(a for a in orch.pending(tr.record_of(paused)) if a.method == "right")
    review = Awaiting(kind="feedback", method="right", activation=right.id, message="Right ok?")
    both = tr.step_awaiting(
        paused, right, review, base_state={}, new_state={}, reducers={}
    ).checkpoint
    assert both.status is RunStatus.PAUSED and both.step == "right"
    assert both.meta.human.awaiting == asked and both.meta.human.pause_reason == "Left ok?"
    assert set(both.meta.human.reviews) == {"left#1", "right#1"}
    answer = Answer(text="fine", awaited=asked)
    assert tr.answered(both, answer).checkpoint.meta.ready == ["left#1", "right#1"]


def test_a_step_halting_a_run_that_already_asks_keeps_its_question_and_reason() -> None:
    """``right`` calls ``self.pause()`` while the run asks ``left``'s question: the run still
    asks it, for its own reason, and the answer sends ``right`` again, to pause anew."""
    _graph, paused = twins_paused_on_left()
    asked = paused.meta.human.awaiting
    right = next(a for a in orch.pending(tr.record_of(paused)) if a.method == "right")
    halted = tr.step_paused(paused, right, "waiting for the legal team").checkpoint
    assert halted.status is RunStatus.PAUSED and halted.step == "right"
    assert halted.meta.human.awaiting == asked and halted.meta.human.pause_reason == "Left ok?"
    answer = Answer(text="fine", awaited=asked)
    assert tr.answered(halted, answer).checkpoint.meta.ready == ["left#1", "right#1"]
    alone = tr.step_paused(tr.answered(halted, answer).checkpoint, right, "legal").checkpoint
    assert alone.meta.human.pause_reason == "legal"  # nothing asked now: its own reason


def test_an_answer_carries_a_step_still_running_instead_of_running_it_again() -> None:
    """Two reviewed steps in parallel: ``left`` paused the run while ``right``'s attempt
    still runs. The answer sends ``left`` again in epoch 3, not ``right``: its attempt of
    epoch 2 commits into epoch 3 (under its own key), and a stray attempt of epoch 3 does not;
    its commit drops the note. A resume carries nothing: it runs every step again."""
    graph, paused = twins_paused_on_left()
    answer = Answer(text="fine", awaited=paused.meta.human.awaiting)

    opened = tr.answered(paused, answer, running={"right#1", "left#1"})
    ckpt = opened.checkpoint
    assert [a.id for a in opened.ready] == ckpt.meta.ready == ["left#1"]
    assert (ckpt.meta.epoch, ckpt.meta.carried) == (3, {"right#1": 2})
    assert tr.epoch_of(ckpt, "right#1") == 2 and tr.epoch_of(ckpt, "left#1") == 3
    assert lifecycle.in_flight(ckpt, 2, "right#1") and not lifecycle.in_flight(ckpt, 3, "right#1")
    assert not lifecycle.in_flight(ckpt, 2, "left#1")
    assert tr.activation_key(ckpt, "right#1") == "2/right#1"

    right = next(a for a in orch.pending(tr.record_of(ckpt)) if a.method == "right")
    done = tr.step_done(
        graph, ckpt, right, base_state={}, new_state={}, output="r", label=None, reducers={}
    ).checkpoint
    assert done.activation == "2/right#1" and done.meta.carried == {}

    assert tr.answered(paused, answer).checkpoint.meta.ready == ["left#1", "right#1"]
    paused_again = ckpt.model_copy(update={"status": RunStatus.PAUSED})
    again = tr.answered(paused_again, answer, running={"right#1"}).checkpoint.meta
    assert again.carried == {"right#1": 2}  # still its first attempt's epoch


def test_resuming_a_paused_or_failed_run_where_it_stands_carries_running_steps() -> None:
    """A resume of a paused or failed run's latest checkpoint goes on from where it stands,
    as an answer does: a step still running goes on (a failed run's parallel branch runs on,
    and commits). One from an older checkpoint rewinds the run; a cancelled run's attempts
    were stopped, so it has nothing running to carry."""
    _, paused = twins_paused_on_left()
    state = dict(paused.state)
    opened = tr.resumed(paused, paused, state, running={"right#1"}).checkpoint.meta
    assert (opened.carried, opened.ready) == ({"right#1": 2}, ["left#1"])
    older = paused.model_copy(update={"id": "older"})
    assert not tr.goes_on(paused, older)
    rewound = tr.resumed(paused, older, state, running={"right#1"}).checkpoint.meta
    assert (rewound.carried, rewound.ready) == ({}, ["left#1", "right#1"])
    failed = paused.model_copy(update={"status": RunStatus.FAILED})
    again = tr.resumed(failed, failed, state, running={"right#1"}).checkpoint.meta
    assert (again.carried, again.ready) == ({"right#1": 2}, ["left#1"])
    cancelled = paused.model_copy(update={"status": RunStatus.CANCELLED})
    assert not tr.goes_on(cancelled, cancelled)
    stopped = tr.resumed(cancelled, cancelled, state, running={"right#1"}).checkpoint.meta
    assert stopped.carried == {}


@pytest.mark.parametrize("epoch", [0, 1, 12])
def test_an_activation_key_gives_back_its_activation_and_its_epoch(epoch: int) -> None:
    key = ids.activation_key_in(epoch, "write#3")
    assert key == ("write#3" if epoch == 0 else f"{epoch}/write#3")  # epoch 0: the bare id
    assert ids.activation_of_key(key) == "write#3"
    assert ids.epoch_of_key(key) == epoch


@pytest.mark.parametrize(
    ("activation", "split", "method"),
    [
        ("write#3", ("write", 3), "write"),
        ("write#12", ("write", 12), "write"),
        ("write", None, "write"),  # a method's name: no number
        ("write#", None, "write#"),
        ("#3", None, "#3"),
        ("write#x", None, "write#x"),
    ],
)
def test_an_activation_id_names_its_method_and_its_number(
    activation: str, split: tuple[str, int] | None, method: str
) -> None:
    assert ids.split_activation(activation) == split
    assert ids.method_of(activation) == method
    if split is not None:
        assert ids.activation_id(*split) == activation
        assert orch.parse_activation(activation) == split
    else:
        with pytest.raises(RunStateError):  # the orchestrator's reading of a record is strict
            orch.parse_activation(activation)
