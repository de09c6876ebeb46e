"""Benchmark: what encryption at rest (``RUNNER_ENCRYPTION_KEYS``) costs a checkpoint commit.

Usage::

    python -m bench.store_encryption [--n 1000] [--warmup 100] [--url URL]

For the flow states of :mod:`bench.store_commit` (2 KB, written inside the snapshot, and
50 KB, written by field), it times ``--n`` commits of the same records (after ``--warmup``
untimed ones) by two providers on the same Redis, interleaved in rotating order: one writing
clear, one with a 256-bit AES-GCM key (:mod:`runner.store.codec`: the snapshot's payload
parts and each changed state field sealed). Each commit is of step ``i`` of its own run
(activation, attempt token, ``max_checkpoints=50``), dumping and sealing inside the timed
region, as :mod:`bench.store_commit`'s store case. Then it reads each run's latest checkpoint
``--n`` times (one round trip, opening it). Prints a Markdown table (p50/p95/mean in µs, p50
ratio sealed/clear) and the target "a sealed commit's p50 within 1.2x of a clear one's" with
PASS/FAIL per state size.

Redis: as :mod:`bench.store_commit` (``--url``, ``$RUNNER_BENCH_REDIS_URL``, DB 15 of
127.0.0.1:6379, else an embedded server); keys under a fresh prefix, deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable

from runner.errors import StoreUnavailable
from runner.store.codec import Codec
from runner.store.redis import RedisProvider

try:
    from bench._common import bench_redis, delete_prefix, interleave, print_table, summarize
    from bench.store_commit import KEEP, SIZES, make_checkpoint, make_state
except ModuleNotFoundError:  # run as `python bench/store_encryption.py`
    from _common import (  # type: ignore[no-redef]
        bench_redis,
        delete_prefix,
        interleave,
        print_table,
        summarize,
    )
    from store_commit import KEEP, SIZES, make_checkpoint, make_state  # type: ignore[no-redef]

TARGET = 1.2
"""A sealed commit's p50 must be within this factor of a clear one's."""
CLEAR, SEALED = "clear", "sealed (AES-GCM)"
HEADERS = ("operation", "state", "case", "p50 µs", "p95 µs", "mean µs", "p50 vs clear")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="timed commits per case and size")
    parser.add_argument("--warmup", type=int, default=100, help="untimed commits first")
    parser.add_argument("--url", default=None, help="Redis URL (default: see the docstring)")
    return parser.parse_args(argv)


def run_size(
    url: str, root: str, size: int, n: int, warmup: int
) -> dict[str, dict[str, list[float]]]:
    """Commit and read latencies (µs) of each case for one state size."""
    codec = Codec([("bench", os.urandom(32))])
    stores = {
        CLEAR: RedisProvider(url, prefix=f"{root}:clear"),
        SEALED: RedisProvider(url, prefix=f"{root}:sealed", codec=codec),
    }
    runs = {case: str(uuid.uuid4()) for case in stores}
    state = make_state(runs[CLEAR], size)

    def committing(case: str) -> Callable[[int], Callable[[], object]]:
        def prepare(i: int) -> Callable[[], object]:
            ckpt = make_checkpoint(runs[case], i, state)
            return lambda: stores[case].commit(ckpt, max_checkpoints=KEEP)

        return prepare

    def reading(case: str) -> Callable[[int], Callable[[], object]]:
        return lambda i: lambda: stores[case].latest(runs[case])

    try:
        return {
            "commit": interleave({c: committing(c) for c in stores}, n, warmup),
            "latest": interleave({c: reading(c) for c in stores}, n, warmup // 10),
        }
    finally:
        for store in stores.values():
            store.close()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when it ran (whatever the verdict), 1 when Redis is unreachable."""
    args = parse_args(argv)
    started = time.perf_counter()
    root = f"bench-crypt-{uuid.uuid4().hex[:8]}"
    rows, verdicts = [], []
    try:
        with bench_redis(args.url) as target:
            admin = target.client()
            try:
                for label, size in SIZES.items():
                    found = run_size(target.url, root, size, args.n, args.warmup)
                    for operation, samples in found.items():
                        clear = summarize(samples[CLEAR])
                        for case in (CLEAR, SEALED):
                            s = summarize(samples[case])
                            ratio = s.p50 / clear.p50
                            timing = (f"{s.p50:.0f}", f"{s.p95:.0f}", f"{s.mean:.0f}")
                            rows.append((operation, label, case, *timing, f"{ratio:.2f}x"))
                            if operation == "commit" and case == SEALED:
                                verdict = "PASS" if ratio <= TARGET else "FAIL"
                                verdicts.append(f"{label}: {ratio:.2f}x {verdict}")
            finally:
                delete_prefix(admin, root + ":")
                admin.close()
            print(
                f"Encryption at rest: {args.n} commits per case after {args.warmup} warm-up, "
                f"interleaved, on Redis {target.masked} ({target.source})"
            )
            print()
            print_table(HEADERS, rows, "lllrrrr")
            print(f"- target: a sealed commit's p50 within {TARGET}x of a clear one's: ", end="")
            print("; ".join(verdicts))
    except StoreUnavailable as exc:
        print(f"store_encryption: {exc}", file=sys.stderr)
        return 1
    print(f"- elapsed: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
