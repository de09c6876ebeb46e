"""Idempotent submission: ``submit(id=...)`` on real workers, from threads, processes, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
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


PRODUCER = """
import sys, time
from runner.distributed.client import submit
from tests.flows.timing import GreetFlow
run_id, at = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, at - time.time()))
print(submit(GreetFlow, {"customer": "bob"}, id=run_id).run_id)
"""


@pytest.mark.slow
def test_twenty_processes_submitting_one_id_make_one_run(
    rt: Any, worker_env: dict[str, str], redis_client: redis.Redis
) -> None:
    run_id = new_id()
    at = time.time() + 8  # every process imported runner and waits for the same instant
    env = {**os.environ, **worker_env}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, run_id, str(at)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(20)
    ]
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 20, [err for _, err in outs]
    assert {out.decode().strip() for out, _ in outs} == {run_id}
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
