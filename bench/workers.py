"""Benchmark: flows on Celery workers against raw Celery on the same broker and settings.

Usage::

    python bench/workers.py [--runs 20] [--warmup 3] [--concurrent 200] [--tasks 1000]
                            [--rounds 5] [--url URL]

Two subprocess workers are started, each ``-P prefork -c 2``: ``celery -A workers worker`` (the
runner's flow workers, importing ``examples.linear``, ``examples.fanout`` and
``bench._bench_flows``) and ``celery -A bench._bench_tasks worker`` (one no-op task on an app
made by the same :func:`~runner.distributed.app.make_app`, so broker, result backend, late acks,
prefetch 1, task events and ``task_track_started`` are the same). Each listens on a queue of its
own. Then, with both idle but for the case being timed:

* **linear**: end-to-end latency (submit to ``handle.wait()`` returning) of the 20-step
  ``LinearFlow`` against ``chain`` of 20 no-op tasks (``apply_async().get()``); ``--runs``
  timed runs each, after ``--warmup`` untimed ones, interleaved in rotating order; the flow
  also on a third worker that stores step results (``RUNNER_TASK_RESULTS=true``; the default
  keeps them out of the result backend; raw Celery needs its results, so it stores them);
* **fan-out**: ``FanoutFlow`` (1 -> 10 parallel -> ``and_`` join) against ``chain(noop,
  chord([noop] * 10, noop))``;
* **throughput**: ``--concurrent`` runs of the 5-step ``FiveStepFlow`` submitted at once,
  steps per second until the last finished, against ``--tasks`` no-op tasks sent at once, tasks
  per second until the last result arrived; ``--rounds`` of each, alternating, median shown.

Prints a Markdown table and the targets (linear p50 at most 1.1x the raw chain's, throughput
at least 90% of raw Celery's) with PASS/FAIL.
Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 13 of 127.0.0.1:6379, else a private
embedded server (see :mod:`bench._common`). The workers are stopped and the benchmark's keys
(its prefix, its queues, its task results) deleted at the end. Exits 0 whatever the verdict.
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
if str(ROOT) not in sys.path:  # run as `python bench/workers.py`: the repo root is not on it
    sys.path.insert(0, str(ROOT))

from celery import Celery, Signature, chain, chord  # noqa: E402

from bench._common import (  # noqa: E402
    bench_redis,
    delete_prefix,
    interleave,
    print_table,
    raw_client,
    summarize,
)
from runner.distributed.app import make_app  # noqa: E402
from runner.distributed.client import submit  # noqa: E402
from runner.distributed.engine import Runtime  # noqa: E402
from runner.distributed.processes import WorkerProcess  # noqa: E402
from runner.settings import RunnerSettings  # noqa: E402

TARGET = 1.1
"""The linear flow's median latency must be at most this factor of the raw chain's."""
THROUGHPUT_TARGET = 0.9
"""Concurrent runs' steps per second must be at least this fraction of raw tasks per second."""
FLOW_MODULES = "examples.linear,examples.fanout,bench._bench_flows"
WAIT = 120.0
"""Seconds any one run or task may take before the benchmark gives up."""


def _worker(app_module: str, env: dict[str, str], log: Path) -> WorkerProcess:
    """A prefork worker of 2 processes for ``app_module``, logging to ``log``."""
    return WorkerProcess(env, app_module=app_module, log=log, cwd=ROOT, stop_timeout=20)


# -- the cases -------------------------------------------------------------------------------


def _ms(samples_us: list[float]) -> tuple[str, str]:
    s = summarize(samples_us)
    return f"{s.p50 / 1000:.1f}", f"{s.p95 / 1000:.1f}"


def _flow_case(rt: Runtime, flow: str, inputs: dict[str, Any] | None = None) -> Callable[[], None]:
    def call() -> None:
        handle = submit(flow, inputs, rt=rt)
        status = handle.wait(WAIT)
        if status.value != "succeeded":
            raise RuntimeError(f"{flow} run {handle.run_id} ended {status.value}")

    return call


def _noops(noop: Signature, n: int) -> list[Signature]:
    return [noop.clone() for _ in range(n)]


def _raw_case(make: Callable[[], Any]) -> Callable[[], None]:
    def call() -> None:
        make().apply_async().get(timeout=WAIT, disable_sync_subtasks=False)

    return call


def flow_throughput(rt: Runtime, runs: int) -> float:
    """Steps per second of ``runs`` five-step runs submitted at once."""
    began = time.perf_counter()
    handles = [submit("bench._bench_flows:FiveStepFlow", rt=rt) for _ in range(runs)]
    for handle in handles:
        if handle.wait(WAIT).value != "succeeded":
            raise RuntimeError(f"run {handle.run_id} did not succeed")
    return runs * 5 / (time.perf_counter() - began)


def raw_throughput(raw: Celery, tasks: int) -> float:
    """Tasks per second of ``tasks`` no-op tasks sent at once."""
    began = time.perf_counter()
    results = [raw.send_task("bench.noop") for _ in range(tasks)]
    for result in results:
        result.get(timeout=WAIT)
    return tasks / (time.perf_counter() - began)


def run(url: str, args: argparse.Namespace) -> None:
    """Start the workers on ``url``, time every case, print the table."""
    token = uuid.uuid4().hex[:8]
    prefix, flow_q, raw_q = f"bench-{token}", f"bench-flows-{token}", f"bench-raw-{token}"
    kept_q = f"bench-kept-{token}"
    base = {"RUNNER_REDIS_URL": url, "RUNNER_PREFIX": prefix, "PYTHONPATH": str(ROOT)}
    flow_env = {**base, "RUNNER_QUEUE": flow_q, "RUNNER_FLOW_MODULES": FLOW_MODULES}
    kept_env = {**flow_env, "RUNNER_QUEUE": kept_q, "RUNNER_TASK_RESULTS": "true"}
    raw_env = {**base, "RUNNER_QUEUE": raw_q, "RUNNER_TASK_RESULTS": "true"}
    flow_settings = RunnerSettings(redis_url=url, prefix=prefix, queue=flow_q)
    rt = Runtime.create(make_app(flow_settings), flow_settings)
    kept_settings = RunnerSettings(redis_url=url, prefix=prefix, queue=kept_q, task_results=True)
    kept = Runtime.create(make_app(kept_settings), kept_settings)
    # Raw Celery needs its results: the chain, the chord and the throughput count wait on them.
    raw = make_app(RunnerSettings(redis_url=url, prefix=prefix, queue=raw_q, task_results=True))
    noop = raw.signature("bench.noop", immutable=True)
    logs = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    try:
        with (
            _worker("workers", flow_env, logs / "flows.log") as flows,
            _worker("workers", kept_env, logs / "kept.log") as kept_worker,
            _worker("bench._bench_tasks", raw_env, logs / "raw.log") as raw_worker,
        ):
            flows.wait_ready(rt.app, timeout=60)
            kept_worker.wait_ready(kept.app, timeout=60)
            raw_worker.wait_ready(raw, timeout=60)
            latency = interleave(
                {
                    "linear": lambda i: _flow_case(rt, "examples.linear:LinearFlow"),
                    "kept": lambda i: _flow_case(kept, "examples.linear:LinearFlow"),
                    "chain": lambda i: _raw_case(lambda: chain(*_noops(noop, 20))),
                    "fanout": lambda i: _flow_case(rt, "examples.fanout:FanoutFlow"),
                    "chord": lambda i: _raw_case(
                        lambda: chain(noop.clone(), chord(_noops(noop, 10), noop.clone()))
                    ),
                },
                args.runs,
                warmup=args.warmup,
            )
            flow_rates, raw_rates = [], []
            for _ in range(args.rounds):  # alternating, so both see the same machine
                flow_rates.append(flow_throughput(rt, args.concurrent))
                raw_rates.append(raw_throughput(raw, args.tasks))
            flow_tps, raw_tps = statistics.median(flow_rates), statistics.median(raw_rates)
    finally:
        with contextlib.closing(raw_client(rt)) as client:
            delete_prefix(client, prefix)
            delete_prefix(client, "celery-task-meta-")
            for queue in (flow_q, kept_q, raw_q):
                client.delete(queue, f"_kombu.binding.{queue}")
        rt.app.close()
        kept.app.close()
        raw.close()

    lin, chn = summarize(latency["linear"]), summarize(latency["chain"])
    fan, crd = summarize(latency["fanout"]), summarize(latency["chord"])
    print(f"workers: prefork, 2 processes each; {args.runs} timed runs per latency case\n")
    print_table(
        ["case", "runner p50 / p95", "raw Celery p50 / p95", "runner / raw (p50)"],
        [
            [
                "20-step linear flow vs 20-task chain (ms)",
                " / ".join(_ms(latency["linear"])),
                " / ".join(_ms(latency["chain"])),
                f"{lin.p50 / chn.p50:.2f}x",
            ],
            [
                "the same flow with step results stored (RUNNER_TASK_RESULTS=true) (ms)",
                " / ".join(_ms(latency["kept"])),
                " / ".join(_ms(latency["chain"])),
                f"{summarize(latency['kept']).p50 / chn.p50:.2f}x",
            ],
            [
                "1 -> 10 -> join vs chain + chord (ms)",
                " / ".join(_ms(latency["fanout"])),
                " / ".join(_ms(latency["chord"])),
                f"{fan.p50 / crd.p50:.2f}x",
            ],
            [
                f"throughput: {args.concurrent} x 5-step runs vs {args.tasks} tasks "
                f"(tasks/s, median of {args.rounds})",
                f"{flow_tps:.0f}",
                f"{raw_tps:.0f}",
                f"{flow_tps / raw_tps:.0%} of raw",
            ],
        ],
    )
    print(
        "throughput rounds (tasks/s): runner",
        [round(r) for r in flow_rates],
        "raw",
        [round(r) for r in raw_rates],
    )
    verdict = "PASS" if lin.p50 <= TARGET * chn.p50 else "FAIL"
    print(f"target: linear p50 <= {TARGET}x raw chain p50: {verdict} ({lin.p50 / chn.p50:.2f}x)")
    verdict = "PASS" if flow_tps >= THROUGHPUT_TARGET * raw_tps else "FAIL"
    print(
        f"target: throughput >= {THROUGHPUT_TARGET:.0%} of raw: "
        f"{verdict} ({flow_tps / raw_tps:.0%})"
    )


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, find a Redis, run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default=None)
    args = parser.parse_args(argv)
    with bench_redis(args.url) as target:
        print(f"redis: {target.masked} ({target.source})")
        run(target.url, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
