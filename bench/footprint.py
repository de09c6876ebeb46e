"""Benchmark: what a finished run keeps in Redis, before and after retention archives it, and
Redis memory over many runs under a 0-day retention.

Usage::

    python -m bench.footprint [--runs 10000] [--every 100] [--url URL]

The run is :class:`tests.flows.retained.Report`: five steps, two state fields of about 2 KB
each, run **in process** (``kickoff`` with every checkpoint written to Redis, as a worker's
commits are), so the numbers are the store's and not the broker's.

1. **Per finished run**: ``MEMORY USAGE`` of each of one run's keys (and the run's share of
   the index entries, from ``used_memory`` over 200 runs), then the same after a retention
   pass (``succeeded=0s``, archive a SQLite file) moved them out: what stays in Redis, and
   what the archive file grew by per run.
2. **Flat memory**: on a private Redis (an embedded ``redis-server``, so ``used_memory`` is
   the bench's alone), ``--runs`` runs under ``RUNNER_RETENTION=succeeded=0s`` with a
   retention pass (:func:`runner.distributed.retention.collect`, as the workers' recovery
   pass runs it, batch ``RUNNER_RETENTION_BATCH``) after every ``--every`` runs; the runs'
   keys (SCAN, ``MEMORY USAGE``) and ``used_memory`` sampled ten times, beside what the runs
   would keep with no retention.
3. **Longest Redis call of a pass**: on a private Redis (an embedded ``redis-server`` whose
   ``SLOWLOG`` logs every command), one pass with the archive on over 101 runs, one of them
   holding 200 checkpoints (``RUNNER_MAX_CHECKPOINTS``' default): the longest time each
   command blocked the server, and the client's longest round trip.

Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of 127.0.0.1:6379, else a
private embedded server (:mod:`bench._common`). Only keys under a fresh prefix are written,
and they are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._common import bench_redis, delete_prefix, print_table, scan_prefix, with_db
from runner import CheckpointConfig
from runner.distributed.retention import close_archives, collect
from runner.embedded import EmbeddedRedis
from runner.ids import checkpoint_id
from runner.settings import RunnerSettings
from runner.store.redis import RedisProvider
from tests.flows.retained import Report

PIPE = "pipeline"
PARTS = ("meta", "history", "snaps", "attempts", "acts", "values", "refs", "pins", "dispatched")


def kickoff(store: RedisProvider) -> str:
    """One finished run of the footprint flow in ``store``; its id."""
    flow = Report(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))
    flow.kickoff()
    return str(flow.state.id)


def run_bytes(store: RedisProvider, run_id: str) -> dict[str, int]:
    """``MEMORY USAGE`` of each key of the run that exists, by its part name."""
    found = {}
    for part in PARTS:
        size = store.client.memory_usage(store.keys.run(run_id, part), samples=0)
        if size:
            found[part] = int(size)
    return found


def used_memory(store: RedisProvider) -> int:
    return int(store.client.info("memory")["used_memory"])


def prefix_bytes(store: RedisProvider) -> tuple[int, int]:
    """(keys, bytes) under the store's prefix."""
    keys = list(scan_prefix(store.client, store.keys.prefix + ":"))
    pipe = store.client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    return len(keys), sum(int(size or 0) for size in pipe.execute())


@contextlib.contextmanager
def timed_commands(store: RedisProvider) -> Iterator[dict[str, float]]:
    """Time every command the store's client sends (name -> longest seconds)."""
    longest: dict[str, float] = {}
    client = store.client
    original = client.execute_command

    def timed(*args: Any, **options: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **options)
        finally:
            name = str(args[0]).upper()
            longest[name] = max(longest.get(name, 0.0), time.perf_counter() - start)

    make_pipeline = client.pipeline

    def pipeline(*args: Any, **options: Any) -> Any:
        pipe = make_pipeline(*args, **options)
        execute = pipe.execute

        def timed_execute(*a: Any, **o: Any) -> Any:
            start = time.perf_counter()
            try:
                return execute(*a, **o)
            finally:
                seconds = time.perf_counter() - start
                longest[PIPE] = max(longest.get(PIPE, 0), seconds)

        pipe.execute = timed_execute
        return pipe

    client.execute_command, client.pipeline = timed, pipeline
    try:
        yield longest
    finally:
        del client.execute_command, client.pipeline


def per_run(url: str, root: str, archive_dir: Path) -> int:
    store = RedisProvider(url, prefix=f"{root}-one")
    settings = RunnerSettings(prefix=store.keys.prefix, redis_url=url, retention="succeeded=0s")
    sample = kickoff(store)
    sizes = run_bytes(store, sample)
    before = used_memory(store)
    many = 200
    for _ in range(many - 1):
        kickoff(store)
    share = (used_memory(store) - before) / (many - 1)
    archive = archive_dir / "footprint.db"
    collect(store, settings.model_copy(update={"archive": str(archive), "retention_batch": 500}))
    after = run_bytes(store, sample)
    keys_left, bytes_left = prefix_bytes(store)
    close_archives()
    rows = [[f"`{part}`", size] for part, size in sizes.items()]
    rows.append(["**all keys of the run (MEMORY USAGE)**", sum(sizes.values())])
    rows.append(["per run from `used_memory` over 200 runs (keys + index entries)", int(share)])
    rows.append(["after archive + expiry: the run's keys", sum(after.values())])
    rows.append([f"after archive + expiry: keys left of all {many} runs", keys_left])
    rows.append([f"after archive + expiry: bytes left of all {many} runs", bytes_left])
    rows.append(["SQLite archive file per run", int(archive.stat().st_size / many)])
    print("Bytes a finished run keeps in Redis (five steps, two ~2 KB state fields)\n")
    print_table(["what", "bytes"], rows)
    store.close()
    return int(share)


def flat(root: str, runs: int, every: int, per_run_bytes: int) -> None:
    """On a private Redis (so ``used_memory`` is the bench's alone): ``runs`` runs under a
    0-day retention, a pass every ``every`` runs."""
    with EmbeddedRedis() as server:
        url = with_db(server.url, 1)
        store = RedisProvider(url, prefix=f"{root}-flat")
        settings = RunnerSettings(prefix=store.keys.prefix, redis_url=url, retention="succeeded=0s")
        rows, start = [], time.perf_counter()
        # Sampled right after a pass: between passes up to `every` runs wait for the next one.
        samples = {1, *(max(runs * i // 10 // every * every, every) for i in range(1, 11)), runs}
        baseline = used_memory(store)
        for n in range(1, runs + 1):
            kickoff(store)
            if n % every == 0 or n == runs:
                collect(store, settings)
            if n in samples:
                keys, size = prefix_bytes(store)
                delta = (used_memory(store) - baseline) / 1024
                kept = n * per_run_bytes / 1024
                rows.append([n, keys, f"{size / 1024:.1f}", f"{delta:+.0f}", f"{kept:,.0f}"])
        took = time.perf_counter() - start
        store.close()
    print(
        f"Memory over {runs} runs in process on a private Redis, RUNNER_RETENTION=succeeded=0s, "
        f"a retention pass every {every} runs ({took:.0f} s, {runs / took:.0f} runs/s)\n"
    )
    headers = ["runs done", "run keys", "run KB", "used_memory Δ KB", "KB kept with no retention"]
    print_table(headers, rows)


def longest_call(root: str, archive_dir: Path) -> None:
    """On a private Redis (its SLOWLOG logging every command): one pass over 101 runs."""
    with EmbeddedRedis() as server:
        url = with_db(server.url, 1)
        store = RedisProvider(url, prefix=f"{root}-block", max_checkpoints=0)
        settings = RunnerSettings(
            prefix=store.keys.prefix,
            redis_url=url,
            retention="succeeded=0s",
            retention_batch=200,
            archive=str(archive_dir / "block.db"),
        )
        big = kickoff(store)
        template = store.latest(big)
        assert template is not None
        # A run at RUNNER_MAX_CHECKPOINTS' default: 200 checkpoints of its ~4 KB state.
        fresh = template.model_copy(update={"run_id": f"{big}-200", "activation": None})
        seq = 0
        for _ in range(200):
            made = store.commit(fresh.model_copy(update={"id": checkpoint_id()}), expected_seq=seq)
            seq = made.seq or seq + 1
        for _ in range(99):
            kickoff(store)
        store.client.config_set("slowlog-log-slower-than", 0)
        store.client.config_set("slowlog-max-len", 100_000)
        store.client.slowlog_reset()
        with timed_commands(store) as longest:
            done = collect(store, settings)
        close_archives()
        logged = store.client.slowlog_get(100_000)
        store.close()
    by_command: dict[str, list[int]] = {}
    for entry in logged:
        name = entry["command"].split()[0].decode().upper()
        if name not in ("SLOWLOG", "CONFIG"):
            by_command.setdefault(name, []).append(int(entry["duration"]))
    rows = [
        [name, len(times), max(times), f"{longest.get(name, 0) * 1000:.2f}"]
        for name, times in sorted(by_command.items())
    ]
    rows.append(["(pipelines, client round trip)", "", "", f"{longest.get(PIPE, 0) * 1000:.2f}"])
    print(
        f"One retention pass (archive: SQLite) over 101 runs, one of them 200 checkpoints: "
        f"{len(done.expired)} expired. Time each command blocked Redis (SLOWLOG, private "
        "server logging every command) and the client's longest round trip\n"
    )
    print_table(["command", "calls", "longest µs (server)", "longest ms (client)"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--url")
    args = parser.parse_args()
    root = f"bench-fp-{uuid.uuid4().hex[:8]}"
    with bench_redis(args.url) as target, tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("RUNNER_REDIS_URL", target.url)
        print(f"Redis: {target.masked} ({target.source})\n")
        admin = target.client()
        try:
            per_run_bytes = per_run(target.url, root, Path(tmp))
            longest_call(root, Path(tmp))
            flat(root, args.runs, args.every, per_run_bytes)
        finally:
            delete_prefix(admin, root)
            admin.close()


if __name__ == "__main__":
    main()
