"""Benchmark: per-method overhead of checkpointing an in-process flow run.

Usage::

    python bench/flow_inprocess.py [--n 200] [--warmup 20] [--url URL] [--profile CASE]
                                   [--fsync none,everysec,always]

Runs :class:`examples.linear.LinearFlow` (20 methods in a chain, each one increments a counter)
with ``kickoff()`` in this process, ``--n`` times per case after ``--warmup`` untimed runs, the
cases interleaved in rotating order (see :func:`bench._common.interleave`):

* **none**: no persistence; the executor alone (thread pool, orchestrator, state diff/merge);
* **redis**: ``CheckpointConfig(provider=RedisProvider(url, prefix=...))``: the default flow
  events, i.e. one checkpoint when the run starts and one after every method (21 commits, each
  one EVALSHA round trip), on the benchmark's Redis (whatever it persists: the table says);
* **redis-everysec** and **redis-always**: the same on private ``redis-server`` processes
  with the append-only file and that ``appendfsync`` (``--fsync`` picks which run; with
  ``always`` each commit is on disk before it returns, as SQLite's is);
* **sqlite**: the same with ``SqliteProvider`` on a file in a temp directory (WAL,
  ``synchronous`` as the table states: FULL fsyncs each commit);
* **json**: the same with ``JsonProvider`` in a temp directory (every file fsync'ed);
* **LangGraph** (the ``bench`` extra), the baseline: a graph of 20 nodes in a chain, each
  incrementing the counter, without a checkpointer and with ``SqliteSaver`` on a file
  (``durability="sync"``: each node's checkpoint written before the next node runs, as ours
  are), a fresh thread per run; its overhead per node beside ours per method.

Each timed call builds nothing: the flow object is made while preparing the iteration and the
call is ``flow.kickoff()``. Prints a Markdown table of the run time (p50/mean, ms) and of the
overhead per method, ``(p50(case) - p50(none)) / 20`` in ms, then the target verdict: under
:data:`TARGET_MS` per method to Redis. For reference it also times the store alone: ``--n``
``commit()`` calls of a checkpoint taken from the middle of a real run (fresh ids), whose p50
is the floor of the per-method overhead (each method is one commit). ``--profile CASE`` instead
prints the top of a cProfile of ``--n`` runs of that case.

Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of 127.0.0.1:6379, else a private
embedded server (see :mod:`bench._common`). Only keys under a fresh per-process prefix are
written, and they are deleted at the end; no DB is flushed.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import sqlite3
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
        FSYNC,
        BenchRedis,
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
except ModuleNotFoundError:  # run as `python bench/flow_inprocess.py`: bench/ is on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from _common import (  # type: ignore[no-redef]
        FSYNC,
        BenchRedis,
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

STEPS = len(LinearFlow.graph().methods)
"""Methods per run (20)."""
TARGET_MS = 0.3
"""Checkpointing to Redis must add less than this per method."""
CASES = ("none", "redis", "sqlite", "json")
"""The runner's cases always run; ``redis-<fsync>`` and the LangGraph ones are added."""
LANGGRAPH = ("langgraph", "langgraph+sqlite")
HEADERS = [
    "case",
    "durability",
    "run p50 (ms)",
    "run mean (ms)",
    "per method p50 (ms)",
    "overhead/method (ms)",
    "store commit alone p50 (ms)",
]


def make_configs(
    target: BenchRedis, prefix: str, tmp: Path, durable: dict[str, BenchRedis]
) -> dict[str, CheckpointConfig | None]:
    """The persistence of every case (``None``: no persistence); ``durable``: the private
    servers by their ``appendfsync``."""
    configs: dict[str, CheckpointConfig | None] = {
        "none": None,
        "redis": CheckpointConfig(provider=RedisProvider(target.url, prefix=prefix)),
    }
    for fsync, server in durable.items():
        configs[f"redis-{fsync}"] = CheckpointConfig(
            provider=RedisProvider(server.url, prefix=prefix)
        )
    configs["sqlite"] = CheckpointConfig(provider=SqliteProvider(tmp / "flows.db"))
    configs["json"] = CheckpointConfig(provider=JsonProvider(tmp / "json"))
    return configs


def langgraph_cases(tmp: Path) -> tuple[dict[str, Callable[[int], Callable[[], object]]], Any]:
    """LangGraph's cases (20 nodes in a chain; without and with ``SqliteSaver``) and the
    saver to close, or no cases when LangGraph is not installed."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return {}, None
    from typing import TypedDict

    class Counter(TypedDict):
        counter: int

    def bump(state: Counter) -> dict[str, int]:
        return {"counter": state["counter"] + 1}

    graph = StateGraph(Counter)
    names = [f"step_{i}" for i in range(STEPS)]
    for name in names:
        graph.add_node(name, bump)
    for a, b in zip([START, *names], [*names, END], strict=True):
        graph.add_edge(a, b)
    plain = graph.compile()
    saver_cm = SqliteSaver.from_conn_string(str(tmp / "langgraph.db"))
    saver = saver_cm.__enter__()
    saved = graph.compile(checkpointer=saver)

    def run_plain(_: int) -> Callable[[], object]:
        return lambda: plain.invoke({"counter": 0})

    def run_saved(_: int) -> Callable[[], object]:
        config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}}
        return lambda: saved.invoke({"counter": 0}, config, durability="sync")

    assert plain.invoke({"counter": 0}) == {"counter": STEPS}
    return {"langgraph": run_plain, "langgraph+sqlite": run_saved}, saver_cm


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
    held: dict[str, str],
) -> None:
    """Print the table and the verdict (samples and commits in µs); ``held``: each case's
    durability."""
    stats = {name: summarize(values) for name, values in samples.items()}
    print(f"## In-process flow kickoff, {STEPS} methods ({n} runs per case after {warmup})\n")
    rows = []
    for name, st in stats.items():
        plain = stats["langgraph" if name.startswith("langgraph") else "none"].p50
        bare = name in ("none", "langgraph")
        overhead = "-" if bare else f"{(st.p50 - plain) / STEPS / 1000:.3f}"
        per_method = f"{st.p50 / STEPS / 1000:.3f}"
        commit = f"{commits[name] / 1000:.3f}" if name in commits else "-"
        run = [f"{st.p50 / 1000:.2f}", f"{st.mean / 1000:.2f}"]
        rows.append([name, held.get(name, "-"), *run, per_method, overhead, commit])
    print_table(HEADERS, rows)
    base = stats["none"].p50
    redis_ms = (stats["redis"].p50 - base) / STEPS / 1000
    verdict = "PASS" if redis_ms < TARGET_MS else "FAIL"
    print(f"target: checkpoint to Redis < {TARGET_MS} ms per method: {redis_ms:.3f} ms  {verdict}")
    if "raw" in commits:
        raw_ms = commits["raw"] / 1000
        print(
            f"baseline in this run: raw MULTI/EXEC of the same writes p50 {raw_ms:.3f} ms; "
            f"our per-method overhead is {redis_ms / raw_ms:.2f}x it"
        )
    if "redis-always" in stats and "langgraph+sqlite" in stats:
        ours = (stats["redis-always"].p50 - base) / STEPS / 1000
        lg = stats["langgraph+sqlite"]
        theirs = (lg.p50 - stats["langgraph"].p50) / STEPS / 1000
        print(
            f"like for like, an fsync per checkpoint: runner on Redis AOF always {ours:.3f} ms "
            f"per method, LangGraph + SqliteSaver {theirs:.3f} ms per node ({ours / theirs:.2f}x)"
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
    print(
        "- langgraph rows: overhead = (p50(langgraph+sqlite) - p50(langgraph)) / nodes, the "
        "same measure as ours; SqliteSaver with durability='sync'"
    )
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
        "--url", help="Redis URL (default: $RUNNER_BENCH_REDIS_URL, local DB 15, else embedded)"
    )
    parser.add_argument("--profile", choices=CASES, help="cProfile one case instead")
    parser.add_argument(
        "--fsync",
        default="everysec,always",
        help="comma-separated appendfsync settings of private redis-servers to add as cases "
        f"({', '.join(f for f in FSYNC if f != 'none')}; empty: none)",
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.warmup < 0:
        parser.error("--n must be >= 1 and --warmup >= 0")
    args.fsync = [f for f in args.fsync.split(",") if f]
    if set(args.fsync) - set(FSYNC):
        parser.error(f"--fsync takes {', '.join(FSYNC)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when it ran (whatever the verdict), 1 when Redis is unreachable."""
    args = parse_args(argv)
    started = time.perf_counter()
    prefix = f"bench-flow-{uuid.uuid4().hex[:8]}"
    try:
        with (
            bench_redis(args.url) as target,
            tempfile.TemporaryDirectory() as tmp,
            contextlib.ExitStack() as stack,
        ):
            durable = {f: stack.enter_context(redis_server(f)) for f in args.fsync}
            configs = make_configs(target, prefix, Path(tmp), durable)
            admin = target.client()
            try:
                check(configs)
                if args.profile:
                    profile(configs[args.profile], args.n)
                    return 0
                held = held_by(configs, target, durable)
                cases = {name: case(config) for name, config in configs.items()}
                others, saver_cm = langgraph_cases(Path(tmp))
                if saver_cm is not None:
                    stack.callback(saver_cm.__exit__, None, None, None)
                    held["langgraph"] = "nothing persisted"
                cases.update(others)
                samples = interleave(cases, n=args.n, warmup=args.warmup)
                if saver_cm is not None:  # the saver set its journal mode on first use
                    with contextlib.closing(sqlite3.connect(Path(tmp) / "langgraph.db")) as db:
                        held["langgraph+sqlite"] = sqlite_sync(db)
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
            report(samples, commits, target, args.n, args.warmup, held)
            print(f"- cleanup: removed {removed} keys under {prefix}:, {left} left")
    except StoreUnavailable as exc:
        print(f"flow_inprocess: {exc}", file=sys.stderr)
        return 1
    print(f"- elapsed: {time.perf_counter() - started:.1f} s")
    return 0


def held_by(
    configs: dict[str, CheckpointConfig | None],
    target: BenchRedis,
    durable: dict[str, BenchRedis],
) -> dict[str, str]:
    """Each runner case's durability, as the table states it."""
    with contextlib.closing(target.client()) as client:
        held = {"none": "nothing persisted", "redis": f"Redis, {durability(client)}"}
    for fsync in durable:
        held[f"redis-{fsync}"] = f"Redis, {durability_of(fsync)}"
    sqlite = configs["sqlite"]
    assert sqlite is not None
    path = sqlite.store().path  # type: ignore[attr-defined]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        held["sqlite"] = sqlite_sync(conn)
    held["json"] = "a file per checkpoint, fsync'ed"
    return held


if __name__ == "__main__":
    sys.exit(main())
