"""Benchmark: latency of one checkpoint commit to Redis, against raw redis-py baselines.

Usage::

    python bench/store_commit.py [--n 1000] [--warmup 100] [--big 20] [--url URL]

For a flow state of 2 KB and of 50 KB, it times (``time.perf_counter``) ``--n`` commits of
each case after ``--warmup`` untimed ones, the cases interleaved in rotating order:

* **store**: ``RedisProvider(url, prefix=...).commit(checkpoint, max_checkpoints=50)``: one
  EVALSHA of the COMMIT script with a realistic record (state of the given size, outputs, a
  completed list, step, activation ``step#i`` and an attempt token, so the idempotency
  bookkeeping runs and trimming deletes a snapshot on every commit once 50 are kept);
* **raw MULTI/EXEC**: one redis-py transaction pipeline with the comparable writes (HSET
  snapshot into the run's snapshot hash, ZADD history, HSET meta, ZADD runs index, HSET
  checkpoint index, ZREMRANGEBYRANK history to 50; it does *not* delete trimmed snapshots);
* **raw EVALSHA**: a minimal Lua script doing HSET+ZADD+HSET, the lower bound of one scripted
  round trip carrying the same snapshot.

Every case serializes the checkpoint inside the timed region (the store with pydantic's
``model_dump_json``, the raw cases with ``json.dumps`` of the same record as a dict); building
the :class:`Checkpoint` is outside it. Prints a Markdown table (p50/p95/mean in µs and the p50
ratio to raw MULTI/EXEC), the target "p50 within 1.5x of raw MULTI/EXEC" with PASS/FAIL per
state size, and the memory flatness check: after all commits with ``max_checkpoints=50`` the run
keeps 50 snapshots, 50 history entries, 50 lookup entries and 50 attempts entries.

Then the **Redis Cluster** table: the same store commits on a local cluster of three masters
(started for the benchmark with ``redis-server --cluster-enabled yes`` on loopback ports, see
:mod:`bench._cluster`) beside the single Redis, interleaved in one run, p50 ratio cluster/single.
Skipped with a note when ``redis-server``/``redis-cli`` are not on ``PATH``.

Last, the **small change of a big state** table: a 5 MB state (5,000 pages of 1 KB and a
100-byte summary) whose steps each change only the summary, committed ``--big`` times (after 2
warm-up) by the store beside the whole-snapshot baseline (a raw HSET of the checkpoint's full
JSON, what every checkpoint cost before the state was stored by field), interleaved. Per step:
bytes sent to Redis (counted on the client's connection), bytes the step adds to Redis's memory
(``MEMORY USAGE`` of the run's keys, every checkpoint kept), and p50 latency.

Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of 127.0.0.1:6379, else a private
embedded server (see :mod:`bench._common`). Only keys under a fresh per-process prefix are
written, and they are deleted at the end; no DB is flushed. Exits 0 whatever the verdicts (1 if
Redis cannot be reached).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.cluster import RedisCluster

from runner.errors import StoreUnavailable
from runner.store.keys import CLUSTER_SHARDS, Keys
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider

try:
    from bench._cluster import cluster_tools, local_cluster
    from bench._common import (
        FSYNC,
        BenchRedis,
        Summary,
        bench_redis,
        count_keys,
        delete_prefix,
        durability,
        interleave,
        print_table,
        summarize,
    )
    from bench._wire import counted_client
except ModuleNotFoundError:  # run as `python bench/store_commit.py`: bench/ is on sys.path
    from _cluster import cluster_tools, local_cluster  # type: ignore[no-redef]
    from _common import (  # type: ignore[no-redef]
        FSYNC,
        BenchRedis,
        Summary,
        bench_redis,
        count_keys,
        delete_prefix,
        durability,
        interleave,
        print_table,
        summarize,
    )
    from _wire import counted_client  # type: ignore[no-redef]

SIZES: dict[str, int] = {"2 KB": 2 * 1024, "50 KB": 50 * 1024}
"""State sizes benchmarked: label -> bytes of the state's JSON."""
KEEP = 50
"""``max_checkpoints`` of every commit (and the trim length of the raw pipeline)."""
TARGET = 1.5
"""The store's p50 must be within this factor of raw MULTI/EXEC's."""
COMPLETED_WINDOW = 8
"""Activations in each record's ``completed`` list (a sliding window, so its size stays put)."""

STORE = "store: RedisProvider.commit"
MULTI = "raw MULTI/EXEC (trim keeps snapshot keys)"
LUA = "raw EVALSHA HSET+ZADD+HSET"
CASES = (STORE, MULTI, LUA)
HEADERS = ("case", "state", "p50 µs", "p95 µs", "mean µs", "ratio p50 vs raw MULTI/EXEC")

CLUSTER = "store on Redis Cluster (3 masters)"
SINGLE = "store on a single Redis"
CLUSTER_HEADERS = ("case", "state", "p50 µs", "p95 µs", "mean µs", "ratio p50 vs single")
DELTA = "store: changed fields only"
WHOLE = "whole snapshot (raw HSET of the full JSON)"
DELTA_HEADERS = (
    "case",
    "bytes sent per step",
    "bytes stored per step",
    "p50 µs",
    "sent vs whole snapshot",
)
BIG_PAGES, PAGE_BYTES, SUMMARY_BYTES = 5000, 1000, 100
"""The big state: 5,000 pages of 1,000 bytes (5 MB) and a summary of 100 bytes."""
DELTA_TARGET = 100_000
"""A step changing the summary must send well under this many bytes."""

MINIMAL_LUA = """
-- KEYS[1] snapshots hash  KEYS[2] history zset  KEYS[3] meta hash
-- ARGV[1] snapshot JSON  ARGV[2] seq  ARGV[3] checkpoint id
redis.call('HSET', KEYS[1], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[3], 'seq', ARGV[2], 'latest', ARGV[3])
return 1
"""

STEPS = ("research", "outline", "draft", "review", "publish")
FLOW = "examples.research:ResearchFlow"
WORDS = (
    *("agent", "crew", "task", "flow", "state", "router", "listen", "start", "output", "tool"),
    *("search", "result", "summary", "draft", "review", "source", "citation", "market"),
    *("revenue", "growth", "risk", "customer", "product", "launch", "pricing", "churn"),
    *("forecast", "quarter", "region", "team", "budget", "model", "latency", "memory"),
)
COMPACT = (",", ":")


# -- records ---------------------------------------------------------------------------------


def make_state(run_id: str, size: int, seed: int = 7) -> dict[str, Any]:
    """A CrewAI-like flow state whose compact JSON is about ``size`` bytes (ASCII only)."""
    rng = random.Random(seed)
    state: dict[str, Any] = {
        "id": run_id,
        "topic": "quarterly market report",
        "iteration": 0,
        "approved": False,
        "scores": {"relevance": 0.82, "accuracy": 0.91, "style": 0.77},
        "sources": [],
        "messages": [],
    }
    while len(json.dumps(state, separators=COMPACT)) < size:
        if len(state["sources"]) < 8:
            state["sources"].append(
                f"https://example.com/{rng.choice(WORDS)}/{rng.randrange(10**6)}"
            )
        text = " ".join(rng.choices(WORDS, k=rng.randint(6, 30)))
        role = rng.choice(("user", "assistant", "tool"))
        state["messages"].append({"role": role, "content": text, "tokens": len(text) // 4})
    return state


def make_checkpoint(run_id: str, i: int, base_state: dict[str, Any]) -> Checkpoint:
    """The record step ``i`` of a flow would commit (activation ``step#i``, fresh attempt)."""
    step = STEPS[i % len(STEPS)]
    done = [f"{STEPS[j % len(STEPS)]}#{j}" for j in range(max(0, i - COMPLETED_WINDOW), i)]
    return Checkpoint(
        run_id=run_id,
        event="method_finished",
        step=step,
        activation=f"{step}#{i}",
        attempt=uuid.uuid4().hex,
        status=RunStatus.RUNNING,
        state={**base_state, "iteration": i},
        completed=done,
        outputs={
            "research": "Found 8 sources on the quarterly market; growth is strongest in APAC.",
            "outline": ["Summary", "Market", "Risks", "Forecast"],
            step: {"ok": True, "tokens": 412 + i % 97, "latency_ms": 830 + i % 211},
        },
        in_flight=[f"{STEPS[(i + 1) % len(STEPS)]}#{i + 1}"],
        record={"routes": {"review": "approved" if i % 3 else "revise"}, "counter": i},
        flow=FLOW,
        fingerprint="5f0c2a9e4b7d1c83",
        meta={"name": "ResearchFlow"},
    )


# -- cases -----------------------------------------------------------------------------------


@dataclass
class Runs:
    """The three cases of one state size: a run id each, under their own key prefixes."""

    root: str
    size: int

    def __post_init__(self) -> None:
        """Pick the run ids and build the shared base state."""
        self.keys = {case: Keys(f"{self.root}:{n}") for n, case in enumerate(CASES)}
        self.run_ids = {case: str(uuid.uuid4()) for case in CASES}
        self.state = make_state(self.run_ids[STORE], self.size)

    def checkpoint(self, case: str, i: int) -> Checkpoint:
        """Record ``i`` of ``case``'s run."""
        return make_checkpoint(self.run_ids[case], i, self.state)


def store_case(provider: RedisProvider, runs: Runs) -> Callable[[int], Callable[[], object]]:
    """Prepare ``RedisProvider.commit`` of record ``i`` (timed: dump + EVALSHA + reply)."""

    def prepare(i: int) -> Callable[[], object]:
        ckpt = runs.checkpoint(STORE, i)
        return lambda: provider.commit(ckpt, max_checkpoints=KEEP)

    return prepare


def multi_case(client: redis.Redis, runs: Runs) -> Callable[[int], Callable[[], object]]:
    """Prepare the raw MULTI/EXEC pipeline of record ``i`` (timed: json.dumps + pipeline)."""
    k, run = runs.keys[MULTI], runs.run_ids[MULTI]

    def prepare(i: int) -> Callable[[], object]:
        ckpt = runs.checkpoint(MULTI, i)
        doc, seq, cid = ckpt.model_dump(mode="json"), i + 1, ckpt.id
        doc["seq"] = seq

        def call() -> object:
            body = json.dumps(doc, separators=COMPACT)
            now = time.time()
            pipe = client.pipeline(transaction=True)
            pipe.hset(k.snapshots(run), cid, body)
            pipe.zadd(k.history(run), {cid: seq})
            pipe.hset(
                k.meta(run),
                mapping={
                    "seq": seq,
                    "latest": cid,
                    "updated_at": repr(now),
                    "status": ckpt.status.value,
                    "event": ckpt.event,
                    "step": ckpt.step or "",
                    "flow": FLOW,
                },
            )
            pipe.zadd(k.runs, {run: now})
            pipe.hset(k.checkpoints, cid, run)
            pipe.zremrangebyrank(k.history(run), 0, -(KEEP + 1))
            return pipe.execute()

        return call

    return prepare


def lua_case(client: redis.Redis, runs: Runs, sha: str) -> Callable[[int], Callable[[], object]]:
    """Prepare the minimal EVALSHA of record ``i`` (timed: json.dumps + EVALSHA)."""
    k, run = runs.keys[LUA], runs.run_ids[LUA]

    def prepare(i: int) -> Callable[[], object]:
        ckpt = runs.checkpoint(LUA, i)
        doc, seq, cid = ckpt.model_dump(mode="json"), i + 1, ckpt.id
        doc["seq"] = seq

        def call() -> object:
            body = json.dumps(doc, separators=COMPACT)
            return client.evalsha(
                sha, 3, k.snapshots(run), k.history(run), k.meta(run), body, seq, cid
            )

        return call

    return prepare


# -- the benchmark ---------------------------------------------------------------------------


@dataclass
class SizeResult:
    """Latencies and the flatness check of one state size."""

    label: str
    stats: dict[str, Summary]
    snapshot_bytes: dict[str, int]
    commits: int
    snapshots: int
    history_len: int
    index_entries: int
    attempts: int
    raw_snapshots: int

    @property
    def ratio(self) -> float:
        """The store's p50 over raw MULTI/EXEC's."""
        return self.stats[STORE].p50 / self.stats[MULTI].p50

    @property
    def flat(self) -> bool:
        """The run kept exactly ``KEEP`` of everything (snapshots, history, lookup, attempts)."""
        return self.snapshots == self.history_len == self.index_entries == self.attempts == KEEP


def run_size(
    label: str, size: int, target: BenchRedis, root: str, n: int, warmup: int
) -> SizeResult:
    """Benchmark the three cases at one state size and check the store's memory flatness."""
    runs = Runs(f"{root}:{size}", size)
    client = target.client()
    provider = RedisProvider(target.url, prefix=runs.keys[STORE].prefix, max_checkpoints=KEEP)
    try:
        sha = client.script_load(MINIMAL_LUA)
        samples = interleave(
            {
                STORE: store_case(provider, runs),
                MULTI: multi_case(client, runs),
                LUA: lua_case(client, runs, sha),
            },
            n=n,
            warmup=warmup,
        )
        snapshot_bytes = {}
        for case in CASES:
            keys, case_run = runs.keys[case], runs.run_ids[case]
            newest = cast(list[bytes], client.zrevrange(keys.history(case_run), 0, 0))[0]
            snapshot_bytes[case] = client.hstrlen(keys.snapshots(case_run), newest.decode())
        k, run = runs.keys[STORE], runs.run_ids[STORE]
        raw_k, raw_run = runs.keys[MULTI], runs.run_ids[MULTI]
        return SizeResult(
            label=label,
            stats={case: summarize(samples[case]) for case in CASES},
            snapshot_bytes=snapshot_bytes,
            commits=n + warmup,
            snapshots=client.hlen(k.snapshots(run)),
            history_len=client.zcard(k.history(run)),
            index_entries=client.hlen(k.checkpoints_of(run)),
            attempts=client.hlen(k.attempts(run)),
            raw_snapshots=client.hlen(raw_k.snapshots(raw_run)),
        )
    finally:
        provider.close()
        client.close()


def run_cluster(
    label: str, size: int, target: BenchRedis, ports: list[int], root: str, n: int, warmup: int
) -> dict[str, Summary]:
    """The store's commit on the local cluster beside the single Redis, at one state size."""
    prefix = f"{root}:cluster:{size}"
    single = RedisProvider(target.url, prefix=prefix, max_checkpoints=KEEP)
    cluster = RedisProvider(
        client=RedisCluster(host="127.0.0.1", port=ports[0]), prefix=prefix, max_checkpoints=KEEP
    )
    run_ids = {SINGLE: str(uuid.uuid4()), CLUSTER: str(uuid.uuid4())}
    state = make_state(run_ids[SINGLE], size)

    def case(provider: RedisProvider, name: str) -> Callable[[int], Callable[[], object]]:
        def prepare(i: int) -> Callable[[], object]:
            ckpt = make_checkpoint(run_ids[name], i, state)
            return lambda: provider.commit(ckpt, max_checkpoints=KEEP)

        return prepare

    try:
        samples = interleave(
            {SINGLE: case(single, SINGLE), CLUSTER: case(cluster, CLUSTER)}, n=n, warmup=warmup
        )
    finally:
        single.close()
        cluster.close()
    return {name: summarize(samples[name]) for name in (SINGLE, CLUSTER)}


@dataclass
class DeltaResult:
    """Bytes and latency per step of the big-state case."""

    steps: int
    sent: dict[str, float]
    stored: dict[str, float]
    stats: dict[str, Summary]
    first_commit_bytes: int


def run_delta(target: BenchRedis, root: str, steps: int) -> DeltaResult:
    """The big state's steps through the store beside whole snapshots, interleaved."""
    prefix = f"{root}:delta"
    client, wire = counted_client(target.url)
    raw_client, raw_wire = counted_client(target.url)
    store = RedisProvider(client=client, prefix=prefix, max_checkpoints=0)
    run, raw_run = str(uuid.uuid4()), str(uuid.uuid4())
    raw_key = Keys(f"{prefix}:raw").snapshots(raw_run)
    rng = random.Random(11)
    pages = ["".join(rng.choices("abcdefghij", k=PAGE_BYTES)) for _ in range(BIG_PAGES)]

    def big(run_id: str, i: int) -> Checkpoint:
        summary = "".join(rng.choices("klmnopqrst", k=SUMMARY_BYTES))
        state = {"id": run_id, "pages": pages, "summary": summary, "step": i}
        return Checkpoint(run_id=run_id, event="method_execution_finished", state=state)

    sent: dict[str, list[int]] = {DELTA: [], WHOLE: []}
    try:
        wire.reset()
        store.commit(big(run, 0))
        first = wire.bytes
        before = _memory(client, store.keys.run_pattern(run))

        def delta(i: int) -> Callable[[], object]:
            ckpt = big(run, i + 1)

            def call() -> object:
                wire.reset()
                done = store.commit(ckpt)
                sent[DELTA].append(wire.bytes)
                return done

            return call

        def whole(i: int) -> Callable[[], object]:
            ckpt = big(raw_run, i + 1)

            def call() -> object:
                raw_wire.reset()
                done = raw_client.hset(raw_key, ckpt.id, ckpt.model_dump_json())
                sent[WHOLE].append(raw_wire.bytes)
                return done

            return call

        samples = interleave({DELTA: delta, WHOLE: whole}, n=steps, warmup=2)
        commits = steps + 2
        grown = (_memory(client, store.keys.run_pattern(run)) - before) / commits
        raw_stored = _memory(raw_client, raw_key) / commits
    finally:
        store.close()
        raw_client.close()
    return DeltaResult(
        steps=steps,
        sent={name: statistics.median(values[-steps:]) for name, values in sent.items()},
        stored={DELTA: grown, WHOLE: raw_stored},
        stats={name: summarize(samples[name]) for name in (DELTA, WHOLE)},
        first_commit_bytes=first,
    )


def _memory(client: redis.Redis, pattern: str) -> int:
    """Bytes Redis uses for the keys matching ``pattern`` (exact: ``SAMPLES 0``)."""
    keys = list(client.scan_iter(match=pattern, count=1000))
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)


def report_delta(res: DeltaResult) -> None:
    """Print the big-state table and its verdict."""
    size = BIG_PAGES * PAGE_BYTES // 1_000_000
    print(
        f"## A step changing one {SUMMARY_BYTES}-byte field of a {size} MB state "
        f"({res.steps} steps after 2 warm-up)\n"
    )
    rows = []
    for name in (DELTA, WHOLE):
        ratio = res.sent[name] / res.sent[WHOLE]
        rows.append(
            [
                name,
                f"{res.sent[name]:,.0f}",
                f"{res.stored[name]:,.0f}",
                f"{res.stats[name].p50:.0f}",
                f"{ratio:.4f}x",
            ]
        )
    print_table(DELTA_HEADERS, rows)
    verdict = "PASS" if res.sent[DELTA] < DELTA_TARGET else "FAIL"
    print(
        f"target: a step sends well under {DELTA_TARGET:,} bytes: {res.sent[DELTA]:,.0f}  {verdict}"
    )
    print(
        f"notes: bytes sent are the medians counted on the client's connection (the whole "
        f"EVALSHA or HSET); the run's first commit sent the whole state "
        f"({res.first_commit_bytes:,} bytes); stored bytes are the growth of MEMORY USAGE over "
        "the run's keys per step, every checkpoint kept\n"
    )


def report_cluster(results: dict[str, dict[str, Summary]] | None, n: int, warmup: int) -> None:
    """Print the cluster table (or why it was skipped)."""
    print(f"## Checkpoint commit on Redis Cluster ({n} commits per case after {warmup} warm-up)\n")
    if results is None:
        print("skipped: redis-server and redis-cli are needed on PATH to start a local cluster\n")
        return
    rows = []
    for label, stats in results.items():
        base = stats[SINGLE].p50
        for name in (SINGLE, CLUSTER):
            st = stats[name]
            micros = [f"{st.p50:.0f}", f"{st.p95:.0f}", f"{st.mean:.0f}"]
            rows.append([name, label, *micros, f"{st.p50 / base:.2f}x"])
    print_table(CLUSTER_HEADERS, rows)
    print(
        "notes: the cluster is 3 masters on this machine's loopback, started for the run; the "
        "commit is the same one EVALSHA (every key in the run's slot), routed by redis-py's "
        "RedisCluster; the run index, checkpoint lookup and active runs are split into "
        f"{CLUSTER_SHARDS} shards, one per slot group\n"
    )


def report(
    target: BenchRedis, version: str, results: list[SizeResult], n: int, warmup: int
) -> None:
    """Print the table, the target verdicts, the flatness check and the notes."""
    print(f"## Checkpoint commit latency ({n} commits per case after {warmup} warm-up)\n")
    rows = []
    for res in results:
        base = res.stats[MULTI].p50
        for case in CASES:
            st = res.stats[case]
            micros = [f"{st.p50:.0f}", f"{st.p95:.0f}", f"{st.mean:.0f}"]
            rows.append([case, res.label, *micros, f"{st.p50 / base:.2f}x"])
    print_table(HEADERS, rows)

    print(f"target: p50 within {TARGET}x of raw MULTI/EXEC")
    for res in results:
        verdict = "PASS" if res.ratio <= TARGET else "FAIL"
        print(f"  {res.label:>5}: {res.ratio:.2f}x  {verdict}")
    print()
    print(f"memory flatness: what the store run keeps with max_checkpoints={KEEP}")
    for res in results:
        verdict = "PASS" if res.flat else "FAIL"
        print(
            f"  {res.label:>5}: {res.snapshots} snapshots after {res.commits} commits "
            f"(history {res.history_len}, checkpoint lookup {res.index_entries}, "
            f"attempts {res.attempts})  {verdict}"
        )
        print(f"         raw MULTI/EXEC left {res.raw_snapshots} snapshots")
    print()
    sizes = ", ".join(
        f"{res.label}: " + "/".join(str(res.snapshot_bytes[case]) for case in CASES)
        for res in results
    )
    print("notes:")
    print(
        f"- snapshot bytes written (store/multi/evalsha): {sizes}; the store's snapshot holds the "
        "state of a checkpoint under 16 KB; a bigger one's state goes by changed field beside it"
    )
    print(
        "- every case serializes inside the timed region (store: pydantic model_dump_json; raw: "
        "json.dumps of model_dump(mode='json'), compact); building the Checkpoint is not timed"
    )
    print(
        "- raw MULTI/EXEC: HSET snapshot, ZADD history, HSET meta (7 fields), ZADD runs index, "
        f"HSET checkpoint index, ZREMRANGEBYRANK history to {KEEP}; no HDEL of trimmed snapshots, "
        "no idempotency check, no attempts hash, no active-run index (the store does all of these)"
    )
    print(
        f"- cases interleaved per iteration in rotating order; GC off while timing; "
        f"redis {version} via {target.source} ({target.masked})"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=1000, help="timed commits per case and size")
    parser.add_argument("--warmup", type=int, default=100, help="untimed commits first")
    parser.add_argument(
        "--url", help="Redis URL (default: $RUNNER_BENCH_REDIS_URL, local DB 15, else embedded)"
    )
    parser.add_argument("--big", type=int, default=20, help="timed steps of the 5 MB state")
    parser.add_argument(
        "--fsync", choices=FSYNC, default=None, help="a private redis-server of this durability"
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.warmup < 0 or args.big < 1:
        parser.error("--n and --big must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when it ran (whatever the verdicts), 1 when Redis is unreachable."""
    args = parse_args(argv)
    started = time.perf_counter()
    root = f"bench-commit-{uuid.uuid4().hex[:8]}"
    try:
        with bench_redis(args.url, fsync=args.fsync) as target:
            admin = target.client()
            try:
                version = admin.info("server").get("redis_version", "?")
                held = durability(admin)
                results = [
                    run_size(label, size, target, root, args.n, args.warmup)
                    for label, size in SIZES.items()
                ]
                delta = run_delta(target, root, args.big)
                clustered = None
                if cluster_tools():
                    with local_cluster() as ports:
                        clustered = {
                            label: run_cluster(
                                label, size, target, ports, root, args.n, args.warmup
                            )
                            for label, size in SIZES.items()
                        }
            finally:
                removed = delete_prefix(admin, root + ":")
                left = count_keys(admin, root + ":")
                admin.close()
            print(f"durability: every case commits to the same Redis: {held}\n")
            report(target, version, results, args.n, args.warmup)
            print(f"- cleanup: removed {removed} keys under {root}:, {left} left")
            print()
            report_cluster(clustered, args.n, args.warmup)
            report_delta(delta)
    except StoreUnavailable as exc:
        print(f"store_commit: {exc}", file=sys.stderr)
        return 1
    print(f"- elapsed: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
