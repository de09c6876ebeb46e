"""Benchmark: the same flows in process, on our Redis checkpoints and on DBOS Transact.

Usage::

    python bench/dbos_compare.py [--n 100] [--warmup 10] [--iterations 3000] [--repeat 3]
                                 [--url URL] [--fsync always]

Two comparisons, each with the cases interleaved (rotating order, garbage collector off):

* **a chain of 20 checkpointed steps**: :class:`examples.linear.LinearFlow` (20 methods, each
  increments a counter) with ``kickoff()`` in this process, without persistence and with
  ``CheckpointConfig(provider=RedisProvider(...))`` (one commit when the run starts and one
  after each method); beside it one ``@DBOS.workflow()`` calling a ``@DBOS.step()`` that
  increments the counter 20 times, on DBOS's SQLite system database (a file in a temp
  directory: a row for the workflow, one per step), and the same 20 calls of the plain
  function. The overhead per checkpointed step is ``(p50(checkpointed) - p50(plain)) / 20``
  for each, ``--n`` runs per case after ``--warmup``.
* **a loop of ``--iterations``**: bench/loop.py's :class:`LoopFlow` (a step and a router
  looping back to it: two checkpoints per iteration) beside a DBOS workflow calling its step
  ``--iterations`` times (one step row per iteration); the whole run's time, median of
  ``--repeat`` runs each, alternating.

Durability: DBOS's SQLite commits with ``synchronous=FULL`` (SQLite's default; DBOS sets
none), an fsync per commit, so ours runs both on the benchmark's Redis (whatever it persists)
and on a private ``redis-server`` with ``appendfsync always`` (``--fsync``; empty for none);
each row states its durability.

DBOS comes with the ``bench`` extra (``pip install -e '.[bench]'``); without it the script
prints one line saying so and exits 0.

Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of 127.0.0.1:6379, else a
private embedded server (see :mod:`bench._common`). Only keys under a fresh per-process
prefix are written, and they are deleted at the end; no DB is flushed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import CheckpointConfig
from runner.errors import StoreUnavailable
from runner.store.redis import RedisProvider

try:
    from examples.linear import LinearFlow
except ModuleNotFoundError:  # run as `python bench/dbos_compare.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from examples.linear import LinearFlow

from bench._common import (
    bench_redis,
    count_keys,
    delete_prefix,
    durability,
    durability_of,
    interleave,
    print_table,
    redis_server,
    sqlite_sync,
    summarize,
)
from bench.loop import LoopFlow, no_gc

STEPS = len(LinearFlow.graph().methods)
"""Steps of the chain (20)."""
CASES = ("runner, no persistence", "runner + Redis", "plain calls", "DBOS + SQLite")
DURABLE = "runner + Redis AOF {fsync}"
"""The name of the case on a private Redis of that ``appendfsync``."""


def bump(counter: int) -> int:
    """The step of the DBOS workflows (and of the plain calls): one more."""
    return counter + 1


def plain_chain() -> int:
    """The chain's 20 steps as plain calls: what DBOS's overhead is measured against."""
    counter = 0
    for _ in range(STEPS):
        counter = bump(counter)
    return counter


@dataclass
class Dbos:
    """DBOS launched on a SQLite file; its chain and loop workflows."""

    chain: Callable[[], int]
    loop: Callable[[int], int]
    shutdown: Callable[[], None]


def launch_dbos(tmp: Path) -> Dbos:
    """DBOS on a SQLite system database in ``tmp``, with the benchmark's workflows."""
    from dbos import DBOS

    step = DBOS.step(name="bench_bump")(bump)

    @DBOS.workflow(name="bench_chain")
    def chain() -> int:
        counter = 0
        for _ in range(STEPS):
            counter = step(counter)
        return counter

    @DBOS.workflow(name="bench_loop")
    def loop(iterations: int) -> int:
        counter = 0
        while counter < iterations:
            counter = step(counter)
        return counter

    DBOS(
        config={
            "name": "bench-dbos",
            "system_database_url": f"sqlite:///{tmp / 'dbos.sqlite'}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    return Dbos(chain, loop, lambda: DBOS.destroy(destroy_registry=True))


def kickoff_on(config: CheckpointConfig) -> Callable[[int], Any]:
    """A case preparing one :class:`LinearFlow` run checkpointed by ``config``."""
    return lambda _: LinearFlow(checkpoint=config).kickoff


def chain_cases(
    provider: RedisProvider, dbos: Dbos, durable: dict[str, RedisProvider]
) -> dict[str, Callable[[int], Any]]:
    """Each case prepares one run (untimed) and returns the call to time."""
    config = CheckpointConfig(provider=provider)
    cases: dict[str, Callable[[int], Any]] = {
        CASES[0]: lambda _: LinearFlow().kickoff,
        CASES[1]: lambda _: LinearFlow(checkpoint=config).kickoff,
    }
    for fsync, store in durable.items():
        cases[DURABLE.format(fsync=fsync)] = kickoff_on(CheckpointConfig(provider=store))
    cases[CASES[2]] = lambda _: plain_chain
    cases[CASES[3]] = lambda _: dbos.chain
    return cases


def check(provider: RedisProvider, dbos: Dbos) -> None:
    """One run of each, asserting it really ran and really checkpointed."""
    flow = LinearFlow(checkpoint=CheckpointConfig(provider=provider))
    assert flow.kickoff() == STEPS - 1 and flow.state.counter == STEPS
    assert len(provider.history(flow.flow_id, limit=100)) == STEPS + 1
    assert plain_chain() == STEPS and dbos.chain() == STEPS
    from dbos import DBOS

    last = DBOS.list_workflows(name="bench_chain", sort_desc=True, limit=1, load_output=False)
    assert last and len(DBOS.list_workflow_steps(last[0].workflow_id)) == STEPS


def time_loops(
    stores: dict[str, RedisProvider], dbos: Dbos, iterations: int, repeat: int
) -> dict[str, float]:
    """Whole-run seconds of the loop on each of ``stores`` (by case name) and on DBOS
    (:data:`CASES` ``[3]``), ``repeat`` times each, the order rotating; the medians."""
    times: dict[str, list[float]] = {name: [] for name in [*stores, CASES[3]]}
    names = list(times)
    for i in range(repeat):
        shift = i % len(names)
        for who in names[shift:] + names[:shift]:
            with no_gc():
                began = time.perf_counter()
                if who in stores:
                    flow = LoopFlow(checkpoint=CheckpointConfig(provider=stores[who]))
                    assert flow.kickoff(inputs={"target": iterations}) == "done"
                else:
                    assert dbos.loop(iterations) == iterations
                times[who].append(time.perf_counter() - began)
    return {name: statistics.median(values) for name, values in times.items()}


def report(
    samples: dict[str, list[float]],
    loops: dict[str, float],
    args: argparse.Namespace,
    source: str,
    version: str,
    held: dict[str, str],
) -> None:
    """Print both tables and the ratios (samples in µs, loops in s); ``held``: each case's
    durability."""
    p50 = {name: summarize(values).p50 / 1000 for name, values in samples.items()}
    overhead = {
        name: (value - p50[CASES[2] if name == CASES[3] else CASES[0]]) / STEPS
        for name, value in p50.items()
        if name not in (CASES[0], CASES[2])
    }
    print(
        f"## {STEPS} checkpointed steps in process, beside DBOS Transact {version} "
        f"({args.n} runs per case after {args.warmup}, interleaved)\n"
    )
    rows = [
        [
            name,
            held.get(name, "-"),
            f"{p50[name]:.2f}",
            f"{overhead[name]:.3f}" if name in overhead else "-",
        ]
        for name in p50
    ]
    print_table(["case", "durability", "run p50 (ms)", "overhead per checkpointed step (ms)"], rows)
    for name in overhead:
        if name != CASES[3]:
            ratio = overhead[name] / overhead[CASES[3]]
            print(f"{name}: overhead per checkpointed step {ratio:.2f}x DBOS's")
    print()
    n = args.iterations
    print(f"## A loop of {n:,} iterations (median of {args.repeat} runs each, rotating)\n")
    rows = [
        [
            f"{name} ({'one step' if name == CASES[3] else 'step + router: 2 checkpoints'})",
            held.get(name, "-"),
            f"{total:.2f}",
            f"{total / n * 1000:.3f}",
            f"{total / loops[CASES[3]]:.2f}x",
        ]
        for name, total in loops.items()
    ]
    print_table(["case", "durability", "whole run (s)", "per iteration (ms)", "vs DBOS"], rows)
    print("notes:")
    print(
        f"- ours: {STEPS + 1} commits per chain (flow_started + one per method), each one "
        "EVALSHA to Redis; DBOS: a workflow row and one row per step in its SQLite file"
    )
    print("- overhead = (p50(checkpointed) - p50(without)) / steps, each against its own base")
    print(f"- redis via {source}; DBOS's SQLite file in a temp directory")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100, help="timed chain runs per case")
    parser.add_argument("--warmup", type=int, default=10, help="untimed chain runs per case")
    parser.add_argument("--iterations", type=int, default=3000, help="loop iterations per run")
    parser.add_argument("--repeat", type=int, default=3, help="loop runs of each, alternating")
    parser.add_argument(
        "--url", help="Redis URL (default: $RUNNER_BENCH_REDIS_URL, local DB 15, else embedded)"
    )
    parser.add_argument(
        "--fsync",
        default="always",
        help="comma-separated appendfsync settings of private redis-servers ours also runs on "
        "(everysec, always; empty: none)",
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.warmup < 0 or args.iterations < 1 or args.repeat < 1:
        parser.error("--n, --iterations and --repeat must be >= 1 and --warmup >= 0")
    args.fsync = [f for f in args.fsync.split(",") if f]
    if set(args.fsync) - {"everysec", "always"}:
        parser.error("--fsync takes everysec, always")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when it ran or DBOS is not installed, 1 when Redis is unreachable."""
    args = parse_args(argv)
    if importlib.util.find_spec("dbos") is None:
        print("dbos_compare: skipped, DBOS is not installed (pip install -e '.[bench]')")
        return 0
    from importlib.metadata import version

    started = time.perf_counter()
    prefix = f"bench-dbos-{uuid.uuid4().hex[:8]}"
    try:
        with (
            bench_redis(args.url) as target,
            tempfile.TemporaryDirectory() as tmp,
            contextlib.ExitStack() as stack,
        ):
            provider = RedisProvider(target.url, prefix=prefix)
            stack.callback(provider.close)
            durable: dict[str, RedisProvider] = {}
            held = {CASES[0]: "nothing persisted", CASES[2]: "nothing persisted"}
            for fsync in args.fsync:
                server = stack.enter_context(redis_server(fsync))
                durable[fsync] = RedisProvider(server.url, prefix=prefix)
                stack.callback(durable[fsync].close)
                held[DURABLE.format(fsync=fsync)] = f"Redis, {durability_of(fsync)}"
            admin = target.client()
            held[CASES[1]] = f"Redis, {durability(admin)}"
            dbos = launch_dbos(Path(tmp))
            try:
                check(provider, dbos)
                cases = chain_cases(provider, dbos, durable)
                samples = interleave(cases, n=args.n, warmup=args.warmup)
                stores = {CASES[1]: provider}
                stores.update({DURABLE.format(fsync=f): s for f, s in durable.items()})
                loops = time_loops(stores, dbos, args.iterations, args.repeat)
                with contextlib.closing(sqlite3.connect(Path(tmp) / "dbos.sqlite")) as db:
                    held[CASES[3]] = sqlite_sync(db) + ", SQLite's default (DBOS sets none)"
            finally:
                dbos.shutdown()
                removed = delete_prefix(admin, prefix + ":")
                left = count_keys(admin, prefix + ":")
                admin.close()
            report(samples, loops, args, target.source, version("dbos"), held)
            print(f"- cleanup: removed {removed} keys under {prefix}:, {left} left")
    except StoreUnavailable as exc:
        print(f"dbos_compare: {exc}", file=sys.stderr)
        return 1
    print(f"- elapsed: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
