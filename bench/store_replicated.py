"""Benchmark: what waiting for a replica (``WAIT 1``) costs one checkpoint commit.

Usage::

    python bench/store_replicated.py [--n 1000] [--warmup 100]

Starts a private primary and one replica (``redis-server`` on loopback ports, no
persistence, stopped at the end) and times ``--n`` commits of a 2 KB state per case after
``--warmup`` untimed ones, the cases interleaved in rotating order (the records are
``bench/store_commit.py``'s):

* **no wait**: ``RedisProvider.commit`` with ``wait_replicas = 0`` (a plain Redis's default);
* **WAIT 1**: the same with ``wait_replicas = 1`` (the default with ``redis+sentinel://``): the
  commit's EVALSHA, then ``WAIT 1 <timeout>`` until the replica has acknowledged it.

Prints a Markdown table: p50/p95/mean in µs and the p50 cost of the wait. On loopback the
wait is about one more round trip plus the replica's acknowledgement; across machines add
the network's round trip to the replica. Exits 0 (1 if ``redis-server`` is missing).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from runner.store.redis import RedisProvider

try:
    from bench._common import interleave, print_table, summarize
    from bench.store_commit import KEEP, make_checkpoint, make_state
except ModuleNotFoundError:  # run as `python bench/store_replicated.py`: bench/ is on sys.path
    from _common import interleave, print_table, summarize  # type: ignore[no-redef]
    from store_commit import KEEP, make_checkpoint, make_state  # type: ignore[no-redef]

NO_WAIT = "commit, no wait"
WAITED = "commit + WAIT 1 (one replica)"
HEADERS = ("case", "p50 µs", "p95 µs", "mean µs", "p50 cost of the wait µs")
STATE_BYTES = 2 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def primary_and_replica() -> Iterator[int]:
    """A primary and a replica in sync with it; yields the primary's port."""
    with tempfile.TemporaryDirectory(prefix="runner-replica-") as folder:
        ports = [_free_port(), _free_port()]
        procs = []
        try:
            for i, port in enumerate(ports):
                args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
                args += ["--save", "", "--appendonly", "no", "--dir", folder]
                args += ["--logfile", str(Path(folder) / f"{port}.log")]
                args += ["--repl-diskless-sync-delay", "0"]
                if i:
                    args += ["--replicaof", "127.0.0.1", str(ports[0])]
                procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
            replica = redis.Redis(port=ports[1])
            deadline = time.monotonic() + 15
            while True:
                try:
                    if replica.info("replication")["master_link_status"] == "up":
                        break
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not attach within 15 s")
                time.sleep(0.05)
            yield ports[0]
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)


def commit_case(
    provider: RedisProvider, run_id: str, state: dict[str, object]
) -> Callable[[int], Callable[[], object]]:
    """Prepare the commit of record ``i`` of ``run_id`` (timed: dump, EVALSHA, any WAIT)."""

    def prepare(i: int) -> Callable[[], object]:
        ckpt = make_checkpoint(run_id, i, state)
        return lambda: provider.commit(ckpt, max_checkpoints=KEEP)

    return prepare


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()
    if not shutil.which("redis-server"):
        print("store_replicated: no redis-server on PATH", file=sys.stderr)
        return 1
    with primary_and_replica() as port:
        url = f"redis://127.0.0.1:{port}/0"
        providers = {}
        for case, replicas in ((NO_WAIT, 0), (WAITED, 1)):
            providers[case] = RedisProvider(url, prefix=f"bench-wait-{uuid.uuid4().hex[:8]}")
            providers[case].wait_replicas = replicas
        state = make_state("bench", STATE_BYTES)
        cases = {
            case: commit_case(provider, str(uuid.uuid4()), state)
            for case, provider in providers.items()
        }
        samples = interleave(cases, args.n, args.warmup)
        for provider in providers.values():
            provider.close()
    plain = summarize(samples[NO_WAIT])
    print(
        f"### Replicated commit ({args.n} commits of a 2 KB state after {args.warmup} "
        "warm-up, primary and replica on loopback; durability: nothing persisted on either, "
        "WAIT 1 puts each commit in a second server's memory)\n"
    )
    rows = []
    for case in (NO_WAIT, WAITED):
        s = summarize(samples[case])
        rows.append(
            (case, f"{s.p50:.0f}", f"{s.p95:.0f}", f"{s.mean:.0f}", f"{s.p50 - plain.p50:+.0f}")
        )
    print_table(HEADERS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
