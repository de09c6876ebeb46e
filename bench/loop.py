"""Benchmark: does a step cost the same at iteration 3,000 as at iteration 10?

Usage::

    python bench/loop.py [--iterations 3000] [--repeat 3] [--url URL] [--profile]
                         [--fsync always]

A flow whose router loops over a step that increments one integer (:class:`LoopFlow`: the
start ``step``, re-run on the label ``again`` of the router ``loop``), run in this process
with ``CheckpointConfig(provider=RedisProvider(...))``: every iteration commits two
checkpoints (the step's and the router's). Beside it, in the same run, the baseline the
issue measured against: LangGraph with ``SqliteSaver`` (a file in a temp directory) running
the same loop, a ``step`` node and a conditional edge back to it (LangGraph's router), one
checkpoint per iteration, with its default ``durability="async"`` (a node's checkpoint is
written in the background while the next node runs; the run waits for the last) and with
``durability="sync"`` (written before the next node runs, as ours are). SQLite runs in WAL
mode with ``synchronous=FULL``, an fsync per commit, so ours also runs on a private
``redis-server`` with ``appendfsync always`` (``--fsync``, comma-separated; empty for none)
beside the benchmark's Redis; each column states its durability. If ``langgraph`` and
``langgraph-checkpoint-sqlite`` (the ``bench`` extra) are not installed, the baseline is a raw
Redis MULTI/EXEC of the same writes as each of our checkpoints (SET snapshot, ZADD history,
HSET run meta), two per iteration, and the table says so.

The runs alternate (each case once per round, the order rotating) ``--repeat`` times,
garbage collector off.
Each step records ``time.perf_counter()`` when it starts; an iteration's time is the gap
between two starts, so it includes the step, the router and their commits. The table gives,
around iterations 10 / 100 / 1,000 / 3,000 (the median over the iterations within 10 of
the mark, or within a tenth of it if more, then the median over the repeats), the time per
iteration and the bytes of the checkpoint written at that iteration (ours: the router's
checkpoint JSON as stored; LangGraph: the checkpoint row, ``checkpoint`` + ``metadata``
blobs), then the whole run from ``kickoff``/``invoke`` to its return: what a caller waits
(LangGraph's ``async`` gaps leave its background writes out; its whole run has them), and
the ratio of each whole run to the fastest LangGraph one. Target: iteration 3,000 within
1.2x of iteration 10, in time and in bytes. ``--profile`` prints the top of a cProfile of
one run of ours instead.

Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of 127.0.0.1:6379, else a
private embedded server (see :mod:`bench._common`). Only keys under a fresh per-process
prefix are written, and they are deleted at the end; no DB is flushed.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import redis

from runner import CheckpointConfig, Flow, FlowState, ids, router, start
from runner.errors import StoreUnavailable
from runner.store.models import Checkpoint
from runner.store.redis import RedisProvider

try:
    from bench._common import (
        bench_redis,
        count_keys,
        delete_prefix,
        durability,
        durability_of,
        print_table,
        redis_server,
    )
except ModuleNotFoundError:  # run as `python bench/loop.py`: bench/ is on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from _common import (  # type: ignore[no-redef]
        bench_redis,
        count_keys,
        delete_prefix,
        durability,
        durability_of,
        print_table,
        redis_server,
    )

MARKS = (10, 100, 1000, 3000)
"""Iterations the table reports (those beyond ``--iterations`` are left out)."""
WINDOW = 10
"""An iteration's time is the median over the iterations within this distance of it, or
within a tenth of its number if that is more (one noisy moment cannot sway the median)."""
TARGET = 1.2
"""Iteration 3,000 may cost at most this many times iteration 10 (time and bytes)."""
MAX_CALLS = 1_000_000
"""``max_calls`` of the loop's methods: the benchmark loops far beyond the default 100."""


class LoopState(FlowState):
    """One integer the step increments, and where the router stops."""

    counter: int = 0
    target: int = 0


class LoopFlow(Flow[LoopState]):
    """``step`` -> ``loop`` -> ``again`` -> ``step`` ... until ``counter == target``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stamps: list[float] = []

    @start("again", max_calls=MAX_CALLS)
    def step(self) -> int:
        self.stamps.append(time.perf_counter())
        self.state.counter += 1
        return self.state.counter

    @router(step, max_calls=MAX_CALLS)
    def loop(self) -> str:
        return "again" if self.state.counter < self.state.target else "done"


@dataclass
class Run:
    """One timed run: when each iteration started, the run's time, checkpoint bytes."""

    stamps: list[float]
    total: float
    sizes: dict[int, int] = field(default_factory=dict)
    """Iteration -> bytes of the checkpoint written at its end."""

    def per_iteration(self, at: int) -> float:
        """Median seconds of the iterations within :func:`reach` of iteration ``at``."""
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]
        low, high = max(0, at - 1 - reach(at)), min(len(gaps), at + reach(at))
        return statistics.median(gaps[low:high])


def reach(at: int) -> int:
    """How far from iteration ``at`` the iterations its time is the median of lie."""
    return max(WINDOW, at // 10)


@contextmanager
def no_gc() -> Iterator[None]:
    """The garbage collector off (as :mod:`timeit` does), after a full collection."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class SizingProvider(RedisProvider):
    """A :class:`RedisProvider` that notes the bytes of the router's checkpoints at the
    iterations of :data:`MARKS` as it commits them (older ones are pruned by then)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sizes: dict[int, int] = {}
        self.marks = {f"loop#{k}": k for k in MARKS}
        self.sample = ""
        """The JSON of the first mark's checkpoint (the raw baseline writes it)."""

    def commit(self, checkpoint: Checkpoint, **kwargs: Any) -> Checkpoint:
        if checkpoint.activation in self.marks:
            body = checkpoint.model_dump_json()
            self.sizes[self.marks[checkpoint.activation]] = len(body.encode())
            self.sample = self.sample or body
        return super().commit(checkpoint, **kwargs)


def run_ours(provider: SizingProvider, iterations: int) -> Run:
    """One run of :class:`LoopFlow` (the default ``max_checkpoints``: older ones pruned)."""
    provider.sizes.clear()
    flow = LoopFlow(checkpoint=CheckpointConfig(provider=provider))
    with no_gc():
        began = time.perf_counter()
        assert flow.kickoff(inputs={"target": iterations}) == "done"
        total = time.perf_counter() - began
    assert flow.state.counter == iterations and len(flow.stamps) == iterations
    return Run(flow.stamps, total, dict(provider.sizes))


class LoopDict(TypedDict):
    """LangGraph's state: the same one integer."""

    counter: int


def langgraph_runner(tmp: Path, durability: str) -> Callable[[int, bool], Run] | None:
    """A function running the loop on LangGraph + SqliteSaver with ``durability``
    (``"async"``, LangGraph's default, or ``"sync"``), or ``None`` if not installed."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return None

    def run(iterations: int, sizes: bool) -> Run:
        stamps: list[float] = []

        def step(state: LoopDict) -> dict[str, int]:
            stamps.append(time.perf_counter())
            return {"counter": state["counter"] + 1}

        def loop(state: LoopDict) -> str:
            return "step" if state["counter"] < iterations else END

        graph = StateGraph(LoopDict)
        graph.add_node("step", step)
        graph.add_edge(START, "step")
        graph.add_conditional_edges("step", loop)
        path = tmp / f"langgraph-{uuid.uuid4().hex[:8]}.db"
        config: Any = {"configurable": {"thread_id": "loop"}, "recursion_limit": iterations + 10}
        with SqliteSaver.from_conn_string(str(path)) as saver:
            app = graph.compile(checkpointer=saver)
            with no_gc():
                began = time.perf_counter()
                mode: Any = durability  # "async" or "sync" (a Literal to LangGraph)
                out = app.invoke({"counter": 0}, config, durability=mode)
                total = time.perf_counter() - began
        assert out == {"counter": iterations} and len(stamps) == iterations
        result = Run(stamps, total)
        if sizes:
            with sqlite3.connect(path) as db:
                rows = db.execute(
                    "SELECT metadata, length(checkpoint) + length(metadata) FROM checkpoints"
                ).fetchall()
            for metadata, size in rows:
                k = json.loads(metadata).get("step")  # after the k-th run of "step"
                if k in MARKS:
                    result.sizes[k] = size
        path.unlink()
        return result

    return run


def raw_runner(
    client: redis.Redis, prefix: str, provider: SizingProvider
) -> Callable[[int, bool], Run]:
    """The fallback baseline: per iteration two raw MULTI/EXECs of a checkpoint's writes
    (SET snapshot, ZADD history, HSET run meta), the snapshot being one of ours."""

    def run(iterations: int, sizes: bool) -> Run:
        doc = json.loads(provider.sample)  # our checkpoint at the first mark, run before
        run_key, stamps = f"{prefix}:raw-{uuid.uuid4().hex[:8]}", []
        with no_gc():
            began = time.perf_counter()
            for i in range(1, iterations + 1):
                stamps.append(time.perf_counter())
                for seq in (2 * i, 2 * i + 1):
                    state = {**doc["state"], "counter": i}
                    fields = {"id": ids.checkpoint_id(), "seq": seq, "state": state}
                    body = json.dumps({**doc, **fields}, separators=(",", ":"))
                    pipe = client.pipeline(transaction=True)
                    pipe.set(f"{run_key}:ckpt:{seq}", body)
                    pipe.zadd(f"{run_key}:history", {str(seq): seq})
                    pipe.hset(f"{run_key}:meta", mapping={"seq": seq, "updated_at": time.time()})
                    pipe.execute()
            total = time.perf_counter() - began
        result = Run(stamps, total)
        if sizes:
            result.sizes = {k: len(body.encode()) for k in MARKS if k <= iterations}
        return result

    return run


def median_of(runs: list[Run], at: int) -> float:
    """Median over the runs of the time per iteration around ``at``, in ms."""
    return statistics.median(r.per_iteration(at) for r in runs) * 1000


def _bytes(run: Run, at: int) -> str:
    return f"{run.sizes[at]:,}" if at in run.sizes else "-"


@dataclass
class Case:
    """One column of the table: how a run is made, what it persists, its runs."""

    label: str
    durability: str
    run: Callable[[int, bool], Run]
    ours: bool
    runs: list[Run] = field(default_factory=list)


def report(cases: list[Case], iterations: int, source: str) -> None:
    """Print the table and the verdict."""
    marks = [k for k in MARKS if k <= iterations]
    repeat = len(cases[0].runs)
    print(
        f"## A router looping over one step, {iterations:,} iterations "
        f"(median of {repeat} runs each, rotating order)\n"
    )
    headers = ["loop iteration (step + router)"]
    for case in cases:
        headers += [f"{case.label} ms", f"{case.label} checkpoint bytes"]
    rows: list[list[object]] = [
        ["durability", *(cell for c in cases for cell in (c.durability, ""))]
    ]
    for k in marks:
        rows.append(
            [
                f"around iteration {k:,}",
                *(
                    cell
                    for c in cases
                    for cell in (f"{median_of(c.runs, k):.3f}", _bytes(c.runs[0], k))
                ),
            ]
        )
    whole = [statistics.median(r.total for r in c.runs) for c in cases]
    fastest = min((w for w, c in zip(whole, cases, strict=True) if not c.ours), default=None)
    rows.append(
        [
            f"whole run of {iterations:,} (s)",
            *(cell for w in whole for cell in (f"{w:.2f}", "")),
        ]
    )
    if fastest:
        rows.append(
            [
                "whole run vs the fastest baseline",
                *(cell for w in whole for cell in (f"{w / fastest:.2f}x", "")),
            ]
        )
    print_table(headers, rows)
    ours = next(c for c in cases if c.ours).runs
    first, last = marks[0], marks[-1]
    time_ratio = median_of(ours, last) / median_of(ours, first)
    size_ratio = ours[0].sizes[last] / ours[0].sizes[first]
    verdict = "PASS" if time_ratio <= TARGET and size_ratio <= TARGET else "FAIL"
    print(
        f"target: iteration {last:,} within {TARGET}x of iteration {first:,}: "
        f"time {time_ratio:.2f}x, checkpoint bytes {size_ratio:.2f}x  {verdict}"
    )
    for case in cases:
        if not case.ours:
            ratio = median_of(case.runs, last) / median_of(case.runs, first)
            print(
                f"baseline in this run: {case.label} iteration {last:,} / {first:,}: {ratio:.2f}x"
            )
    print()
    print("notes:")
    print(
        "- ours: two checkpoints per iteration (step, router), each one EVALSHA to Redis; "
        "bytes: the router's checkpoint JSON"
    )
    print(
        f"- time per iteration: median of the iterations within {WINDOW} of it, or within a "
        "tenth of its number if more (1,000: 900-1,100), then median over the runs"
    )
    print(
        "- whole run: kickoff()/invoke() to its return; LangGraph async writes each checkpoint "
        "in the background during the next node (its gaps leave them out, its whole run not)"
    )
    print(f"- redis via {source}")


def profile(provider: SizingProvider, iterations: int) -> None:
    """Print the top of a cProfile of one run of ours."""
    prof = cProfile.Profile()
    prof.enable()
    run_ours(provider, iterations)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=3000, help="loop iterations per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, alternating")
    parser.add_argument(
        "--url", help="Redis URL (default: $RUNNER_BENCH_REDIS_URL, local DB 15, else embedded)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one run of ours")
    parser.add_argument(
        "--fsync",
        default="always",
        help="comma-separated appendfsync settings of private redis-servers ours also runs on "
        "(everysec, always; empty: none)",
    )
    args = parser.parse_args(argv)
    if args.iterations < MARKS[0] + WINDOW or args.repeat < 1:
        parser.error(f"--iterations must be >= {MARKS[0] + WINDOW} and --repeat >= 1")
    args.fsync = [f for f in args.fsync.split(",") if f]
    if set(args.fsync) - {"everysec", "always"}:
        parser.error("--fsync takes everysec, always")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when it ran (whatever the verdict), 1 when Redis is unreachable."""
    args = parse_args(argv)
    started = time.perf_counter()
    prefix = f"bench-loop-{uuid.uuid4().hex[:8]}"
    try:
        with (
            bench_redis(args.url) as target,
            tempfile.TemporaryDirectory() as tmp,
            contextlib.ExitStack() as stack,
        ):
            provider = SizingProvider(target.url, prefix=prefix)
            stack.callback(provider.close)
            admin = target.client()
            try:
                if args.profile:
                    profile(provider, args.iterations)
                    return 0
                with contextlib.closing(target.client()) as probe:
                    held = f"Redis, {durability(probe)}"
                cases = [Case("runner", held, lambda n, _: run_ours(provider, n), True)]
                for fsync in args.fsync:
                    server = stack.enter_context(redis_server(fsync))
                    durable = SizingProvider(server.url, prefix=prefix)
                    stack.callback(durable.close)
                    cases.append(
                        Case(
                            f"runner, AOF {fsync}",
                            f"Redis, {durability_of(fsync)}",
                            lambda n, _, d=durable: run_ours(d, n),  # type: ignore[misc]
                            True,
                        )
                    )
                for mode in ("async", "sync"):
                    other = langgraph_runner(Path(tmp), mode)
                    if other is not None:
                        sqlite = "SQLite WAL, synchronous=FULL (fsync per commit)"
                        cases.append(Case(f"LangGraph {mode}", sqlite, other, False))
                if len(cases) == 1 + len(args.fsync):
                    raw = "raw MULTI/EXEC (langgraph not installed)"
                    cases.append(Case(raw, held, raw_runner(admin, prefix, provider), False))
                for i in range(args.repeat):
                    shift = i % len(cases)
                    for case in cases[shift:] + cases[:shift]:
                        case.runs.append(case.run(args.iterations, i == 0))
            finally:
                removed = delete_prefix(admin, prefix + ":")
                left = count_keys(admin, prefix + ":")
                admin.close()
            report(cases, args.iterations, target.source)
            print(f"- cleanup: removed {removed} keys under {prefix}:, {left} left")
    except StoreUnavailable as exc:
        print(f"loop: {exc}", file=sys.stderr)
        return 1
    print(f"- elapsed: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
