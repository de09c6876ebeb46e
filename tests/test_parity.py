"""Parity: the same flows through both executors give the same checkpoints, state, status
and events.

Each flow runs in this process (``kickoff``, every checkpoint to Redis) and on real
subprocess workers (``submit``); both settle every step through
:mod:`runner.flow.lifecycle`. The checkpoints are compared as a whole (parallel branches
commit in either order): the same events, the same first (``flow_started``) and the same
final checkpoint's event and status (the run's closing ``flow_finished``/``flow_failed``
where the run ended with the step that ended it), state and steps. A child run's link
(``child_run_started``) is the workers' alone.

The events told to the flow's listeners are compared too (the parity flows record them in
Redis, from whichever process tells them): the same events, each step's in the same order,
and the run's own (``flow_*``) in the same order. Across worker processes only causally
ordered events have an order, so one step's end and the next step's start are not compared:
nor, for a method that runs again (a loop), one run's end and its next run's start (a worker
tells a step's end after the commit that already sent the next step); each end of it must
still follow a start of it.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from runner import CheckpointConfig
from runner.distributed import control
from runner.distributed.client import submit
from runner.errors import CycleLimitExceeded
from runner.flow import orchestrator as orch
from runner.flow.local import Paused
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider
from tests._dist_support import eventually, history
from tests.flows import crews, parity
from tests.flows._recording import recorded

Told = list[tuple[str, str | None]]
RUN_EVENTS = frozenset({"flow_started", "flow_paused", "flow_finished", "flow_failed"})
ENDS = frozenset({"method_execution_finished", "method_execution_failed"})


def _events(
    ckpts: list[Checkpoint], closers: frozenset[str] = frozenset()
) -> list[tuple[str, str | None]]:
    """(event, step) of each checkpoint; the run's closing checkpoint names whichever of
    ``closers`` (parallel failures) committed first, so any of them reads alike."""

    def step(c: Checkpoint) -> str | None:
        closing = c.event in ("flow_failed", "flow_finished") and c.step in closers
        return " | ".join(sorted(closers)) if closing else c.step

    return [(c.event, step(c)) for c in ckpts if c.event != "child_run_started"]


def _every_checkpoint(store: RedisProvider) -> CheckpointConfig:
    return CheckpointConfig(provider=store, on_events=["*"])


def _in_process(flow_cls: Any, store: RedisProvider, inputs: dict[str, Any]) -> tuple[Any, str]:
    flow = flow_cls(checkpoint=_every_checkpoint(store))
    try:
        out = flow.kickoff(inputs=inputs)
    except Exception as exc:  # the run failed: the flow raises its step's error
        out = exc
    return out, flow.state.id


def _on_workers(rt: Any, flow_cls: Any, inputs: dict[str, Any]) -> str:
    handle = submit(flow_cls, inputs, rt=rt)
    handle.wait(timeout=30)
    return handle.run_id


def _same(
    local: RedisProvider,
    rt: Any,
    local_id: str,
    worker_id: str,
    any_order: frozenset[str] = frozenset(),
    closers: frozenset[str] = frozenset(),
) -> list[Checkpoint]:
    """Compare the two runs; ``any_order``: list fields parallel branches append to, whose
    order is the order the branches committed (on workers, either); ``closers``: parallel
    steps any of which may be the one whose failure closes the run."""
    here = list(reversed(local.history(local_id, limit=1000)))
    # A parallel step may commit after the commit that stopped the run (and woke the waiter).
    there: list[Checkpoint] = eventually(
        lambda: (found := history(rt, worker_id)) and len(found) >= len(here) and found
    )
    assert Counter(_events(here, closers)) == Counter(_events(there, closers))
    assert _events(here)[0] == _events(there)[0] == ("flow_started", None)
    last_here, last_there = here[-1], there[-1]
    assert (last_here.event, last_here.status) == (last_there.event, last_there.status)
    drop = {"id", "tag"}

    def settled(state: dict[str, Any]) -> dict[str, Any]:
        return {k: sorted(v) if k in any_order else v for k, v in state.items() if k not in drop}

    assert settled(last_here.state) == settled(last_there.state)
    assert sorted(last_here.completed) == sorted(last_there.completed)
    assert last_here.in_flight == last_there.in_flight
    return there


def _told_alike(local_id: str, worker_id: str) -> Told:
    """Compare the events told for the two runs (see the module docstring); the workers'."""
    here = recorded(local_id)

    def all_told() -> Told | None:
        # A worker tells a step's events after its commit: wait until it has told them all.
        told = recorded(worker_id)
        return told if len(told) >= len(here) else None

    there: Told = eventually(all_told)
    assert Counter(there) == Counter(here)
    assert [e for e in there if e[0] in RUN_EVENTS] == [e for e in here if e[0] in RUN_EVENTS]
    for method in {m for _, m in here if m is not None}:
        mine = [e for e in here if e[1] == method]
        theirs = [e for e in there if e[1] == method]
        if sum(kind in ENDS for kind, _ in mine) > 1:  # run again: see the module docstring
            assert _ends_follow_starts(theirs), theirs
        else:
            assert theirs == mine
    return there


def _ends_follow_starts(told: Told) -> bool:
    """Whether, at every point of ``told`` (one method's events), it has ended no more times
    than it has started."""
    started = ended = 0
    for kind, _ in told:
        started += kind == "method_execution_started"
        ended += kind in ENDS
        if ended > started:
            return False
    return True


@pytest.fixture
def local(redis_url: str, prefix: str) -> Any:
    store = RedisProvider(redis_url, prefix=prefix)
    yield store
    store.close()


def _tags() -> tuple[dict[str, str], dict[str, str]]:
    return {"tag": uuid.uuid4().hex}, {"tag": uuid.uuid4().hex}


@pytest.mark.parametrize(
    ("flow_cls", "any_order"),
    [
        (parity.LinearParity, frozenset()),
        (parity.JoinParity, frozenset({"trail"})),  # left and right both append to it
        (parity.OrParity, frozenset()),
        (parity.LoopParity, frozenset()),
    ],
    ids=["linear", "fan-out-and-join", "or-waves", "router-loop"],
)
def test_successful_flows_settle_the_same_in_process_and_on_workers(
    rt: Any, local: RedisProvider, flow_cls: Any, any_order: frozenset[str]
) -> None:
    mine, theirs = _tags()
    out, local_id = _in_process(flow_cls, local, mine)
    worker_id = _on_workers(rt, flow_cls, theirs)
    there = _same(local, rt, local_id, worker_id, any_order)
    assert (there[-1].event, there[-1].status) == ("flow_finished", RunStatus.SUCCEEDED)
    assert out == orch.last_output(there[-1].record)
    told = _told_alike(local_id, worker_id)
    # Each worker process tells the events of the steps it runs: a start running in another
    # process (or-waves has two) may tell its own before the opener tells flow_started, so
    # the run's events are ordered among themselves, not against every step's.
    runs = [e for e in told if e[0] in RUN_EVENTS]
    assert (runs[0], runs[-1]) == (("flow_started", None), ("flow_finished", None))
    assert told[-1] == ("flow_finished", None)


def test_the_run_s_closing_event_is_told_after_a_step_whose_process_tells_late(
    rt: Any, local: RedisProvider
) -> None:
    """On workers a step tells its events after its commit, and whichever of ``left`` and
    ``right`` commits second sends ``join``, which ends the run, to the other process before
    ``left``'s end is told: ``join``'s end and ``flow_finished`` are still the last events,
    as in process."""
    mine, theirs = _tags()
    out, local_id = _in_process(parity.LateTellerJoin, local, mine)
    worker_id = _on_workers(rt, parity.LateTellerJoin, theirs)
    there = _same(local, rt, local_id, worker_id, frozenset({"trail"}))
    assert out == orch.last_output(there[-1].record) == "joined"
    told = _told_alike(local_id, worker_id)
    assert told[-2:] == [("method_execution_finished", "join"), ("flow_finished", None)]


def test_a_loop_past_max_calls_fails_the_run_with_cycle_limit_exceeded_in_both(
    rt: Any, local: RedisProvider
) -> None:
    mine, theirs = _tags()
    out, local_id = _in_process(parity.RunawayParity, local, mine)
    assert isinstance(out, CycleLimitExceeded)
    worker_id = _on_workers(rt, parity.RunawayParity, theirs)
    there = _same(local, rt, local_id, worker_id)
    failed = there[-1]
    assert (failed.event, failed.step, failed.status) == ("flow_failed", "check", RunStatus.FAILED)
    assert failed.error is not None and failed.error.type == "CycleLimitExceeded"
    assert there[-2].event == "method_execution_failed" and there[-2].error == failed.error
    told = _told_alike(local_id, worker_id)
    assert told[-2:] == [("method_execution_failed", "check"), ("flow_failed", None)]


def test_retry_then_success_and_retries_exhausted_settle_the_same(
    rt: Any, local: RedisProvider
) -> None:
    mine, theirs = _tags()
    _out, local_id = _in_process(parity.RetryParity, local, mine)
    worker_id = _on_workers(rt, parity.RetryParity, theirs)
    there = _same(local, rt, local_id, worker_id)
    assert (there[-1].event, there[-1].status) == ("flow_finished", RunStatus.SUCCEEDED)
    assert [(c.step, c.attempts) for c in there if c.step == "flaky"] == [("flaky", 2)]
    told = _told_alike(local_id, worker_id)
    assert [e for e in told if e[1] == "flaky"] == [
        ("method_execution_started", "flaky"),
        ("method_execution_started", "flaky"),
        ("method_execution_finished", "flaky"),
    ]

    mine, theirs = _tags()
    out, local_id = _in_process(parity.ExhaustedParity, local, mine)
    assert isinstance(out, ValueError)
    worker_id = _on_workers(rt, parity.ExhaustedParity, theirs)
    there = _same(local, rt, local_id, worker_id)
    assert (there[-1].event, there[-1].step, there[-1].status) == (
        "flow_failed",
        "broken",
        RunStatus.FAILED,
    )
    assert there[-1].error is not None and there[-1].error.attempts == 2
    assert there[-1].error.type == "ValueError"
    told = _told_alike(local_id, worker_id)
    assert told[-3:] == [
        ("method_execution_started", "broken"),
        ("method_execution_failed", "broken"),
        ("flow_failed", None),
    ]


def test_pause_and_resume_settle_the_same(rt: Any, local: RedisProvider) -> None:
    mine, theirs = _tags()
    flow = parity.PauseParity(checkpoint=_every_checkpoint(local))
    assert isinstance(flow.kickoff(inputs=mine), Paused)
    latest = local.latest(flow.state.id)
    assert latest is not None and latest.status is RunStatus.PAUSED
    again = parity.PauseParity(checkpoint=_every_checkpoint(local))
    again.kickoff(inputs={"approved": "ann"}, from_checkpoint=latest.id)

    handle = submit(parity.PauseParity, theirs, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.PAUSED
    eventually(lambda: ("flow_paused", "review") in recorded(handle.run_id))
    control.resume(handle.run_id, inputs={"approved": "ann"}, rt=rt).wait(timeout=30)
    paused = [c for c in history(rt, handle.run_id) if c.status is RunStatus.PAUSED]
    assert [(c.event, c.step) for c in paused] == [("flow_paused", "review")]
    there = _same(local, rt, flow.state.id, handle.run_id)
    assert there[-1].outputs["publish"] == "published: draft approved by ann"
    assert there[-1].event == "flow_finished"
    told = _told_alike(flow.state.id, handle.run_id)
    assert [e[0] for e in told if e[0] in RUN_EVENTS] == [
        "flow_started",
        "flow_paused",
        "flow_started",  # the resume
        "flow_finished",
    ]


def test_two_parallel_failures_fail_the_run_once_in_both(rt: Any, local: RedisProvider) -> None:
    mine, theirs = _tags()
    out, local_id = _in_process(parity.TwoFailParity, local, mine)
    assert isinstance(out, ValueError | KeyError)
    worker_id = _on_workers(rt, parity.TwoFailParity, theirs)
    there = _same(local, rt, local_id, worker_id, closers=frozenset({"left", "right"}))
    assert there[-1].status is RunStatus.FAILED
    assert there[-1].step in ("left", "right")
    assert sorted(c.step for c in there if c.event == "method_execution_failed") == [
        "left",
        "right",
    ]
    assert [c.event for c in there].count("flow_failed") == 1
    told = _told_alike(local_id, worker_id)
    assert [e[0] for e in told].count("flow_failed") == 1
    assert [e[0] for e in told].count("method_execution_failed") == 2


def test_a_crew_child_run_settles_the_same(rt: Any, local: RedisProvider) -> None:
    mine = {"topic": "bees", "tag": uuid.uuid4().hex}
    theirs = {"topic": "bees", "tag": uuid.uuid4().hex}
    _out, local_id = _in_process(crews.HostFlow, local, mine)
    worker_id = _on_workers(rt, crews.HostFlow, theirs)
    there = _same(local, rt, local_id, worker_id)
    assert (there[-1].event, there[-1].status) == ("flow_finished", RunStatus.SUCCEEDED)
    assert there[-1].state["summary"] == "a3(a2(a1(bees)))"
