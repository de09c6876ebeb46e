"""The smallest end-to-end proof: flows run on real subprocess workers."""

from __future__ import annotations

from typing import Any

from examples.fanout import FanoutFlow
from examples.linear import LinearFlow
from runner.store.models import RunStatus


def test_linear_flow_runs_every_method_once_on_workers(rt: Any) -> None:
    handle = LinearFlow.submit()
    assert handle.result(timeout=30) == 19
    assert handle.latest().state["counter"] == 20
    assert handle.status() is RunStatus.SUCCEEDED


def test_fanout_branches_merge_their_writes_on_workers(rt: Any) -> None:
    handle = FanoutFlow.submit({"topic": "x"})
    assert handle.result(timeout=30) == "10 notes"
    state = handle.latest().state
    assert sorted(state["notes"]) == sorted(f"note-{i}" for i in range(10))
    assert all(state[f"b{i}"] == f"done-{i}" for i in range(10))
