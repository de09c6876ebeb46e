"""Benchmark: a rate limit held across two workers, and what a limited backlog costs others.

Usage::

    python bench/flow_control.py [--runs 60] [--free 20] [--url URL]

Two subprocess workers (``-P prefork -c 2``) import ``bench._bench_limited``: ``LimitedFlow``,
one step with ``rate_limit="10/s"``, and ``FreeFlow``, one unlimited step. It times
``--free`` ``FreeFlow`` runs one after another (submit to success) with the workers idle, then
submits ``--runs`` ``LimitedFlow`` runs at once and times ``--free`` more ``FreeFlow`` runs
beside that backlog, and prints the observed rate of the limited starts (after the burst)
against the configured one, the busiest second, and the two latencies.
Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of 127.0.0.1:6379, else a private
embedded server. The workers are stopped and the benchmark's keys deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/flow_control.py`
    sys.path.insert(0, str(ROOT))

from bench._bench_limited import RATE, FreeFlow, LimitedFlow, starts_key  # noqa: E402
from bench._common import (  # noqa: E402
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
from runner.flow.rates import parse_rate  # noqa: E402
from runner.settings import RunnerSettings  # noqa: E402
from runner.store.models import RunStatus  # noqa: E402

WAIT = 120.0


def _latencies(rt: Runtime, n: int) -> list[float]:
    """Milliseconds from submit to success of ``n`` FreeFlow runs, one after another."""
    took = []
    for _ in range(n):
        began = time.perf_counter()
        if submit(FreeFlow, {}, rt=rt).wait(timeout=WAIT) is not RunStatus.SUCCEEDED:
            raise RuntimeError("a FreeFlow run did not succeed")
        took.append((time.perf_counter() - began) * 1000)
    return took


def run(url: str, args: argparse.Namespace) -> None:
    """Start two workers on ``url``, measure, print the table."""
    token = uuid.uuid4().hex[:8]
    prefix, queue, batch = f"bench-fc-{token}", f"bench-fc-{token}", token
    env = {
        "RUNNER_REDIS_URL": url,
        "RUNNER_PREFIX": prefix,
        "RUNNER_QUEUE": queue,
        "RUNNER_FLOW_MODULES": "bench._bench_limited",
        "PYTHONPATH": str(ROOT),
    }
    settings = RunnerSettings(redis_url=url, prefix=prefix, queue=queue)
    rt = Runtime.create(make_app(settings), settings)
    logs = Path(tempfile.mkdtemp(prefix="bench-flow-control-"))
    try:
        with (
            WorkerProcess(env, log=logs / "w1.log", cwd=ROOT, stop_timeout=20) as one,
            WorkerProcess(env, log=logs / "w2.log", cwd=ROOT, stop_timeout=20) as two,
        ):
            one.wait_ready(rt.app, timeout=60)
            two.wait_ready(rt.app, timeout=60)
            alone = _latencies(rt, args.free)
            runs = [submit(LimitedFlow, {"batch": batch}, rt=rt) for _ in range(args.runs)]
            beside = _latencies(rt, args.free)
            for handle in runs:
                if handle.wait(timeout=WAIT) is not RunStatus.SUCCEEDED:
                    raise RuntimeError("a LimitedFlow run did not succeed")
            starts = sorted(float(s) for s in raw_client(rt).lrange(starts_key(batch), 0, -1))
    finally:
        with contextlib.closing(raw_client(rt)) as client:
            delete_prefix(client, prefix)
            delete_prefix(client, f"bench-limits:{batch}:")
            delete_queues(client, Layout.of(rt.app).queue_keys(queue), token)
        rt.app.close()
    rate = parse_rate(RATE)
    after_burst = starts[rate.burst - 1 :]
    observed = (len(after_burst) - 1) / (after_burst[-1] - after_burst[0])
    busiest = max(sum(1 for s in starts if t <= s < t + 1) for t in starts)
    print(f"{args.runs} LimitedFlow runs ({RATE}, burst {rate.burst}) on two workers")
    print()
    span = (len(starts) - rate.burst) * rate.interval
    print_table(
        ["measure", "configured", "observed"],
        [
            [
                "starts per second after the burst",
                f"{rate.count / rate.period:.2f}",
                f"{observed:.2f}",
            ],
            ["most starts in any one second", f"{rate.burst + rate.count} at most", str(busiest)],
            ["first to last start (s)", f"{span:.2f}", f"{starts[-1] - starts[0]:.2f}"],
        ],
        "lrr",
    )
    print_table(
        ["FreeFlow run, submit to success (ms)", "p50", "mean"],
        [
            ["workers idle", f"{statistics.median(alone):.1f}", f"{statistics.mean(alone):.1f}"],
            ["beside the limited backlog", *_p50_mean(beside)],
        ],
        "lrr",
    )


def _p50_mean(samples: list[float]) -> list[str]:
    return [f"{statistics.median(samples):.1f}", f"{statistics.mean(samples):.1f}"]


def main() -> None:
    """Parse the arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60, help="LimitedFlow runs (default 60)")
    parser.add_argument("--free", type=int, default=20, help="FreeFlow runs timed per case")
    parser.add_argument("--url", default=None, help="Redis URL (default: see the docstring)")
    args = parser.parse_args()
    with bench_redis(args.url) as found:
        with contextlib.closing(found.client()) as probe:
            print(f"redis: {found.masked} ({found.source}), {durability(probe)}")
        run(found.url, args)


if __name__ == "__main__":
    main()
