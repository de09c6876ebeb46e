"""CrewAI flows moved over by changing imports: the behaviours CrewAI's own flow tests rely on,
checked in process against the Redis and SQLite stores (and the JSON-file location)."""

from __future__ import annotations

import threading
import types
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from runner import (
    CheckpointConfig,
    Flow,
    FlowState,
    JsonProvider,
    RedisFlowPersistence,
    SQLiteFlowPersistence,
    and_,
    listen,
    or_,
    persist,
    router,
    start,
)
from runner.errors import (
    CheckpointNotFound,
    CorruptCheckpoint,
    DefinitionWarning,
    NotSerializable,
    SelfTrigger,
    UnknownTrigger,
)
from runner.settings import reset_settings
from runner.store.base import CheckpointStore
from runner.store.persistence import StorePersistence
from runner.store.redis import RedisProvider
from tests._flow_support import STORES, Tally, make_store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made = make_store(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture(params=STORES)
def persistence(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorePersistence]:
    if request.param == "redis":
        made: StorePersistence = RedisFlowPersistence(
            request.getfixturevalue("redis_url"), prefix=request.getfixturevalue("prefix")
        )
    else:
        made = SQLiteFlowPersistence(tmp_path / "flow_states.db")
    yield made
    made.close()


# --- 1. state models ---------------------------------------------------------------------------


class PlainState(BaseModel):
    """A CrewAI user's state: a plain model without an ``id``."""

    counter: int = 0
    note: str = ""


class PlainFlow(Flow[PlainState]):
    @start()
    def bump(self) -> int:
        self.state.counter += 1
        return self.state.counter

    @listen(bump)
    def describe(self, counter: int) -> str:
        self.state.note = f"counted {counter}"
        return self.state.note


def test_a_plain_model_state_gets_a_uuid_id_that_names_the_run(store):
    flow = PlainFlow(checkpoint=CheckpointConfig(provider=store))

    assert flow.kickoff() == "counted 1"

    state_id = flow.state.model_dump()["id"]  # a field of the state, as in CrewAI
    assert state_id == flow.flow_id and len(state_id) == 36 and UUID(state_id)
    assert isinstance(flow.state, PlainState)
    saved = store.latest(state_id)
    assert saved is not None and saved.state == {
        "counter": 1,
        "note": "counted 1",
        "id": state_id,
    }


def test_a_plain_model_state_resumes_by_its_id(store):
    config = CheckpointConfig(provider=store)
    first = PlainFlow(checkpoint=config)
    first.kickoff()

    again = PlainFlow(checkpoint=config)
    again.kickoff(inputs={"id": first.flow_id})

    assert again.flow_id == first.flow_id and again.state.counter == 2


class LockedState(BaseModel):
    data: dict[str, Any] = {}
    items: list[Any] = []


class LockingFlow(Flow[LockedState]):
    @start()
    def hold(self) -> None:
        self.state.data["lock"] = threading.RLock()
        self.state.data["value"] = 42

    @listen(hold)
    def more(self) -> None:
        self.state.items.append(threading.Lock())
        self.state.items.append("plain")


def test_state_that_is_not_json_runs_when_nothing_is_persisted():
    flow = LockingFlow()

    flow.kickoff()

    assert flow.state.data["value"] == 42 and len(flow.state.items) == 2


def test_state_that_is_not_json_fails_when_persisted_naming_the_field(store):
    flow = LockingFlow(checkpoint=CheckpointConfig(provider=store))

    with pytest.raises(NotSerializable, match=r"data\.lock") as caught:
        flow.kickoff()

    assert caught.value.fields["path"] == "data.lock"
    failed = store.latest(flow.flow_id)
    assert failed is not None and failed.status == "failed" and failed.step == "hold"


# --- 2. an id set inside a method --------------------------------------------------------------


def test_an_id_set_in_a_method_of_a_dict_state_is_the_id_persist_saves_under(persistence):
    pinned = f"pinned-{uuid.uuid4().hex[:8]}"

    class DictFlow(Flow[dict[str, str]]):
        initial_state = dict()  # CrewAI's own spelling: a dict instance

        @start()
        @persist(persistence)
        def init_step(self) -> None:
            self.state["message"] = "hello"
            self.state["id"] = pinned

    flow = DictFlow(persistence=persistence)
    flow.kickoff()

    assert flow.state["id"] == pinned
    saved = persistence.load_state(pinned)
    assert saved is not None and saved["message"] == "hello"


def test_an_id_set_in_a_method_of_a_model_state_moves_the_rest_of_the_run(persistence):
    pinned = f"model-{uuid.uuid4().hex[:8]}"

    class Counter(FlowState):
        counter: int = 0

    @persist(persistence)
    class Renaming(Flow[Counter]):
        @start()
        def first(self) -> None:
            self.state.id = pinned
            self.state.counter += 1

        @listen(first)
        def second(self) -> None:
            self.state.counter += 1

    flow = Renaming()
    flow.kickoff()

    assert persistence.load_state(pinned) == {"id": pinned, "counter": 2}
    resumed = Renaming()
    resumed.kickoff(inputs={"id": pinned})
    assert resumed.state.counter == 4


class PoemState(FlowState):
    sentence_count: int = 1000
    has_set_count: bool = False


def test_persisted_values_override_defaults_and_inputs_override_persisted_values(persistence):
    @persist(persistence)
    class Poem(Flow[PoemState]):
        @start()
        def count(self) -> None:
            if not self.state.has_set_count:
                self.state.sentence_count = 2
                self.state.has_set_count = True
            elif self.state.sentence_count == 2:
                self.state.sentence_count = 3

    first = Poem()
    first.kickoff()
    assert first.state.sentence_count == 2

    again = Poem()
    again.kickoff(inputs={"id": first.flow_id})
    assert again.state.sentence_count == 3  # the persisted 2, not the default 1000

    overridden = Poem()
    overridden.kickoff(inputs={"id": first.flow_id, "sentence_count": 5})
    assert overridden.state.sentence_count == 5

    fresh = Poem()
    fresh.kickoff(inputs={"has_set_count": True})
    assert fresh.state.sentence_count == 1000 and fresh.flow_id != first.flow_id


def test_an_initial_state_given_to_the_constructor_is_the_flows_state():
    class Counted(Flow[PlainState]):
        @start()
        def bump(self) -> int:
            self.state.counter += 1
            return self.state.counter

    flow = Counted(initial_state=PlainState(counter=41))

    assert flow.kickoff() == 42 and flow.state.note == ""


# --- 3. triggers -------------------------------------------------------------------------------


def test_a_listener_of_a_label_no_router_returns_is_accepted_with_a_warning_and_never_runs():
    tally = Tally()

    class Nested(Flow):
        @start()
        def one(self) -> None:
            tally("one")

        @router(one)
        def pick(self) -> str:
            tally("pick")
            return "b_condition"

        @listen(or_("a_condition", "b_condition"))
        def either(self) -> None:
            tally("either")

        @listen(and_("a_condition", either))
        def never(self) -> None:
            tally("never")

    with pytest.warns(DefinitionWarning, match=r"Nested\.either listens to 'a_condition'"):
        Nested().kickoff()

    assert tally.order == ["one", "pick", "either"]


def test_a_strict_flow_refuses_a_listener_of_a_label_nothing_emits():
    class Typo(Flow):
        @start()
        def begin(self) -> str:
            return "go"

        @router(begin)
        def route(self) -> str:
            return "approved"

        @listen("aproved")
        def act(self) -> None: ...

    with pytest.raises(UnknownTrigger, match="'aproved'") as caught:
        Typo(strict=True)
    assert caught.value.fields["step"] == "act"

    class StrictTypo(Typo):
        strict = True

    with pytest.raises(UnknownTrigger):
        StrictTypo()


def test_router_emit_declares_labels_that_are_not_in_its_source():
    tally = Tally()
    outcome = {"label": "late"}

    class Declared(Flow):
        @start()
        def begin(self) -> None: ...

        @router(begin, emit=["early", "late"])
        def route(self) -> str:
            return outcome["label"]  # not readable from the source: emit= says it

        @listen("late")
        def on_late(self) -> str:
            tally("on_late")
            return "late handled"

        @listen("early")
        def on_early(self) -> None:
            tally("on_early")

    assert Declared.graph().methods["route"].labels == {"early", "late"}
    assert Declared().kickoff() == "late handled"
    assert tally.order == ["on_late"]


@pytest.mark.parametrize("listen_outside", [True, False])
def test_listen_stacked_on_router_is_a_router_with_that_trigger(listen_outside):
    tally = Tally()

    def checker(self: Any) -> str:
        tally("check")
        return "ok"

    marked = (
        listen("begin")(router()(checker)) if listen_outside else router()(listen("begin")(checker))
    )

    class Stacked(Flow):
        @start()
        def begin(self) -> None:
            tally("begin")

        check = marked

        @listen("ok")
        def done(self) -> str:
            tally("done")
            return "done"

    assert Stacked().kickoff() == "done"
    assert tally.order == ["begin", "check", "done"]


def test_start_stacked_with_listen_runs_at_kickoff_and_again_when_triggered():
    tally = Tally()

    class Twice(Flow):
        rounds = 0

        @start()
        def begin(self) -> None:
            tally("begin")

        @start()
        @listen("again")
        def work(self) -> None:
            tally("work")

        @router(work)
        def loop(self) -> str:
            self.rounds += 1
            return "again" if self.rounds < 2 else "stop"

    Twice().kickoff()

    assert tally["work"] == 2 and tally["begin"] == 1


def test_a_method_listening_to_itself_is_a_value_error():
    class Selfish(Flow):
        @start()
        def begin(self) -> None: ...

        @listen(or_("begin", "echo"))
        def echo(self) -> None: ...

    with pytest.raises(ValueError, match="listens to itself") as caught:
        Selfish().kickoff()
    assert isinstance(caught.value, SelfTrigger)


def test_cyclic_flow_with_a_conditional_start_loops_on_instance_attributes():
    log: list[str] = []

    class Cycle(Flow[dict[str, str]]):
        iteration = 0

        @start()
        def initial(self) -> None:
            log.append("initial")

        @router(initial)
        def enter(self) -> str:
            return "loop"

        @start("loop")
        def cycle(self) -> None:
            log.append(f"cycle_{self.iteration}")
            self.iteration += 1

        @router(cycle)
        def again(self) -> str:
            return "loop" if self.iteration < 3 else "exit"

    Cycle().kickoff()

    assert log == ["initial", "cycle_0", "cycle_1", "cycle_2"]


# --- 4. the flow's surface ---------------------------------------------------------------------


def test_method_outputs_lists_each_finished_methods_output_in_order():
    class Outputs(Flow):
        @start()
        def first(self) -> str:
            return "a"

        @listen(first)
        def second(self, previous: str) -> str:
            return previous + "b"

    flow = Outputs()

    assert flow.kickoff() == "ab"
    assert flow.method_outputs == ["a", "ab"]
    flow.kickoff()
    assert flow.method_outputs == ["a", "ab"]  # one kickoff's outputs, not every kickoff's


class PayloadState(BaseModel):
    message: str = ""


def test_the_trigger_payload_input_reaches_start_methods_that_declare_it_and_not_the_state():
    seen: list[Any] = []

    class Triggered(Flow[PayloadState]):
        @start()
        def one(self, crewai_trigger_payload: Any = None) -> str:
            seen.append(("one", crewai_trigger_payload))
            return "started"

        @start()
        def two(self, crewai_trigger_payload: Any = None) -> None:
            seen.append(("two", crewai_trigger_payload))

        @listen(one)
        def after(self, started: str) -> str:
            seen.append(("after", started))
            return "finished"

    flow = Triggered()
    assert flow.kickoff(inputs={"crewai_trigger_payload": {"ticket": 7}, "message": "m"}) == (
        "finished"
    )
    assert sorted(seen[:2]) == [("one", {"ticket": 7}), ("two", {"ticket": 7})]
    assert seen[2] == ("after", "started")
    assert flow.state.message == "m"

    seen.clear()
    flow.kickoff(inputs={"message": "no payload"})
    assert sorted(seen[:2]) == [("one", None), ("two", None)]


def test_the_trigger_payload_reaches_an_async_start_through_kickoff_async():
    import asyncio

    class AsyncTriggered(Flow):
        @start()
        async def begin(self, crewai_trigger_payload: Any = None) -> Any:
            await asyncio.sleep(0)
            return crewai_trigger_payload

        @listen(begin)
        async def echo(self, payload: Any) -> str:
            return f"got {payload}"

    result = asyncio.run(AsyncTriggered().kickoff_async(inputs={"crewai_trigger_payload": "p"}))

    assert result == "got p"


def _go() -> Any:
    def go(self: Any) -> str:
        return f"go:{self.state.counter}"

    return start()(go)


def test_flow_of_a_state_is_a_real_class_type_and_new_class_can_derive():
    made = type("Made", (Flow[PlainState],), {"go": _go()})
    built = types.new_class("Built", (Flow[PlainState],), {}, lambda ns: ns.update({"go": _go()}))

    assert Flow[PlainState] is Flow[PlainState] and issubclass(Flow[PlainState], Flow)
    for cls in (made, built):
        flow = cls()
        assert flow.kickoff() == "go:0"
        assert isinstance(flow.state, PlainState) and flow.state.model_dump()["id"]


def test_name_and_state_are_read_as_crewai_reads_them():
    class Named(Flow):
        name = "MyFlow"

        @start()
        def begin(self) -> None:
            self.state["seen"] = True

    flow = Named()
    flow.kickoff()

    assert flow.name == "MyFlow" and flow.state["seen"] is True
    assert flow.flow_id == flow.state["id"]


# --- 5. restoring the newest checkpoint file of a failed run ---------------------------------


class Order(FlowState):
    when: datetime | None = None
    ref: UUID | None = None
    amount: Decimal = Decimal("0")
    trail: list[str] = []


class OrderFlow(Flow[Order]):
    def __init__(self, tally: Tally, fail: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally
        self.fail = fail

    @start()
    def take(self) -> str:
        self.tally("take")
        self.state.when = datetime(2026, 4, 7, 12, 0, 0, 123456, tzinfo=UTC)
        self.state.ref = UUID("12345678-1234-5678-1234-567812345678")
        self.state.amount = Decimal("10.10")
        self.state.trail = [*self.state.trail, "take"]
        return "taken"

    @router(take)
    def route(self) -> str:
        self.tally("route")
        return "big" if self.state.amount > 10 else "small"

    @listen("big")
    def review(self, routed: str) -> str:
        self.tally("review")
        if self.fail:
            raise RuntimeError("review failed")
        self.state.trail = [*self.state.trail, f"review:{routed}"]
        return "reviewed"

    @listen("small")
    def skip(self) -> None:
        self.tally("skip")

    @listen(review)
    def ship(self, reviewed: str) -> str:
        self.tally("ship")
        return f"shipped after {reviewed}"


def test_the_newest_json_file_of_a_failed_run_restores_it_skipping_completed_steps(tmp_path):
    older = OrderFlow(Tally(), checkpoint=CheckpointConfig(location=str(tmp_path)))
    older.kickoff()  # another run in the same location
    failing = OrderFlow(Tally(), fail=True, checkpoint=CheckpointConfig(location=str(tmp_path)))
    with pytest.raises(RuntimeError, match="review failed"):
        failing.kickoff()

    files = sorted(Path(tmp_path).rglob("*.json"))
    newest = files[-1]
    assert all(p.parent == tmp_path for p in files)
    latest = JsonProvider(tmp_path).latest(failing.flow_id)
    assert latest is not None and JsonProvider.extract_id(newest) == latest.id
    tally = Tally()

    restored = OrderFlow.from_checkpoint(str(newest), tally=tally)

    assert restored.kickoff() == "shipped after reviewed"
    assert dict(tally.counts) == {"review": 1, "ship": 1}
    assert restored.state.id == failing.flow_id
    assert restored.state.trail == ["take", "review:big"]
    assert restored.state.when == datetime(2026, 4, 7, 12, 0, 0, 123456, tzinfo=UTC)
    assert restored.state.ref == UUID("12345678-1234-5678-1234-567812345678")
    assert restored.state.amount == Decimal("10.10") and str(restored.state.amount) == "10.10"


def test_a_json_file_that_is_not_a_checkpoint_is_refused_clearly(tmp_path):
    blob = JsonProvider().checkpoint('{"crew": "state"}', str(tmp_path), branch="main")

    with pytest.raises(CorruptCheckpoint, match="is not a checkpoint of this runner"):
        OrderFlow.from_checkpoint(blob, tally=Tally()).kickoff()
    with pytest.raises(CheckpointNotFound):
        OrderFlow.from_checkpoint(str(tmp_path / "missing.json"), tally=Tally()).kickoff()


def test_restoring_the_latest_checkpoint_of_a_failed_run_in_a_store(store):
    config = CheckpointConfig(provider=store)
    failing = OrderFlow(Tally(), fail=True, checkpoint=config)
    with pytest.raises(RuntimeError):
        failing.kickoff()
    latest = store.latest(failing.flow_id)
    assert latest is not None and latest.status == "failed"
    tally = Tally()

    restored = OrderFlow.from_checkpoint(
        CheckpointConfig(provider=store, restore_from=latest.id), tally=tally
    )

    assert restored.kickoff() == "shipped after reviewed"
    assert dict(tally.counts) == {"review": 1, "ship": 1}
    assert restored.state.amount == Decimal("10.10")


def test_a_completed_conditional_start_is_skipped_when_its_failed_run_is_restored(store):
    tally = Tally()
    failing = {"on": True}

    class Branching(Flow[dict[str, str]]):
        @start()
        def init(self) -> str:
            tally("init")
            return "initialized"

        @router(init)
        def emit_branch(self) -> str:
            tally("emit_branch")
            return "branch_a"

        @start("branch_a")
        def branch_a_start(self) -> None:
            tally("branch_a_start")
            self.state["branch"] = "a"

        @listen(branch_a_start)
        def branch_a_process(self) -> None:
            tally("branch_a_process")
            if failing["on"]:
                raise RuntimeError("process failed")
            self.state["processed"] = "yes"

    flow = Branching(checkpoint=CheckpointConfig(provider=store))
    with pytest.raises(RuntimeError):
        flow.kickoff()
    failing["on"] = False
    tally.order.clear()

    restored = Branching.from_checkpoint(
        CheckpointConfig(provider=store, restore_from=flow.flow_id)
    )
    restored.kickoff()

    assert tally.order == ["branch_a_process"]
    assert restored.state["branch"] == "a" and restored.state["processed"] == "yes"


def test_an_older_checkpoint_directory_is_migrated_and_still_restores(tmp_path):
    import json
    import os

    location = tmp_path / "old"
    failing = OrderFlow(Tally(), fail=True, checkpoint=CheckpointConfig(location=str(location)))
    with pytest.raises(RuntimeError):
        failing.kickoff()
    # Rewrite the directory in the first layout: runs/<run>/meta.json, <seq>-<id>.json files.
    (run_dir,) = (location / "runs").iterdir()
    meta = json.loads((run_dir / "meta.run").read_text())
    for seq, ident, name in meta.pop("history"):
        os.replace(location / name, run_dir / f"{seq:010d}-{ident}.json")
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "meta.run").unlink()
    (location / "index.runs").rename(location / "index.json")
    tally = Tally()

    restored = OrderFlow.from_checkpoint(
        CheckpointConfig(location=str(location), restore_from=failing.flow_id), tally=tally
    )

    assert restored.kickoff() == "shipped after reviewed"
    assert dict(tally.counts) == {"review": 1, "ship": 1}
    assert not (location / "index.json").exists() and not list(run_dir.glob("*.json"))
    assert sorted(p.parent for p in location.rglob("*.json")) == [location] * len(
        list(location.rglob("*.json"))
    )


# --- 6. RedisFlowPersistence() reads the settings ----------------------------------------------


def test_redis_flow_persistence_without_arguments_uses_the_configured_prefix(
    monkeypatch, redis_url, prefix
):
    monkeypatch.setenv("RUNNER_PREFIX", prefix)
    reset_settings()
    try:
        persistence = RedisFlowPersistence()
        run = f"r-{uuid.uuid4().hex[:8]}"
        persistence.save_state(run, "step", {"id": run, "n": 1})
        assert RedisProvider(redis_url, prefix=prefix).latest(run) is not None
        assert RedisProvider(redis_url, prefix="runner").latest(run) is None
        persistence.close()
    finally:
        monkeypatch.delenv("RUNNER_PREFIX")
        reset_settings()
