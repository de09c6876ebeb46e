"""Benchmark: a run's stream, from ``self.stream_chunk()`` on a worker to an SSE client, beside
raw Redis ``XADD``/``XREAD`` in the same run.

Usage::

    python -m bench.stream_latency [--runs 20] [--chunks 200] [--interval 0.02] [--url URL]

Starts one worker (``celery -A workers worker -P threads -c RUNS``, importing
``bench._bench_stream``) and the console (``runner ui``, read-only, its own process). Then:

* **runner**: ``--runs`` runs of :class:`~bench._bench_stream.StreamBench` at once, each step
  writing ``--chunks`` chunks ``--interval`` s apart (the chunk carries ``time.time()`` at the
  call); one SSE client per run (``GET /api/runs/{id}/stream``, all in one asyncio loop of this
  process) notes each chunk's arrival. Latency = arrival - the time in the chunk, so it counts
  the writer's batching, Redis, the console's reader and its HTTP response.
* **producer**: the same runs again, each read by ``handle.stream()`` in a thread of this
  process (no HTTP);
* **raw Redis**: as many writer threads as runs, each ``XADD``-ing the same chunks at the same
  interval (one round trip per chunk, no batching) to a stream of its own, and as many reader
  threads blocked in ``XREAD``; latency = arrival - the time in the entry.

Prints a Markdown table (p50, p99, max, samples) with the targets (runner p50 < 50 ms, p99 <
200 ms) and PASS/FAIL; a stream's memory (``MEMORY USAGE``) against ``RUNNER_STREAM_MAXLEN``;
and the batching: the round trips one step's writer makes for 2,000 chunks at a few gaps
between chunks, with the cost of a ``stream_chunk`` call. Exits 0 whatever the verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis  # noqa: E402

from bench._common import (  # noqa: E402
    bench_redis,
    delete_prefix,
    delete_queues,
    percentile,
    print_table,
)
from runner import Flow, FlowState, start  # noqa: E402
from runner.distributed.app import make_app  # noqa: E402
from runner.distributed.broker import Layout  # noqa: E402
from runner.distributed.client import RunHandle, submit  # noqa: E402
from runner.distributed.engine import Runtime  # noqa: E402
from runner.distributed.processes import WorkerProcess  # noqa: E402
from runner.settings import RunnerSettings  # noqa: E402

P50_TARGET_MS = 50.0
P99_TARGET_MS = 200.0
FLOW = "bench._bench_stream:StreamBench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _console(env: dict[str, str], log: Path) -> Iterator[str]:
    port = _free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "ui", "--port", str(port)],
            env={**os.environ, **env},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/api/runs?limit=1", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the console did not start (see {log})")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


async def _sse_client(http: httpx.AsyncClient, url: str, out: list[float]) -> None:
    async with http.stream("GET", url) as response:
        data = None
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line[6:]
            elif line.startswith("event: end"):
                return
            elif not line and data is not None:
                frame = json.loads(data)
                payload = frame.get("data")
                if frame.get("channel") == "tokens" and isinstance(payload, dict):
                    out.append((time.time() - payload["t"]) * 1000)
                data = None


async def _sse_all(console: str, run_ids: list[str]) -> list[float]:
    samples: list[float] = []
    limits = httpx.Limits(max_connections=len(run_ids) + 5)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(
            *(_sse_client(http, f"{console}/api/runs/{r}/stream", samples) for r in run_ids)
        )
    return samples


def runner_case(rt: Runtime, console: str, args: argparse.Namespace) -> list[float]:
    """``--runs`` streaming runs at once, read over SSE; latency samples (ms)."""
    inputs = {"chunks": args.chunks, "interval": args.interval}
    handles = [submit(FLOW, inputs, rt=rt) for _ in range(args.runs)]
    samples = asyncio.run(_sse_all(console, [h.run_id for h in handles]))
    for handle in handles:
        RunHandle(handle.run_id, rt).wait(timeout=120)
    return samples


def handle_case(rt: Runtime, args: argparse.Namespace) -> list[float]:
    """The same runs read by ``handle.stream()`` (one thread per run); latency samples (ms)."""
    inputs = {"chunks": args.chunks, "interval": args.interval}
    handles = [RunHandle(submit(FLOW, inputs, rt=rt).run_id, rt) for _ in range(args.runs)]
    samples: list[float] = []
    lock = threading.Lock()

    def read(handle: RunHandle) -> None:
        for frame in handle.stream(channels=["tokens"]):
            if isinstance(frame.data, dict) and "t" in frame.data:
                with lock:
                    samples.append((time.time() - frame.data["t"]) * 1000)

    threads = [threading.Thread(target=read, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


def raw_case(url: str, args: argparse.Namespace, prefix: str) -> list[float]:
    """The same chunks with one XADD each, read by XREAD BLOCK; latency samples (ms)."""
    samples: list[float] = []
    lock = threading.Lock()
    keys = [f"{prefix}:raw:{i}" for i in range(args.runs)]

    def write(key: str) -> None:
        client = redis.Redis.from_url(url)
        for i in range(args.chunks):
            client.xadd(key, {"d": json.dumps({"i": i, "t": time.time()})}, maxlen=10_000)
            time.sleep(args.interval)
        client.close()

    def read(key: str) -> None:
        client: Any = redis.Redis.from_url(url)
        last, got = "0", 0
        while got < args.chunks:
            for _key, items in client.xread({key: last}, block=1000, count=500) or ():
                now = time.time()
                for entry_id, fields in items:
                    last, got = entry_id, got + 1
                    sent = json.loads(fields[b"d"])["t"]
                    with lock:
                        samples.append((now - sent) * 1000)
        client.close()

    threads = [threading.Thread(target=read, args=(k,)) for k in keys]
    threads += [threading.Thread(target=write, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


def batching_case(url: str, prefix: str) -> list[tuple[str, int, int, float]]:
    """Round trips the process's sender makes for 2,000 chunks of one step at a few gaps
    between chunks, and for 20 steps at once writing 100 chunks each 20 ms apart; the cost of
    a ``stream_chunk`` call on the step's thread (µs, the sleeps excluded)."""
    from runner import CheckpointConfig
    from runner.flow import streaming
    from runner.store.redis import RedisProvider

    store = RedisProvider(url, prefix=prefix)
    rounds = [0]
    send = streaming._send

    def counted(*a: Any) -> None:
        rounds[0] += 1
        send(*a)

    def kickoff(gap: float, chunks: int) -> float:
        flow = Burst(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))
        flow.kickoff(inputs={"gap": gap, "chunks": chunks})
        return flow.state.cost_us

    found = []
    streaming._send = counted  # type: ignore[assignment]
    try:
        for gap in (0.0, 0.001, 0.005, 0.02):
            rounds[0] = 0
            cost = kickoff(gap, 2000)
            label = "none (a burst)" if gap == 0 else f"{gap * 1000:g} ms"
            found.append((f"one step, {label}", 2000, rounds[0], cost))
        rounds[0] = 0
        costs: list[float] = []
        threads = [
            threading.Thread(target=lambda: costs.append(kickoff(0.02, 100))) for _ in range(20)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        found.append(("20 steps at once, 20 ms", 2000, rounds[0], sum(costs) / len(costs)))
    finally:
        streaming._send = send
        store.close()
    return found


class BurstState(FlowState):
    gap: float = 0.0
    chunks: int = 2000
    cost_us: float = 0.0


class Burst(Flow[BurstState]):
    """One step writing 2,000 chunks ``gap`` seconds apart; ``cost_us``: per call."""

    @start()
    def burst(self) -> None:
        spent = 0.0
        for i in range(self.state.chunks):
            began = time.perf_counter()
            self.stream_chunk(f"t{i} ")
            spent += time.perf_counter() - began
            if self.state.gap:
                time.sleep(self.state.gap)
        self.state.cost_us = spent / self.state.chunks * 1e6


def run(url: str, args: argparse.Namespace) -> None:
    token = uuid.uuid4().hex[:8]
    prefix, queue = f"bench-stream-{token}", f"bench-stream-{token}"
    env = {
        "RUNNER_REDIS_URL": url,
        "RUNNER_PREFIX": prefix,
        "RUNNER_QUEUE": queue,
        "RUNNER_FLOW_MODULES": "bench._bench_stream",
        "PYTHONPATH": str(ROOT),
    }
    settings = RunnerSettings(
        redis_url=url, prefix=prefix, queue=queue, flow_modules=["bench._bench_stream"]
    )
    rt = Runtime.create(make_app(settings), settings)
    logs = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    worker = WorkerProcess(
        env,
        app_module="workers",
        concurrency=args.runs,
        pool="threads",
        log=logs / "worker.log",
        cwd=ROOT,
        stop_timeout=20,
    )
    client = redis.Redis.from_url(url)
    try:
        with worker, _console(env, logs / "console.log") as console:
            worker.wait_ready(rt.app, timeout=60)
            runner_case(rt, console, argparse.Namespace(**{**vars(args), "chunks": 20}))  # warm
            ours = runner_case(rt, console, args)
            producer = handle_case(rt, args)
            raw = raw_case(url, args, prefix)
            biggest = max(rt.store.run_ids(), key=lambda r: rt.store.stream_info(r).length)
            stream_key = f"{prefix}:{{{biggest}}}:stream"
            memory = client.memory_usage(stream_key)
            length = client.xlen(stream_key)
        batching = batching_case(url, prefix)
    finally:
        delete_prefix(client, prefix)
        delete_queues(client, Layout.of(rt.app).queue_keys(queue), token)
        client.close()
        rt.close()

    def row(name: str, xs: list[float]) -> list[str]:
        return [
            name,
            f"{percentile(xs, 50):.1f}",
            f"{percentile(xs, 99):.1f}",
            f"{max(xs):.1f}",
            str(len(xs)),
        ]

    print(
        f"{args.runs} concurrent streams, {args.chunks} chunks each, one every "
        f"{args.interval * 1000:.0f} ms; worker -P threads -c {args.runs}; console over SSE\n"
    )
    print_table(
        ["path", "p50 ms", "p99 ms", "max ms", "chunks"],
        [
            row("stream_chunk on a worker -> SSE client (runner)", ours),
            row("stream_chunk on a worker -> handle.stream() (runner)", producer),
            row("raw XADD -> XREAD BLOCK (one round trip per chunk)", raw),
        ],
    )
    print(
        "\nbatching: the round trips one process's sender makes (in process, a Redis store), "
        f"RUNNER_STREAM_LINGER_MS={settings.stream_linger_ms:g}\n"
    )
    print_table(
        [
            "writers, gap between chunks",
            "chunks",
            "round trips",
            "chunks per round trip",
            "stream_chunk() µs",
        ],
        [
            [label, str(chunks), str(trips), f"{chunks / max(trips, 1):.1f}", f"{cost:.1f}"]
            for label, chunks, trips, cost in batching
        ],
    )
    if memory is not None:
        per = memory / max(length, 1)
        print(
            f"memory: one run's stream of {length} entries takes {memory} bytes "
            f"(~{per:.0f} B/entry): capped at RUNNER_STREAM_MAXLEN={settings.stream_maxlen} "
            f"entries, about {per * settings.stream_maxlen / 1e6:.1f} MB per stream at most"
        )
    p50, p99 = percentile(ours, 50), percentile(ours, 99)
    verdict = "PASS" if p50 < P50_TARGET_MS and p99 < P99_TARGET_MS else "FAIL"
    print(
        f"target: p50 < {P50_TARGET_MS:.0f} ms and p99 < {P99_TARGET_MS:.0f} ms: {verdict} "
        f"(p50 {p50:.1f} ms, p99 {p99:.1f} ms)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--url", default=None)
    args = parser.parse_args(argv)
    with bench_redis(args.url) as target:
        run(target.url, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
