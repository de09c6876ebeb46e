"""Benchmark: Redis commands per step of a flow on workers, against raw Celery no-op tasks.

Usage::

    python bench/redis_commands.py [--runs 20]

Starts a private ``redis-server`` (so nothing else's commands are counted), a flows worker
(``celery -A workers worker``) and a raw worker (``celery -A bench._bench_tasks worker``), both
prefork with 2 processes and the same broker settings. Then, one case at a time:

* **runner**: ``--runs`` runs of the 20-step ``LinearFlow``, one after another;
* **raw Celery**: ``--runs`` chains of 20 no-op tasks (results stored: the chain needs them).

For each case ``INFO commandstats`` is read before and after (commands run inside Lua scripts
count too), the idle rate of the same workers (broker polling, heartbeats, the recovery pass)
is measured for as long as the case took and subtracted, and the difference is divided by the
steps run. Prints a Markdown table: commands per step by command, and the total.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/redis_commands.py`
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import chain  # noqa: E402

from bench._common import print_table  # noqa: E402
from runner.distributed.app import make_app  # noqa: E402
from runner.distributed.client import submit  # noqa: E402
from runner.distributed.engine import Runtime  # noqa: E402
from runner.distributed.processes import WorkerProcess  # noqa: E402
from runner.embedded import EmbeddedRedis  # noqa: E402
from runner.settings import RunnerSettings  # noqa: E402

STEPS = 20
WAIT = 120.0


CPU = "~cpu-us"
"""Pseudo-command: the server's CPU time (user + system, microseconds), I/O included."""
NET = "~net-bytes"
"""Pseudo-command: bytes the server read and wrote on its sockets."""


def commandstats(client: redis.Redis) -> Counter[str]:
    """Calls per command since the server started (``cmdstat_evalsha`` -> ``evalsha``), plus
    the server's CPU microseconds and network bytes so far (the capacity model's inputs)."""
    stats = client.info("commandstats")
    out = Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})
    cpu, net = client.info("cpu"), client.info("stats")
    out[CPU] = int((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6)
    out[NET] = int(net["total_net_input_bytes"]) + int(net["total_net_output_bytes"])
    return out


def measured(client: redis.Redis, work: Callable[[], None]) -> tuple[Counter[str], float]:
    """Commands ``work()`` caused and the seconds it took."""
    before = commandstats(client)
    began = time.perf_counter()
    work()
    took = time.perf_counter() - began
    return commandstats(client) - before, took


def idle(client: redis.Redis, seconds: float) -> dict[str, float]:
    """Commands per second the idle workers cause (polling, heartbeats, recovery)."""
    before = commandstats(client)
    time.sleep(seconds)
    return {k: v / seconds for k, v in (commandstats(client) - before).items()}


def per_step(
    case: Counter[str], took: float, rate: dict[str, float], steps: int
) -> dict[str, float]:
    return {k: max(0.0, (v - rate.get(k, 0) * took) / steps) for k, v in case.items()}


def run(args: argparse.Namespace) -> None:
    token = uuid.uuid4().hex[:8]
    logs = Path(tempfile.mkdtemp(prefix="bench-commands-"))
    with EmbeddedRedis() as server:
        url = server.url
        client = redis.Redis.from_url(url)
        flow_q, raw_q = f"flows-{token}", f"raw-{token}"
        base = {"RUNNER_REDIS_URL": url, "RUNNER_PREFIX": "bench", "PYTHONPATH": str(ROOT)}
        flow_env = {**base, "RUNNER_QUEUE": flow_q, "RUNNER_FLOW_MODULES": "examples.linear"}
        raw_env = {**base, "RUNNER_QUEUE": raw_q, "RUNNER_TASK_RESULTS": "true"}
        flow_settings = RunnerSettings(redis_url=url, prefix="bench", queue=flow_q)
        rt = Runtime.create(make_app(flow_settings), flow_settings)
        raw = make_app(
            RunnerSettings(redis_url=url, prefix="bench", queue=raw_q, task_results=True)
        )
        noop = raw.signature("bench.noop", immutable=True)

        def flows() -> None:
            for _ in range(args.runs):
                handle = submit("examples.linear:LinearFlow", rt=rt)
                if handle.wait(WAIT).value != "succeeded":
                    raise RuntimeError(f"run {handle.run_id} did not succeed")

        def chains() -> None:
            for _ in range(args.runs):
                chain(*[noop.clone() for _ in range(STEPS)]).apply_async().get(timeout=WAIT)

        try:
            with (
                WorkerProcess(flow_env, log=logs / "flows.log", cwd=ROOT) as fw,
                WorkerProcess(
                    raw_env, app_module="bench._bench_tasks", log=logs / "raw.log", cwd=ROOT
                ) as rw,
            ):
                fw.wait_ready(rt.app, timeout=60)
                rw.wait_ready(raw, timeout=60)
                flows()  # warm up both
                chains()
                runner_case, runner_took = measured(client, flows)
                raw_case, raw_took = measured(client, chains)
                rate = idle(client, 5.0)
        finally:
            rt.app.close()
            raw.close()
            client.close()
    steps = args.runs * STEPS
    mine = per_step(runner_case, runner_took, rate, steps)
    theirs = per_step(raw_case, raw_took, rate, steps)
    extra = {name: (mine.pop(name, 0.0), theirs.pop(name, 0.0)) for name in (CPU, NET)}
    names = sorted(set(mine) | set(theirs), key=lambda k: -(mine.get(k, 0) + theirs.get(k, 0)))
    rows = [
        [name, f"{mine.get(name, 0):.1f}", f"{theirs.get(name, 0):.1f}"]
        for name in names
        if mine.get(name, 0) >= 0.05 or theirs.get(name, 0) >= 0.05
    ]
    rows.append(["**total**", f"**{sum(mine.values()):.1f}**", f"**{sum(theirs.values()):.1f}**"])
    print(
        f"{args.runs} runs of a {STEPS}-step flow vs {args.runs} chains of {STEPS} no-op tasks "
        "(one private Redis, nothing persisted, for both: commands are counted, not timed)\n"
    )
    print_table(["Redis command", "runner, per step", "raw Celery, per task"], rows)
    cpu_mine, cpu_theirs = extra[CPU]
    net_mine, net_theirs = extra[NET]
    print("\nCapacity of one Redis (one shard): its CPU is the bound, as Redis runs commands on")
    print("one thread; steps/s = 1,000,000 / server CPU µs per step (broker and store on it).\n")
    print_table(
        ["per step", "runner", "raw Celery"],
        [
            ["server CPU µs", f"{cpu_mine:.0f}", f"{cpu_theirs:.0f}"],
            ["network bytes", f"{net_mine:,.0f}", f"{net_theirs:,.0f}"],
            [
                "steps/s one Redis sustains",
                f"{1e6 / cpu_mine:,.0f}" if cpu_mine else "-",
                f"{1e6 / cpu_theirs:,.0f}" if cpu_theirs else "-",
            ],
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
