"""A run whose data cannot be read is quarantined (status ``corrupt``, one ERROR naming it,
listed by ``runner runs --status corrupt``) and never stops the recovery of other runs.

Broken runs are made the way they break in the field: a snapshot overwritten with bytes
that are not a checkpoint, a snapshot that is gone, a checkpoint that names no flow.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import redis

from runner.console.data import list_runs
from runner.distributed.client import RunHandle
from runner.distributed.engine import Runtime, first_checkpoint, task_id, task_name
from runner.store.models import Checkpoint, RunStatus
from tests import cli_support
from tests._dist_support import eventually, private_pool, recovery_passes
from tests.flows.reliability import Nap

pytestmark = pytest.mark.slow


def _committed(rt: Runtime, seconds: float = 0.1) -> Checkpoint:
    """A new Nap run's first checkpoint, committed and never sent (as if its producer died)."""
    first = first_checkpoint(Nap, {"seconds": seconds}).checkpoint
    return rt.store.commit(first, expected_seq=0)


def _garbled(rt: Runtime, r: redis.Redis) -> str:
    ckpt = _committed(rt)
    r.hset(rt.store.keys.snapshots(ckpt.run_id), ckpt.id, b"\x00 not a checkpoint")
    return ckpt.run_id


def _missing(rt: Runtime, r: redis.Redis) -> str:
    ckpt = _committed(rt)
    r.hdel(rt.store.keys.snapshots(ckpt.run_id), ckpt.id)
    return ckpt.run_id


def _nameless(rt: Runtime) -> str:
    first = first_checkpoint(Nap, {"seconds": 0.1}).checkpoint
    first.flow = None
    first.meta = first.meta.updated(name=None)
    return rt.store.commit(first, expected_seq=0).run_id


def _status(rt: Runtime, run_id: str) -> RunStatus | None:
    info = rt.store.run(run_id)
    return None if info is None else info.status


def _quarantine_lines(logdir: Path, run_id: str) -> list[str]:
    lines = []
    for log in sorted(logdir.glob("*.log")):
        lines += [
            line for line in log.read_text().splitlines() if f"run {run_id} quarantined" in line
        ]
    return lines


def _cli_runs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_support.run("runs", *args, env=env)


def test_unreadable_runs_are_quarantined_and_recovery_goes_on(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        broken = {
            "garbled": _garbled(rt, redis_client),
            "missing": _missing(rt, redis_client),
            "nameless": _nameless(rt),
        }
        healthy = _committed(rt).run_id  # its start was never sent: only recovery sends it
        pool.start()
        assert RunHandle(healthy, rt).wait(timeout=30) is RunStatus.SUCCEEDED
        for why, run_id in broken.items():
            eventually(lambda r=run_id: _status(rt, r) is RunStatus.CORRUPT, timeout=10)  # type: ignore[misc]
            info = rt.store.run(run_id)
            assert info is not None and info.error, why
            assert info.error.startswith("CorruptCheckpoint: "), (why, info.error)
            assert run_id not in rt.coord.active_runs(), why
        recovery_passes(rt, 4)  # more passes: still logged once
        for why, run_id in broken.items():
            assert len(_quarantine_lines(tmp_path, run_id)) == 1, why

        # Listing: every run still lists; the quarantined ones by their status.
        listed = {info.run_id for info in rt.store.runs(limit=100)}
        assert set(broken.values()) | {healthy} <= listed
        result = _cli_runs(env, "--status", "corrupt", "--json")
        assert result.returncode == 0, result.stderr
        assert {row["run_id"] for row in json.loads(result.stdout)} == set(broken.values())
        rows = list_runs(rt.store, status=RunStatus.CORRUPT)  # the console's list
        assert {row["run_id"] for row in rows} == set(broken.values())


def test_a_step_of_a_corrupt_run_quarantines_it_instead_of_failing_for_ever(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    # No recovery pass: the step message alone meets the broken run.
    overrides = {"RUNNER_RECOVERY_INTERVAL": "3600"}
    with private_pool(worker_env, str(tmp_path), **overrides) as (pool, rt, _):
        pool.start()
        run_id = _garbled(rt, redis_client)
        tid = task_id(run_id, 0, "nap#1")
        rt.app.send_task(
            task_name("Nap", "nap"),
            kwargs={"run_id": run_id, "activation": "nap#1", "epoch": 0},
            task_id=tid,
        )
        eventually(lambda: _status(rt, run_id) is RunStatus.CORRUPT, timeout=20)
        assert run_id not in rt.coord.active_runs()
        eventually(lambda: len(_quarantine_lines(tmp_path, run_id)) == 1, timeout=5)
        text = "".join(log.read_text() for log in tmp_path.glob("*.log"))
        assert "Traceback" not in text
        assert uuid.UUID(run_id)  # the log line names the run by its id
