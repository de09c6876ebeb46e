"""CrewAI's pluggable default persistence: ``set_flow_persistence_factory`` and
``default_flow_persistence`` (our built-in default is Redis from the settings).

In process, ``@persist`` given no persistence uses the factory's, an explicit one wins, a
falsy one is kept. On workers the run's checkpoints stay in their Redis (coordination);
an allow-listed module that sets a factory at import makes the workers save the user's
copy of each persisted method's state there, after the step's commit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import runner
from runner import (
    Flow,
    FlowPersistence,
    FlowState,
    RedisFlowPersistence,
    SQLiteFlowPersistence,
    default_flow_persistence,
    persist,
    set_flow_persistence_factory,
    start,
)
from runner.checkpointing import PersistSink, state_copy
from runner.errors import DefinitionError
from runner.store.persistence_factory import flow_persistence_factory
from runner.store.redis import RedisProvider
from runner.store.sqlite import SqliteProvider
from tests import factory_flows
from tests._dist_support import private_pool
from tests.factory_flows import PersistedSteps, PlainSteps, SecondPersisted


@pytest.fixture(autouse=True)
def no_factory() -> Iterator[None]:
    """Each test starts with the built-in default and leaves it so."""
    before = flow_persistence_factory()
    set_flow_persistence_factory(None)
    yield
    set_flow_persistence_factory(before)


class Kept(FlowPersistence):
    """A CrewAI-style persistence of our own: states in a list; falsy while empty (as a
    container is), which must not make anyone replace it."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, str, dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.saved)

    def init_db(self) -> None:
        """Nothing to create."""

    def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None:
        data = state_data.model_dump() if isinstance(state_data, BaseModel) else dict(state_data)
        self.saved.append((flow_uuid, method_name, data))

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        found = [data for uuid, _, data in self.saved if uuid == flow_uuid]
        return found[-1] if found else None


class Counter(FlowState):
    count: int = 0


@persist
class Bare(Flow[Counter]):
    @start()
    def bump(self) -> int:
        self.state.count += 1
        return self.state.count


# --- in process -----------------------------------------------------------------------------


def test_both_names_are_importable_from_runner_and_the_default_is_redis_from_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runner.settings import reset_settings

    monkeypatch.setenv("RUNNER_PREFIX", "factory-default")
    reset_settings()
    try:
        made = default_flow_persistence()
    finally:
        monkeypatch.delenv("RUNNER_PREFIX")
        reset_settings()
    assert {"default_flow_persistence", "set_flow_persistence_factory"} <= set(runner.__all__)
    assert isinstance(made, RedisFlowPersistence)
    assert isinstance(made.store, RedisProvider)
    assert made.store.keys.prefix == "factory-default"
    made.close()


def test_persist_given_no_persistence_saves_every_state_through_the_factorys() -> None:
    kept = Kept()
    calls: list[int] = []

    def factory() -> Kept:
        calls.append(1)
        return kept

    set_flow_persistence_factory(factory)
    assert default_flow_persistence() is kept
    flow = PersistedSteps()
    flow.kickoff()

    assert [(uuid, step) for uuid, step, _ in kept.saved] == [
        (flow.flow_id, "first"),
        (flow.flow_id, "second"),
        (flow.flow_id, "third"),
    ]
    assert [data["count"] for _, _, data in kept.saved] == [1, 2, 3]
    assert calls  # resolved where the default is needed, not at class definition


def test_a_kickoff_with_an_id_loads_that_state_from_the_factorys_persistence() -> None:
    kept = Kept()
    kept.save_state("known-run", "bump", {"id": "known-run", "count": 41})
    set_flow_persistence_factory(lambda: kept)

    flow = Bare()
    assert flow.kickoff(inputs={"id": "known-run"}) == 42
    assert kept.load_state("known-run") == {"id": "known-run", "count": 42}


def test_a_persistence_given_explicitly_wins_over_the_factory() -> None:
    kept, other = Kept(), Kept()
    calls: list[int] = []
    set_flow_persistence_factory(lambda: calls.append(1) or other)

    @persist(kept)
    class Explicit(factory_flows.Steps):
        pass

    Explicit().kickoff()
    PersistedSteps(persistence=kept).kickoff()

    assert [step for _, step, _ in kept.saved] == ["first", "second", "third"] * 2
    assert other.saved == [] and calls == []


def test_a_falsy_persistence_from_the_factory_is_used_not_replaced() -> None:
    empty = Kept()
    assert not empty  # falsy, as an empty container is
    set_flow_persistence_factory(lambda: empty)

    flow = SecondPersisted()
    flow.kickoff()

    assert [(uuid, step) for uuid, step, _ in empty.saved] == [(flow.flow_id, "second")]


def test_resetting_the_factory_to_none_restores_redis() -> None:
    set_flow_persistence_factory(Kept)
    assert isinstance(default_flow_persistence(), Kept)
    set_flow_persistence_factory(None)
    made = default_flow_persistence()
    assert isinstance(made, RedisFlowPersistence)
    made.close()


def test_a_factory_that_is_not_callable_or_returns_none_is_one_clear_error() -> None:
    with pytest.raises(TypeError, match="takes a callable returning a FlowPersistence"):
        set_flow_persistence_factory(Kept())  # type: ignore[arg-type]
    set_flow_persistence_factory(lambda: None)
    with pytest.raises(DefinitionError, match="returned None"):
        PersistedSteps().kickoff()


# --- what workers copy where ----------------------------------------------------------------


def test_workers_copy_nothing_without_persist_a_factory_or_beyond_their_own_redis(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    own = RedisProvider(redis_url, prefix=prefix)
    try:
        # The built-in default is the workers' own Redis: their checkpoints are the copy.
        assert state_copy(PersistedSteps, own) is None
        set_flow_persistence_factory(lambda: RedisFlowPersistence(redis_url, prefix=prefix))
        assert state_copy(PersistedSteps, own) is None
        assert state_copy(PlainSteps, own) is None

        elsewhere = SQLiteFlowPersistence(tmp_path / "copy.db")
        set_flow_persistence_factory(lambda: elsewhere)
        found = state_copy(SecondPersisted, own)
        assert isinstance(found, PersistSink)
        assert found.persistence is elsewhere and found.methods == frozenset({"second"})
        other_prefix = RedisFlowPersistence(redis_url, prefix=f"{prefix}-copy")
        set_flow_persistence_factory(lambda: other_prefix)
        assert isinstance(state_copy(PersistedSteps, own), PersistSink)
        other_prefix.close()
        elsewhere.close()
    finally:
        own.close()


@pytest.mark.slow
def test_workers_importing_a_module_that_sets_a_factory_save_each_persisted_state_there(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    copy_db = tmp_path / "user-copy.db"
    with private_pool(
        worker_env,
        str(tmp_path),
        RUNNER_FLOW_MODULES="tests.factory_flows",
        **{factory_flows.COPY_DB_ENV: str(copy_db)},
    ) as (pool, rt, _env):
        pool.start(concurrency=1)
        every = PersistedSteps.submit(rt=rt)
        one = SecondPersisted.submit(rt=rt)
        plain = PlainSteps.submit(rt=rt)
        for handle in (every, one, plain):
            assert handle.wait(timeout=30).value == "succeeded"
        in_redis = [c.event for c in reversed(rt.store.history(every.run_id, limit=100))]

    copies = SqliteProvider(copy_db)
    try:
        saved = list(reversed(copies.history(every.run_id, limit=100)))
        assert [(c.step, c.state["count"], c.state["trail"]) for c in saved] == [
            ("first", 1, ["first"]),
            ("second", 2, ["first", "second"]),
            ("third", 3, ["first", "second", "third"]),
        ]
        assert [c.step for c in copies.history(one.run_id, limit=100)] == ["second"]
        assert copies.run(plain.run_id) is None
    finally:
        copies.close()
    # The run itself is in the workers' Redis, whole: the copy added nothing there.
    assert in_redis[0] == "flow_started" and in_redis[-1] == "flow_finished"
    assert in_redis.count("method_execution_finished") == 3
    assert os.environ.get(factory_flows.COPY_DB_ENV) is None  # the test process set none
