"""Three places where the runner differed from CrewAI (issue 21, point 7): a falsy persistence
object is used, not replaced by Redis; ``Flow.from_checkpoint`` returns the checkpoint's state at
once; a crew built inside a function (CrewAI's factory pattern) is restored by passing it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import CheckpointConfig, Crew, Flow, FlowState, Task, listen, persist, start
from runner.crew import TaskInput
from runner.errors import CheckpointNotFound, DefinitionError, FlowImportError, GraphChanged
from runner.store.base import CheckpointStore
from runner.store.persistence import FlowPersistence
from tests._flow_support import STORES, Tally, make_store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made = make_store(request.param, request, tmp_path)
    yield made
    made.close()


# --- a persistence whose truth value is false is still the one used ----------------------------


class ShelfPersistence(FlowPersistence):
    """A user's persistence that is also a container of the states it keeps: empty (so
    falsy) until its first save, like a dict or list would be."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, str, dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.saved)

    def init_db(self) -> None:
        """Nothing to create: states live in this object."""

    def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None:
        self.saved.append((flow_uuid, method_name, dict(state_data)))

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        found = [s for f, _, s in self.saved if f == flow_uuid]
        return dict(found[-1]) if found else None


class Counted(FlowState):
    steps: list[str] = []


class TwoSteps(Flow[Counted]):
    @start()
    def first(self) -> None:
        self.state.steps = [*self.state.steps, "first"]

    @listen(first)
    def second(self) -> str:
        self.state.steps = [*self.state.steps, "second"]
        return "done"


def test_an_empty_persistence_given_to_persist_on_the_class_gets_every_state():
    shelf = ShelfPersistence()
    assert not shelf

    @persist(shelf)
    class Shelved(TwoSteps):
        pass

    flow = Shelved()
    flow.kickoff()

    assert [(f, m, s["steps"]) for f, m, s in shelf.saved] == [
        (flow.flow_id, "first", ["first"]),
        (flow.flow_id, "second", ["first", "second"]),
    ]


def test_an_empty_persistence_given_to_persist_on_a_method_gets_that_methods_state():
    shelf = ShelfPersistence()

    class ShelvedSecond(TwoSteps):
        @listen("first")
        @persist(shelf)
        def second(self) -> str:
            return super().second()

    flow = ShelvedSecond()
    flow.kickoff()

    assert [(m, s["steps"]) for _, m, s in shelf.saved] == [("second", ["first", "second"])]


def test_an_empty_persistence_given_to_the_flow_gets_every_state_and_restores_by_id():
    shelf = ShelfPersistence()

    @persist
    class Persisted(TwoSteps):
        pass

    first = Persisted(persistence=shelf)
    first.kickoff()
    again = Persisted(persistence=shelf)
    again.kickoff(inputs={"id": first.flow_id})

    assert [m for _, m, _ in shelf.saved] == ["first", "second", "first", "second"]
    assert again.state.steps == ["first", "second", "first", "second"]


# --- Flow.from_checkpoint holds the checkpoint's state before kickoff --------------------------


class Order(FlowState):
    customer: str = ""
    items: list[str] = []
    total: int = 0


class OrderFlow(Flow[Order]):
    def __init__(self, tally: Tally | None = None, fail: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally or Tally()
        self.fail = fail

    @start()
    def take(self) -> None:
        self.tally("take")
        self.state.items = ["tea", "cake"]

    @listen(take)
    def price(self) -> int:
        self.tally("price")
        self.state.total = 7
        return self.state.total

    @listen(price)
    def charge(self, total: int) -> str:
        self.tally("charge")
        if self.fail:
            raise RuntimeError("card declined")
        return f"charged {self.state.customer} {total}"


def _declined(config: CheckpointConfig) -> OrderFlow:
    flow = OrderFlow(fail=True, checkpoint=config)
    with pytest.raises(RuntimeError, match="card declined"):
        flow.kickoff(inputs={"customer": "ada"})
    return flow


def test_a_flow_from_a_checkpoint_in_a_store_has_its_state_before_kickoff(store):
    declined = _declined(CheckpointConfig(provider=store))
    tally = Tally()

    restored = OrderFlow.from_checkpoint(
        CheckpointConfig(provider=store, restore_from=declined.flow_id), tally=tally
    )

    assert restored.flow_id == declined.flow_id
    assert restored.state.id == declined.flow_id
    assert (restored.state.customer, restored.state.items, restored.state.total) == (
        "ada",
        ["tea", "cake"],
        7,
    )
    assert tally.order == []
    assert restored.kickoff() == "charged ada 7"
    assert tally.order == ["charge"]


def test_a_flow_from_a_checkpoint_file_has_that_checkpoints_state(tmp_path):
    declined = _declined(CheckpointConfig(location=str(tmp_path)))
    files = sorted(tmp_path.rglob("*.json"))
    after_take = next(f for f in files if '"step":"take"' in f.read_text())

    restored = OrderFlow.from_checkpoint(str(after_take))

    assert restored.state.id == declined.flow_id
    assert (restored.state.items, restored.state.total) == (["tea", "cake"], 0)
    assert restored.kickoff() == "charged ada 7"
    assert restored.tally.order == ["price", "charge"]


def test_a_dict_state_flow_from_a_checkpoint_has_its_fields(store):
    class Notes(Flow[dict[str, Any]]):
        @start()
        def jot(self) -> None:
            self.state["note"] = "remember the milk"

        @listen(jot)
        def stop(self) -> None:
            raise RuntimeError("interrupted")

    flow = Notes(checkpoint=CheckpointConfig(provider=store))
    with pytest.raises(RuntimeError, match="interrupted"):
        flow.kickoff()

    restored = Notes.from_checkpoint(CheckpointConfig(provider=store, restore_from=flow.flow_id))

    assert restored.state == {"id": flow.flow_id, "note": "remember the milk"}


def test_a_flow_from_a_missing_checkpoint_fails_at_once(store):
    with pytest.raises(CheckpointNotFound):
        OrderFlow.from_checkpoint(CheckpointConfig(provider=store, restore_from="no-such-run"))


# --- a crew built inside a function is restored by passing it ----------------------------------

RUNS: Counter[str] = Counter()
FAIL: set[str] = set()


def act(task: TaskInput) -> str:
    RUNS[task.name] += 1
    if task.name in FAIL:
        raise RuntimeError(f"planned failure of {task.name}")
    before = task.context[-1].raw if task.context else task.inputs["topic"]
    return f"{task.name}({before})"


def make_crew(config: CheckpointConfig) -> Crew:
    """CrewAI's usual shape: a factory builds the crew, no module variable holds it."""
    return Crew(
        tasks=[
            Task("Research {topic}", "notes", name="research", fn=act),
            Task("Write about {topic}", "a draft", name="write", fn=act),
            Task("Review the draft", "the final text", name="review", fn=act),
        ],
        name="factory_crew",
        checkpoint=config,
    )


@pytest.fixture
def failed_at_write(tmp_path: Path) -> Iterator[Path]:
    """A factory-built crew's run that failed at ``write``; its newest checkpoint file."""
    RUNS.clear()
    FAIL.clear()
    FAIL.add("write")
    with pytest.raises(RuntimeError, match="planned failure of write"):
        make_crew(CheckpointConfig(location=str(tmp_path / "cp"))).kickoff({"topic": "bees"})
    FAIL.clear()
    yield sorted((tmp_path / "cp").rglob("*.json"))[-1]
    RUNS.clear()


def test_restoring_a_factory_built_crew_by_path_says_in_one_line_to_pass_the_crew(
    failed_at_write,
):
    with pytest.raises(FlowImportError) as raised:
        Crew.from_checkpoint(str(failed_at_write))

    message = str(raised.value)
    assert "\n" not in message
    assert "factory_crew" in message
    assert "Crew.from_checkpoint(config, crew=make_crew())" in message


def test_a_factory_built_crew_passed_to_from_checkpoint_resumes_its_run(failed_at_write, tmp_path):
    given = make_crew(CheckpointConfig(location=str(tmp_path / "elsewhere")))

    restored = Crew.from_checkpoint(str(failed_at_write), crew=given)

    assert restored.kickoff().raw == "review(write(research(bees)))"
    assert dict(RUNS) == {"research": 1, "write": 2, "review": 1}
    assert not (tmp_path / "elsewhere").exists()  # the run went on where it is kept
    RUNS.clear()
    assert given.kickoff({"topic": "ants"}).raw == "review(write(research(ants)))"
    assert dict(RUNS) == {"research": 1, "write": 1, "review": 1}  # the given crew is unchanged


def test_a_factory_built_crew_passed_to_fork_starts_a_new_run(failed_at_write, tmp_path):
    store = CheckpointConfig(location=str(tmp_path / "cp")).store()
    (source,) = store.runs()

    fork = Crew.fork(str(failed_at_write), branch="retry", crew=make_crew(CheckpointConfig()))

    assert fork.kickoff().raw == "review(write(research(bees)))"
    assert dict(RUNS) == {"research": 1, "write": 2, "review": 1}
    runs = {r.run_id for r in store.runs()}
    assert source.run_id in runs and len(runs) == 2


def test_a_crew_without_the_checkpoints_tasks_is_refused_when_passed(failed_at_write):
    other = Crew(tasks=[Task("Summarise {topic}", "a line", name="summary", fn=act)])

    with pytest.raises(GraphChanged, match="research"):
        Crew.from_checkpoint(str(failed_at_write), crew=other)


def test_from_checkpoint_takes_only_a_crew_as_crew(failed_at_write):
    with pytest.raises(DefinitionError, match="crew=a Crew"):
        Crew.from_checkpoint(str(failed_at_write), crew=make_crew)  # type: ignore[arg-type]
