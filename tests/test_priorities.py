"""``priority=`` on ``submit`` (and ``runner submit --priority``) and on a method: one busy
worker takes the queued steps of higher priority first, on Redis and on RabbitMQ; a resumed
run keeps its priority, and so do a retried and a deferred step; a RabbitMQ queue declared
without priorities and a priority outside 0-9 are refused in one line.

Each test has one worker of concurrency 1 on a queue of its own: a blocker keeps it busy
while runs of several priorities are queued, then the order in which their steps started is
read back (each step notes its start).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection
from typer.testing import CliRunner

from runner.cli import app as cli
from runner.distributed import broker
from runner.distributed.client import RunHandle, submit
from runner.distributed.control import resume
from runner.distributed.engine import Runtime
from runner.errors import DefinitionError, InvalidInputs
from runner.store.models import RunStatus
from tests._dist_support import eventually, private_pool
from tests.conftest import WorkerPool
from tests.flows.flow_control import notes
from tests.flows.priorities import PacedFlow, RankedFlow, RetriedFlow, UrgentFlow
from tests.test_rabbitmq import BROKER, DOWN

# Part of the broker conformance suite (make test-latest): kombu's Redis priority lists and
# RabbitMQ's x-max-priority (and its 406 refusal), Celery's retry keeping a message's priority.
pytestmark = [pytest.mark.slow, pytest.mark.broker]


@contextlib.contextmanager
def one_busy_worker(
    worker_env: dict[str, str], logdir: Path, **overrides: str
) -> Iterator[tuple[WorkerPool, Runtime, dict[str, str]]]:
    """A pool with one worker of concurrency 1 on its own queue."""
    with private_pool(worker_env, str(logdir), **overrides) as (pool, rt, env):
        pool.start(concurrency=1)
        yield pool, rt, env


def queued_in_order(rt: Runtime, env: dict[str, str]) -> None:
    """Keep the worker busy, queue runs of several priorities (and resume one of priority
    9), and check the order they start in: by priority, in submission order within one."""
    group = uuid.uuid4().hex[:8]
    # A run of priority 9 fails at its step; its resume must keep the 9.
    failed = submit(RankedFlow, {"group": group, "fail": True}, priority=9, rt=rt)
    assert failed.wait(timeout=30) is RunStatus.FAILED

    blocker = submit(RankedFlow, {"group": group, "seconds": 2.0}, rt=rt)
    eventually(lambda: notes(group, "starts"), timeout=20)
    low = [submit(RankedFlow, {"group": group}, priority=0, rt=rt) for _ in range(2)]
    normal = submit(RankedFlow, {"group": group}, rt=rt)  # the default, 5
    urgent = submit(UrgentFlow, {"group": group}, rt=rt)  # its method's 8
    # From the command line, as `runner submit --priority 9` does.
    shown = CliRunner().invoke(
        cli, ["submit", RankedFlow.flow_path(), "-i", f"group={group}", "--priority", "9"], env=env
    )
    assert shown.exit_code == 0, shown.output
    high = [RunHandle(shown.output.strip().split()[-1], rt)]
    high.append(submit(RankedFlow, {"group": group}, priority=9, rt=rt))
    resumed = resume(failed.run_id, inputs={"fail": False}, rt=rt)
    assert rt.coord.read(failed.run_id).meta.scheduling.priority == 9  # kept through the resume
    assert len(notes(group, "starts")) == 1, "the blocker must still be running"

    names = {blocker.run_id: "blocker", normal.run_id: "normal", urgent.run_id: "urgent"}
    names.update({r.run_id: f"low{i}" for i, r in enumerate(low)})
    names.update({r.run_id: f"high{i}" for i, r in enumerate(high)})
    names[resumed.run_id] = "resumed"
    for run_id in names:
        assert RunHandle(run_id, rt).wait(timeout=60) is RunStatus.SUCCEEDED, names[run_id]
    started = [names[str(n["run"])] for n in notes(group, "starts")]
    # 9s in submission order (the resumed run last), the method's 8, the default 5, the 0s.
    assert started == ["blocker", "high0", "high1", "resumed", "urgent", "normal", "low0", "low1"]


def test_a_busy_worker_on_redis_takes_higher_priorities_first(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with one_busy_worker(worker_env, tmp_path) as (_pool, rt, env):
        queued_in_order(rt, env)


@pytest.mark.skipif(DOWN is not None, reason=DOWN or "")
def test_a_busy_worker_on_rabbitmq_takes_higher_priorities_first(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with one_busy_worker(worker_env, tmp_path, RUNNER_BROKER_URL=BROKER) as (pool, rt, env):
        try:
            queued_in_order(rt, env)
        finally:
            pool.discard()
            with Connection(BROKER) as conn:
                conn.default_channel.queue_delete(rt.settings.queue)


def test_a_retried_and_a_deferred_step_keep_their_runs_priority(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with one_busy_worker(worker_env, tmp_path) as (_pool, rt, _env):
        group = uuid.uuid4().hex[:8]
        # Not 9: on Redis a message without a priority reads as kombu's 0, the runner's 9.
        retried = submit(RetriedFlow, {"group": group}, priority=2, rt=rt)
        paced = [submit(PacedFlow, {"group": group}, priority=2, rt=rt) for _ in range(2)]
        for run in (retried, *paced):
            assert run.wait(timeout=30) is RunStatus.SUCCEEDED
        attempts = notes(group, "attempts")
        assert len(attempts) == 2  # the first attempt and its retry
        starts = notes(group, "paced")
        # The second start waited for the rate (deferred: a retry of its message).
        assert len(starts) == 2 and float(starts[1]["at"]) - float(starts[0]["at"]) > 0.5
        for noted in (*attempts, *starts):
            assert broker.wire_priority(rt.app, int(noted["priority"])) == 2, noted


@pytest.mark.skipif(DOWN is not None, reason=DOWN or "")
def test_a_rabbitmq_queue_declared_without_priorities_is_refused_in_one_line(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """A queue an earlier version declared without x-max-priority: the worker refuses to
    start and a submit is refused, each with one line naming the queue and the fix."""
    with private_pool(worker_env, str(tmp_path), RUNNER_BROKER_URL=BROKER) as (_, rt, env):
        queue = rt.settings.queue
        with Connection(BROKER) as conn:
            conn.default_channel.queue_declare(queue, durable=True, auto_delete=False)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "celery", "-A", "runner.worker", "worker", "-l", "warning"],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode != 0
            (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
            assert f"the RabbitMQ queue '{queue}' exists without the runner's priorities" in error
            assert f"rabbitmqctl delete_queue {queue}" in error

            with pytest.raises(broker.QueueWithoutPriorities, match=f"delete_queue {queue}"):
                submit(RankedFlow, {"group": "x"}, rt=rt)
            shown = CliRunner().invoke(cli, ["submit", RankedFlow.flow_path()], env=env)
            assert shown.exit_code != 0
            assert shown.output.count("error:") == 1 and queue in shown.output, shown.output
        finally:
            with Connection(BROKER) as conn:
                conn.default_channel.queue_delete(queue)


def test_a_priority_outside_0_to_9_is_refused(worker_env: dict[str, str], tmp_path: Path) -> None:
    for bad in (-1, 10, 2.5, True, "9"):
        with pytest.raises(DefinitionError, match=r"must be an int from 0 \(the lowest\) to 9"):
            routing_flow_with(bad)
    with private_pool(worker_env, str(tmp_path)) as (_, rt, env):
        with pytest.raises(InvalidInputs, match="priority=10: must be an int from 0"):
            submit(RankedFlow, {}, priority=10, rt=rt)
        shown = CliRunner().invoke(
            cli, ["submit", RankedFlow.flow_path(), "--priority", "10"], env=env
        )
        assert shown.exit_code == 2 and "--priority" in shown.output, shown.output
        assert not list(rt.store.client.scan_iter(f"{rt.settings.prefix}:*"))  # nothing stored


def routing_flow_with(priority: object) -> None:
    """Define a flow whose start has ``priority``."""
    from runner import Flow, start

    class Bad(Flow):
        @start(priority=priority)  # type: ignore[arg-type]
        def go(self) -> None:
            """Never runs."""
