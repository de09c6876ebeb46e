"""Every ready step is dispatched and committed exactly once; parallel branches merge."""

from __future__ import annotations

import time
from typing import Any

import redis

from runner.distributed import handoff
from runner.distributed.client import RunHandle
from runner.distributed.engine import Runtime, task_id
from runner.flow import transition as tr
from runner.flow.state import reducers_for
from runner.store.base import CommitRequest
from runner.store.models import RunStatus
from tests._dist_support import events_of, eventually, finished, history
from tests.flows import dist
from tests.flows.dist import DistDiamond, DistEcho, DistFan, DistRace, executions

DIAMOND = ("top", "left", "right", "both", "any", "end")


def test_diamond_and_joins_run_each_step_once(rt: Runtime, redis_client: redis.Redis) -> None:
    handle = DistDiamond.submit()
    assert handle.result(timeout=20) == sorted(DIAMOND)
    run = handle.run_id
    assert {m: executions(redis_client, run, m) for m in DIAMOND} == dict.fromkeys(DIAMOND, 1)
    assert sorted(c.step or "" for c in finished(rt, run)) == sorted(DIAMOND)
    latest = handle.latest()
    assert sorted(latest.completed) == sorted(f"{m}#1" for m in DIAMOND)
    assert latest.in_flight == []


def test_branches_finishing_together_fire_their_join_once(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    handle = DistRace.submit()
    assert handle.wait(timeout=30) is RunStatus.SUCCEEDED
    run = handle.run_id
    assert executions(redis_client, run, "join") == 1
    assert len(finished(rt, run, "join")) == 1
    assert handle.latest().state["joined"] == 1
    # The barrier released both branches at once: both started before either committed.
    assert int(redis_client.get(dist.key(run, "barrier", "race")) or 0) == 2


def test_ten_parallel_branches_keep_every_write(rt: Runtime, redis_client: redis.Redis) -> None:
    handle = DistFan.submit()
    assert handle.result(timeout=30) == 10
    run = handle.run_id
    state = handle.latest().state
    assert sorted(state["items"]) == sorted(f"item-{i}" for i in range(10))
    assert all(state[f"f{i}"] == f"set-{i}" for i in range(10))
    methods = ["root", "gather", *(f"b{i}" for i in range(10))]
    assert {m: executions(redis_client, run, m) for m in methods} == dict.fromkeys(methods, 1)
    assert len(finished(rt, run)) == 12
    # Different fields and a reducer field: nothing to warn about.
    assert not any(c.meta.conflicts for c in history(rt, run))


def test_same_field_without_reducer_last_commit_wins_with_a_warning(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    handle = DistRace.submit()
    assert handle.wait(timeout=30) is RunStatus.SUCCEEDED
    run = handle.run_id
    red, blue = finished(rt, run, "red")[0], finished(rt, run, "blue")[0]
    first, last = sorted([red, blue], key=lambda c: c.seq)
    state = handle.latest().state
    assert state["winner"] == last.step
    assert sorted(state["notes"]) == ["blue", "red"]  # the reducer field merges
    assert last.meta.conflicts == ["winner"]
    assert not first.meta.conflicts


def test_redelivered_committed_step_commits_and_dispatches_nothing(
    rt: Runtime, redis_client: redis.Redis, task_events: list[dict[str, Any]]
) -> None:
    handle = DistDiamond.submit()
    handle.wait(timeout=20)
    run = handle.run_id
    before = [c.id for c in history(rt, run)]
    markers = rt.coord.dispatched(run)
    tid = f"{task_id(run, 0, 'left#1')}:again"
    rt.app.send_task(
        "DistDiamond.left",
        kwargs={"run_id": run, "activation": "left#1", "epoch": 0},
        task_id=tid,
    )
    # Not a second SUCCESS: the redelivery ends as the custom state DUPLICATE.
    eventually(lambda: any(e["type"] == "task-duplicate" for e in events_of(task_events, tid)))
    assert "task-succeeded" not in {e["type"] for e in events_of(task_events, tid)}
    assert [c.id for c in history(rt, run)] == before
    assert rt.coord.dispatched(run) == markers
    assert executions(redis_client, run, "left") == 1
    assert executions(redis_client, run, "both") == 1


def test_redelivery_while_the_run_goes_on_sends_nothing_twice(
    rt: Runtime, redis_client: redis.Redis, task_events: list[dict[str, Any]]
) -> None:
    handle = DistEcho.submit({"count": 3})
    handle.wait(timeout=20)
    run = handle.run_id
    # Two more copies of the first step's message, as a broker might redeliver them.
    for i in range(2):
        rt.app.send_task(
            "DistEcho.hello",
            kwargs={"run_id": run, "activation": "hello#1", "epoch": 0},
            task_id=f"{run}:dup-{i}",
        )
    for i in range(2):
        tid = f"{run}:dup-{i}"
        eventually(
            lambda tid=tid: "task-duplicate" in {e["type"] for e in events_of(task_events, tid)}
        )
    assert executions(redis_client, run, "hello") == 1
    assert executions(redis_client, run, "shout") == 1
    assert len(finished(rt, run)) == 2


def test_start_never_sent_is_dispatched_by_recovery(rt: Runtime, redis_client: redis.Redis) -> None:
    # The producer died after writing the first checkpoint and before sending anything.
    flow = DistEcho()
    run = flow.flow_id
    first = tr.start(
        DistEcho.graph(), run, flow._dump(), flow=DistEcho.flow_path(), name="DistEcho"
    )
    rt.store.commit(first.checkpoint)
    assert rt.coord.dispatched(run) == {}
    handle = RunHandle(run, rt)
    assert handle.result(timeout=20) == 0
    assert executions(redis_client, run, "hello") == 1


def test_commit_whose_committer_died_before_sending_is_completed_by_recovery(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    # Commit `hello` the way a worker does (marking `shout` dispatched in the same round
    # trip), then "die" without sending `shout`.
    flow = DistEcho()
    run, graph = flow.flow_id, DistEcho.graph()
    start = tr.start(graph, run, flow._dump(), flow=DistEcho.flow_path(), name="DistEcho")
    started = rt.store.commit(start.checkpoint)
    rt.coord.mark_dispatched(run, ["hello#1"], now=time.time() + 3600)  # "running elsewhere"
    act = start.ready[0]
    done = tr.step_done(
        graph,
        started,
        act,
        base_state=started.state,
        new_state={**started.state, "count": 5},
        output=5,
        label=None,
        reducers=reducers_for(DistEcho.state_type()),
        attempt="dead-attempt",
    )
    handoff.hold(rt.coord, run, ["shout#1"])  # a committer holds it as sender, then dies
    rt.store.commit_request(
        CommitRequest(done.checkpoint, expected_seq=started.seq, dispatching=["shout#1"])
    )
    handle = RunHandle(run, rt)
    assert handle.result(timeout=20) == 10
    assert executions(redis_client, run, "hello") == 0
    assert executions(redis_client, run, "shout") == 1
    assert len(finished(rt, run, "shout")) == 1


def test_parallel_commits_leave_no_lease_behind(rt: Runtime) -> None:
    handle = DistFan.submit()
    handle.wait(timeout=30)
    assert rt.coord.leases(handle.run_id) == {}
    eventually(lambda: handle.run_id not in rt.coord.active_runs())
