"""The chaos driver (``make chaos``, ``tests/test_chaos.py``) and what the reliability tests share.

The driver starts a redis-server of its own (AOF, fsync always), a few Celery workers at
the runner's DEFAULT lease and recovery settings, and submits :class:`ChaosRouted` runs
(fan-out, ``and_`` join, router) a window at a time. A killer thread SIGKILLs whole
workers (replaced at once) and pool children, aiming at processes that run a step, and
the driver restarts Redis once. Every random choice comes from one seed
(``CHAOS_SEED``, printed); the number of kills does not depend on timing (submission
waits for the killer). At the end it checks every run against the store and the steps'
traces and prints a table::

    python -m tests.chaos_support            # make chaos: 300 runs, >= 60 kills
    CHAOS_SEED=123 python -m tests.chaos_support --runs 60 --kills 10
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from kombu.exceptions import OperationalError

from runner.distributed.app import make_app
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime
from runner.distributed.processes import WorkerProcess
from runner.settings import RunnerSettings, reset_settings
from runner.store.models import RunStatus
from tests.flows import reliability
from tests.flows.reliability import BUSY, ChaosRouted, expected_effects

TUNED = ("RUNNER_LEASE_SECONDS", "RUNNER_RECOVERY_INTERVAL", "RUNNER_RETRY_BACKOFF")
"""Variables the suite's shared workers set for speed; the reliability tests drop them."""


def at_defaults(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the test tuning of leases, recovery and backoff: the defaults."""
    return {k: v for k, v in env.items() if k not in TUNED}


DEFAULT_LEASE = float(RunnerSettings.model_fields["lease_seconds"].default)
DEFAULT_INTERVAL = float(RunnerSettings.model_fields["recovery_interval"].default)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server of one test's own: AOF with fsync always (a restart loses nothing),
    bound to ``bind`` (loopback by default), restartable on the same port."""

    def __init__(self, data_dir: str | os.PathLike[str], bind: str = "127.0.0.1") -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not on PATH")
        self.exe, self.dir, self.bind = exe, Path(data_dir), bind
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port(bind)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped_at = 0.0
        """Wall time the last :meth:`stop` began (the server stops answering then)."""
        self.answered_at = 0.0
        """Wall time the last :meth:`start` saw the server answer PING."""

    @property
    def url(self) -> str:
        """``redis://<bind>:<port>/0``."""
        return f"redis://{self.bind}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        argv = [self.exe, "--port", str(self.port), "--bind", self.bind, "--daemonize", "no"]
        argv += ["--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")]
        argv += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        # Bound to one private address only (loopback, or a test's veth), so no password.
        argv += ["--protected-mode", "no"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        with contextlib.closing(redis.Redis.from_url(self.url, socket_timeout=1)) as probe:
            while True:
                with contextlib.suppress(redis.RedisError):
                    if probe.ping():
                        self.answered_at = time.time()
                        return self
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"redis-server did not start; see {self.dir}/redis.log")
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: Redis flushes its AOF and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.stopped_at = time.time()
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def restart(self, pause: float = 0.0) -> float:
        """Stop, wait ``pause`` seconds, start again on the same port and data; returns the
        seconds it was down."""
        began = time.monotonic()
        self.stop()
        time.sleep(pause)
        self.start()
        return time.monotonic() - began

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


def runtime_on(env: dict[str, str]) -> Runtime:
    """A producer runtime with exactly the settings ``env`` gives (the rest at defaults)."""
    values: dict[str, Any] = {
        k[len("RUNNER_") :].lower(): v for k, v in env.items() if k.startswith("RUNNER_")
    }
    values.pop("test_db", None)
    fields = RunnerSettings.model_fields
    settings = RunnerSettings(**{k: v for k, v in values.items() if k in fields})
    return Runtime.create(make_app(settings), settings)


def start_worker(env: dict[str, str], logdir: Path, rt: Runtime, **kw: Any) -> WorkerProcess:
    """A started worker (waited for) on ``env``, logging to ``logdir``."""
    (worker,) = start_workers(1, env, logdir, rt, **kw)
    return worker


def start_workers(
    count: int, env: dict[str, str], logdir: Path, rt: Runtime, **kw: Any
) -> list[WorkerProcess]:
    """``count`` workers on ``env`` started at once, then each waited for."""
    workers = [
        WorkerProcess(env, log=logdir / f"worker-{uuid.uuid4().hex[:6]}.log", **kw)
        for _ in range(count)
    ]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 60
    for worker in workers:
        while True:
            try:
                worker.wait_ready(rt.app, timeout=max(deadline - time.monotonic(), 1))
                break
            except (redis.ConnectionError, OperationalError):
                # A pooled connection from before a Redis restart: the next ping takes a new one.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return workers


# --- the chaos driver -------------------------------------------------------------------------


@dataclass
class Kill:
    """One SIGKILL: of a whole worker (parent and pool) or of one pool child."""

    kind: str
    at: float
    pids: list[int]


@dataclass
class Report:
    """What a chaos session found."""

    seed: int
    runs: int = 0
    kills: list[Kill] = field(default_factory=list)
    redis_restarts: int = 0
    redis_down: list[tuple[float, float]] = field(default_factory=list)
    """When Redis was down for each restart (wall-clock seconds, as kills and traces)."""
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    double_commits: list[str] = field(default_factory=list)
    reexecuted: int = 0
    durations: list[float] = field(default_factory=list)
    recovery_delays: list[float] = field(default_factory=list)
    unrecovered: list[str] = field(default_factory=list)
    """Executions cut by a kill with no later execution of the step (should be empty)."""
    worst_recovery: str = ""
    """The step behind the worst recovery delay, its kill and any Redis restart since (so a
    slow recovery can be told from a double fault)."""
    logdir: str = ""
    started: float = field(default_factory=time.time)
    """When the session began: the times :attr:`worst_recovery` gives count from it."""

    def kills_of(self, kind: str) -> int:
        """How many kills of ``kind`` (``worker`` or ``child``)."""
        return sum(1 for k in self.kills if k.kind == kind)

    def table(self) -> str:
        """The Markdown table the README shows."""
        d = sorted(self.durations) or [0.0]
        p95 = d[min(len(d) - 1, math.ceil(0.95 * len(d)) - 1)]
        worst = max(self.recovery_delays, default=0.0)
        rows = [
            ("seed (CHAOS_SEED)", str(self.seed)),
            ("runs (fan-out + join + router, 8 steps each)", str(self.runs)),
            (
                "kills (whole workers / pool children)",
                f"{len(self.kills)} ({self.kills_of('worker')} / {self.kills_of('child')})",
            ),
            ("Redis restarts", str(self.redis_restarts)),
            ("lost runs", str(len(self.lost))),
            ("stuck runs", str(len(self.stuck))),
            ("wrong results", str(len(self.wrong))),
            ("double commits", str(len(self.double_commits))),
            ("re-executed steps", str(self.reexecuted)),
            (
                "time to finish p50 / p95 / max",
                f"{statistics.median(d):.1f} s / {p95:.1f} s / {d[-1]:.1f} s",
            ),
            (
                "worst recovery delay (kill -> step running again)",
                f"{worst:.1f} s ({len(self.recovery_delays)} steps cut by kills)",
            ),
        ]
        lines = ["| measure | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in rows]
        return "\n".join(lines)


class Killer(threading.Thread):
    """SIGKILLs a whole worker or a pool child, preferring processes that run a step, every
    ``pause`` seconds (seeded), until told to stop; replaces killed workers at once."""

    def __init__(self, driver: ChaosDriver) -> None:
        super().__init__(name="chaos-killer", daemon=True)
        self.driver = driver
        self.rt = runtime_on(driver.env)  # its own app: it pings the workers it starts
        self.rng = random.Random(driver.seed)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(*self.driver.pause)):
                if self.driver.all_sent.is_set():
                    return  # the last runs finish in peace: kills now would only pad the count
                with self.driver.quiet:  # not while Redis restarts
                    self.kill_one()
        except BaseException as exc:  # reported by the driver
            self.error = exc
        finally:
            self.rt.app.close()
            self.rt.store.close()

    def busy(self) -> set[int]:
        try:
            return {int(pid) for pid in self.driver.probe.hkeys(BUSY)}
        except redis.RedisError:
            return set()  # Redis restarting: aim at random

    def kill_one(self) -> None:
        d = self.driver
        busy = self.busy()
        whole = self.rng.random() < d.worker_share
        workers = [w for w in d.workers if w.proc is not None and w.proc.poll() is None]
        pools = {w: w.children() for w in workers}
        aimed = [w for w in workers if busy & set(pools[w])] or workers
        worker = self.rng.choice(sorted(aimed, key=lambda w: w.name))
        if whole:
            pids = [*pools[worker], worker.proc.pid] if worker.proc else []
            worker.kill()
            d.kills.append(Kill("worker", time.time(), pids))
            d.workers.remove(worker)
            d.workers.append(start_worker(d.env, d.logdir, self.rt, concurrency=d.concurrency))
            return
        candidates = sorted(busy & set(pools[worker])) or sorted(pools[worker])
        if not candidates:
            return
        pid = self.rng.choice(candidates)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        d.kills.append(Kill("child", time.time(), [pid]))


class ChaosDriver:
    """One chaos session (see the module docstring)."""

    def __init__(
        self,
        *,
        runs: int,
        kills: int,
        seed: int,
        workdir: Path,
        workers: int = 3,
        concurrency: int = 2,
        window: int = 16,
        pause: tuple[float, float] = (0.5, 1.5),
        worker_share: float = 0.5,
        restart_redis: bool = True,
        budget: float = 900.0,
    ) -> None:
        self.runs, self.min_kills, self.seed = runs, kills, seed
        self.workdir, self.logdir = workdir, workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.n_workers, self.concurrency, self.window = workers, concurrency, window
        self.pause, self.worker_share = pause, worker_share
        self.restart_redis, self.budget = restart_redis, budget
        self.kills: list[Kill] = []
        self.all_sent = threading.Event()
        self.quiet = threading.Lock()
        """Held by the killer while it kills (and replaces), by the driver while Redis restarts."""
        self.workers: list[WorkerProcess] = []
        self.env: dict[str, str] = {}
        self.rt: Runtime
        self.probe: redis.Redis

    def run(self) -> Report:
        """Run the session and check every run; the report says what went wrong, if anything."""
        with RedisServer(self.workdir / "redis") as server:
            token = uuid.uuid4().hex[:8]
            self.env = {
                "RUNNER_REDIS_URL": server.url,
                "RUNNER_PREFIX": f"chaos-{token}",
                "RUNNER_QUEUE": f"chaos-{token}",
                "RUNNER_FLOW_MODULES": "tests.flows.reliability",
                reliability.TRACE_RECEIPTS: "1",
            }
            self.rt = runtime_on(self.env)
            self.probe = redis.Redis.from_url(server.url, socket_timeout=5)
            try:
                return self._session(server)
            finally:
                for worker in self.workers:
                    worker.kill()
                self.rt.app.close()
                self.rt.store.close()
                self.probe.close()

    @contextlib.contextmanager
    def _env(self) -> Iterator[None]:
        # The producer's own settings come from ``self.env`` (the driver's process too); every
        # variable it sets goes with the session (processes the test process starts later,
        # such as other tests' workers, must not trace receipts).
        def ours(name: str) -> bool:
            return name.startswith("RUNNER_") or name in self.env

        saved = {k: os.environ.pop(k) for k in list(os.environ) if ours(k)}
        os.environ.update(self.env)
        reset_settings()
        try:
            yield
        finally:
            for k in list(os.environ):
                if ours(k):
                    del os.environ[k]
            os.environ.update(saved)
            reset_settings()

    def _session(self, server: RedisServer) -> Report:
        report = Report(seed=self.seed, logdir=str(self.workdir))
        rng = random.Random(self.seed ^ 0x5EED)
        restart_at = rng.randrange(self.runs // 4, self.runs // 2) if self.restart_redis else -1
        with self._env():
            self.workers = [
                start_worker(self.env, self.logdir, self.rt, concurrency=self.concurrency)
                for _ in range(self.n_workers)
            ]
            killer = Killer(self)
            killer.start()
            submitted: dict[str, tuple[int, float]] = {}
            open_runs: set[str] = set()
            deadline = time.monotonic() + self.budget
            said = time.monotonic()
            try:
                while (len(submitted) < self.runs or open_runs) and time.monotonic() < deadline:
                    if not killer.is_alive() and not self.all_sent.is_set():
                        break  # its error is raised below
                    if time.monotonic() - said > 10:
                        said = time.monotonic()
                        print(
                            f"chaos: {len(submitted)} submitted, {len(open_runs)} open, "
                            f"{len(self.kills)} kills",
                            flush=True,
                        )
                    self._reap(open_runs)
                    i = len(submitted)
                    kills_due = math.ceil(self.min_kills * (i + 1) / self.runs)
                    if (
                        i < self.runs
                        and len(open_runs) < self.window
                        and len(self.kills) >= min(kills_due, self.min_kills)
                    ):
                        if i == restart_at:
                            with self.quiet:
                                down = time.time()
                                server.restart(pause=1.0)
                            report.redis_restarts += 1
                            report.redis_down.append((down, time.time()))
                        n = rng.randrange(1000)
                        handle = submit(ChaosRouted, {"n": n}, rt=self.rt)
                        submitted[handle.run_id] = (n, time.time())
                        open_runs.add(handle.run_id)
                        if len(submitted) == self.runs:
                            self.all_sent.set()
                        continue
                    time.sleep(0.1)
            finally:
                killer.stop.set()
                killer.join(timeout=120)
            if killer.error is not None:
                raise killer.error
            report.kills = list(self.kills)
            self._check(report, submitted, open_runs)
        return report

    def _reap(self, open_runs: set[str]) -> None:
        for run_id in list(open_runs):
            info = self.rt.store.run(run_id)
            if info is not None and info.status.finished:
                open_runs.discard(run_id)

    def _check(
        self, report: Report, submitted: dict[str, tuple[int, float]], open_runs: set[str]
    ) -> None:
        report.runs = len(submitted)
        traces: dict[str, list[dict[str, Any]]] = {}
        for run_id, (n, sent_at) in submitted.items():
            handle = RunHandle(run_id, self.rt)
            info = self.rt.store.run(run_id)
            traces[run_id] = reliability.entries(self.probe, run_id)
            if info is None:
                report.lost.append(run_id)
                continue
            if run_id in open_runs or info.status is RunStatus.RUNNING:
                report.stuck.append(run_id)
                continue
            if info.status is not RunStatus.SUCCEEDED:
                report.lost.append(f"{run_id} ({info.status.value}: {info.error})")
                continue
            latest = handle.latest()
            if sorted(latest.state["effects"]) != expected_effects(n):
                report.wrong.append(f"{run_id}: {sorted(latest.state['effects'])}")
            elif handle.result() != expected_effects(n):
                report.wrong.append(f"{run_id}: result {handle.result()}")
            commits = Counter(
                c.activation
                for c in self.rt.store.history(run_id, limit=1000)
                if c.event == "method_execution_finished"
            )
            report.double_commits += [f"{run_id} {a}" for a, k in commits.items() if k > 1]
            starts = [e for e in traces[run_id] if e["e"] == "start"]
            report.reexecuted += len(starts) - len(commits)
            report.durations.append(latest.created_at - sent_at)
        self._recovery_delays(report, traces)

    def _recovery_delays(self, report: Report, traces: dict[str, list[dict[str, Any]]]) -> None:
        """For each execution a kill cut short: the time until its step ran again, from the
        last kill that cut its recovery (a worker killed after it received the step's
        re-sent message, before it ran it: that kill's own recovery)."""
        for kill in report.kills:
            for run_id, entries in traces.items():
                for e in entries:
                    if e["e"] != "start" or e["pid"] not in kill.pids or e["t"] > kill.at:
                        continue
                    ended = any(
                        x["e"] == "end"
                        and x["m"] == e["m"]
                        and x["pid"] == e["pid"]
                        and e["t"] <= x["t"] <= kill.at
                        for x in entries
                    )
                    if ended:
                        continue
                    again = [
                        x["t"]
                        for x in entries
                        if x["e"] == "start" and x["m"] == e["m"] and x["t"] > kill.at
                    ]
                    if again:
                        first = min(again)
                        since = recovery_cut_last(report.kills, entries, e["m"], kill.at, first)
                        if first - since > max(report.recovery_delays, default=0.0):
                            report.worst_recovery = self._described(
                                report, run_id, e["m"], kill, since, first
                            )
                        report.recovery_delays.append(first - since)
                    else:
                        report.unrecovered.append(f"{run_id} {e['m']} (pid {e['pid']})")

    @staticmethod
    def _described(
        report: Report, run_id: str, method: str, kill: Kill, since: float, first: float
    ) -> str:
        def t(at: float) -> str:
            return f"{at - report.started:.1f} s"

        said = f"{method} of run {run_id}: cut by a {kill.kind} kill at {t(kill.at)}"
        if since != kill.at:
            said += f", its recovery cut again at {t(since)}"
        said += f"; ran again at {t(first)} ({first - since:.1f} s later)"
        for down, up in report.redis_down:
            if down < first and up > since - DEFAULT_LEASE:  # Redis down while it recovered
                said += f"; Redis down from {t(down)} to {t(up)}"
        return said


def recovery_cut_last(
    kills: list[Kill], entries: list[dict[str, Any]], method: str, since: float, until: float
) -> float:
    """When the recovery of ``method``, cut at ``since`` and running again at ``until``,
    was last cut: ``since``, or the later kill of a worker that had received the step's
    message (``recv``) after the clock last started, not having run it."""
    for kill in sorted(kills, key=lambda k: k.at):
        if since < kill.at < until and any(
            x["e"] == "recv"
            and x["m"] == method
            and x["pid"] in kill.pids
            and since <= x["t"] <= kill.at
            for x in entries
        ):
            since = kill.at
    return since


def seed_from_env() -> int:
    """``CHAOS_SEED`` if set, else a fresh one (printed by the callers)."""
    raw = os.environ.get("CHAOS_SEED")
    return int(raw) if raw else random.randrange(1 << 31)


def main(argv: list[str] | None = None) -> int:
    """``make chaos``: run a session, print the table; non-zero exit if anything was lost."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos_support", description=__doc__)
    parser.add_argument("--runs", type=int, default=300, help="runs to submit (default 300)")
    parser.add_argument("--kills", type=int, default=60, help="kills at least (default 60)")
    parser.add_argument("--workers", type=int, default=3, help="workers (default 3)")
    args = parser.parse_args(argv)
    seed = seed_from_env()
    print(f"chaos: CHAOS_SEED={seed} runs={args.runs} kills>={args.kills}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="runner-chaos-"))
    report = ChaosDriver(
        runs=args.runs, kills=args.kills, seed=seed, workdir=workdir, workers=args.workers
    ).run()
    print(report.table())
    if report.worst_recovery:
        print(f"worst recovery: {report.worst_recovery}")
    print(f"logs: {workdir}")
    bad = report.lost or report.stuck or report.wrong or report.double_commits
    for name in ("lost", "stuck", "wrong", "double_commits", "unrecovered"):
        for item in getattr(report, name)[:20]:
            print(f"{name}: {item}", file=sys.stderr)
    return 1 if bad or report.unrecovered else 0


if __name__ == "__main__":
    sys.exit(main())
