"""Rate and concurrency limits across the deployment, on two real worker processes: a
limited step is deferred without holding a pool slot, and a killed worker's slot comes back
with its lease."""

from __future__ import annotations

import time
import uuid

import pytest

from runner.distributed.client import RunHandle, submit
from runner.store.models import METHOD_FINISHED, RunStatus
from tests._dist_support import eventually, history, private_pool
from tests.flows.flow_control import NarrowFlow, QuickFlow, RatedFlow, notes

pytestmark = pytest.mark.slow


def _latency(rt: object, runs: int) -> float:
    """Mean seconds from submit to success of ``runs`` unlimited runs, one after another."""
    took = []
    for _ in range(runs):
        began = time.monotonic()
        run = submit(QuickFlow, {}, rt=rt)
        assert run.wait(timeout=30) is RunStatus.SUCCEEDED
        took.append(time.monotonic() - began)
    return sum(took) / len(took)


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at any one time."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_a_rate_limit_holds_across_two_workers_and_unlimited_runs_keep_their_pace(
    worker_env: dict[str, str], tmp_path: str
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start_many(2)
        unloaded = _latency(rt, 8)
        group = uuid.uuid4().hex[:8]
        runs = [submit(RatedFlow, {"group": group}, rt=rt) for _ in range(30)]
        time.sleep(0.5)  # the backlog is being deferred now
        loaded = _latency(rt, 8)
        for run in runs:
            assert run.wait(timeout=60) is RunStatus.SUCCEEDED
        starts = sorted(float(e["at"]) for e in notes(group, "starts"))
        assert len(starts) == 30
        busiest = max(sum(1 for s in starts if t <= s < t + 1) for t in starts)
        print(
            f"busiest second {busiest}, span {starts[-1] - starts[0]:.2f}s, "
            f"latency {unloaded:.3f}s alone vs {loaded:.3f}s beside the backlog"
        )
        assert busiest <= 10
        assert starts[-1] - starts[0] >= 4.0
        assert loaded <= 2 * unloaded + 0.05


def test_concurrency_two_never_runs_three_attempts_at_once(
    worker_env: dict[str, str], tmp_path: str
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start_many(2)
        group = uuid.uuid4().hex[:8]
        runs = [submit(NarrowFlow, {"group": group, "seconds": 0.6}, rt=rt) for _ in range(8)]
        for run in runs:
            assert run.wait(timeout=60) is RunStatus.SUCCEEDED
        began, ended = notes(group, "began"), notes(group, "ended")
        intervals = [
            (float(b["at"]), float(e["at"]))
            for b in began
            for e in ended
            if (b["run"], b["pid"]) == (e["run"], e["pid"])
        ]
        assert len(intervals) == 8
        assert _most_at_once(intervals) == 2


def test_a_slot_held_by_a_killed_worker_comes_back_with_its_lease(
    worker_env: dict[str, str], tmp_path: str
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start_many(2)
        group = uuid.uuid4().hex[:8]
        runs = [submit(NarrowFlow, {"group": group, "seconds": 1.5}, rt=rt) for _ in range(6)]
        first = eventually(lambda: notes(group, "began"), timeout=20)[0]
        victim = next(w for w in pool.workers if int(first["pid"]) in w.children())
        killed_at = time.time()
        victim.kill()
        pool.start()  # two live workers again
        for run in runs:
            assert RunHandle(run.run_id, rt).wait(timeout=90) is RunStatus.SUCCEEDED
        began, ended = notes(group, "began"), notes(group, "ended")
        intervals = []
        for b in began:
            ends = [e for e in ended if (b["run"], b["pid"]) == (e["run"], e["pid"])]
            # An attempt the kill ended has no end of its own: it ran until the kill.
            intervals.append((float(b["at"]), float(ends[0]["at"]) if ends else killed_at))
        assert len({b["run"] for b in began}) == 6
        assert len(intervals) > 6  # the killed attempts ran again
        assert _most_at_once(intervals) <= 2


def test_steps_a_rate_limit_deferred_survive_the_worker_holding_them_being_killed(
    worker_env: dict[str, str], tmp_path: str
) -> None:
    """The deferred steps a killed worker held (messages due later, reserved by it) are
    neither lost nor run twice: each run's step commits once, only a step that had already
    started when the kill came starts again, and the limit still holds."""
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start_many(2)
        group = uuid.uuid4().hex[:8]
        runs = [submit(RatedFlow, {"group": group}, rt=rt) for _ in range(25)]
        eventually(lambda: len(notes(group, "starts")) >= 5, timeout=20)  # the rest wait
        # Taken once the killed processes are gone: a step one of its pool children began
        # while the kill was being sent (listing the children, signalling each) began before it.
        pool.workers[0].kill()
        killed_at = time.time()
        pool.start()
        for run in runs:
            assert RunHandle(run.run_id, rt).wait(timeout=90) is RunStatus.SUCCEEDED
        starts = notes(group, "starts")
        per_run: dict[str, list[float]] = {}
        for event in starts:
            per_run.setdefault(str(event["run"]), []).append(float(event["at"]))
        assert set(per_run) == {run.run_id for run in runs}
        again = [times for times in per_run.values() if len(times) > 1]
        print(f"{len(again)} step(s) started again after the kill")
        assert all(min(times) <= killed_at for times in again)
        for run in runs:
            done = [c for c in history(rt, run.run_id) if c.event == METHOD_FINISHED]
            assert [c.step for c in done] == ["call"]
        moments = sorted(at for times in per_run.values() for at in times)
        assert max(sum(1 for s in moments if t <= s < t + 1) for t in moments) <= 10
