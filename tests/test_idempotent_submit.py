"""Idempotent submission: ``submit(id=...)`` on real workers, from threads, processes, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

import runner
from runner.errors import InvalidInputs, RunExists
from tests.flows.dist import executions
from tests.flows.timing import GreetFlow, SlowFlow
from tests.test_cli import Cli, cli  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
GREET = "tests.flows.timing:GreetFlow"


def new_id() -> str:
    return f"order-{uuid.uuid4().hex[:8]}"


def creations(rt: Any, run_id: str) -> int:
    """How many checkpoints of the run started it (a second creation would add one)."""
    return sum(1 for c in rt.store.history(run_id, limit=1000) if c.event == "flow_started")


def test_twenty_threads_submitting_one_id_make_one_run(rt: Any, redis_client: redis.Redis) -> None:
    run_id = new_id()
    gate = threading.Barrier(20)
    handles: list[Any] = []
    errors: list[BaseException] = []

    def producer() -> None:
        gate.wait()
        try:
            handles.append(GreetFlow.submit({"customer": "ada"}, id=run_id))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=producer) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert {h.run_id for h in handles} == {run_id} and len(handles) == 20
    assert handles[0].result(timeout=30) == len("hello ada")
    assert creations(rt, run_id) == 1
    assert executions(redis_client, run_id, "greet") == 1
    assert executions(redis_client, run_id, "measure") == 1


PRODUCERS = """
import json, multiprocessing, sys
from runner.distributed.client import submit
from tests.flows.timing import GreetFlow
run_id, n = sys.argv[1], int(sys.argv[2])
fork = multiprocessing.get_context("fork")
gate, results = fork.Barrier(n), fork.Queue()

def producer():
    gate.wait(timeout=60)  # every process is up: they submit at the same instant
    try:
        results.put(submit(GreetFlow, {"customer": "bob"}, id=run_id).run_id)
    except BaseException as exc:
        results.put(f"{type(exc).__name__}: {exc}")

procs = [fork.Process(target=producer) for _ in range(n)]
for proc in procs:
    proc.start()
ids = [results.get(timeout=60) for _ in procs]
for proc in procs:
    proc.join(timeout=60)
codes = [proc.exitcode for proc in procs]
print(json.dumps({"ids": ids, "pids": len({proc.pid for proc in procs}), "codes": codes}))
"""


@pytest.mark.slow
def test_twenty_processes_submitting_one_id_make_one_run(
    rt: Any, worker_env: dict[str, str], redis_client: redis.Redis
) -> None:
    # Twenty processes forked from one interpreter that imported runner (and made no client
    # yet): each opens its own connections and they race as twenty fresh interpreters would,
    # for one import's CPU instead of twenty.
    run_id = new_id()
    done = subprocess.run(
        [sys.executable, "-c", PRODUCERS, run_id, "20"],
        cwd=ROOT,
        env={**os.environ, **worker_env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["pids"] == 20 and out["codes"] == [0] * 20, out
    assert out["ids"] == [run_id] * 20, out
    handle = runner.RunHandle(run_id, rt)
    assert handle.result(timeout=30) == len("hello bob")
    assert creations(rt, run_id) == 1
    assert executions(redis_client, run_id, "greet") == 1


def test_a_retried_submit_returns_the_finished_run_without_running_it_again(
    rt: Any, redis_client: redis.Redis
) -> None:
    run_id = new_id()
    first = GreetFlow.submit({"customer": "cy"}, id=run_id)
    assert first.result(timeout=30) == len("hello cy")
    again = runner.submit(GreetFlow, {"customer": "cy"}, id=run_id)
    assert again.run_id == run_id and again.result(timeout=5) == len("hello cy")
    assert executions(redis_client, run_id, "greet") == 1
    assert creations(rt, run_id) == 1


def test_the_same_id_with_other_inputs_or_another_flow_is_refused_and_changes_nothing(
    rt: Any,
) -> None:
    run_id = new_id()
    GreetFlow.submit({"customer": "di"}, id=run_id).result(timeout=30)
    before = [c.id for c in rt.store.history(run_id, limit=100)]
    with pytest.raises(RunExists, match="not submitted with this flow, these inputs"):
        GreetFlow.submit({"customer": "eve"}, id=run_id)
    with pytest.raises(RunExists, match="not submitted with this flow, these inputs"):
        SlowFlow.submit({"customer": "di"}, id=run_id)
    with pytest.raises(RunExists, match="and this priority"):
        GreetFlow.submit({"customer": "di"}, id=run_id, priority=9)
    with pytest.raises(RunExists, match="if_exists=reject"):
        GreetFlow.submit({"customer": "di"}, id=run_id, if_exists="reject")
    assert [c.id for c in rt.store.history(run_id, limit=100)] == before


def test_bad_identity_options_are_refused_before_anything_is_stored(rt: Any) -> None:
    run_id = new_id()
    with pytest.raises(InvalidInputs, match="if_exists must be one of return, reject"):
        GreetFlow.submit({"customer": "fay"}, id=run_id, if_exists="replace")
    with pytest.raises(InvalidInputs, match="differ"):
        GreetFlow.submit({"customer": "fay", "id": "other"}, id=run_id)
    assert rt.store.run(run_id) is None


def test_cli_submit_with_an_id_prints_the_same_run_and_refuses_other_inputs(
    cli: Cli,  # noqa: F811
) -> None:
    run_id = new_id()
    first = cli.ok("submit", GREET, "--id", run_id, "--input", "customer=gus", "--wait")
    again = cli.ok("submit", GREET, "--id", run_id, "--input", "customer=gus", "--json")
    assert run_id in first.stdout and json.loads(again.stdout)["run_id"] == run_id
    other = cli("submit", GREET, "--id", run_id, "--input", "customer=hal")
    assert other.exit_code == 1
    assert other.stderr.startswith("error: ") and len(other.stderr.splitlines()) == 1
    assert f"run {run_id} already exists" in other.stderr
    rejected = cli("submit", GREET, "--id", run_id, "--input", "customer=gus", "--if-exists", "x")
    assert rejected.exit_code == 2 and "if_exists must be one of" in rejected.stderr
