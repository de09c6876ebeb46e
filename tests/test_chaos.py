"""Chaos, short version of ``make chaos``: workers and pool children SIGKILLed at random and
Redis restarted once during 60 runs of a fan-out + join + router flow, at the DEFAULT lease
and recovery settings; nothing is lost, stuck, wrong or committed twice.

Seeded by ``CHAOS_SEED`` (printed; a fresh seed when unset). The driver is
:mod:`tests.chaos_support`; the number of kills is fixed (submission waits for the
killer), so the assertions do not depend on timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos_support import ChaosDriver, seed_from_env

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(600)]

RUNS = 60
KILLS = 10


def test_runs_survive_random_kills_and_a_redis_restart_at_the_defaults(tmp_path: Path) -> None:
    seed = seed_from_env()
    print(f"CHAOS_SEED={seed}")
    # A run still open after the budget is reported stuck (not a pytest timeout).
    report = ChaosDriver(runs=RUNS, kills=KILLS, seed=seed, workdir=tmp_path, budget=300).run()
    print(report.table())
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
    assert max(report.recovery_delays, default=0.0) < 10.0, context
