"""The rules every checkpoint store keeps, run against each provider.

A provider passes when it behaves the same as the others here; see the rules in
:mod:`runner.store.base`. The ``coord_store`` tests cover the providers that implement
:class:`~runner.store.base.CoordinatedStore` (dispatch markers and leases).
``tests/test_cluster.py`` runs this whole module again against a Redis Cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from runner import ids
from runner.errors import (
    CheckpointNotFound,
    CommitConflict,
    NotSerializable,
    RunNotFound,
    StaleAttempt,
    StoreError,
)
from runner.store.base import BeginOutcome, CheckpointStore, CommitRequest, CoordinatedStore
from runner.store.codec import Codec
from runner.store.jsondir import JsonProvider
from runner.store.models import Checkpoint, Lineage, RunMeta, RunStatus, StepError
from runner.store.redis import RedisProvider
from runner.store.sqlite import SqliteProvider

Opener = Callable[..., CheckpointStore]

SEALED = Codec([("test", bytes(range(32)))])
"""The "-sealed" providers' codec: the store with its payloads encrypted."""


@pytest.fixture(
    params=["redis", "redis-sealed", "sqlite", "sqlite-sealed", "jsondir", "jsondir-sealed"]
)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens stores of one provider, all on the same storage; closes them afterwards
    (``-sealed``: its payloads encrypted)."""
    opened: list[CheckpointStore] = []

    def make(**kwargs: Any) -> CheckpointStore:
        if request.param.endswith("-sealed"):
            kwargs.setdefault("codec", SEALED)
        if request.param.startswith("redis"):
            url = request.getfixturevalue("redis_url")
            prefix = request.getfixturevalue("prefix")
            return RedisProvider(url, prefix=prefix, **kwargs)
        if request.param.startswith("sqlite"):
            return SqliteProvider(tmp_path / "store.db", **kwargs)
        return JsonProvider(tmp_path / "store", **kwargs)

    def opener(**kwargs: Any) -> CheckpointStore:
        store = make(**kwargs)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Opener) -> CheckpointStore:
    """A store of the provider under test that keeps every checkpoint."""
    return open_store(max_checkpoints=0)


@pytest.fixture(params=["redis", "redis-sealed"])
def open_coord(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> Iterator[Opener]:
    """Opens stores of each provider that implements :class:`CoordinatedStore`, all on the
    same storage; closes them afterwards."""
    opened: list[CheckpointStore] = []

    def opener(**kwargs: Any) -> CheckpointStore:
        if request.param == "redis-sealed":
            kwargs.setdefault("codec", SEALED)
        provider = RedisProvider(redis_url, prefix=prefix, **kwargs)
        assert isinstance(provider, CoordinatedStore)
        opened.append(provider)
        return provider

    yield opener
    for provider in opened:
        provider.close()


@pytest.fixture
def coord_store(open_coord: Opener) -> Any:
    """A coordinated store that keeps every checkpoint."""
    return open_coord(max_checkpoints=0)


def ckpt(run_id: str, **fields: Any) -> Checkpoint:
    fields.setdefault("event", "method_finished")
    return Checkpoint(run_id=run_id, **fields)


def commit_many(store: CheckpointStore, run_id: str, n: int, **kwargs: Any) -> list[Checkpoint]:
    return [store.commit(ckpt(run_id, state={"n": i}), **kwargs) for i in range(n)]


def full_checkpoint(run_id: str) -> Checkpoint:
    return Checkpoint(
        run_id=run_id,
        seq=99,  # ignored: the store assigns seq
        event="method_failed",
        step="write",
        activation="write#1",
        attempt="token-1",
        status=RunStatus.FAILED,
        state={"id": run_id, "nested": {"list": [1, 2.5, None, "é"], "ok": True}, "n": 0},
        completed=["start#1", "plan#1"],
        outputs={"plan": {"steps": ["a", "b"]}, "start": None},
        in_flight=["review#1"],
        record={"routers": {"route#1": "yes"}, "joins": {"and_1": ["a"]}},
        flow="pkg.mod:ReportFlow",
        fingerprint="f00d",
        lineage=Lineage(parent_run_id="parent", parent_checkpoint_id="p-1", branch="b"),
        created_at=1_700_000_000.125,
        error=StepError(type="ValueError", message="bad", traceback="Traceback ...", attempts=3),
        meta={"name": "Report", "epoch": 2, "ready": ["c1#1"]},
    )


def test_commit_assigns_gapless_seq_from_one_and_round_trips_every_field(store):
    run = ids.run_id()
    first = commit_many(store, run, 3)
    full = full_checkpoint(run)
    committed = store.commit(full)

    assert [c.seq for c in [*first, committed]] == [1, 2, 3, 4]
    expected = full.model_copy(update={"seq": 4})
    assert committed == expected
    assert store.get(full.id) == expected
    assert store.latest(run) == expected
    assert store.history(run)[0] == expected


def test_get_of_unknown_checkpoint_raises_checkpoint_not_found(store):
    with pytest.raises(CheckpointNotFound):
        store.get(ids.checkpoint_id())


def test_unknown_run_has_no_latest_history_or_metadata(store):
    run = ids.run_id()
    assert store.latest(run) is None
    assert store.history(run) == []
    assert store.run(run) is None


def test_history_is_newest_first_and_pages_with_limit_and_offset(store):
    run = ids.run_id()
    commit_many(store, run, 7)

    def seqs(**page: int) -> list[int]:
        return [c.seq for c in store.history(run, **page)]

    assert seqs() == [7, 6, 5, 4, 3, 2, 1]
    assert seqs(limit=3) == [7, 6, 5]
    assert seqs(limit=3, offset=3) == [4, 3, 2]
    assert seqs(limit=3, offset=6) == [1]
    assert seqs(offset=10) == []


def test_runs_lists_newest_updated_first_with_status_filter_and_limit(store):
    a, b, c = ids.run_id(), ids.run_id(), ids.run_id()
    for run, status in [(a, RunStatus.RUNNING), (b, RunStatus.SUCCEEDED), (c, RunStatus.RUNNING)]:
        store.commit(ckpt(run, status=status))
        time.sleep(0.01)
    store.commit(ckpt(a))

    assert [r.run_id for r in store.runs()] == [a, c, b]
    assert [r.run_id for r in store.runs(limit=2)] == [a, c]
    assert [r.run_id for r in store.runs(limit=2, offset=1)] == [c, b]
    assert [r.run_id for r in store.runs(status=RunStatus.SUCCEEDED)] == [b]
    assert [r.run_id for r in store.runs(status=RunStatus.RUNNING, limit=1)] == [a]
    assert store.runs(status=RunStatus.CANCELLED) == []


def test_run_metadata_reflects_the_latest_checkpoint(store):
    run = ids.run_id()
    store.commit(ckpt(run, event="run_started", flow="pkg.mod:F", meta={"name": "F"}))
    last = store.commit(ckpt(run, step="plan", status=RunStatus.PAUSED))

    info = store.run(run)
    assert info is not None
    assert (info.run_id, info.status, info.latest, info.seq) == (run, RunStatus.PAUSED, last.id, 2)
    assert (info.event, info.step, info.flow, info.name) == (
        "method_finished",
        "plan",
        "pkg.mod:F",
        "F",
    )
    assert 0 < info.created_at <= info.updated_at
    assert info.parent_run_id is None and info.error is None

    failure = StepError(type="KeyError", message="boom")
    store.commit(ckpt(run, event="method_failed", status=RunStatus.FAILED, error=failure))
    info = store.run(run)
    assert info is not None
    assert (info.status, info.seq, info.error) == (RunStatus.FAILED, 3, "KeyError: boom")


def test_update_run_sets_status(store):
    run = ids.run_id()
    latest = store.commit(ckpt(run))

    info = store.update_run(run, status=RunStatus.CANCELLED)

    assert info.status == RunStatus.CANCELLED
    assert store.run(run) == info
    assert [r.run_id for r in store.runs(status=RunStatus.CANCELLED)] == [run]
    assert store.latest(run) == latest


def test_update_run_with_an_unknown_field_or_a_bad_value_is_a_store_error_and_changes_nothing(
    store,
):
    run = ids.run_id()
    store.commit(ckpt(run))
    before = store.run(run)

    with pytest.raises(StoreError, match="bogus"):
        store.update_run(run, bogus=1)
    with pytest.raises(StoreError):
        store.update_run(run, status="exploded")

    assert store.run(run) == before


def test_a_state_value_json_cannot_hold_is_not_serializable_and_writes_nothing(store):
    run = ids.run_id()
    first = store.commit(ckpt(run, state={"n": 1}))

    for state in ({"n": object()}, {"big": "x" * 20_000, "n": object()}):
        with pytest.raises(NotSerializable):
            store.commit(ckpt(run, state=state))

    assert store.history(run) == [first]


def test_update_run_of_unknown_run_raises_run_not_found(store):
    with pytest.raises(RunNotFound):
        store.update_run(ids.run_id(), status=RunStatus.CANCELLED)


def test_delete_run_removes_the_run_and_all_its_checkpoints(store):
    doomed, kept = ids.run_id(), ids.run_id()
    gone = commit_many(store, doomed, 3)
    commit_many(store, kept, 2)

    assert store.delete_run(doomed) is True

    for checkpoint in gone:
        with pytest.raises(CheckpointNotFound):
            store.get(checkpoint.id)
    assert store.latest(doomed) is None and store.history(doomed) == []
    assert store.run(doomed) is None
    assert [r.run_id for r in store.runs()] == [kept]
    assert len(store.history(kept)) == 2
    assert store.delete_run(doomed) is False


def test_commit_with_max_checkpoints_keeps_only_the_newest_n(store, open_store):
    run = ids.run_id()
    made = commit_many(store, run, 6, max_checkpoints=3)

    assert [c.id for c in store.history(run)] == [c.id for c in reversed(made[3:])]
    with pytest.raises(CheckpointNotFound):
        store.get(made[0].id)
    assert store.commit(ckpt(run), max_checkpoints=3).seq == 7

    small = open_store(max_checkpoints=2)
    other = ids.run_id()
    commit_many(small, other, 4)
    assert [c.seq for c in small.history(other)] == [4, 3]


def test_prune_keeps_the_newest_n_and_returns_the_deleted_ids(store):
    run = ids.run_id()
    made = commit_many(store, run, 6)
    doomed = {c.id for c in made[:4]}

    assert set(store.prune(run, 2, dry_run=True)) == doomed
    assert len(store.history(run)) == 6

    assert set(store.prune(run, 2)) == doomed
    assert [c.seq for c in store.history(run)] == [6, 5]
    assert store.prune(run, 2) == []


def test_pruning_never_deletes_a_checkpoint_a_fork_points_to(store):
    run = ids.run_id()
    made = commit_many(store, run, 5)
    store.fork(made[1].id, new_run_id=ids.run_id())

    assert set(store.prune(run, 1)) == {made[0].id, made[2].id, made[3].id}
    assert store.get(made[1].id) == made[1]
    store.commit(ckpt(run), max_checkpoints=1)
    assert [c.seq for c in store.history(run)] == [6, 2]


def test_same_activation_and_attempt_committed_twice_returns_the_first_checkpoint(store):
    run = ids.run_id()
    first = store.commit(ckpt(run, activation="plan#1", attempt="t1", state={"v": 1}))

    again = store.commit(ckpt(run, activation="plan#1", attempt="t1", state={"v": 2}))

    assert (again.id, again.seq, again.state) == (first.id, first.seq, {"v": 1})
    assert len(store.history(run)) == 1
    assert store.commit(ckpt(run, activation="write#1", attempt="t1")).seq == 2


def test_same_activation_with_another_attempt_raises_stale_attempt_and_writes_nothing(store):
    run = ids.run_id()
    store.commit(ckpt(run, activation="plan#1", attempt="t1"))
    before = (store.history(run), store.run(run))

    with pytest.raises(StaleAttempt):
        store.commit(ckpt(run, activation="plan#1", attempt="t2"))

    assert (store.history(run), store.run(run)) == before


def test_expected_seq_mismatch_raises_commit_conflict_and_writes_nothing(store):
    run = ids.run_id()
    assert store.commit(ckpt(run), expected_seq=0).seq == 1
    store.commit(ckpt(run))
    before = (store.history(run), store.run(run))

    for stale in (0, 1, 5):
        with pytest.raises(CommitConflict):
            store.commit(ckpt(run), expected_seq=stale)

    assert (store.history(run), store.run(run)) == before
    assert store.commit(ckpt(run), expected_seq=2).seq == 3


def test_fork_copies_the_checkpoint_into_a_new_run_and_leaves_the_source_untouched(store):
    source = ids.run_id()
    made = [
        store.commit(ckpt(source, state={"id": source, "n": i}, completed=[f"s{i}#1"]))
        for i in range(3)
    ]
    before = (store.history(source), store.run(source))
    new = ids.run_id()

    forked = store.fork(made[1].id, new_run_id=new, branch="try-b")

    assert forked.id not in {c.id for c in made}
    assert (forked.run_id, forked.seq, forked.event) == (new, 1, "forked")
    assert forked.lineage == Lineage(
        parent_run_id=source, parent_checkpoint_id=made[1].id, branch="try-b"
    )
    assert forked.state == {"id": new, "n": 1}
    assert forked.completed == ["s1#1"]
    assert store.latest(new) == forked
    info = store.run(new)
    assert info is not None
    assert (info.parent_run_id, info.parent_checkpoint_id, info.branch) == (
        source,
        made[1].id,
        "try-b",
    )
    assert (store.history(source), store.run(source)) == before

    edited = store.fork(made[2].id, new_run_id=ids.run_id(), state={"n": 42})
    assert edited.state == {"n": 42}
    with pytest.raises(CheckpointNotFound):
        store.fork(ids.checkpoint_id(), new_run_id=ids.run_id())


def _commit_concurrently(stores: list[CheckpointStore], run: str, each: int) -> list[Checkpoint]:
    def work(store: CheckpointStore) -> list[Checkpoint]:
        return [store.commit(ckpt(run, state={"n": i})) for i in range(each)]

    with ThreadPoolExecutor(max_workers=len(stores)) as pool:
        return [c for batch in pool.map(work, stores) for c in batch]


def test_concurrent_commits_from_eight_threads_are_all_kept_with_gapless_seq(store):
    run = ids.run_id()
    made = _commit_concurrently([store] * 8, run, 25)

    assert sorted(c.seq for c in made) == list(range(1, 201))
    history = store.history(run, limit=500)
    assert [c.seq for c in history] == list(range(200, 0, -1))
    assert {c.id for c in history} == {c.id for c in made}


def test_concurrent_commits_through_separate_stores_keep_seq_gapless(open_store):
    run = ids.run_id()
    stores = [open_store(max_checkpoints=0) for _ in range(8)]
    made = _commit_concurrently(stores, run, 10)

    assert sorted(c.seq for c in made) == list(range(1, 81))
    assert len(stores[0].history(run, limit=500)) == 80


@pytest.mark.parametrize("status", list(RunStatus))
def test_checkpoint_json_round_trip_keeps_error_and_status(status):
    checkpoint = full_checkpoint("run-1").model_copy(update={"status": status, "seq": 4})

    data = checkpoint.model_dump_json()

    assert f'"status":"{status.value}"' in data
    assert Checkpoint.model_validate_json(data) == checkpoint
    assert Checkpoint.model_validate_json(data).error == StepError(
        type="ValueError", message="bad", traceback="Traceback ...", attempts=3
    )


# -- the coordinated protocol: dispatch markers and leases --------------------------------------


def test_dispatch_markers_are_set_once_and_re_dated_by_stamp(coord_store):
    run = ids.run_id()
    coord_store.commit(ckpt(run))

    assert coord_store.mark_dispatched(run, ["a#1", "b#1"], at=100.0) == [True, True]
    assert coord_store.mark_dispatched(run, ["b#1", "c#1"], at=200.0) == [False, True]
    assert coord_store.markers(run) == {"a#1": 100.0, "b#1": 100.0, "c#1": 200.0}

    coord_store.stamp(run, "a#1", at=500.0)
    assert coord_store.markers(run)["a#1"] == 500.0
    assert coord_store.mark_dispatched(run, []) == []


def test_a_commit_marks_the_activations_it_dispatches_and_a_lost_commit_marks_none(coord_store):
    run = ids.run_id()
    first = coord_store.commit_request(CommitRequest(ckpt(run), dispatching=["plan#1"]))
    assert set(coord_store.markers(run)) == {"plan#1"}

    with pytest.raises(CommitConflict):
        coord_store.commit_request(
            CommitRequest(ckpt(run), expected_seq=0, dispatching=["write#1"])
        )
    assert set(coord_store.markers(run)) == {"plan#1"}
    # The marker set by the commit is not set again by a later dispatch.
    assert coord_store.mark_dispatched(run, ["plan#1"]) == [False]
    assert coord_store.latest(run) == first


def test_begin_takes_the_lease_reports_a_live_holder_and_a_committed_step(coord_store):
    run = ids.run_id()
    assert coord_store.begin_attempt(run, "plan#1", "t1", 30) == (None, BeginOutcome.NO_RUN, "")
    first = coord_store.commit(ckpt(run, event="flow_started"))

    before = time.time()
    begun = coord_store.begin_attempt(run, "plan#1", "t1", 30)
    assert (begun.latest, begun.outcome) == (first, BeginOutcome.OK)
    assert before + 29 < coord_store.leases(run)["plan#1"] < time.time() + 31

    held = coord_store.begin_attempt(run, "plan#1", "t2", 30)
    assert (held.latest, held.outcome, held.holder) == (first, BeginOutcome.HELD, "t1")
    assert coord_store.begin_attempt(run, "plan#1", "t1", 30).outcome is BeginOutcome.OK

    coord_store.commit(ckpt(run, activation="plan#1", attempt="t1"))
    assert coord_store.leases(run) == {}  # the commit dropped the committing step's lease
    done = coord_store.begin_attempt(run, "plan#1", "t3", 30)
    assert done.outcome is BeginOutcome.DONE
    assert coord_store.leases(run) == {}


def test_a_commit_drops_only_its_own_activations_lease(coord_store):
    run = ids.run_id()
    coord_store.commit(ckpt(run))
    coord_store.begin_attempt(run, "left#1", "t-left", 30)
    coord_store.begin_attempt(run, "right#1", "t-right", 30)

    coord_store.commit(ckpt(run, activation="left#1", attempt="t-left"))

    assert set(coord_store.leases(run)) == {"right#1"}
    coordination = coord_store.coordination(run)
    assert set(coordination.leases) == {"right#1"}
    assert coordination.markers == coord_store.markers(run)


def test_a_pause_keeps_the_leases_and_a_new_epoch_only_those_it_carries(coord_store):
    """A paused run's steps may still run: its leases and markers stay. The next epoch drops
    them, but for the steps it carries on (``CommitRequest.carried``: still running when a
    paused run went on); a run's end drops them all, but a failure keeps the live ones (a
    parallel branch runs on, and a resume of the failed run carries it)."""
    run = ids.run_id()
    coord_store.commit(ckpt(run))
    coord_store.mark_dispatched(run, ["left#1", "right#1"])
    coord_store.begin_attempt(run, "left#1", "t-left", 30)
    coord_store.begin_attempt(run, "right#1", "t-right", 30)
    coord_store.commit(ckpt(run, status=RunStatus.PAUSED))  # left's question
    assert set(coord_store.leases(run)) == set(coord_store.markers(run)) == {"left#1", "right#1"}
    assert coord_store.release(run, "left#1", "t-left") is True

    opened = ckpt(run, meta=RunMeta(epoch=1, carried={"right#1": 0}))
    coord_store.commit_request(CommitRequest(opened, carried=["right#1"]))
    assert set(coord_store.leases(run)) == set(coord_store.markers(run)) == {"right#1"}
    assert coord_store.renew(run, "right#1", "t-right", 30) is True  # its attempt holds it still

    coord_store.commit(ckpt(run, status=RunStatus.FAILED, meta=RunMeta(epoch=1)))
    assert set(coord_store.leases(run)) == set(coord_store.markers(run)) == {"right#1"}
    assert coord_store.renew(run, "right#1", "t-right", 30) is True
    coord_store.commit(ckpt(run, status=RunStatus.CANCELLED, meta=RunMeta(epoch=1)))
    assert coord_store.leases(run) == {} and coord_store.markers(run) == {}


def test_a_failure_keeps_the_live_leases_only(coord_store):
    """A commit that fails the run keeps the leases (and markers) that are live, and drops
    the lapsed ones with the markers of steps nobody holds."""
    run = ids.run_id()
    coord_store.commit(ckpt(run))
    coord_store.mark_dispatched(run, ["left#1", "right#1", "queued#1"])
    coord_store.begin_attempt(run, "left#1", "t-left", 30)
    coord_store.begin_attempt(run, "right#1", "t-right", 0)  # a lease lapsed (holder died)
    coord_store.commit(ckpt(run, status=RunStatus.FAILED))
    assert set(coord_store.leases(run)) == set(coord_store.markers(run)) == {"left#1"}


def test_a_commit_drops_the_lease_of_the_attempt_it_releases_while_that_attempt_holds_it(
    coord_store,
):
    """A step that paused stays in flight, uncommitted, but its attempt has ended: the pause's
    commit drops that attempt's lease (``CommitRequest.released``), and no other's."""
    run = ids.run_id()
    coord_store.commit(ckpt(run))
    coord_store.mark_dispatched(run, ["left#1", "right#1"])
    coord_store.begin_attempt(run, "left#1", "t-left", 30)
    coord_store.begin_attempt(run, "right#1", "t-right", 30)
    left_paused = ckpt(run, status=RunStatus.PAUSED)
    coord_store.commit_request(CommitRequest(left_paused, released=("left#1", "t-left")))
    assert set(coord_store.leases(run)) == {"right#1"}
    assert set(coord_store.markers(run)) == {"left#1", "right#1"}  # in flight: still sent

    not_its = ckpt(run, status=RunStatus.PAUSED)
    coord_store.commit_request(CommitRequest(not_its, released=("right#1", "t-left")))
    assert set(coord_store.leases(run)) == {"right#1"}
    assert coord_store.renew(run, "right#1", "t-right", 30) is True


def test_an_expired_lease_is_taken_by_the_next_attempt(coord_store):
    run = ids.run_id()
    coord_store.commit(ckpt(run))
    coord_store.begin_attempt(run, "plan#1", "t1", -1)  # expired at once

    assert coord_store.begin_attempt(run, "plan#1", "t2", 30).outcome is BeginOutcome.OK
    assert coord_store.release(run, "plan#1", "t1") is False
    assert coord_store.release(run, "plan#1", "t2") is True
    assert coord_store.leases(run) == {}


def test_renew_take_over_and_release_act_only_for_the_holder(coord_store):
    run = ids.run_id()
    coord_store.commit(ckpt(run))
    coord_store.begin_attempt(run, "plan#1", "t1", 1)
    expiry = coord_store.leases(run)["plan#1"]

    assert coord_store.renew(run, "plan#1", "t2", 60) is False
    assert coord_store.renew(run, "plan#1", "t1", 60) is True
    assert coord_store.leases(run)["plan#1"] > expiry + 50

    assert coord_store.take_over(run, "plan#1", "t-unknown", "t2", 60) is False
    assert coord_store.take_over(run, "plan#1", "t1", "t2", 60) is True
    assert coord_store.begin_attempt(run, "plan#1", "t1", 60).holder == "t2"
    assert coord_store.release(run, "plan#1", "t1") is False
    assert coord_store.release(run, "plan#1", "t2") is True
    assert coord_store.renew(run, "plan#1", "t2", 60) is False  # never re-creates a lease
    assert coord_store.leases(run) == {}


@pytest.mark.parametrize("size", [10, 40_000], ids=["inline", "by-field"])
def test_a_commit_that_ends_the_run_writes_its_closing_checkpoint_in_the_same_write(
    coord_store, size
):
    run = ids.run_id()
    first = coord_store.commit(ckpt(run, event="flow_started", state={"id": run, "n": 0}))
    state = {"id": run, "n": 1, "doc": "x" * size}
    step = ckpt(run, event="method_execution_finished", step="a", activation="a#1")
    step = step.model_copy(update={"attempt": "t1", "state": state, "status": RunStatus.SUCCEEDED})
    closing = ckpt(run, event="flow_finished", status=RunStatus.SUCCEEDED, state=dict(state))

    with pytest.raises(CommitConflict):  # nothing of a commit that does not land
        coord_store.commit_request(CommitRequest(step, expected_seq=0, closing=closing))
    assert [c.id for c in coord_store.history(run)] == [first.id]

    done = coord_store.commit_request(CommitRequest(step, expected_seq=first.seq, closing=closing))
    assert done.seq == 2
    kept = coord_store.history(run)
    assert [(c.seq, c.event, c.id) for c in kept] == [
        (3, "flow_finished", closing.id),
        (2, "method_execution_finished", step.id),
        (1, "flow_started", first.id),
    ]
    assert kept[0].state == kept[1].state == state
    assert coord_store.get(closing.id) == kept[0]
    info = coord_store.run(run)
    assert info is not None
    assert (info.seq, info.latest, info.event, info.status) == (
        3,
        closing.id,
        "flow_finished",
        "succeeded",
    )

    # The same attempt again is a duplicate: no second closing checkpoint.
    again = closing.model_copy(update={"id": "another-closing"})
    assert coord_store.commit_request(CommitRequest(step, closing=again)).id == step.id
    assert len(coord_store.history(run)) == 3
    # A later commit builds on the closing checkpoint (the run's latest).
    later = coord_store.commit(ckpt(run, event="flow_resumed", state={**state, "n": 2}))
    assert later.seq == 4 and coord_store.latest(run) == later


def test_soft_leases_give_way_to_an_attempt_and_a_senders_to_a_receivers(coord_store):
    run = ids.run_id()
    coord_store.commit(ckpt(run))
    coord_store.commit_request(
        CommitRequest(ckpt(run), dispatching=["a#1"], sender="~send:s1", sender_lease=30)
    )
    # A sender's live lease gives way to a receiving worker's, which keeps off other senders
    # and workers, and gives way to an attempt, which keeps off everyone.
    assert coord_store.claim(run, ["a#1"], "~recv:r1", 30) == [BeginOutcome.OK]
    assert coord_store.claim(run, ["a#1"], "~send:s2", 30) == [BeginOutcome.HELD]
    assert coord_store.claim(run, ["a#1"], "~recv:r2", 30) == [BeginOutcome.HELD]
    assert coord_store.begin_attempt(run, "a#1", "attempt-1", 30).outcome is BeginOutcome.OK
    held = coord_store.begin_attempt(run, "a#1", "attempt-2", 30)
    assert (held.outcome, held.holder) == (BeginOutcome.HELD, "attempt-1")
    assert coord_store.claim(run, ["a#1"], "~recv:r1", 30) == [BeginOutcome.HELD]


def test_claim_takes_leases_by_begins_rule_without_a_run_it_takes_none(coord_store):
    run = ids.run_id()
    assert coord_store.claim(run, ["a#1", "b#1"], "~send:s", 30) == [BeginOutcome.NO_RUN] * 2
    assert coord_store.leases(run) == {}  # nothing is written for a run that does not exist
    coord_store.commit(ckpt(run))
    coord_store.begin_attempt(run, "b#1", "attempt", 30)
    coord_store.begin_attempt(run, "c#1", "attempt-c", 30)
    coord_store.commit(ckpt(run, activation="c#1", attempt="attempt-c"))

    found = coord_store.claim(run, ["a#1", "b#1", "c#1"], "~send:s", 30)

    assert found == [BeginOutcome.OK, BeginOutcome.HELD, BeginOutcome.DONE]
    assert set(coord_store.leases(run)) == {"a#1", "b#1"}
    assert coord_store.begin_attempt(run, "a#1", "other", 30).outcome is BeginOutcome.OK  # gave way


def test_release_all_drops_the_leases_their_tokens_still_hold(coord_store):
    one, two = ids.run_id(), ids.run_id()
    for run in (one, two):
        coord_store.commit(ckpt(run))
        coord_store.claim(run, ["a#1", "b#1"], "~send:s", 30)
    coord_store.begin_attempt(one, "b#1", "attempt", 30)  # taken over: no longer the sender's

    coord_store.release_all(
        [(one, "a#1", "~send:s"), (one, "b#1", "~send:s"), (two, "a#1", "~send:s")]
    )

    assert set(coord_store.leases(one)) == {"b#1"}
    assert set(coord_store.leases(two)) == {"b#1"}
    coord_store.release_all([])
    coord_store.release_all([(two, "b#1", "~send:s")])
    assert coord_store.leases(two) == {}


def test_latest_each_reads_what_latest_reads_of_each_run(open_coord):
    store = open_coord(max_checkpoints=0)
    small, big, empty = ids.run_id(), ids.run_id(), ids.run_id()
    store.commit(ckpt(small, event="flow_started", state={"n": 0}))
    store.commit(ckpt(small, state={"n": 1}))
    store.commit(ckpt(big, state=_big_state(big)))  # its state stored by field
    store.commit(ckpt(big, state={**_big_state(big), "n": 1}))
    wanted = [big, empty, small]
    expected = {run: store.latest(run) for run in wanted}

    # Another process (no field digests remembered) reads the same.
    assert open_coord(max_checkpoints=0).latest_each(wanted) == expected
    assert expected[empty] is None and expected[big].state["n"] == 1
    assert list(store.latest_each(wanted)) == wanted  # in the order asked
    assert store.latest_each([]) == {}


def test_runs_to_check_are_quiet_ones_those_with_a_lapsed_lease_and_those_asked_for(coord_store):
    busy, lapsed, asked, stopped = (ids.run_id() for _ in range(4))
    for run in (busy, lapsed, asked, stopped):
        coord_store.commit(ckpt(run))
    coord_store.begin_attempt(busy, "a#1", "attempt", 30)
    coord_store.begin_attempt(lapsed, "a#1", "attempt", -1)  # its holder died
    coord_store.commit(ckpt(stopped, status=RunStatus.SUCCEEDED))
    now = time.time()

    mine = {busy, lapsed, asked, stopped}
    recent = set(coord_store.runs_to_check(now - 60, now, also={asked, stopped})) & mine
    assert recent == {lapsed, asked}
    assert set(coord_store.runs_to_check(now + 1, now)) & mine == {busy, lapsed, asked}


def test_active_runs_are_the_running_ones(coord_store):
    running, done = ids.run_id(), ids.run_id()
    coord_store.commit(ckpt(running))
    coord_store.commit(ckpt(done))
    coord_store.commit(ckpt(done, status=RunStatus.SUCCEEDED))

    active = set(coord_store.active_runs())
    assert running in active and done not in active
    coord_store.update_run(running, status=RunStatus.CANCELLED)
    assert running not in set(coord_store.active_runs())


def test_stop_notices_reach_subscribers_and_locks_are_exclusive(coord_store):
    run = ids.run_id()
    with coord_store.stop_notices(run) as notices:
        assert notices.next(0.05) is None
        coord_store.notify_stopped(run, RunStatus.SUCCEEDED)
        deadline = time.monotonic() + 5
        seen = None
        while seen is None and time.monotonic() < deadline:
            seen = notices.next(0.5)
    assert seen == "succeeded"

    assert coord_store.try_lock("conformance", 5) is True
    assert coord_store.try_lock("conformance", 5) is False


def _run_keys(coord_store: Any, run: str) -> dict[str, str]:
    """Every key of ``run`` -> its type."""
    client = coord_store.client
    found = client.scan_iter(match=coord_store.keys.run_pattern(run), count=1000)
    return {key.decode(): client.type(key).decode() for key in found}


def test_every_per_run_key_is_bounded_by_the_history_kept_and_removed_with_the_run(coord_store):
    run, keep, steps = ids.run_id(), 5, 300
    k = coord_store.keys
    coord_store.commit_request(CommitRequest(ckpt(run, event="flow_started"), dispatching=["s#0"]))
    for i in range(steps):
        coord_store.begin_attempt(run, f"s#{i}", f"t{i}", 30)
        latest = coord_store.commit_request(
            CommitRequest(
                ckpt(run, activation=f"s#{i}", attempt=f"t{i}", state={"i": i}),
                max_checkpoints=keep,
                dispatching=[f"s#{i + 1}"],
            )
        )
    client = coord_store.client
    sizes = {
        "history": client.zcard(k.history(run)),
        "attempts": client.hlen(k.attempts(run)),
        "acts": client.hlen(k.acts(run)),
        "markers": len(coord_store.markers(run)),
        "leases": len(coord_store.leases(run)),
    }
    assert sizes == {
        "history": keep,
        "attempts": keep,
        "acts": keep,
        "markers": keep + 1,
        "leases": 0,
    }, sizes
    kept = coord_store.history(run)
    assert [c.seq for c in kept] == list(range(steps + 1, steps + 1 - keep, -1))
    assert set(coord_store.markers(run)) == {f"s#{i}" for i in range(steps - keep, steps + 1)}
    # Fencing of the activations still in the history and of the one in flight is intact.
    again = coord_store.commit(ckpt(run, activation=f"s#{steps - 1}", attempt=f"t{steps - 1}"))
    assert again.id == latest.id
    with pytest.raises(StaleAttempt):
        coord_store.commit(ckpt(run, activation=f"s#{steps - keep}", attempt="zombie"))
    assert coord_store.begin_attempt(run, f"s#{steps - 1}", "late", 30).outcome is BeginOutcome.DONE
    assert coord_store.begin_attempt(run, f"s#{steps}", "next", 30).outcome is BeginOutcome.OK
    assert coord_store.mark_dispatched(run, [f"s#{steps}"]) == [False]
    per_run = _run_keys(coord_store, run)
    assert len(per_run) <= 12, per_run
    coord_store.prune(run, 2)
    assert client.hlen(k.attempts(run)) == client.hlen(k.acts(run)) == 2
    assert len(coord_store.markers(run)) == 3

    # A resume into a new epoch, or a run that stops, leaves no markers or leases behind.
    coord_store.commit_request(CommitRequest(ckpt(run, meta={"epoch": 1}), dispatching=["1/s#300"]))
    assert set(coord_store.markers(run)) == {"1/s#300"} and coord_store.leases(run) == {}
    coord_store.begin_attempt(run, "1/s#300", "t-e1", 30)
    coord_store.commit(ckpt(run, meta={"epoch": 1}, status=RunStatus.SUCCEEDED))
    assert coord_store.coordination(run).leases == coord_store.markers(run) == {}

    assert coord_store.delete_run(run) is True
    assert _run_keys(coord_store, run) == {}
    assert run not in {info.run_id for info in coord_store.runs(limit=1000)}
    assert run not in coord_store.active_runs()
    with pytest.raises(CheckpointNotFound):
        coord_store.get(kept[0].id)


# -- state stored by field: a checkpoint costs what its step changed ----------------------------


def _big_state(run: str) -> dict[str, Any]:
    return {"id": run, "doc": "x" * 200_000, "notes": ["a", "b"], "n": 0, "flag": None}


def test_every_kept_checkpoint_reads_back_whole_while_steps_change_single_fields(coord_store):
    run = ids.run_id()
    state = _big_state(run)
    made = [coord_store.commit(ckpt(run, event="flow_started", state=dict(state)))]
    for i in range(1, 8):
        if i == 3:
            state.pop("flag")  # a removed field
        elif i == 5:
            state["extra"] = {"nested": [i, "é"]}  # a new one
        else:
            state["n"] = i
        made.append(coord_store.commit(ckpt(run, state=dict(state))))

    assert coord_store.history(run) == list(reversed(made))
    for checkpoint in made:
        assert coord_store.get(checkpoint.id) == checkpoint
        assert list(coord_store.get(checkpoint.id).state) == list(checkpoint.state)  # order too
    assert coord_store.latest(run) == made[-1]
    assert coord_store.begin_attempt(run, "s#1", "t", 30).latest == made[-1]
    fork = coord_store.fork(made[2].id, new_run_id=ids.run_id())
    assert fork.state == {**made[2].state, "id": fork.run_id}
    assert coord_store.latest(fork.run_id) == fork


def test_pruning_keeps_exactly_the_field_values_kept_checkpoints_refer_to(coord_store):
    run, keep = ids.run_id(), 3
    state = _big_state(run)
    made = [coord_store.commit(ckpt(run, state=dict(state)), max_checkpoints=keep)]
    coord_store.fork(made[0].id, new_run_id=ids.run_id())  # pins the first checkpoint
    for i in range(1, 20):
        state["n"] = i
        made.append(coord_store.commit(ckpt(run, state=dict(state)), max_checkpoints=keep))

    kept = coord_store.history(run)
    assert [c.seq for c in kept] == [20, 19, 18, 1]
    assert kept == [*reversed(made[-keep:]), made[0]]
    # One version of each unchanged field (written by the pinned first checkpoint), the
    # pinned n=0 and the kept n=17, 18, 19.
    assert coord_store.client.hlen(coord_store.keys.values(run)) == len(state) + keep
    coord_store.commit(ckpt(run, state={"id": run}), max_checkpoints=1)
    assert coord_store.latest(run).state == {"id": run}
    assert coord_store.get(made[0].id) == made[0]


def test_commits_through_stores_that_saw_other_versions_of_the_run_stay_exact(open_coord):
    run = ids.run_id()
    first, second = open_coord(max_checkpoints=0), open_coord(max_checkpoints=0)
    one, two, three = ("one" * 10_000, "two" * 10_000, "three" * 10_000)
    a = first.commit(ckpt(run, state={"id": run, "doc": one, "n": 1}))
    b = second.commit(ckpt(run, state={"id": run, "doc": two, "n": 1}))
    # `first` last saw `a`; its change is refused as based on a stale checkpoint and sent whole.
    c = first.commit(ckpt(run, state={"id": run, "doc": one, "n": 2}))
    assert [x.state for x in first.history(run)] == [c.state, b.state, a.state]

    second.delete_run(run)
    d = second.commit(ckpt(run, state={"id": run, "doc": three, "n": 2}))
    e = first.commit(ckpt(run, state={"id": run, "doc": one, "n": 3}))
    assert [x.state for x in second.history(run)] == [e.state, d.state]


def test_a_state_growing_past_the_inline_size_and_shrinking_back_reads_back_exactly(
    coord_store,
):
    run = ids.run_id()
    k, client = coord_store.keys, coord_store.client
    small = coord_store.commit(ckpt(run, state={"id": run, "log": ["start"]}))
    assert client.hlen(k.values(run)) == 0  # a small state stays inside its snapshot
    made = [small]
    for size in (1, 20_000, 20_000, 30_000, 10, 20_000):
        state = {"id": run, "log": ["x" * size], "size": size}
        made.append(coord_store.commit(ckpt(run, state=state), max_checkpoints=5))
    assert coord_store.history(run) == list(reversed(made[-5:]))
    assert coord_store.latest(run) == made[-1]
    # Kept: seq 3-7. The state went by field at 3 (3 fields), then only changed fields were
    # written: log and size at 5, 6 and 7 (a run seen by field goes on by field).
    assert client.hlen(k.values(run)) == 3 + 2 + 2 + 2
    other = RedisProvider(client=client, prefix=k.prefix)  # has not seen the run: whole
    last = other.commit(ckpt(run, state={"id": run, "log": []}), max_checkpoints=5)
    assert coord_store.latest(run) == last
    # Seq 4-8 kept: 4 (the same state as 3) still refers to the three values written at 3.
    assert client.hlen(k.values(run)) == 3 + 2 + 2 + 2


@pytest.mark.processes
@pytest.mark.parametrize("codec", [None, SEALED], ids=["redis", "redis-sealed"])
def test_a_store_whose_redis_lost_its_scripts_loads_them_again(
    tmp_path: Path, codec: Codec | None
) -> None:
    # A private server: SCRIPT FLUSH empties a whole server's script cache, so on the shared
    # Redis it would pull the scripts from under every other test's processes.
    from tests.redis_servers import redis_server

    with redis_server(tmp_path) as server:
        store = RedisProvider(f"redis://127.0.0.1:{server.port}/0", prefix="t", codec=codec)
        try:
            run = ids.run_id()
            store.commit(ckpt(run, event="flow_started", state={"n": 0}))
            store.claim(run, ["a#1"], "~send:s", 30)
            expected = store.latest_each([run])
            store.client.script_flush()  # Redis lost its scripts (a restart)
            store.release_all([(run, "a#1", "~send:s")])  # the pipelines load them again
            assert store.leases(run) == {}
            assert store.latest_each([run]) == expected
            store.client.script_flush()
            assert store.commit(ckpt(run, state={"n": 1})).seq == 2  # and a single script
        finally:
            store.close()
