"""Benchmark: I/O-bound runs on a thread pool, the runner against raw Celery on the same pool.

Usage::

    python -m bench.threads [--runs 200] [--threads 200] [--rounds 3] [--url URL | --fsync F]

``--runs`` runs of three 1-second I/O-bound steps (``bench._bench_io``: a blocking
``time.sleep``, and the same as ``async def`` methods awaiting ``asyncio.sleep``) are
submitted at once to one worker ``-P threads -c <--threads>`` (``celery -A workers worker``,
the runner's flow workers); the baseline is as many ``chain``s of three 1-second tasks sent
at once to a raw Celery worker on the same pool (``celery -A bench._bench_io_tasks worker``,
an app made by the same :func:`~runner.distributed.app.make_app`, so broker, late acks,
prefetch and task events are alike; it stores results, which its chains need). Each worker
has a queue of its own. The cases alternate for ``--rounds`` rounds after one warm-up round
of 10 runs each; the table shows the median wall time from the first submit to the last run
finished (3 s is the floor: three 1-second waits in a row), the best and worst round, and
the ratio to raw Celery.

Both sides use the same Redis (broker, results, store): the table states what it persists;
``--fsync`` starts a private ``redis-server`` of that durability. The flow worker's step
failures (its log's ERROR lines, e.g. redis-py's "Too many connections") are counted and
shown.

Redis: ``--fsync``, else ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of
127.0.0.1:6379, else a private embedded server (see :mod:`bench._common`). The workers are
stopped and the benchmark's own keys deleted at the end (its prefix, its queues, the results
of its chains' tasks, whose ids are under its token). Exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/threads.py`: the repo root is not on it
    sys.path.insert(0, str(ROOT))

from celery import Celery, chain  # noqa: E402
from celery.exceptions import TimeoutError as CeleryTimeout  # noqa: E402

from bench._common import (  # noqa: E402
    FSYNC,
    bench_redis,
    delete_prefix,
    delete_queues,
    durability,
    print_table,
    raw_client,
)
from runner.distributed.app import make_app  # noqa: E402
from runner.distributed.broker import Layout  # noqa: E402
from runner.distributed.client import submit  # noqa: E402
from runner.distributed.engine import Runtime  # noqa: E402
from runner.distributed.processes import WorkerProcess  # noqa: E402
from runner.settings import RunnerSettings  # noqa: E402

WAIT = 120.0
"""Seconds one round may take before the benchmark gives up on it (a round takes about 4)."""
WARMUP = 10
"""Runs of each case in the untimed first round."""


def _worker(app_module: str, env: dict[str, str], threads: int, log: Path) -> WorkerProcess:
    """A thread-pool worker of ``threads`` threads for ``app_module``, logging to ``log``."""
    return WorkerProcess(
        env,
        app_module=app_module,
        pool="threads",
        concurrency=threads,
        log=log,
        cwd=ROOT,
        stop_timeout=30,
    )


def flow_round(rt: Runtime, flow: str, runs: int) -> float:
    """Seconds from submitting ``runs`` runs of ``flow`` at once until the last finished."""
    began = time.perf_counter()
    handles = [submit(flow, rt=rt) for _ in range(runs)]
    for handle in handles:
        status = handle.wait(WAIT)
        if status.value != "succeeded":
            raise RuntimeError(f"{flow} run {handle.run_id} ended {status.value}")
    return time.perf_counter() - began


def raw_round(raw: Celery, runs: int, token: str) -> float:
    """Seconds from sending ``runs`` chains of three tasks at once until the last finished
    (task ids start with ``token``, so their results are found and deleted)."""
    step = raw.signature("bench.io_wait", immutable=True)

    def link() -> Any:
        return step.clone().set(task_id=f"{token}-{uuid.uuid4().hex}")

    began = time.perf_counter()
    results = [chain(link(), link(), link()).apply_async() for _ in range(runs)]
    for result in results:
        result.get(timeout=WAIT, disable_sync_subtasks=False)
    return time.perf_counter() - began


def run(url: str, args: argparse.Namespace) -> None:
    """Start the two workers on ``url``, time the rounds, print the table."""
    token = uuid.uuid4().hex[:8]
    prefix, flow_q, raw_q = f"bench-{token}", f"bench-io-{token}", f"bench-io-raw-{token}"
    base = {"RUNNER_REDIS_URL": url, "RUNNER_PREFIX": prefix, "PYTHONPATH": str(ROOT)}
    flow_env = {**base, "RUNNER_QUEUE": flow_q, "RUNNER_FLOW_MODULES": "bench._bench_io"}
    raw_env = {**base, "RUNNER_QUEUE": raw_q, "RUNNER_TASK_RESULTS": "true"}
    settings = RunnerSettings(redis_url=url, prefix=prefix, queue=flow_q)
    rt = Runtime.create(make_app(settings), settings)
    raw = make_app(RunnerSettings(redis_url=url, prefix=prefix, queue=raw_q, task_results=True))
    cases: dict[str, Callable[[int], float]] = {
        "runner": lambda n: flow_round(rt, "bench._bench_io:IOFlow", n),
        "runner_async": lambda n: flow_round(rt, "bench._bench_io:AsyncIOFlow", n),
        "raw": lambda n: raw_round(raw, n, prefix),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    lost: dict[str, int] = dict.fromkeys(cases, 0)
    logs = Path(tempfile.mkdtemp(prefix="bench-threads-"))
    try:
        with (
            _worker("workers", flow_env, args.threads, logs / "flows.log") as flows,
            _worker("bench._bench_io_tasks", raw_env, args.threads, logs / "raw.log") as raw_w,
        ):
            flows.wait_ready(rt.app, timeout=60)
            raw_w.wait_ready(raw, timeout=60)
            for name in cases:
                _timed(cases[name], WARMUP, name, lost)
            for i in range(args.rounds):  # rotating order, so all see the same machine
                names = list(cases)
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    times[name].append(_timed(cases[name], args.runs, name, lost))
    finally:
        with contextlib.closing(raw_client(rt)) as client:
            held = durability(client)
            delete_prefix(client, f"{prefix}:")
            delete_prefix(client, f"celery-task-meta-{prefix}-")
            queues = [k for q in (flow_q, raw_q) for k in Layout.of(raw).queue_keys(q)]
            delete_queues(client, queues, token)
        rt.app.close()
        raw.close()
    failures = sum(
        1
        for line in (logs / "flows.log").read_text(errors="replace").splitlines()
        if "ERROR/" in line
    )

    raw_median = statistics.median(times["raw"])

    def row(label: str, name: str) -> list[str]:
        median = statistics.median(times[name])
        return [
            label,
            f"{median:.2f}",
            f"{min(times[name]):.2f} / {max(times[name]):.2f}",
            f"{median / raw_median:.2f}x",
        ]

    print(
        f"{args.runs} concurrent runs of three 1-second I/O-bound steps, one worker "
        f"-P threads -c {args.threads} each; median of {args.rounds} rounds (floor: 3 s); "
        f"one Redis for both sides: {held}\n"
    )
    print_table(
        ["case", "wall time (s)", "best / worst (s)", "vs raw Celery"],
        [
            row("runner: flow of 3 blocking steps (time.sleep)", "runner"),
            row("runner: flow of 3 async def steps (asyncio.sleep)", "runner_async"),
            row("raw Celery: chain of 3 tasks (time.sleep)", "raw"),
        ],
    )
    print(f"flow worker ERROR lines (failed steps, e.g. 'Too many connections'): {failures}")
    if any(lost.values()):
        print(f"rounds run again after a chain's result did not come in {WAIT:.0f} s: {lost}")


def _timed(case: Callable[[int], float], runs: int, name: str, lost: dict[str, int]) -> float:
    """``case(runs)``; once more if a raw chain's result did not come within :data:`WAIT`
    (it happened once in a ``make bench``: no error in the raw worker's log), counted in
    ``lost``. A flow run that does not succeed stops the benchmark."""
    try:
        return case(runs)
    except CeleryTimeout as exc:
        lost[name] += 1
        print(f"{name}: a round gave up ({exc}); running it again", file=sys.stderr)
        return case(runs)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, find a Redis, run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default=None)
    parser.add_argument(
        "--fsync", choices=FSYNC, default=None, help="a private redis-server of this durability"
    )
    args = parser.parse_args(argv)
    with bench_redis(args.url, fsync=args.fsync) as target:
        print(f"redis: {target.masked} ({target.source})")
        run(target.url, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
