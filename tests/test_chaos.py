"""Chaos, short version of ``make chaos``: workers and pool children SIGKILLed at random and
Redis restarted once during 60 runs of a fan-out + join + router flow, at the DEFAULT lease
and recovery settings; nothing is lost, stuck, wrong or committed twice.

Seeded by ``CHAOS_SEED`` (printed; a fresh seed when unset). The driver is
:mod:`tests.chaos_support`; the number of kills is fixed (submission waits for the
killer), so the assertions do not depend on timing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos_support import ChaosDriver, Kill, recovery_cut_last, seed_from_env
from tests.flows.reliability import TRACE_RECEIPTS

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(600)]

RUNS = 60
KILLS = 10


def test_runs_survive_random_kills_and_a_redis_restart_at_the_defaults(tmp_path: Path) -> None:
    seed = seed_from_env()
    print(f"CHAOS_SEED={seed}")
    # A run still open after the budget is reported stuck (not a pytest timeout).
    report = ChaosDriver(runs=RUNS, kills=KILLS, seed=seed, workdir=tmp_path, budget=300).run()
    print(report.table())
    # The session's variables went with it: later tests' workers do not trace receipts.
    assert TRACE_RECEIPTS not in os.environ
    context = f"CHAOS_SEED={seed} logs={tmp_path}"
    assert report.runs == RUNS, context
    assert len(report.kills) >= KILLS, context
    assert report.redis_restarts == 1, context
    assert report.lost == [], context
    assert report.stuck == [], context
    assert report.wrong == [], context
    assert report.double_commits == [], context
    assert report.unrecovered == [], context
    # Recovery within the promised 10 s of a kill, at the defaults.
    assert max(report.recovery_delays, default=0.0) < 10.0, f"{context}: {report.worst_recovery}"


def test_a_kill_that_takes_a_re_sent_message_with_it_starts_the_recovery_clock_again() -> None:
    """``a`` is cut at 10 (its pool child, pid 1), re-sent and received at 15.5 by worker 8,
    whose whole worker (7, 8) is killed at 16; it runs again at 22: 6 s after the kill that
    cut its recovery, not 12. A kill of a worker that never received it changes nothing."""
    kills = [Kill("child", 10.0, [1]), Kill("worker", 16.0, [7, 8]), Kill("worker", 18.0, [9])]
    entries = [
        {"e": "start", "m": "a", "pid": 1, "t": 9.0},
        {"e": "recv", "m": "a", "pid": 8, "t": 15.5},
        {"e": "recv", "m": "b", "pid": 9, "t": 17.0},
        {"e": "start", "m": "a", "pid": 3, "t": 22.0},
    ]
    assert recovery_cut_last(kills, entries, "a", 10.0, 22.0) == 16.0
    assert recovery_cut_last(kills, entries, "b", 10.0, 22.0) == 18.0
    assert recovery_cut_last(kills, entries[:1] + entries[3:], "a", 10.0, 22.0) == 10.0
