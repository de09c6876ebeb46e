"""Persistence as CrewAI documents it: ``@persist``, ``CheckpointConfig``, resume by id, fork.

Every behaviour that touches a store runs against Redis and SQLite (DESIGN.md section 6).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import (
    CheckpointConfig,
    Flow,
    FlowState,
    JsonProvider,
    RedisFlowPersistence,
    SQLiteFlowPersistence,
    listen,
    persist,
    set_flow_persistence_factory,
    start,
)
from runner.errors import InvalidInputs, NotSerializable, RunNotFound
from runner.store.base import CheckpointStore
from runner.store.persistence import FlowPersistence, StorePersistence
from tests._flow_support import STORES, Tally, history, make_store, steps_finished


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made = make_store(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture(params=["sqlite", "redis"])
def persistence(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorePersistence]:
    """CrewAI's two persistences, as a user spells them."""
    if request.param == "sqlite":
        made: StorePersistence = SQLiteFlowPersistence(db_path=str(tmp_path / "flows.db"))
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisFlowPersistence(url, prefix=request.getfixturevalue("prefix"))
    yield made
    made.close()


class CountState(FlowState):
    counter: int = 0
    topic: str = ""
    trail: list[str] = []


class ThreeSteps(Flow[CountState]):
    """first -> second -> third, each one counting and leaving a trail."""

    def __init__(self, tally: Tally | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally or Tally()

    def _step(self, name: str) -> str:
        self.tally(name)
        self.state.counter += 1
        self.state.trail.append(name)
        return f"{name}:{self.state.counter}"

    @start()
    def first(self) -> str:
        return self._step("first")

    @listen(first)
    def second(self) -> str:
        return self._step("second")

    @listen(second)
    def third(self) -> str:
        return self._step("third")


def persisted_class(persistence: Any, **options: Any) -> type[ThreeSteps]:
    """``ThreeSteps`` with ``@persist(persistence, ...)`` on the class."""

    @persist(persistence, **options)
    class Persisted(ThreeSteps):
        pass

    return Persisted


# --- @persist -------------------------------------------------------------------------------


def test_persist_on_the_class_saves_the_state_after_every_method(persistence):
    flow = persisted_class(persistence)()

    flow.kickoff(inputs={"topic": "tides"})

    saved = history(persistence.store, flow.flow_id)
    assert [c.step for c in saved] == ["first", "second", "third"]
    assert [c.state["counter"] for c in saved] == [1, 2, 3]
    assert persistence.load_state(flow.flow_id) == flow.state.model_dump(mode="json")


def test_persist_without_arguments_and_with_the_keyword_spelling(persistence):
    @persist
    class Bare(ThreeSteps):
        pass

    @persist(persistence=persistence)
    class Keyword(ThreeSteps):
        pass

    bare, keyword = Bare(), Keyword()
    set_flow_persistence_factory(lambda: persistence)  # what @persist given none uses
    try:
        bare.kickoff()
        keyword.kickoff()
    finally:
        set_flow_persistence_factory(None)

    assert steps_finished(persistence.store, bare.flow_id) == ["first", "second", "third"]
    assert steps_finished(persistence.store, keyword.flow_id) == ["first", "second", "third"]


def test_persist_on_a_method_saves_only_after_that_method(persistence):
    class OneMarked(ThreeSteps):
        @listen("first")
        @persist(persistence)
        def second(self) -> str:
            return self._step("second")

    flow = OneMarked()

    flow.kickoff()

    saved = history(persistence.store, flow.flow_id)
    assert [(c.step, c.state["counter"]) for c in saved] == [("second", 2)]


def test_persistence_argument_of_the_flow_saves_every_method(persistence):
    flow = ThreeSteps(persistence=persistence)

    flow.kickoff()

    assert steps_finished(persistence.store, flow.flow_id) == ["first", "second", "third"]


class MemoryPersistence(FlowPersistence):
    """A user's own FlowPersistence that keeps what it is given."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, str, Any]] = []

    def init_db(self) -> None:
        pass

    def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None:
        self.saved.append((flow_uuid, method_name, state_data))

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        found = [s for f, _, s in self.saved if f == flow_uuid]
        return dict(found[-1]) if found else None


def test_a_custom_flow_persistence_gets_each_methods_state_as_it_was_then():
    memory = MemoryPersistence()
    flow = persisted_class(memory)()

    flow.kickoff()

    assert [(f, m, s["trail"]) for f, m, s in memory.saved] == [
        (flow.flow_id, "first", ["first"]),
        (flow.flow_id, "second", ["first", "second"]),
        (flow.flow_id, "third", ["first", "second", "third"]),
    ]


def test_verbose_persist_logs_each_save(persistence, caplog):
    flow = persisted_class(persistence, verbose=True)()

    with caplog.at_level(logging.INFO, logger="runner.persist"):
        flow.kickoff()

    saves = [r for r in caplog.records if "Saving flow state" in r.getMessage()]
    assert len(saves) == 3
    assert all(flow.flow_id in r.getMessage() for r in saves)


def test_quiet_persist_logs_nothing(persistence, caplog):
    flow = persisted_class(persistence)()

    with caplog.at_level(logging.INFO, logger="runner.persist"):
        flow.kickoff()

    assert not [r for r in caplog.records if "Saving flow state" in r.getMessage()]


# --- inputs={"id": X}: resume a state -------------------------------------------------------


def test_inputs_id_restores_the_latest_state_applies_inputs_and_reruns_everything(persistence):
    cls = persisted_class(persistence)
    first = cls()
    first.kickoff(inputs={"topic": "tides"})
    run_id = first.flow_id
    tally = Tally()

    again = cls(tally)
    result = again.kickoff(inputs={"id": run_id, "topic": "reefs"})

    assert again.flow_id == run_id
    assert again.state.counter == 6  # 3 restored + 3 re-run
    assert again.state.topic == "reefs"
    assert result == "third:6"
    assert dict(tally.counts) == {"first": 1, "second": 1, "third": 1}
    saved = history(persistence.store, run_id)
    assert [c.state["counter"] for c in saved] == [1, 2, 3, 4, 5, 6]
    assert [c.seq for c in saved] == [1, 2, 3, 4, 5, 6]


def test_inputs_id_of_an_unknown_state_starts_fresh_with_that_id(persistence):
    flow = persisted_class(persistence)()

    flow.kickoff(inputs={"id": "brand-new"})

    assert flow.flow_id == "brand-new"
    assert flow.state.counter == 3
    assert steps_finished(persistence.store, "brand-new") == ["first", "second", "third"]


def test_inputs_id_with_a_checkpoint_config_extends_the_runs_history(store):
    config = CheckpointConfig(provider=store)
    first = ThreeSteps(checkpoint=config)
    first.kickoff()
    before = len(history(store, first.flow_id))

    again = ThreeSteps(checkpoint=config)
    again.kickoff(inputs={"id": first.flow_id})

    assert again.state.counter == 6
    after = history(store, first.flow_id)
    assert len(after) == 2 * before
    assert [c.seq for c in after] == list(range(1, 2 * before + 1))


def test_kicking_off_the_same_flow_object_again_continues_its_run(store):
    flow = ThreeSteps(checkpoint=CheckpointConfig(provider=store))
    flow.kickoff()

    flow.kickoff()

    assert flow.state.counter == 6
    saved = history(store, flow.flow_id)
    assert [c.state["counter"] for c in saved if c.step] == [1, 2, 3, 4, 5, 6]
    assert store.run(flow.flow_id).status == "succeeded"


class FixedIdState(CountState):
    id: str = "the-one-run"


class FixedIdFlow(ThreeSteps):
    initial_state = FixedIdState


def test_a_state_model_with_a_fixed_default_id_continues_that_run(store):
    config = CheckpointConfig(provider=store)
    FixedIdFlow(checkpoint=config).kickoff()

    again = FixedIdFlow(checkpoint=config)
    again.kickoff()

    assert again.flow_id == "the-one-run"
    assert [c.state["counter"] for c in history(store, "the-one-run") if c.step] == [1, 2, 3] * 2


# --- restore_from_state_id: fork a state ----------------------------------------------------


def _source_run(persistence: Any) -> tuple[type[ThreeSteps], str, list[str]]:
    cls = persisted_class(persistence)
    source = cls()
    source.kickoff(inputs={"topic": "tides"})
    ids = [c.id for c in history(persistence.store, source.flow_id)]
    return cls, source.flow_id, ids


def test_restore_from_state_id_forks_into_a_fresh_run(persistence):
    cls, source_id, source_ckpts = _source_run(persistence)
    tally = Tally()

    fork = cls(tally)
    fork.kickoff(restore_from_state_id=source_id)

    assert fork.flow_id != source_id
    assert fork.state.counter == 6
    assert fork.state.topic == "tides"
    assert dict(tally.counts) == {"first": 1, "second": 1, "third": 1}
    assert [c.id for c in history(persistence.store, source_id)] == source_ckpts
    info = persistence.store.run(fork.flow_id)
    assert info is not None and info.parent_run_id == source_id
    assert info.parent_checkpoint_id == source_ckpts[-1]


def test_restore_from_state_id_forks_a_run_checkpointed_with_a_config(store):
    config = CheckpointConfig(provider=store)
    source = ThreeSteps(checkpoint=config)
    source.kickoff(inputs={"topic": "tides"})
    source_ckpts = [c.id for c in history(store, source.flow_id)]

    fork = ThreeSteps(checkpoint=config)
    fork.kickoff(restore_from_state_id=source.flow_id)

    assert fork.flow_id != source.flow_id
    assert (fork.state.counter, fork.state.topic) == (6, "tides")
    assert [c.id for c in history(store, source.flow_id)] == source_ckpts
    forked = history(store, fork.flow_id)
    assert forked[0].lineage is not None
    assert forked[0].lineage.parent_checkpoint_id == source_ckpts[-1]
    assert store.run(fork.flow_id).parent_run_id == source.flow_id


def test_restore_from_state_id_with_an_input_id_pins_the_forks_id(persistence):
    cls, source_id, source_ckpts = _source_run(persistence)

    fork = cls()
    fork.kickoff(inputs={"id": "pinned-fork", "topic": "reefs"}, restore_from_state_id=source_id)

    assert fork.flow_id == "pinned-fork"
    assert (fork.state.counter, fork.state.topic) == (6, "reefs")
    assert steps_finished(persistence.store, "pinned-fork") == ["first", "second", "third"]
    assert [c.id for c in history(persistence.store, source_id)] == source_ckpts


def test_restore_from_an_unknown_state_id_falls_back_to_a_fresh_run(persistence):
    flow = persisted_class(persistence)()

    flow.kickoff(inputs={"topic": "tides"}, restore_from_state_id="no-such-state")

    assert flow.flow_id != "no-such-state"
    assert (flow.state.counter, flow.state.topic) == (3, "tides")
    assert persistence.store.run(flow.flow_id) is not None
    assert persistence.store.run(flow.flow_id).parent_run_id is None


def test_strict_restore_from_an_unknown_state_id_is_an_error(persistence):
    tally = Tally()
    flow = persisted_class(persistence)(tally)

    with pytest.raises(RunNotFound, match="no-such-state"):
        flow.kickoff(restore_from_state_id="no-such-state", strict=True)

    assert not tally.counts
    assert persistence.store.run(flow.flow_id) is None


def test_restore_from_state_id_none_is_a_plain_kickoff(persistence):
    flow = persisted_class(persistence)()

    flow.kickoff(restore_from_state_id=None)

    assert flow.state.counter == 3
    info = persistence.store.run(flow.flow_id)
    assert info is not None and info.parent_run_id is None


def test_from_checkpoint_and_restore_from_state_id_together_raise_naming_both(store):
    tally = Tally()
    flow = ThreeSteps(tally, checkpoint=CheckpointConfig(provider=store))

    with pytest.raises(ValueError, match=r"from_checkpoint.*restore_from_state_id"):
        flow.kickoff(from_checkpoint="some-run", restore_from_state_id="some-state")

    assert not tally.counts
    assert store.runs() == []


@pytest.mark.parametrize("entry", ["kickoff_async", "akickoff"])
async def test_fork_through_the_async_entry_points(persistence, entry):
    cls, source_id, source_ckpts = _source_run(persistence)

    fork = cls()
    result = await getattr(fork, entry)(restore_from_state_id=source_id)

    assert result == "third:6"
    assert fork.flow_id != source_id
    assert [c.id for c in history(persistence.store, source_id)] == source_ckpts


# --- CheckpointConfig -----------------------------------------------------------------------


def test_checkpoint_config_defaults_to_json_files_and_a_checkpoint_per_method(tmp_path):
    flow = ThreeSteps(checkpoint=CheckpointConfig(location=str(tmp_path)))

    flow.kickoff()

    saved = history(JsonProvider(tmp_path), flow.flow_id)
    assert [(c.event, c.step) for c in saved] == [
        ("flow_started", None),
        ("method_execution_finished", "first"),
        ("method_execution_finished", "second"),
        ("method_execution_finished", "third"),
    ]
    assert [c.state["counter"] for c in saved] == [0, 1, 2, 3]
    assert saved[-1].status == "succeeded"


def test_checkpoint_true_uses_the_default_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flow = ThreeSteps(checkpoint=True)

    flow.kickoff()

    assert steps_finished(JsonProvider(tmp_path / ".checkpoints"), flow.flow_id) == [
        "first",
        "second",
        "third",
    ]


def test_checkpoint_on_every_event_includes_the_finish(store):
    flow = ThreeSteps(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))

    flow.kickoff()

    events = [c.event for c in history(store, flow.flow_id)]
    assert events == ["flow_started", *["method_execution_finished"] * 3, "flow_finished"]
    assert store.run(flow.flow_id).status == "succeeded"


def test_checkpoint_only_on_flow_finished_writes_just_that(store):
    flow = ThreeSteps(checkpoint=CheckpointConfig(provider=store, on_events=["flow_finished"]))

    flow.kickoff()

    saved = history(store, flow.flow_id)
    assert [(c.event, c.state["counter"], c.status) for c in saved] == [
        ("flow_finished", 3, "succeeded")
    ]
    assert saved[0].completed == ["first#1", "second#1", "third#1"]


def test_max_checkpoints_prunes_older_ones(store):
    flow = ThreeSteps(checkpoint=CheckpointConfig(provider=store, max_checkpoints=2))

    flow.kickoff()

    saved = history(store, flow.flow_id)
    assert [(c.seq, c.step) for c in saved] == [(3, "second"), (4, "third")]


class FailOnce(ThreeSteps):
    """``second`` fails while ``fail`` is set."""

    fail = True

    @listen("first")
    def second(self) -> str:
        self.tally("second")
        if self.fail:
            raise RuntimeError("second is broken")
        self.state.counter += 1
        self.state.trail.append("second")
        return f"second:{self.state.counter}"


def _failed_run(store: CheckpointStore) -> str:
    flow = FailOnce(checkpoint=CheckpointConfig(provider=store))
    with pytest.raises(RuntimeError, match="second is broken"):
        flow.kickoff()
    return flow.flow_id


@pytest.mark.parametrize("how", ["from_checkpoint", "kickoff_from_checkpoint"])
def test_restoring_a_checkpoint_skips_every_completed_method(store, how):
    run_id = _failed_run(store)
    config = CheckpointConfig(provider=store, restore_from=run_id)
    tally = Tally()

    if how == "from_checkpoint":
        flow = FailOnce.from_checkpoint(config, tally=tally, fail=False)
        result = flow.kickoff()
    else:
        flow = FailOnce(tally, fail=False, checkpoint=CheckpointConfig(provider=store))
        result = flow.kickoff(from_checkpoint=config)

    assert dict(tally.counts) == {"second": 1, "third": 1}
    assert result == "third:3"
    assert flow.flow_id == run_id
    assert flow.state.trail == ["first", "second", "third"]
    assert store.run(run_id).status == "succeeded"


@pytest.mark.parametrize("how", ["from_checkpoint", "kickoff_from_checkpoint"])
def test_a_restore_config_naming_its_store_wins_over_the_flows_own(store, tmp_path, how):
    run_id = _failed_run(store)
    elsewhere = CheckpointConfig(location=str(tmp_path / "elsewhere"))  # the flow's own
    config = CheckpointConfig(provider=store, restore_from=run_id)
    tally = Tally()

    if how == "from_checkpoint":
        flow = FailOnce.from_checkpoint(config, tally=tally, fail=False, checkpoint=elsewhere)
        result = flow.kickoff()
    else:
        flow = FailOnce(tally, fail=False, checkpoint=elsewhere)
        result = flow.kickoff(from_checkpoint=config)

    # Restored from the config's store, and the run went on there.
    assert dict(tally.counts) == {"second": 1, "third": 1}
    assert result == "third:3"
    assert store.run(run_id).status == "succeeded"
    assert not [p for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()]


def test_restoring_an_older_checkpoint_reruns_what_followed_it(store):
    flow = ThreeSteps(checkpoint=CheckpointConfig(provider=store))
    flow.kickoff()
    after_first = next(c for c in history(store, flow.flow_id) if c.step == "first")
    tally = Tally()

    restored = ThreeSteps.from_checkpoint(
        CheckpointConfig(provider=store, restore_from=after_first.id), tally=tally
    )

    assert restored.kickoff() == "third:3"
    assert dict(tally.counts) == {"second": 1, "third": 1}
    assert restored.state.trail == ["first", "second", "third"]


def test_restoring_a_checkpoint_file(tmp_path):
    flow = FailOnce(checkpoint=CheckpointConfig(location=str(tmp_path)))
    with pytest.raises(RuntimeError):
        flow.kickoff()
    files = sorted(tmp_path.rglob("*.json"))
    failed = [p for p in files if "method_execution_failed" in p.read_text()]
    tally = Tally()

    restored = FailOnce.from_checkpoint(
        CheckpointConfig(location=str(tmp_path), restore_from=failed[0]), tally=tally, fail=False
    )

    assert restored.kickoff() == "third:3"
    assert dict(tally.counts) == {"second": 1, "third": 1}


def test_restoring_a_finished_run_runs_nothing_and_returns_its_result(store):
    flow = ThreeSteps(checkpoint=CheckpointConfig(provider=store))
    flow.kickoff()
    tally = Tally()

    again = ThreeSteps.from_checkpoint(
        CheckpointConfig(provider=store, restore_from=flow.flow_id), tally=tally
    )

    assert again.kickoff() == "third:3"
    assert not tally.counts


# --- bad input ------------------------------------------------------------------------------


class TypedState(FlowState):
    count: int = 0
    extra: Any = None


class TypedFlow(Flow[TypedState]):
    @start()
    def begin(self) -> int:
        if self.state.count < 0:
            self.state.extra = object()
        return self.state.count


def test_invalid_inputs_raise_one_readable_error_and_write_nothing(store):
    flow = TypedFlow(checkpoint=CheckpointConfig(provider=store))

    with pytest.raises(InvalidInputs) as caught:
        flow.kickoff(inputs={"count": "many"})

    message = str(caught.value)
    assert "count" in message and "integer" in message
    assert "\n" not in message
    assert store.runs() == []


def test_invalid_inputs_on_resume_by_id_write_nothing(store):
    config = CheckpointConfig(provider=store)
    first = TypedFlow(checkpoint=config)
    first.kickoff(inputs={"count": 2})
    before = [c.id for c in history(store, first.flow_id)]

    with pytest.raises(InvalidInputs):
        TypedFlow(checkpoint=config).kickoff(inputs={"id": first.flow_id, "count": "x"})

    assert [c.id for c in history(store, first.flow_id)] == before


def test_state_that_is_not_json_at_kickoff_names_the_field_and_writes_nothing(store):
    flow = TypedFlow(checkpoint=CheckpointConfig(provider=store))

    with pytest.raises(NotSerializable, match="extra"):
        flow.kickoff(inputs={"extra": object()})

    assert store.runs() == []


def test_a_method_leaving_state_that_is_not_json_fails_naming_the_field(store):
    flow = TypedFlow(checkpoint=CheckpointConfig(provider=store))

    with pytest.raises(NotSerializable, match="extra"):
        flow.kickoff(inputs={"count": -1})

    latest = store.latest(flow.flow_id)
    assert latest is not None and latest.status == "failed"
    assert latest.error is not None and latest.error.type == "NotSerializable"


class Observer(ThreeSteps):
    """Each method looks at what the store holds when it starts."""

    def __init__(self, store: CheckpointStore, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.found: dict[str, Any] = {}

    def _step(self, name: str) -> str:
        latest = self.store.latest(self.state.id)
        self.found[name] = None if latest is None else (latest.step, latest.state["counter"])
        return super()._step(name)


def test_a_methods_checkpoint_is_written_before_the_next_method_starts(store):
    flow = Observer(store, checkpoint=CheckpointConfig(provider=store))

    flow.kickoff()

    assert flow.found == {"first": (None, 0), "second": ("first", 1), "third": ("second", 2)}
