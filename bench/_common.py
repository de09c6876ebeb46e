"""Helpers shared by the benchmark scripts in ``bench/``.

* :func:`bench_redis` picks the Redis a benchmark talks to, always on a private DB
  (:data:`BENCH_DB` unless told otherwise): ``--url``, else ``$RUNNER_BENCH_REDIS_URL``,
  else a local ``127.0.0.1:6379`` that answers PING, else a private :class:`EmbeddedRedis`
  started for the benchmark and stopped after it. With ``fsync`` it is instead a private
  ``redis-server`` with that durability (:func:`redis_server`); :func:`durability` says what
  a server persists, for the tables.
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
import shutil
import socket
import sqlite3
import subprocess
import tempfile
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

BENCH_DB = 15
"""Default Redis DB number of the benchmarks: apart from the application's DB 0 and from
the tests' (DB 11 and up, one per xdist worker)."""
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


FSYNC = ("none", "everysec", "always")
"""Durability of a private :func:`redis_server`: nothing persisted, or the append-only file
with ``appendfsync everysec`` (a second of writes at risk) or ``always`` (an fsync per write,
as SQLite's default and DBOS's Postgres/SQLite commit)."""


@contextmanager
def redis_server(fsync: str, *, db: int = BENCH_DB) -> Iterator[BenchRedis]:
    """A private ``redis-server`` on a free loopback port for the duration, its data in a
    temporary directory removed after: ``fsync`` one of :data:`FSYNC` (``none``: no RDB, no
    AOF; else AOF with that ``appendfsync``). Yields DB ``db`` of it."""
    if fsync not in FSYNC:
        raise ValueError(f"fsync is one of {', '.join(FSYNC)}, not {fsync!r}")
    binary = shutil.which("redis-server")
    if binary is None:
        raise StoreUnavailable("redis-server is not on PATH (needed for --fsync)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = tempfile.mkdtemp(prefix=f"bench-redis-{fsync}-")
    aof = ["--appendonly", "no"] if fsync == "none" else ["--appendonly", "yes"]
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *aof]
    args += ["--appendfsync", "everysec" if fsync == "none" else fsync, "--dir", data]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/{db}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                ping(url, timeout=0.2)
                break
            except StoreUnavailable:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield BenchRedis(url, f"private redis-server, {durability_of(fsync)}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def durability_of(fsync: str) -> str:
    """How a table names the durability ``fsync`` (one of :data:`FSYNC`) gives."""
    return "nothing persisted" if fsync == "none" else f"AOF appendfsync {fsync}"


def durability(client: redis.Redis) -> str:
    """What the server behind ``client`` persists, read with CONFIG GET (``unknown`` if it
    refuses CONFIG): ``AOF appendfsync always|everysec|no``, ``RDB snapshots only`` or
    ``nothing persisted``."""
    try:
        conf = client.config_get("appendonly") | client.config_get("appendfsync")
        conf |= client.config_get("save")
    except redis.RedisError:
        return "unknown (CONFIG refused)"
    text = {_text(k): _text(v) for k, v in conf.items()}
    if text.get("appendonly") == "yes":
        return f"AOF appendfsync {text.get('appendfsync')}"
    return "RDB snapshots only" if text.get("save") else "nothing persisted"


def sqlite_sync(conn: sqlite3.Connection) -> str:
    """``WAL, synchronous=FULL`` (or what the connection has): SQLite's durability."""
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    level = conn.execute("PRAGMA synchronous").fetchone()[0]
    name = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))
    return f"SQLite {mode.upper()}, synchronous={name}" + (
        " (fsync per commit)" if level >= 2 else ""
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextmanager
def bench_redis(
    url: str | None = None, *, db: int = BENCH_DB, fsync: str | None = None
) -> Iterator[BenchRedis]:
    """Yield the Redis to benchmark against; stop it afterwards if it was started here.

    With ``fsync`` (one of :data:`FSYNC`), a private :func:`redis_server` of that durability.
    Else ``url`` (a ``--url`` option) or ``$RUNNER_BENCH_REDIS_URL`` is used as given and must
    answer PING (else :class:`StoreUnavailable`). Otherwise DB ``db`` of ``127.0.0.1:6379``
    if that answers, else DB ``db`` of a private :class:`EmbeddedRedis` for the duration.
    """
    if fsync is not None:
        if url:
            raise ValueError("--url and --fsync exclude each other (--fsync starts a server)")
        with redis_server(fsync, db=db) as private:
            yield private
        return
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


def delete_queues(client: redis.Redis, queue_keys: Sequence[str], token: str) -> None:
    """Delete a benchmark's broker keys: ``queue_keys`` (each queue's lists, from
    :meth:`~runner.distributed.broker.Layout.queue_keys`), their version twins, their kombu
    bindings, and the entries of kombu's shared ``_kombu.binding_deadlines`` that name
    ``token`` (its pidbox exchanges); nobody else's."""
    queues = [key for key in queue_keys if key]
    # A flow worker also consumes each queue's version twins ``<queue>@<version>``
    # (:func:`runner.distributed.routing.version_queue`): their lists and bindings go too.
    twins = [
        key
        for queue in queues
        for pattern in (f"{queue}@*", f"_kombu.binding*.{queue}@*")
        for key in client.scan_iter(match=pattern, count=1000)
    ]
    bindings = [
        f"_kombu.{kind}.{queue}" for queue in queues for kind in ("binding", "binding_permanent")
    ]
    client.delete(*queues, *bindings, *twins)
    deadlines = "_kombu.binding_deadlines"
    ours = [_text(m) for m in client.zrange(deadlines, 0, -1) if token in _text(m)]
    if ours:
        client.zrem(deadlines, *ours)


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
