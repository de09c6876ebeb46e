"""Flow state: JSON dumping, diffs and merging the changes of parallel branches."""

from __future__ import annotations

import json
import operator
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel, Field

from runner.errors import NotSerializable
from runner.flow.state import (
    Changes,
    FlowState,
    add,
    append,
    apply_changes,
    contribution,
    diff,
    dump_state,
    merge_dict,
    reducers_for,
    same,
)


class Color(StrEnum):
    RED = "red"


class Point(BaseModel):
    x: int
    y: int


class ReportState(FlowState):
    topic: str = ""
    notes: Annotated[list[str], append] = Field(default_factory=list)
    sources: Annotated[dict[str, str], merge_dict] = Field(default_factory=dict)
    tokens: Annotated[int, add] = 0
    cost: Annotated[float, operator.add] = 0.0
    outline: str = ""


def test_flow_state_has_a_fresh_uuid_id() -> None:
    first, second = FlowState(), FlowState()
    assert first.id != second.id
    assert UUID(first.id).version == 4
    assert FlowState(id="given").id == "given"


def test_reducers_are_read_from_annotated_fields() -> None:
    assert reducers_for(ReportState) == {
        "notes": append,
        "sources": merge_dict,
        "tokens": add,
        "cost": operator.add,
    }
    assert reducers_for(None) == {}


# --- diff and apply -------------------------------------------------------------------------


def test_diff_reports_changed_added_and_removed_fields() -> None:
    changes = diff({"a": 1, "b": [1], "c": 0}, {"a": 1, "b": [1, 2], "d": True})
    assert changes == Changes(set={"b": [1, 2], "d": True}, removed=frozenset({"c"}))
    assert diff({"a": 1}, {"a": 1}).empty
    assert diff({"a": 1}, {"a": True}).set == {"a": True}  # JSON types are told apart


def test_branches_changing_different_fields_keep_both_writes() -> None:
    base = dump_state(ReportState(id="r"))
    left = {**base, "topic": "AI"}
    right = {**base, "outline": "1. intro"}
    latest, conflicts = apply_changes(base, base, diff(base, left), {})
    latest, more = apply_changes(latest, base, diff(base, right), {})
    assert latest["topic"] == "AI" and latest["outline"] == "1. intro"
    assert conflicts == more == []


def test_ten_parallel_branches_appending_with_a_reducer_keep_all_items() -> None:
    base = dump_state(ReportState(id="r", notes=["seed"]))
    reducers = reducers_for(ReportState)
    latest = base
    for i in range(10):
        branch = ReportState.model_validate(base)
        branch.notes.append(f"note {i}")
        branch.tokens += 5
        branch.cost += 0.5
        branch.sources[f"s{i}"] = f"url {i}"
        latest, conflicts = apply_changes(latest, base, diff(base, dump_state(branch)), reducers)
        assert conflicts == []
    assert latest["notes"] == ["seed", *(f"note {i}" for i in range(10))]
    assert latest["tokens"] == 50 and latest["cost"] == 5.0
    assert latest["sources"] == {f"s{i}": f"url {i}" for i in range(10)}


def test_same_field_without_reducer_last_commit_wins_and_is_reported() -> None:
    base = {"id": "r", "topic": "", "other": 1}
    latest, _ = apply_changes(base, base, diff(base, {**base, "topic": "first"}), {})
    latest, conflicts = apply_changes(latest, base, diff(base, {**base, "topic": "second"}), {})
    assert latest["topic"] == "second" and latest["other"] == 1
    assert conflicts == ["topic"]


def test_the_same_change_made_twice_is_not_a_conflict() -> None:
    base = {"topic": ""}
    latest, _ = apply_changes(base, base, Changes(set={"topic": "x"}), {})
    assert apply_changes(latest, base, Changes(set={"topic": "x"}), {}) == ({"topic": "x"}, [])


def test_a_branch_that_rewrites_a_list_with_no_concurrent_change_keeps_its_list() -> None:
    base = {"notes": ["a", "b"]}
    merged, conflicts = apply_changes(base, base, diff(base, {"notes": ["c"]}), {"notes": append})
    assert merged == {"notes": ["c"]} and conflicts == []


def test_removed_keys_are_deleted_and_a_concurrent_change_is_a_conflict() -> None:
    base = {"id": "r", "tmp": 1, "gone": 2}
    latest = {"id": "r", "tmp": 5, "gone": 2}
    merged, conflicts = apply_changes(latest, base, diff(base, {"id": "r"}), {})
    assert merged == {"id": "r"} and conflicts == ["tmp"]


def test_contribution_is_what_the_step_added() -> None:
    assert contribution([1, 2], [1, 2, 3]) == [3]
    assert contribution([1, 2], [2]) == [2]
    assert contribution({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == {"b": 3, "c": 4}
    assert contribution(10, 12) == 2
    assert contribution("x", "y") == "y"


def test_apply_changes_does_not_modify_its_inputs() -> None:
    base = {"notes": ["a"]}
    latest = {"notes": ["a", "b"]}
    apply_changes(latest, base, diff(base, {"notes": ["a", "c"]}), {"notes": append})
    assert latest == {"notes": ["a", "b"]} and base == {"notes": ["a"]}


# --- JSON -----------------------------------------------------------------------------------


class Rich(FlowState):
    when: datetime = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    day: date = date(2024, 5, 1)
    ref: UUID = Field(default_factory=uuid4)
    price: Decimal = Decimal("10.25")
    color: Color = Color.RED
    point: Point = Point(x=1, y=2)
    points: list[Point] = Field(default_factory=lambda: [Point(x=3, y=4)])
    extra: Any = None


def test_rich_pydantic_state_round_trips_through_json() -> None:
    state = Rich()
    dumped = dump_state(state)
    assert json.loads(json.dumps(dumped)) == dumped
    assert dumped["price"] == "10.25" and dumped["color"] == "red"
    assert dumped["point"] == {"x": 1, "y": 2}
    assert Rich.model_validate(dumped) == state


def test_dict_state_with_rich_values_dumps_to_plain_json() -> None:
    ref = uuid4()
    state = {
        "id": "r",
        "when": datetime(2024, 5, 1, tzinfo=UTC),
        "ref": ref,
        "price": Decimal("1.5"),
        "color": Color.RED,
        "point": Point(x=1, y=2),
        "nested": {"tags": ("a", "b"), 3: None},
    }
    dumped = dump_state(state)
    assert dumped == {
        "id": "r",
        "when": "2024-05-01T00:00:00Z",
        "ref": str(ref),
        "price": "1.5",
        "color": "red",
        "point": {"x": 1, "y": 2},
        "nested": {"tags": ["a", "b"], "3": None},
    }
    assert json.loads(json.dumps(dumped)) == dumped


def test_a_value_that_is_not_json_raises_naming_its_key_path() -> None:
    with pytest.raises(NotSerializable, match=r"items\[1\]\.handle") as info:
        dump_state({"id": "r", "items": [{"ok": 1}, {"handle": object()}]})
    assert info.value.fields["path"] == "items[1].handle"
    assert info.value.fields["type_name"] == "object"


def test_a_model_field_that_is_not_json_raises_naming_the_field() -> None:
    with pytest.raises(NotSerializable, match=r"extra\.conn"):
        dump_state(Rich(extra={"conn": object()}))


def test_state_of_another_type_is_rejected() -> None:
    with pytest.raises(NotSerializable):
        dump_state([1, 2])  # type: ignore[arg-type]


def test_same_tells_json_types_apart() -> None:
    assert same({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]})
    assert not same(1, 1.0) and not same(1, True) and not same([1], [1, 2])
    assert same(float("nan"), float("nan"))
