"""CrewAI's ``FlowPersistence`` face: the same behaviour on SQLite and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from runner import ids
from runner.errors import NotSerializable
from runner.store.persistence import (
    FlowPersistence,
    RedisFlowPersistence,
    SQLiteFlowPersistence,
    StorePersistence,
)
from runner.store.redis import RedisProvider


class ReportState(BaseModel):
    id: str
    topic: str = ""
    drafts: list[str] = []


@pytest.fixture(params=["sqlite", "redis"])
def persistence(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorePersistence]:
    """A persistence of each kind, closed after the test."""
    if request.param == "sqlite":
        made: StorePersistence = SQLiteFlowPersistence(tmp_path / "flow_states.db")
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisFlowPersistence(url, prefix=request.getfixturevalue("prefix"))
    made.init_db()
    yield made
    made.close()


def test_saved_state_loads_back(persistence):
    flow = ids.run_id()
    state = {"id": flow, "topic": "tides", "nested": {"n": [1, 2.5, None]}}

    persistence.save_state(flow, "plan", state)

    assert persistence.load_state(flow) == state


def test_latest_saved_state_wins(persistence):
    flow = ids.run_id()
    for n in range(3):
        persistence.save_state(flow, f"step_{n}", {"id": flow, "n": n})

    assert persistence.load_state(flow) == {"id": flow, "n": 2}


def test_unknown_flow_loads_none(persistence):
    assert persistence.load_state(ids.run_id()) is None


def test_pydantic_model_state_is_saved_as_a_dict(persistence):
    flow = ids.run_id()

    persistence.save_state(flow, "draft", ReportState(id=flow, topic="tides", drafts=["a"]))

    assert persistence.load_state(flow) == {"id": flow, "topic": "tides", "drafts": ["a"]}


def test_each_save_is_a_method_finished_checkpoint_of_the_flow_run(persistence):
    flow = ids.run_id()
    persistence.save_state(flow, "plan", {"id": flow})
    persistence.save_state(flow, "write", {"id": flow})

    history = persistence.store.history(flow)

    assert [(c.seq, c.event, c.step) for c in history] == [
        (2, "method_finished", "write"),
        (1, "method_finished", "plan"),
    ]


def test_state_that_is_not_json_raises_not_serializable(persistence):
    flow = ids.run_id()
    with pytest.raises(NotSerializable):
        persistence.save_state(flow, "plan", {"id": flow, "handle": object()})
    with pytest.raises(NotSerializable):
        persistence.save_state(flow, "plan", ["not", "a", "dict"])
    assert persistence.load_state(flow) is None


def test_persistences_are_flow_persistences(persistence):
    assert isinstance(persistence, FlowPersistence)


def test_sqlite_persistence_defaults_to_flow_states_db_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))

    persistence = SQLiteFlowPersistence()
    try:
        persistence.save_state("f-1", "plan", {"id": "f-1"})
        assert persistence.db_path == str(tmp_path / "data" / "runner" / "flow_states.db")
        assert Path(persistence.db_path).is_file()
    finally:
        persistence.close()


def test_redis_persistence_wraps_a_given_provider(redis_url, prefix):
    provider = RedisProvider(redis_url, prefix=prefix)
    with RedisFlowPersistence(provider=provider) as persistence:
        persistence.save_state("f-2", "plan", {"id": "f-2"})
        assert persistence.store is provider
        assert provider.latest("f-2") is not None
