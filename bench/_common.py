"""Helpers shared by the benchmark scripts in ``bench/``.

* :func:`bench_redis` picks the Redis a benchmark talks to, always on a private DB
  (:data:`BENCH_DB` unless told otherwise): ``--url``, else ``$RUNNER_BENCH_REDIS_URL``,
  else a local ``127.0.0.1:6379`` that answers PING, else a private :class:`EmbeddedRedis`
  started for the benchmark and stopped after it.
* :func:`delete_prefix`/:func:`count_keys` clean up and inspect a benchmark's own keys with
  SCAN; :func:`flush_bench_db` empties the bench DB and refuses DB 0.
* :func:`percentile`/:func:`summarize` reduce latency samples, :func:`interleave` collects
  them from several cases in rotating order, :func:`markdown_table` prints results ready to
  paste into the README.
"""

from __future__ import annotations

import gc
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis

from runner.embedded import EmbeddedRedis, mask_url, ping
from runner.errors import StoreUnavailable
from runner.store.redis import RedisProvider

BENCH_DB = 13
"""Default Redis DB number of the benchmarks (kept apart from the application's DB 0)."""
URL_ENV = "RUNNER_BENCH_REDIS_URL"
"""Environment variable naming the benchmark Redis (used as given, DB included)."""
LOCAL_URL = "redis://127.0.0.1:6379"
"""The local server tried before an embedded one is started."""
PROBE_TIMEOUT = 0.5
"""Seconds the local server gets to answer PING."""


# -- Redis -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchRedis:
    """The Redis a benchmark runs against."""

    url: str
    """Connection URL, DB included."""
    source: str
    """Where it came from: ``--url``, ``$RUNNER_BENCH_REDIS_URL``, ``local`` or ``embedded``."""

    @property
    def db(self) -> int:
        """The DB number the URL selects."""
        return url_db(self.url)

    @property
    def masked(self) -> str:
        """The URL with any password shown as ``***`` (for printing)."""
        return mask_url(self.url)

    def client(self) -> redis.Redis:
        """A new client on :attr:`url`."""
        return redis.Redis.from_url(self.url)


def with_db(url: str, db: int) -> str:
    """``url`` selecting DB ``db`` (the path of ``redis://``, the ``db=`` query of ``unix://``)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "db"]
    if parts.scheme == "unix":  # urlunsplit would drop the empty authority of unix:///path
        query.append(("db", str(db)))
        return url.split("?", 1)[0].split("#", 1)[0] + "?" + urlencode(query)
    return urlunsplit(parts._replace(path=f"/{db}", query=urlencode(query)))


def url_db(url: str) -> int:
    """The DB number ``url`` selects (0 when it names none)."""
    pool = redis.ConnectionPool.from_url(url)
    try:
        return int(pool.connection_kwargs.get("db", 0) or 0)
    finally:
        pool.disconnect()


@contextmanager
def bench_redis(url: str | None = None, *, db: int = BENCH_DB) -> Iterator[BenchRedis]:
    """Yield the Redis to benchmark against; stop it afterwards if it was started here.

    ``url`` (a ``--url`` option) or ``$RUNNER_BENCH_REDIS_URL`` is used as given and must
    answer PING (else :class:`StoreUnavailable`). Otherwise DB ``db`` of ``127.0.0.1:6379``
    if that answers, else DB ``db`` of a private :class:`EmbeddedRedis` for the duration.
    """
    given, source = (url, "--url") if url else (os.environ.get(URL_ENV), f"${URL_ENV}")
    if given:
        ping(given)
        yield BenchRedis(given, source)
        return
    local = with_db(LOCAL_URL, db)
    try:
        ping(local, timeout=PROBE_TIMEOUT)
    except StoreUnavailable:
        pass
    else:
        yield BenchRedis(local, "local")
        return
    with EmbeddedRedis() as server:
        yield BenchRedis(with_db(server.url, db), "embedded")


def glob_escape(text: str) -> str:
    """``text`` with the glob characters of SCAN MATCH (``* ? [ ] \\``) escaped."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def scan_prefix(client: redis.Redis, prefix: str, count: int = 1000) -> Iterator[bytes]:
    """Every key starting with ``prefix`` (SCAN MATCH, never KEYS)."""
    yield from client.scan_iter(match=glob_escape(prefix) + "*", count=count)


def count_keys(client: redis.Redis, prefix: str) -> int:
    """How many keys start with ``prefix``."""
    return sum(1 for _ in scan_prefix(client, prefix))


def raw_client(rt: Any) -> redis.Redis:
    """The redis-py client under a runtime's store: a benchmark reads and cleans Redis
    directly, which the runner itself never does outside ``runner/store``."""
    store = rt.store
    if not isinstance(store, RedisProvider):
        raise TypeError(f"a benchmark needs the Redis store, not {type(store).__name__}")
    client: redis.Redis = store.client
    return client


def delete_prefix(client: redis.Redis, prefix: str, batch: int = 500) -> int:
    """UNLINK every key starting with ``prefix``; return how many were removed."""
    if not prefix:
        raise ValueError("refusing to delete with an empty prefix")
    removed, pending = 0, []
    for key in scan_prefix(client, prefix):
        pending.append(key)
        if len(pending) >= batch:
            removed += client.unlink(*pending)
            pending.clear()
    if pending:
        removed += client.unlink(*pending)
    return removed


def flush_bench_db(client: redis.Redis) -> None:
    """FLUSHDB the client's DB; refuses DB 0, which may hold real runs."""
    db = int(client.connection_pool.connection_kwargs.get("db", 0) or 0)
    if db == 0:
        raise RuntimeError("refusing to flush Redis DB 0; benchmarks use a private DB")
    client.flushdb()


# -- statistics ------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``, linearly interpolated (numpy's default)."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    """Percentiles and mean of one set of latency samples (in the samples' unit)."""

    n: int
    p50: float
    p95: float
    p99: float
    mean: float
    min: float
    max: float


def summarize(samples: Sequence[float]) -> Summary:
    """:class:`Summary` of ``samples``."""
    if not samples:
        raise ValueError("summary of no samples")
    return Summary(
        n=len(samples),
        p50=percentile(samples, 50),
        p95=percentile(samples, 95),
        p99=percentile(samples, 99),
        mean=math.fsum(samples) / len(samples),
        min=min(samples),
        max=max(samples),
    )


def interleave(
    cases: Mapping[str, Callable[[int], Callable[[], object]]], n: int, warmup: int = 0
) -> dict[str, list[float]]:
    """Time ``n`` calls of each case after ``warmup`` untimed ones; latencies in µs.

    ``cases[name](i)`` prepares iteration ``i`` (untimed) and returns the call to time. Each
    iteration runs every case once, the order rotating, so drift (CPU frequency, server-side
    growth, a noisy neighbour) spreads over all cases alike. The garbage collector is off
    while timing, as with :mod:`timeit`.
    """
    names = list(cases)
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(warmup + n):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                call = cases[name](i)
                start = clock()
                call()
                elapsed = clock() - start
                if i >= warmup:
                    samples[name].append(elapsed * 1e6)
    finally:
        if was_enabled:
            gc.enable()
    return samples


# -- output ----------------------------------------------------------------------------------

_JUSTIFY: dict[str, Callable[[str, int], str]] = {"l": str.ljust, "r": str.rjust, "c": str.center}
_RULE: dict[str, Callable[[int], str]] = {
    "l": lambda size: ":" + "-" * (size - 1),
    "r": lambda size: "-" * (size - 1) + ":",
    "c": lambda size: ":" + "-" * (size - 2) + ":",
}


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None
) -> str:
    """A GitHub-flavoured Markdown table; ``align`` has one ``l``/``r``/``c`` per column.

    Without ``align`` the first column is left-aligned and the others right-aligned. Cells are
    padded so the table reads well as plain text too; ``|`` inside a cell is escaped.
    """
    width = len(headers)
    if any(len(row) != width for row in rows):
        raise ValueError(f"every row needs {width} cells")
    aligns = align or "l" + "r" * (width - 1)
    if len(aligns) != width or set(aligns) - set("lrc"):
        raise ValueError(f"align needs {width} of l/r/c, got {aligns!r}")
    cells = [[str(cell).replace("|", "\\|") for cell in row] for row in [headers, *rows]]
    sizes = [max(3, *(len(row[col]) for row in cells)) for col in range(width)]

    def line(row: Sequence[str]) -> str:
        padded = [
            _JUSTIFY[how](text, size) for text, size, how in zip(row, sizes, aligns, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = [_RULE[how](size) for how, size in zip(aligns, sizes, strict=True)]
    return "\n".join([line(cells[0]), line(rule), *(line(row) for row in cells[1:])])


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None
) -> None:
    """Print :func:`markdown_table` of the arguments, followed by a blank line."""
    print(markdown_table(headers, rows, align))
    print()
