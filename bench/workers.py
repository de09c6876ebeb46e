"""Benchmark: flows on Celery workers against raw Celery on the same broker and settings.

Usage::

    python bench/workers.py [--runs 20] [--warmup 3] [--concurrent 200] [--tasks 1000]
                            [--rounds 5] [--url URL | --fsync none|everysec|always]

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
* **throughput**: ``--concurrent`` runs of the 5-step ``FiveStepFlow`` submitted at once
  (one ``submit`` after another, then waiting for each), steps per second until the last
  finished, against as many raw ``chain``s of five no-op tasks sent the same way (one
  ``apply_async`` after another, then ``get`` of each), tasks per second. The flow workers keep
  no task results (the default), so the chains keep only their last task's, the one a caller
  waits on; a second pair has both keep every task's result (the ``RUNNER_TASK_RESULTS=true``
  worker against chains storing all five). For reference, ``--tasks`` single no-op tasks sent
  one by one. A runner worker's kombu keeps one Redis client per channel (the broker
  adapter's :func:`~runner.distributed.broker.one_client_per_channel`); the raw worker's
  kombu is as released, what a Celery user runs. So that the gain from that is not taken
  for the flows' own, one more row runs the same chains on a raw worker that keeps its
  clients too (``BENCH_ONE_CLIENT=true``). ``--rounds`` rounds, the cases' order rotating
  each round; median and spread shown. Beside each, the CPU it cost per task (Linux): the
  serving worker's pool processes and its main process (``/proc``), and the Redis server
  (``INFO cpu``: the whole server, so another client's load on a shared Redis counts too);
  median of the rounds.

Both sides use the same Redis as broker, result backend and (the runner's) store, so the same
durability; the table states it. ``--fsync`` starts a private ``redis-server`` of that
durability for the benchmark (see :func:`bench._common.redis_server`).

Prints a Markdown table and the targets (linear p50 at most 1.1x the raw chain's, throughput
at least 95% of raw chains') with PASS/FAIL.
Redis: ``--fsync``, else ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of
127.0.0.1:6379, else a private embedded server (see :mod:`bench._common`). The workers are
stopped and the benchmark's own keys deleted at the end: its prefix, its queues, and the task
results of its tasks and runs (each given an id under the benchmark's token), never another's.
Exits 0 whatever the verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import os
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
from celery.result import GroupResult  # noqa: E402

from bench._common import (  # noqa: E402
    FSYNC,
    bench_redis,
    delete_prefix,
    delete_queues,
    durability,
    interleave,
    print_table,
    raw_client,
    summarize,
)
from runner.distributed.app import make_app  # noqa: E402
from runner.distributed.broker import Layout  # noqa: E402
from runner.distributed.client import submit  # noqa: E402
from runner.distributed.engine import Runtime  # noqa: E402
from runner.distributed.processes import WorkerProcess  # noqa: E402
from runner.settings import RunnerSettings  # noqa: E402

TARGET = 1.1
"""The linear flow's median latency must be at most this factor of the raw chain's."""
THROUGHPUT_TARGET = 0.95
"""Concurrent runs' steps per second must be at least this fraction of raw chains' tasks per
second."""
STEPS = 5
"""Steps of ``FiveStepFlow``, tasks of a raw chain."""
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


def _flow_case(
    rt: Runtime, flow: str, inputs: dict[str, Any] | None = None, run_id: str | None = None
) -> Callable[[], None]:
    def call() -> None:
        handle = submit(flow, inputs, id=run_id, rt=rt)
        status = handle.wait(WAIT)
        if status.value != "succeeded":
            raise RuntimeError(f"{flow} run {handle.run_id} ended {status.value}")

    return call


class Ids:
    """Task and run ids under the benchmark's token, so that only its own results are
    deleted at the end (Celery's result keys are ``celery-task-meta-<id>``)."""

    def __init__(self, token: str) -> None:
        self.token, self.n = token, 0

    def __call__(self) -> str:
        self.n += 1
        return f"{self.token}-{self.n}"


def _noops(noop: Signature, n: int, ids: Ids, keep: str = "all") -> list[Signature]:
    """``n`` no-op signatures with ids of ours; ``keep="last"``: only the last one's result
    is stored (the one a caller of the chain waits on)."""
    return [
        noop.clone().set(task_id=ids(), ignore_result=keep == "last" and i < n - 1)
        for i in range(n)
    ]


def _raw_case(make: Callable[[], Any], groups: list[str] | None = None) -> Callable[[], None]:
    """Send ``make()`` and wait for it; the ids of the groups it made go in ``groups`` (a
    chain freezes its chord's group with an id of Celery's: its keys are deleted by it)."""

    def call() -> None:
        result = make().apply_async()
        result.get(timeout=WAIT, disable_sync_subtasks=False)
        while result is not None and groups is not None:
            if isinstance(result, GroupResult):
                groups.append(result.id)
            result = result.parent

    return call


def flow_throughput(rt: Runtime, runs: int, ids: Ids | None = None) -> float:
    """Tasks (steps) per second of ``runs`` five-step runs submitted one after another,
    until the last finished; with ``ids``, the runs are named by it."""
    flow = "bench._bench_flows:FiveStepFlow"
    began = time.perf_counter()
    handles = [submit(flow, id=ids() if ids else None, rt=rt) for _ in range(runs)]
    for handle in handles:
        if handle.wait(WAIT).value != "succeeded":
            raise RuntimeError(f"run {handle.run_id} did not succeed")
    return runs * STEPS / (time.perf_counter() - began)


def chain_throughput(noop: Signature, chains: int, ids: Ids, keep: str) -> float:
    """Tasks per second of ``chains`` chains of five no-op tasks sent one after another,
    until the last chain's result arrived (``keep``: whose results are stored)."""
    began = time.perf_counter()
    results = [chain(*_noops(noop, STEPS, ids, keep)).apply_async() for _ in range(chains)]
    for result in results:
        result.get(timeout=WAIT, disable_sync_subtasks=False)
    return chains * STEPS / (time.perf_counter() - began)


def raw_throughput(raw: Celery, tasks: int, ids: Ids) -> float:
    """Tasks per second of ``tasks`` no-op tasks sent one after another."""
    began = time.perf_counter()
    results = [raw.send_task("bench.noop", task_id=ids()) for _ in range(tasks)]
    for result in results:
        result.get(timeout=WAIT)
    return tasks / (time.perf_counter() - began)


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (``nan`` without ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return float("nan")


class Meter:
    """CPU per task of each case: its worker's pool processes, main process, and Redis."""

    PARTS = ("pool", "main", "redis")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.per_task: dict[str, dict[str, list[float]]] = {}

    def _redis(self) -> float:
        try:
            cpu = self.client.info("cpu")
            return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        except Exception:  # an ACL without INFO: no Redis column
            return float("nan")

    def _read(self, worker: WorkerProcess) -> tuple[float, float, float]:
        pool = sum(_cpu_seconds(pid) for pid in worker.children())
        main = _cpu_seconds(worker.proc.pid) if worker.proc is not None else float("nan")
        return pool, main, self._redis()

    def wrap(
        self, name: str, worker: WorkerProcess, tasks: int, case: Callable[[], float]
    ) -> Callable[[], float]:
        """``case`` metered: each call adds its CPU per task (µs) under ``name``."""

        def call() -> float:
            before = self._read(worker)
            rate = case()
            after = self._read(worker)
            got = self.per_task.setdefault(name, {part: [] for part in self.PARTS})
            for part, a, b in zip(self.PARTS, before, after, strict=True):
                got[part].append((b - a) / tasks * 1e6)
            return rate

        return call

    def line(self) -> str:
        def cell(values: list[float]) -> str:
            value = statistics.median(values)
            return "n/a" if value != value else f"{value:.0f}"

        return "; ".join(
            f"{name} {' / '.join(cell(got[part]) for part in self.PARTS)}"
            for name, got in self.per_task.items()
        )


def _rounds(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """``rounds`` rounds of every case, the order rotating each round (ABAB...)."""
    names = list(cases)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            rates[name].append(cases[name]())
    return rates


def run(url: str, args: argparse.Namespace) -> None:
    """Start the workers on ``url``, time every case, print the table."""
    token = uuid.uuid4().hex[:8]
    prefix, flow_q, raw_q = f"bench-{token}", f"bench-flows-{token}", f"bench-raw-{token}"
    kept_q = f"bench-kept-{token}"
    base = {"RUNNER_REDIS_URL": url, "RUNNER_PREFIX": prefix, "PYTHONPATH": str(ROOT)}
    flow_env = {**base, "RUNNER_QUEUE": flow_q, "RUNNER_FLOW_MODULES": FLOW_MODULES}
    kept_env = {**flow_env, "RUNNER_QUEUE": kept_q, "RUNNER_TASK_RESULTS": "true"}
    raw_env = {**base, "RUNNER_QUEUE": raw_q, "RUNNER_TASK_RESULTS": "true"}
    one_q = f"bench-one-{token}"
    one_env = {**raw_env, "RUNNER_QUEUE": one_q, "BENCH_ONE_CLIENT": "true"}
    flow_settings = RunnerSettings(redis_url=url, prefix=prefix, queue=flow_q)
    rt = Runtime.create(make_app(flow_settings), flow_settings)
    kept_settings = RunnerSettings(redis_url=url, prefix=prefix, queue=kept_q, task_results=True)
    kept = Runtime.create(make_app(kept_settings), kept_settings)
    # Raw Celery needs its results: the chain, the chord and the throughput count wait on them.
    raw = make_app(RunnerSettings(redis_url=url, prefix=prefix, queue=raw_q, task_results=True))
    noop = raw.signature("bench.noop", immutable=True)
    one = make_app(RunnerSettings(redis_url=url, prefix=prefix, queue=one_q, task_results=True))
    one_noop = one.signature("bench.noop", immutable=True)
    ids = Ids(f"{prefix}-t")
    logs = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    kept_runs = Ids(f"{prefix}-kept")
    groups: list[str] = []
    meter = Meter(raw_client(rt))  # the store's client: closed with it, below
    try:
        with (
            _worker("workers", flow_env, logs / "flows.log") as flows,
            _worker("workers", kept_env, logs / "kept.log") as kept_worker,
            _worker("bench._bench_tasks", raw_env, logs / "raw.log") as raw_worker,
            _worker("bench._bench_tasks", one_env, logs / "one.log") as one_worker,
        ):
            flows.wait_ready(rt.app, timeout=60)
            kept_worker.wait_ready(kept.app, timeout=60)
            raw_worker.wait_ready(raw, timeout=60)
            one_worker.wait_ready(one, timeout=60)
            latency = interleave(
                {
                    "linear": lambda i: _flow_case(rt, "examples.linear:LinearFlow"),
                    "kept": lambda i: _flow_case(
                        kept, "examples.linear:LinearFlow", run_id=kept_runs()
                    ),
                    "chain": lambda i: _raw_case(lambda: chain(*_noops(noop, 20, ids))),
                    "fanout": lambda i: _flow_case(rt, "examples.fanout:FanoutFlow"),
                    "chord": lambda i: _raw_case(
                        lambda: chain(
                            noop.clone().set(task_id=ids()),
                            chord(_noops(noop, 10, ids), noop.clone().set(task_id=ids())),
                        ),
                        groups,
                    ),
                },
                args.runs,
                warmup=args.warmup,
            )
            n = args.concurrent
            steps = n * STEPS
            rates = _rounds(
                {
                    "flow": meter.wrap("flow", flows, steps, lambda: flow_throughput(rt, n)),
                    "chains": meter.wrap(
                        "chains", raw_worker, steps, lambda: chain_throughput(noop, n, ids, "last")
                    ),
                    "chains_one": meter.wrap(
                        "chains_one",
                        one_worker,
                        steps,
                        lambda: chain_throughput(one_noop, n, ids, "last"),
                    ),
                    "flow_kept": meter.wrap(
                        "flow_kept", kept_worker, steps, lambda: flow_throughput(kept, n, kept_runs)
                    ),
                    "chains_kept": meter.wrap(
                        "chains_kept",
                        raw_worker,
                        steps,
                        lambda: chain_throughput(noop, n, ids, "all"),
                    ),
                    "tasks": meter.wrap(
                        "tasks",
                        raw_worker,
                        args.tasks,
                        lambda: raw_throughput(raw, args.tasks, ids),
                    ),
                },
                args.rounds,
            )
    finally:
        with contextlib.closing(raw_client(rt)) as client:
            held = durability(client)
            delete_prefix(client, f"{prefix}:")
            # Only our tasks' and runs' results: their ids start with the prefix (a chord's
            # group and counter keys are named after its header's group id: ours too).
            for meta in ("celery-task-meta-", "celery-taskset-meta-", ""):
                delete_prefix(client, f"{meta}{prefix}-")
            for gid in groups:  # the chords' groups: their result and counters
                client.delete(
                    *(f"celery-taskset-meta-{gid}{end}" for end in ("", ".j", ".t", ".c"))
                )
            queues = [
                k for q in (flow_q, kept_q, raw_q, one_q) for k in Layout.of(raw).queue_keys(q)
            ]
            delete_queues(client, queues, token)
        rt.app.close()
        kept.app.close()
        raw.close()
        one.close()

    lin, chn = summarize(latency["linear"]), summarize(latency["chain"])
    fan, crd = summarize(latency["fanout"]), summarize(latency["chord"])
    print(
        f"workers: prefork, 2 processes each; {args.runs} timed runs per latency case; "
        f"one Redis for broker, results and store, both sides: {held}\n"
    )
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
            *throughput_rows(rates, args),
        ],
    )
    print(
        "throughput rounds (tasks/s):",
        "; ".join(f"{name} {[round(r) for r in rs]}" for name, rs in rates.items()),
    )
    print(
        "CPU per task (us; the serving worker's pool processes / its main process / the Redis "
        "server; median of the rounds):",
        meter.line(),
    )
    verdict = "PASS" if lin.p50 <= TARGET * chn.p50 else "FAIL"
    print(f"target: linear p50 <= {TARGET}x raw chain p50: {verdict} ({lin.p50 / chn.p50:.2f}x)")
    ratio = paired_ratio(rates, "flow", "chains")
    verdict = "PASS" if ratio >= THROUGHPUT_TARGET else "FAIL"
    print(
        f"target: throughput >= {THROUGHPUT_TARGET:.0%} of raw chains (same results kept as "
        f"needed; median of the rounds' ratios): {verdict} ({ratio:.1%})"
    )
    alike = paired_ratio(rates, "flow", "chains_one")
    print(
        f"(the same against chains on a raw worker keeping one kombu client per channel, as "
        f"runner's workers do: {alike:.1%})"
    )
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


def paired_ratio(rates: dict[str, list[float]], a: str, b: str) -> float:
    """The median of the rounds' ratios of case ``a`` to case ``b``: each round's pair ran
    back to back, so their ratio drifts less with the machine's load than the medians taken
    apart do."""
    return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))


def throughput_rows(rates: dict[str, list[float]], args: argparse.Namespace) -> list[list[str]]:
    """The throughput rows: each flow case beside its chains (median, min-max of rounds)."""

    def cell(name: str) -> str:
        rs = rates[name]
        return f"{statistics.median(rs):.0f} ({min(rs):.0f}-{max(rs):.0f})"

    def ratio(a: str, b: str) -> str:
        paired = paired_ratio(rates, a, b)
        whole = statistics.median(rates[a]) / statistics.median(rates[b])
        return f"{paired:.1%} of raw (ratio of medians {whole:.1%})"

    n, rounds = args.concurrent, args.rounds
    return [
        [
            f"throughput: {n} x 5-step runs vs {n} chains of 5 tasks, results of the last "
            f"task only (tasks/s, median (min-max) of {rounds})",
            cell("flow"),
            cell("chains"),
            ratio("flow", "chains"),
        ],
        [
            f"the same, the raw worker keeping one kombu client per channel as runner's do "
            f"(tasks/s, median (min-max) of {rounds})",
            cell("flow"),
            cell("chains_one"),
            ratio("flow", "chains_one"),
        ],
        [
            f"throughput: the same, every task's result stored on both sides (tasks/s, "
            f"median (min-max) of {rounds})",
            cell("flow_kept"),
            cell("chains_kept"),
            ratio("flow_kept", "chains_kept"),
        ],
        [
            f"for reference: {n} x 5-step runs vs {args.tasks} single tasks sent one by one "
            f"(tasks/s)",
            cell("flow"),
            cell("tasks"),
            ratio("flow", "tasks"),
        ],
    ]


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, find a Redis, run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
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
