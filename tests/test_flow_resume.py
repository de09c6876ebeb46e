"""Resuming in process where CrewAI's resume goes wrong: exact step skipping, routers, joins,
arguments, snapshots, rich state types, changed graphs, and pausing for a human."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from runner import CheckpointConfig, Flow, FlowState, and_, listen, or_, router, start
from runner.errors import GraphChanged, InvalidInputs
from runner.flow.events import EventListener, FlowEvent
from runner.flow.local import Paused
from runner.store.base import CheckpointStore
from tests._flow_support import STORES, Tally, history, make_store, steps_finished


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made = make_store(request.param, request, tmp_path)
    yield made
    made.close()


def config(store: CheckpointStore, **options: Any) -> CheckpointConfig:
    return CheckpointConfig(provider=store, **options)


# --- a 20-step flow failing at step 15 ------------------------------------------------------


class Counter(FlowState):
    counter: int = 0


def _step(i: int) -> Any:
    def step(self: TwentySteps) -> int:
        self.tally(f"step_{i:02d}")
        self.state.counter += 1
        if i == self.fail_at:
            raise RuntimeError(f"step {i} failed")
        return i

    step.__name__ = f"step_{i:02d}"
    return step


class TwentySteps(Flow[Counter]):
    """step_01 -> ... -> step_20; each adds one to the counter; ``fail_at`` raises after it."""

    def __init__(self, tally: Tally, fail_at: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally
        self.fail_at = fail_at

    step_01 = start()(_step(1))
    step_02 = listen(step_01)(_step(2))
    step_03 = listen(step_02)(_step(3))
    step_04 = listen(step_03)(_step(4))
    step_05 = listen(step_04)(_step(5))
    step_06 = listen(step_05)(_step(6))
    step_07 = listen(step_06)(_step(7))
    step_08 = listen(step_07)(_step(8))
    step_09 = listen(step_08)(_step(9))
    step_10 = listen(step_09)(_step(10))
    step_11 = listen(step_10)(_step(11))
    step_12 = listen(step_11)(_step(12))
    step_13 = listen(step_12)(_step(13))
    step_14 = listen(step_13)(_step(14))
    step_15 = listen(step_14)(_step(15))
    step_16 = listen(step_15)(_step(16))
    step_17 = listen(step_16)(_step(17))
    step_18 = listen(step_17)(_step(18))
    step_19 = listen(step_18)(_step(19))
    step_20 = listen(step_19)(_step(20))


def test_a_run_failed_at_step_15_resumes_there_and_counts_to_exactly_20(store):
    tally = Tally()
    flow = TwentySteps(tally, fail_at=15, checkpoint=config(store))
    with pytest.raises(RuntimeError, match="step 15 failed"):
        flow.kickoff()
    failed = store.latest(flow.flow_id)
    assert failed is not None and failed.state["counter"] == 14

    resumed = TwentySteps.from_checkpoint(config(store, restore_from=flow.flow_id), tally=tally)
    result = resumed.kickoff()

    assert result == 20
    assert resumed.state.counter == 20
    assert all(tally[f"step_{i:02d}"] == 1 for i in range(1, 15))
    assert all(tally[f"step_{i:02d}"] == 1 for i in range(16, 21))
    assert tally["step_15"] == 2
    assert store.run(flow.flow_id).status == "succeeded"


# --- routers, arguments and joins across a restore ------------------------------------------


class Review(FlowState):
    draft: str = ""
    published: str = ""


class ReviewFlow(Flow[Review]):
    """write -> check (router) -"ok"-> publish -> announce; publish can fail once."""

    def __init__(self, tally: Tally, broken: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally
        self.broken = broken
        self.arguments: dict[str, Any] = {}

    @start()
    def write(self) -> dict[str, Any]:
        self.tally("write")
        self.state.draft = "draft v1"
        return {"words": 2}

    @router(write)
    def check(self, stats: dict[str, Any]) -> str:
        self.tally("check")
        return "ok" if stats["words"] > 1 else "redo"

    @listen("ok")
    def publish(self, label_output: str) -> str:
        self.tally("publish")
        self.arguments["publish"] = label_output
        if self.broken:
            raise RuntimeError("press is down")
        self.state.published = self.state.draft
        return "published"

    @listen(publish)
    def announce(self, published: str) -> str:
        self.tally("announce")
        self.arguments["announce"] = published
        return f"announced {published}"

    @listen("redo")
    def rewrite(self) -> None:
        self.tally("rewrite")


def test_a_completed_routers_label_still_reaches_its_listeners_after_restore(store):
    first = ReviewFlow(Tally(), broken=True, checkpoint=config(store))
    with pytest.raises(RuntimeError, match="press is down"):
        first.kickoff()
    tally = Tally()

    resumed = ReviewFlow.from_checkpoint(config(store, restore_from=first.flow_id), tally=tally)

    assert resumed.kickoff() == "announced published"
    assert dict(tally.counts) == {"publish": 1, "announce": 1}
    assert resumed.state.published == "draft v1"


def test_restoring_the_routers_own_checkpoint_runs_what_its_label_triggers(store):
    first = ReviewFlow(Tally(), checkpoint=config(store))
    first.kickoff()
    after_router = next(c for c in history(store, first.flow_id) if c.step == "check")
    tally = Tally()

    resumed = ReviewFlow.from_checkpoint(config(store, restore_from=after_router.id), tally=tally)
    resumed.kickoff()

    assert dict(tally.counts) == {"publish": 1, "announce": 1}


def test_a_pending_listener_receives_its_triggers_stored_output(store):
    first = ReviewFlow(Tally(), broken=True, checkpoint=config(store))
    with pytest.raises(RuntimeError):
        first.kickoff()

    resumed = ReviewFlow.from_checkpoint(config(store, restore_from=first.flow_id), tally=Tally())
    resumed.kickoff()

    assert resumed.arguments == {"publish": "ok", "announce": "published"}


class Outline(FlowState):
    parts: dict[str, str] = {}


class JoinFlow(Flow[Outline]):
    """plan -> (intro, body) -> merge = and_(intro, body) -> review(merge output)."""

    def __init__(self, tally: Tally, broken: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally
        self.broken = broken
        self.arguments: dict[str, Any] = {}

    def _maybe_break(self, name: str) -> None:
        self.tally(name)
        if name == self.broken:
            raise RuntimeError(f"{name} broke")

    @start()
    def plan(self) -> list[str]:
        self._maybe_break("plan")
        return ["intro", "body"]

    @listen(plan)
    def intro(self, plan: list[str]) -> str:
        self._maybe_break("intro")
        self.arguments["intro"] = plan
        return "INTRO"

    @listen(plan)
    def body(self) -> str:
        self._maybe_break("body")
        return "BODY"

    @listen(and_(intro, body))
    def merge(self) -> str:
        self._maybe_break("merge")
        return "merged"

    @listen(merge)
    def review(self, merged: str) -> str:
        self._maybe_break("review")
        self.arguments["review"] = merged
        return f"reviewed {merged}"


def test_an_and_join_fires_when_its_triggers_completed_before_the_checkpoint(store):
    first = JoinFlow(Tally(), broken="merge", checkpoint=config(store))
    with pytest.raises(RuntimeError, match="merge broke"):
        first.kickoff()
    tally = Tally()

    resumed = JoinFlow.from_checkpoint(config(store, restore_from=first.flow_id), tally=tally)

    assert resumed.kickoff() == "reviewed merged"
    assert dict(tally.counts) == {"merge": 1, "review": 1}
    assert resumed.arguments == {"review": "merged"}


def test_a_join_with_one_trigger_done_waits_for_the_other_after_restore(store):
    first = JoinFlow(Tally(), checkpoint=config(store))
    first.kickoff()
    saved = history(store, first.flow_id)
    one_done = next(
        c for c in saved if c.event == "method_execution_finished" and c.step in {"intro", "body"}
    )
    tally = Tally()

    resumed = JoinFlow.from_checkpoint(config(store, restore_from=one_done.id), tally=tally)
    resumed.kickoff()

    other = "body" if one_done.step == "intro" else "intro"
    assert dict(tally.counts) == {other: 1, "merge": 1, "review": 1}
    if other == "intro":
        assert resumed.arguments["intro"] == ["intro", "body"]


# --- snapshots hold the state as it was when the method finished ----------------------------


class Shared(FlowState):
    data: dict[str, Any] = {}
    notes: list[Any] = []
    fast: str = ""
    slow: str = ""
    last: str = ""


class CommitWatch(EventListener):
    """Sets an event once a method's commit is done."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.committed = threading.Event()

    def on_event(self, event: FlowEvent) -> None:
        if event.type == "method_execution_finished" and event.method == self.method:
            self.committed.set()


class SnapshotFlow(Flow[Shared]):
    """begin -> (fast, slow) in parallel; slow changes nested state in place, then waits
    until fast has committed before it finishes."""

    def __init__(self, **kwargs: Any) -> None:
        self.fast_done = CommitWatch("fast")
        super().__init__(listeners=[self.fast_done], **kwargs)
        self.slow_changed = threading.Event()
        self.seen: dict[str, dict[str, Any]] = {}

    def _saw(self, name: str) -> None:
        self.seen[name] = self.state.model_dump(mode="json")

    @start()
    def begin(self) -> None:
        self.state.data = {"items": [], "meta": {"n": 0}}
        self.state.notes = [{"by": "begin"}]
        self._saw("begin")

    @listen(begin)
    def fast(self) -> str:
        assert self.slow_changed.wait(5)
        self.state.fast = "done"
        self._saw("fast")
        return "fast"

    @listen(begin)
    def slow(self) -> str:
        self.state.data["items"].append("slow")
        self.state.data["meta"]["n"] += 1
        self.state.notes[0]["by"] = "slow"
        self.slow_changed.set()
        assert self.fast_done.committed.wait(5)
        self.state.slow = "done"
        self._saw("slow")
        return "slow"

    @listen(and_(fast, slow))
    def finish(self) -> str:
        self.state.last = "finish"
        self._saw("finish")
        return "finished"


def test_each_methods_checkpoint_holds_the_state_that_method_saw(store):
    flow = SnapshotFlow(checkpoint=config(store))

    flow.kickoff()

    by_step = {c.step: c.state for c in history(store, flow.flow_id) if c.step}
    assert by_step["begin"] == flow.seen["begin"]
    # fast committed first: slow's unfinished nested changes must not leak into its snapshot
    assert by_step["fast"] == flow.seen["fast"]
    assert by_step["fast"]["data"] == {"items": [], "meta": {"n": 0}}
    assert by_step["fast"]["notes"] == [{"by": "begin"}]
    assert by_step["slow"] == {**flow.seen["slow"], "fast": "done"}
    assert by_step["finish"] == flow.seen["finish"]
    assert by_step["finish"]["data"] == {"items": ["slow"], "meta": {"n": 1}}


class Loud(FlowState):
    log: list[str] = []
    nested: dict[str, Any] = {}


class PartialWriteFlow(Flow[Loud]):
    """A failing method's changes to nested state are not kept."""

    def __init__(self, broken: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.broken = broken

    @start()
    def begin(self) -> None:
        self.state.nested = {"calls": []}

    @listen(begin)
    def risky(self) -> int:
        self.state.log.append("risky")
        self.state.nested["calls"].append("risky")
        if self.broken:
            raise RuntimeError("half done")
        return len(self.state.nested["calls"])


def test_a_failed_methods_partial_changes_are_not_in_any_checkpoint(store):
    flow = PartialWriteFlow(broken=True, checkpoint=config(store))
    with pytest.raises(RuntimeError):
        flow.kickoff()
    for ckpt in history(store, flow.flow_id):
        assert ckpt.state["log"] == []
        assert ckpt.state["nested"] in ({}, {"calls": []})

    resumed = PartialWriteFlow.from_checkpoint(
        config(store, restore_from=flow.flow_id), broken=False
    )

    assert resumed.kickoff() == 1
    assert resumed.state.nested == {"calls": ["risky"]}
    assert resumed.state.log == ["risky"]


# --- rich state types -----------------------------------------------------------------------


class Priority(Enum):
    LOW = "low"
    HIGH = "high"


class Author(BaseModel):
    name: str
    joined: dt.date
    tags: set[str] = set()


class RichState(FlowState):
    when: dt.datetime = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    ref: uuid.UUID = uuid.UUID(int=0)
    price: Decimal = Decimal("0")
    priority: Priority = Priority.LOW
    author: Author | None = None
    history: list[Author] = []
    span: dt.timedelta = dt.timedelta(0)


WHEN = dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.timezone(dt.timedelta(hours=5)))
REF = uuid.UUID("12345678-1234-5678-1234-567812345678")


class RichFlow(Flow[RichState]):
    def __init__(self, broken: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.broken = broken
        self.seen: RichState | None = None

    @start()
    def fill(self) -> None:
        self.state.when = WHEN
        self.state.ref = REF
        self.state.price = Decimal("19.990")
        self.state.priority = Priority.HIGH
        self.state.author = Author(name="Ada", joined=dt.date(1843, 7, 1), tags={"math"})
        self.state.history = [self.state.author]
        self.state.span = dt.timedelta(days=1, microseconds=7)

    @listen(fill)
    def use(self) -> str:
        if self.broken:
            raise RuntimeError("later")
        self.seen = self.state.model_copy(deep=True)
        return "used"


def test_rich_state_types_persist_and_restore_exactly(store):
    flow = RichFlow(broken=True, checkpoint=config(store))
    with pytest.raises(RuntimeError):
        flow.kickoff()

    resumed = RichFlow.from_checkpoint(config(store, restore_from=flow.flow_id))
    resumed.kickoff()

    seen = resumed.seen
    assert seen is not None
    assert seen.when == WHEN and seen.when.utcoffset() == dt.timedelta(hours=5)
    assert seen.ref == REF and isinstance(seen.ref, uuid.UUID)
    assert seen.price == Decimal("19.990") and str(seen.price) == "19.990"
    assert seen.priority is Priority.HIGH
    assert seen.author == Author(name="Ada", joined=dt.date(1843, 7, 1), tags={"math"})
    assert seen.history == [seen.author]
    assert seen.span == dt.timedelta(days=1, microseconds=7)
    assert resumed.state == seen


# --- the flow's graph changed since the checkpoint ------------------------------------------


class V1(Flow[Counter]):
    def __init__(self, tally: Tally, broken: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally
        self.broken = broken

    @start()
    def fetch(self) -> None:
        self.tally("fetch")
        self.state.counter += 1

    @listen(fetch)
    def clean(self) -> None:
        self.tally("clean")
        self.state.counter += 1

    @listen(clean)
    def load(self) -> str:
        self.tally("load")
        if self.broken:
            raise RuntimeError("load failed")
        return "loaded"


class V2AddsAStep(V1):
    """The same steps, and a new one at the end."""

    @listen("load")
    def report(self) -> str:
        self.tally("report")
        return f"reported {self.state.counter}"


class V2DropsAStep(Flow[Counter]):
    """``clean`` was renamed: a completed step no longer exists."""

    def __init__(self, tally: Tally, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally

    @start()
    def fetch(self) -> None:
        self.tally("fetch")

    @listen(fetch)
    def scrub(self) -> None:
        self.tally("scrub")

    @listen(scrub)
    def load(self) -> str:
        self.tally("load")
        return "loaded"


def _failed_v1(store: CheckpointStore) -> str:
    flow = V1(Tally(), broken=True, checkpoint=config(store))
    with pytest.raises(RuntimeError):
        flow.kickoff()
    return flow.flow_id


def test_a_changed_graph_resumes_when_every_completed_step_still_exists(store):
    run_id = _failed_v1(store)
    tally = Tally()

    resumed = V2AddsAStep.from_checkpoint(config(store, restore_from=run_id), tally=tally)

    assert resumed.kickoff() == "reported 2"
    assert dict(tally.counts) == {"load": 1, "report": 1}


def test_a_changed_graph_missing_a_completed_step_is_refused_naming_it(store):
    run_id = _failed_v1(store)
    before = [c.id for c in history(store, run_id)]
    tally = Tally()

    with pytest.raises(GraphChanged, match="clean") as caught:
        V2DropsAStep.from_checkpoint(config(store, restore_from=run_id), tally=tally).kickoff()

    assert caught.value.missing == ["clean"]
    assert not tally.counts
    assert [c.id for c in history(store, run_id)] == before


# --- pause for a human ----------------------------------------------------------------------


class Approval(FlowState):
    draft: str = ""
    approved: bool = False
    reviewer: str = ""
    sent: str = ""


def approval_flow(store: CheckpointStore) -> type[Flow[Approval]]:
    """A flow class whose persistence is ``store`` (as a user would configure it)."""

    class ApprovalFlow(Flow[Approval]):
        checkpoint = config(store)

        def __init__(self, tally: Tally | None = None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.tally = tally or Tally()

        @start()
        def draft_it(self) -> str:
            self.tally("draft_it")
            self.state.draft = "hello"
            return self.state.draft

        @listen(draft_it)
        def ask(self, draft: str) -> str:
            self.tally("ask")
            if not self.state.approved:
                self.pause(f"approve {draft!r}?")
            return self.state.reviewer

        @listen(ask)
        def send(self, reviewer: str) -> str:
            self.tally("send")
            self.state.sent = f"{self.state.draft} (ok by {reviewer})"
            return self.state.sent

    return ApprovalFlow


def test_pause_returns_paused_and_records_the_reason(store):
    cls = approval_flow(store)
    tally = Tally()
    flow = cls(tally)

    outcome = flow.kickoff()

    assert outcome == Paused(run_id=flow.flow_id, step="ask", reason="approve 'hello'?")
    latest = store.latest(flow.flow_id)
    assert latest is not None
    assert latest.status == "paused" and latest.event == "flow_paused"
    assert latest.meta.human.pause_reason == "approve 'hello'?"
    assert store.run(flow.flow_id).status == "paused"
    assert dict(tally.counts) == {"draft_it": 1, "ask": 1}


def test_resuming_a_paused_run_reruns_the_pausing_method_with_the_inputs(store):
    cls = approval_flow(store)
    flow = cls()
    flow.kickoff()
    tally = Tally()

    resumed = cls.from_checkpoint(flow.flow_id, tally=tally)
    result = resumed.kickoff(inputs={"approved": True, "reviewer": "Grace"})

    assert result == "hello (ok by Grace)"
    assert dict(tally.counts) == {"ask": 1, "send": 1}
    assert resumed.flow_id == flow.flow_id
    assert store.run(flow.flow_id).status == "succeeded"
    assert steps_finished(store, flow.flow_id) == ["draft_it", "ask", "send"]


class Unpersisted(Flow[Approval]):
    @start()
    def ask(self) -> str:
        if not self.state.approved:
            self.pause("approve?")
        return "approved"


def test_from_checkpoint_of_a_run_id_without_a_configured_store_uses_the_default_redis(
    monkeypatch, prefix
):
    from runner.settings import reset_settings
    from runner.store.redis import RedisProvider

    monkeypatch.setenv("RUNNER_PREFIX", prefix)
    reset_settings()
    try:
        default = RedisProvider()
        flow = Unpersisted(checkpoint=CheckpointConfig(provider=default))
        assert isinstance(flow.kickoff(), Paused)

        result = Unpersisted.from_checkpoint(flow.flow_id).kickoff(inputs={"approved": True})

        assert result == "approved"
        assert default.run(flow.flow_id).status == "succeeded"
        default.close()
    finally:
        monkeypatch.delenv("RUNNER_PREFIX")
        reset_settings()


# --- or_ listener across a restore -----------------------------------------------------------


class EitherFlow(Flow[Counter]):
    def __init__(self, tally: Tally, broken: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tally = tally
        self.broken = broken

    @start()
    def a(self) -> str:
        self.tally("a")
        return "A"

    @start()
    def b(self) -> str:
        self.tally("b")
        return "B"

    @listen(or_(a, b))
    def first_of(self, value: str) -> str:
        self.tally("first_of")
        if self.broken:
            raise RuntimeError("first_of broke")
        return f"got {value}"


def test_an_or_listener_runs_once_across_a_restore(store):
    flow = EitherFlow(Tally(), broken=True, checkpoint=config(store))
    with pytest.raises(RuntimeError):
        flow.kickoff()
    tally = Tally()

    resumed = EitherFlow.from_checkpoint(config(store, restore_from=flow.flow_id), tally=tally)
    result = resumed.kickoff()

    assert tally["first_of"] == 1 and tally["a"] == 0 and tally["b"] == 0
    assert result in {"got A", "got B"}


def test_resuming_with_invalid_inputs_raises_and_writes_nothing(store):
    cls = approval_flow(store)
    flow = cls()
    flow.kickoff()
    before = [c.id for c in history(store, flow.flow_id)]
    tally = Tally()

    with pytest.raises(InvalidInputs, match="approved"):
        cls.from_checkpoint(flow.flow_id, tally=tally).kickoff(inputs={"approved": "perhaps"})
    with pytest.raises(InvalidInputs, match="fork it instead"):
        cls.from_checkpoint(flow.flow_id, tally=tally).kickoff(inputs={"id": "another-run"})

    assert not tally.counts
    assert [c.id for c in history(store, flow.flow_id)] == before
    assert store.run(flow.flow_id).status == "paused"


def test_a_config_without_restore_from_resumes_the_latest_run(store):
    flow = V1(Tally(), broken=True, checkpoint=config(store))
    with pytest.raises(RuntimeError):
        flow.kickoff()
    tally = Tally()

    resumed = V1.from_checkpoint(config(store), tally=tally)

    assert resumed.kickoff() == "loaded"
    assert resumed.flow_id == flow.flow_id
    assert dict(tally.counts) == {"load": 1}
