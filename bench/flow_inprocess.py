"""Benchmark: per-method overhead of checkpointing an in-process flow run.

Usage::

    python bench/flow_inprocess.py [--n 200] [--warmup 20] [--url URL] [--profile CASE]

Runs :class:`examples.linear.LinearFlow` (20 methods in a chain, each one increments a counter)
with ``kickoff()`` in this process, ``--n`` times per case after ``--warmup`` untimed runs, the
cases interleaved in rotating order (see :func:`bench._common.interleave`):

* **none**: no persistence; the executor alone (thread pool, orchestrator, state diff/merge);
* **redis**: ``CheckpointConfig(provider=RedisProvider(url, prefix=...))``: the default flow
  events, i.e. one checkpoint when the run starts and one after every method (21 commits, each
  one EVALSHA round trip);
* **sqlite**: the same with ``SqliteProvider`` on a file in a temp directory (WAL);
* **json**: the same with ``JsonProvider`` in a temp directory (every file fsync'ed).

Each timed call builds nothing: the flow object is made while preparing the iteration and the
call is ``flow.kickoff()``. Prints a Markdown table of the run time (p50/mean, ms) and of the
overhead per method, ``(p50(case) - p50(none)) / 20`` in ms, then the target verdict: under
:data:`TARGET_MS` per method to Redis. For reference it also times the store alone: ``--n``
``commit()`` calls of a checkpoint taken from the middle of a real run (fresh ids), whose p50
is the floor of the per-method overhead (each method is one commit). ``--profile CASE`` instead
prints the top of a cProfile of ``--n`` runs of that case.

Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 13 of 127.0.0.1:6379, else a private
embedded server (see :mod:`bench._common`). Only keys under a fresh per-process prefix are
written, and they are deleted at the end; no DB is flushed.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples.linear import LinearFlow
from runner import CheckpointConfig, JsonProvider, SqliteProvider, ids
from runner.errors import StoreUnavailable
from runner.store.redis import RedisProvider

try:
    from bench._common import (
        BenchRedis,
        bench_redis,
        count_keys,
        delete_prefix,
        interleave,
        print_table,
        summarize,
    )
except ModuleNotFoundError:  # run as `python bench/flow_inprocess.py`: bench/ is on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from _common import (  # type: ignore[no-redef]
        BenchRedis,
        bench_redis,
        count_keys,
        delete_prefix,
        interleave,
        print_table,
        summarize,
    )

STEPS = len(LinearFlow.graph().methods)
"""Methods per run (20)."""
TARGET_MS = 0.3
"""Checkpointing to Redis must add less than this per method."""
CASES = ("none", "redis", "sqlite", "json")
HEADERS = [
    "case",
    "run p50 (ms)",
    "run mean (ms)",
    "per method p50 (ms)",
    "overhead/method (ms)",
    "store commit alone p50 (ms)",
]


def make_configs(target: BenchRedis, prefix: str, tmp: Path) -> dict[str, CheckpointConfig | None]:
    """The persistence of every case (``None``: no persistence)."""
    return {
        "none": None,
        "redis": CheckpointConfig(provider=RedisProvider(target.url, prefix=prefix)),
        "sqlite": CheckpointConfig(provider=SqliteProvider(tmp / "flows.db")),
        "json": CheckpointConfig(provider=JsonProvider(tmp / "json")),
    }


def case(config: CheckpointConfig | None) -> Callable[[int], Callable[[], object]]:
    """Prepare one fresh flow per iteration; the timed call is its ``kickoff()``."""

    def prepare(_: int) -> Callable[[], object]:
        return LinearFlow(checkpoint=config).kickoff

    return prepare


def check(configs: dict[str, CheckpointConfig | None]) -> None:
    """One run per case, asserting the flow really ran and really checkpointed."""
    for name, config in configs.items():
        flow = LinearFlow(checkpoint=config)
        assert flow.kickoff() == STEPS - 1 and flow.state.counter == STEPS, name
        if config is not None:
            history = config.store().history(flow.flow_id, limit=100)
            assert len(history) == STEPS + 1, (name, len(history))


def commit_cost(config: CheckpointConfig, n: int) -> float:
    """p50 in µs of one ``commit`` of a mid-run checkpoint (a fresh id and run each time)."""
    store = config.store()
    flow = LinearFlow(checkpoint=config)
    flow.kickoff()
    sample = next(c for c in store.history(flow.flow_id, limit=100) if c.step == "step_10")
    copies = [
        sample.model_copy(update={"id": ids.checkpoint_id(), "run_id": f"{flow.flow_id}-{i}"})
        for i in range(n)
    ]
    times = []
    for ckpt in copies:
        began = time.perf_counter()
        store.commit(ckpt)
        times.append((time.perf_counter() - began) * 1e6)
    return summarize(times).p50


def raw_multi_cost(client: Any, config: CheckpointConfig, n: int) -> float:
    """p50 in µs of a raw MULTI/EXEC of the same writes as one checkpoint (the baseline).

    SET snapshot, ZADD history, HSET meta, ZADD run index, HSET checkpoint index, trim:
    what a hand-rolled Redis checkpoint would write, measured in this same run.
    """
    store = config.store()
    flow = LinearFlow(checkpoint=config)
    flow.kickoff()
    sample = next(c for c in store.history(flow.flow_id, limit=100) if c.step == "step_10")
    doc = sample.model_dump(mode="json")
    times = []
    for i in range(n):
        run, cid = f"{flow.flow_id}-raw-{i % 20}", ids.checkpoint_id()
        began = time.perf_counter()
        body = json.dumps({**doc, "id": cid, "seq": i + 1}, separators=(",", ":"))
        now = time.time()
        pipe = client.pipeline(transaction=True)
        pipe.set(f"{run}:ckpt:{cid}", body)
        pipe.zadd(f"{run}:history", {cid: i + 1})
        pipe.hset(f"{run}:meta", mapping={"seq": i + 1, "latest": cid, "updated_at": now})
        pipe.zadd(f"{flow.flow_id}-raw-runs", {run: now})
        pipe.hset(f"{flow.flow_id}-raw-ckpts", cid, run)
        pipe.zremrangebyrank(f"{run}:history", 0, -201)
        pipe.execute()
        times.append((time.perf_counter() - began) * 1e6)
    for key in client.scan_iter(f"{flow.flow_id}-raw-*"):
        client.delete(key)
    return summarize(times).p50


def report(
    samples: dict[str, list[float]],
    commits: dict[str, float],
    target: BenchRedis,
    n: int,
    warmup: int,
) -> None:
    """Print the table and the verdict (samples and commits in µs)."""
    stats = {name: summarize(samples[name]) for name in CASES}
    base = stats["none"].p50
    print(f"## In-process flow kickoff, {STEPS} methods ({n} runs per case after {warmup})\n")
    rows = []
    for name in CASES:
        st = stats[name]
        overhead = "-" if name == "none" else f"{(st.p50 - base) / STEPS / 1000:.3f}"
        per_method = f"{st.p50 / STEPS / 1000:.3f}"
        commit = f"{commits[name] / 1000:.3f}" if name in commits else "-"
        run = [f"{st.p50 / 1000:.2f}", f"{st.mean / 1000:.2f}"]
        rows.append([name, *run, per_method, overhead, commit])
    print_table(HEADERS, rows)
    redis_ms = (stats["redis"].p50 - base) / STEPS / 1000
    verdict = "PASS" if redis_ms < TARGET_MS else "FAIL"
    print(f"target: checkpoint to Redis < {TARGET_MS} ms per method: {redis_ms:.3f} ms  {verdict}")
    if "raw" in commits:
        raw_ms = commits["raw"] / 1000
        print(
            f"baseline in this run: raw MULTI/EXEC of the same writes p50 {raw_ms:.3f} ms; "
            f"our per-method overhead is {redis_ms / raw_ms:.2f}x it"
        )
    print()
    print("notes:")
    print(
        f"- every persisted run writes {STEPS + 1} checkpoints (flow_started + one per method, "
        "the default events); overhead = (p50(case) - p50(none)) / methods"
    )
    print(
        "- store commit alone: the provider's commit() of a step_10 checkpoint, no flow "
        "around it; per-method overhead minus this is what the executor adds"
    )
    print("- json fsyncs every file (a durable write per checkpoint), so it is disk-bound")
    print(f"- cases interleaved in rotating order; GC off while timing; redis via {target.source}")


def profile(config: CheckpointConfig | None, n: int) -> None:
    """Print the top of a cProfile of ``n`` runs."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        LinearFlow(checkpoint=config).kickoff()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=200, help="timed runs per case")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs per case first")
    parser.add_argument(
        "--url", help="Redis URL (default: $RUNNER_BENCH_REDIS_URL, local DB 13, else embedded)"
    )
    parser.add_argument("--profile", choices=CASES, help="cProfile one case instead")
    args = parser.parse_args(argv)
    if args.n < 1 or args.warmup < 0:
        parser.error("--n must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when it ran (whatever the verdict), 1 when Redis is unreachable."""
    args = parse_args(argv)
    started = time.perf_counter()
    prefix = f"bench-flow-{uuid.uuid4().hex[:8]}"
    try:
        with bench_redis(args.url) as target, tempfile.TemporaryDirectory() as tmp:
            configs = make_configs(target, prefix, Path(tmp))
            admin = target.client()
            try:
                check(configs)
                if args.profile:
                    profile(configs[args.profile], args.n)
                    return 0
                samples = interleave(
                    {name: case(config) for name, config in configs.items()},
                    n=args.n,
                    warmup=args.warmup,
                )
                commits = {
                    name: commit_cost(config, args.n)
                    for name, config in configs.items()
                    if config is not None
                }
                redis_config = configs["redis"]
                assert redis_config is not None
                commits["raw"] = raw_multi_cost(admin, redis_config, args.n * 5)
            finally:
                for config in configs.values():
                    if config is not None:
                        config.store().close()
                removed = delete_prefix(admin, prefix + ":")
                left = count_keys(admin, prefix + ":")
                admin.close()
            report(samples, commits, target, args.n, args.warmup)
            print(f"- cleanup: removed {removed} keys under {prefix}:, {left} left")
    except StoreUnavailable as exc:
        print(f"flow_inprocess: {exc}", file=sys.stderr)
        return 1
    print(f"- elapsed: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
