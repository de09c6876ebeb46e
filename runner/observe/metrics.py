"""Prometheus metrics of the workers and the console, named in one place.

=======================================  =========  ==========================================
metric                                   type       what it counts
=======================================  =========  ==========================================
``runner_steps_total``                   counter    step attempts on workers, by ``flow``,
                                                    ``method`` and ``outcome`` (below)
``runner_step_duration_seconds``         histogram  attempts that ran their method, by ``flow``
                                                    and ``method``: from the attempt's start
                                                    to its commit (or retry, or failure)
``runner_steps_running``                 gauge      attempts running now, by ``flow`` and
                                                    ``method``
``runner_recovered_steps_total``         counter    steps the recovery pass sent again
``runner_takeovers_total``               counter    attempts that took over the lease of a dead
                                                    attempt
``runner_quarantined_runs_total``        counter    runs marked corrupt (unreadable data)
``runner_queue_depth``                   gauge      messages waiting in a queue, by ``queue``
                                                    (read from the broker at each scrape)
``runner_queue_oldest_seconds``          gauge      age of a queue's oldest waiting message, by
                                                    ``queue`` (the console; 0 when empty; left
                                                    out where not measured: RabbitMQ)
``runner_runs``                          gauge      runs by ``status`` (the console, read from
                                                    the store at each scrape)
=======================================  =========  ==========================================

The outcomes of ``runner_steps_total`` are :data:`OUTCOMES`. A deferral is the outcome
``deferred``: the step's message is put back for later, because a live attempt holds the
step or a rate or concurrency limit holds it back (:mod:`runner.distributed.limits`).

Each worker serves its metrics on ``RUNNER_METRICS_PORT`` (:func:`serve_worker`). A step
runs in one of the pool's processes, so the counters use prometheus_client's multiprocess
mode: every process writes its values to files in a directory of its worker's own
(``PROMETHEUS_MULTIPROC_DIR``, made when the worker starts and removed when it stops), and
the worker's main process adds them up at each scrape. The metrics are made once that
variable is set, in the worker's main process before its pool forks. The console serves
``/metrics`` itself (:func:`console_registry`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from runner.store.base import DeploymentStore

log = logging.getLogger("runner.metrics")

OUTCOMES = (
    "done",
    "paused",
    "child",
    "retry",
    "failed",
    "deferred",
    "duplicate",
    "skipped",
    "error",
)
"""How an attempt ends, as ``runner_steps_total`` counts it: committed (``done``), paused
the run for a human, started a child run, failed and will be retried, failed its run,
deferred (a live attempt or a limit holds the step), a duplicate that committed nothing (or a
message of another deployment, handed back), skipped (its run is unknown, stopped or in
a newer epoch), or broke off with an unexpected error (its lease lapses and recovery sends
the step again)."""

RAN = frozenset({"done", "paused", "child", "retry", "failed"})
"""Outcomes of attempts that ran their method: their durations are observed."""

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
"""Seconds: a step may be a quick function or a long LLM call."""

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Instruments:
    """The worker's counters, gauge and histogram (made once multiprocess mode is on).

    ``registry``: where they are registered; none on a worker, whose ``/metrics`` reads the
    values every process wrote to its directory, not a registry of one process.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = ("flow", "method")
        self.steps = Counter(
            "runner_steps_total",
            "Step attempts on workers by outcome.",
            [*labels, "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "runner_step_duration_seconds",
            "Duration of step attempts that ran their method.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.running = Gauge(
            "runner_steps_running",
            "Step attempts running now.",
            labels,
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.recovered = Counter(
            "runner_recovered_steps_total", "Steps the recovery pass sent again.", registry=registry
        )
        self.takeovers = Counter(
            "runner_takeovers_total",
            "Attempts that took over the lease of a dead attempt.",
            registry=registry,
        )
        self.quarantined = Counter(
            "runner_quarantined_runs_total",
            "Runs marked corrupt (their data cannot be read).",
            registry=registry,
        )


_on: Instruments | None = None
"""The worker's instruments while it serves metrics; ``None`` (nothing recorded) otherwise."""


def recording() -> Instruments | None:
    """The instruments, when this worker serves metrics."""
    return _on


def recovered(count: int) -> None:
    """The recovery pass sent ``count`` steps again."""
    if _on is not None and count:
        _on.recovered.inc(count)


def took_over() -> None:
    """An attempt took over the lease of a dead attempt."""
    if _on is not None:
        _on.takeovers.inc()


def quarantined() -> None:
    """A run was marked corrupt."""
    if _on is not None:
        _on.quarantined.inc()


# --- the worker's server -------------------------------------------------------------------


@dataclass
class WorkerMetrics:
    """A worker's metrics server and the directory its processes write their values to."""

    directory: str
    server: Any
    port: int

    def close(self) -> None:
        """Stop serving and remove the directory (the worker stops)."""
        global _on
        _on = None
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)


def serve_worker(app: Celery, port: int, queues: list[str]) -> WorkerMetrics | None:
    """Turn multiprocess mode on and serve ``/metrics`` on ``port`` from this (the worker's
    main) process, before its pool starts; ``None`` (one ERROR said why) if it cannot."""
    global _on
    directory = tempfile.mkdtemp(prefix=f"runner-metrics-{os.getpid()}-")
    os.environ[MULTIPROC_ENV] = directory  # the pool's processes inherit it
    from prometheus_client import CollectorRegistry, start_http_server, values

    # prometheus_client picks the class of its values when imported, and the `celery`
    # command has imported it already (Flower's command plugin imports it): pick again, now
    # that the directory is set, before any of our metrics is made.
    values.ValueClass = values.get_value_class()

    registry = CollectorRegistry()
    registry.register(_LiveProcesses(directory))
    registry.register(QueueDepth(app, queues))
    try:
        server, _thread = start_http_server(port, registry=registry)
    except OSError as exc:
        log.error("metrics: cannot serve on port %d (%s); this worker serves no metrics", port, exc)
        shutil.rmtree(directory, ignore_errors=True)
        return None
    _on = Instruments()
    return WorkerMetrics(directory, server, port)


_PID = re.compile(r"_(\d+)\.db$")


class _LiveProcesses:
    """The values every process of the worker wrote, summed; first, the gauges of processes
    gone (a pool process that exited or was killed) are dropped, so ``runner_steps_running``
    counts only live attempts. Counters of gone processes stay: their counts happened."""

    def __init__(self, directory: str) -> None:
        from prometheus_client import multiprocess

        self.directory = directory
        self.summed = multiprocess.MultiProcessCollector(None, path=directory)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client import multiprocess

        pids = {int(m.group(1)) for name in os.listdir(self.directory) if (m := _PID.search(name))}
        for pid in pids:
            if not _alive(pid):
                multiprocess.mark_process_dead(pid, self.directory)
        yield from self.summed.collect()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a live process of another user: not one of ours, nothing to drop
    return True


# --- read at scrape time -------------------------------------------------------------------


class QueueDepth:
    """``runner_queue_depth{queue}``: the messages waiting in each queue, read from the broker
    (kombu's passive declare, on Redis and RabbitMQ alike) when scraped."""

    def __init__(self, app: Celery, queues: list[str]) -> None:
        self.app, self.queues = app, queues

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        from runner.distributed.broker import queue_depths

        depths = queue_depths(self.app, self.queues)  # None: unreachable, logged there
        if depths is None:
            return
        family = GaugeMetricFamily(
            "runner_queue_depth", "Messages waiting in the queue.", labels=["queue"]
        )
        for queue, depth in depths.items():
            family.add_metric([queue], depth)
        yield family


class RunsByStatus:
    """``runner_runs{status}``: every run of the deployment by status, read from the store's
    run index when scraped (a page of run metadata per 500 runs)."""

    PAGE = 500

    def __init__(self, store: DeploymentStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        from runner.store.models import RunStatus

        counts = dict.fromkeys(RunStatus, 0)
        offset = 0
        while page := self.store.runs(limit=self.PAGE, offset=offset):
            for info in page:
                counts[info.status] += 1
            offset += len(page)
        family = GaugeMetricFamily("runner_runs", "Runs by status.", labels=["status"])
        for status, count in counts.items():
            family.add_metric([status.value], count)
        yield family


class QueueBacklog:
    """``runner_queue_depth{queue}`` and ``runner_queue_oldest_seconds{queue}`` of every
    queue ``read`` returns as (queue, depth, oldest message's age or ``None``), read when
    scraped (the console passes :func:`runner.distributed.fleet.backlog_reader`). A queue
    whose age is not measured (``None``: RabbitMQ) has no ``oldest_seconds`` sample."""

    def __init__(self, read: Callable[[], list[tuple[str, int, float | None]]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            found = self.read()
        except Exception as exc:  # Redis or the broker away: no sample rather than a 500
            log.warning("metrics: cannot read the queues (%s)", exc)
            return
        depth = GaugeMetricFamily(
            "runner_queue_depth", "Messages waiting in the queue.", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "runner_queue_oldest_seconds",
            "Age of the oldest message waiting in the queue (0 when empty).",
            labels=["queue"],
        )
        for queue, count, age in found:
            depth.add_metric([queue], count)
            if age is not None:
                oldest.add_metric([queue], age)
        yield depth
        yield oldest


class StoreMemoryUse:
    """``runner_store_memory_used_bytes{store}``, ``..._limit_bytes`` and ``..._free_bytes``
    (below the limit): each Redis server of the store, read (``INFO memory``) when scraped.
    Limit and free are left out for a server without a limit."""

    def __init__(self, store: DeploymentStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        found = self.store.memory()
        families = {
            name: GaugeMetricFamily(f"runner_store_memory_{name}_bytes", text, labels=["store"])
            for name, text in (
                ("used", "Memory the store's Redis uses."),
                ("limit", "The store's memory limit (maxmemory or RUNNER_STORE_MAX_BYTES)."),
                ("free", "Memory left below the limit."),
            )
        }
        for memory in found:
            families["used"].add_metric([memory.store], memory.used)
            if memory.limit is not None and memory.free is not None:
                families["limit"].add_metric([memory.store], memory.limit)
                families["free"].add_metric([memory.store], memory.free)
        yield from families.values()


def console_registry(
    app: Celery,
    store: DeploymentStore,
    queues: list[str],
    backlog: Callable[[], list[tuple[str, int, float | None]]] | None = None,
) -> CollectorRegistry:
    """What the console's ``/metrics`` serves: runs by status, the store's memory and, with
    ``backlog``, every known queue's depth and oldest message's age (:class:`QueueBacklog`),
    else the depth of ``queues``."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsByStatus(store))
    registry.register(QueueDepth(app, queues) if backlog is None else QueueBacklog(backlog))
    registry.register(StoreMemoryUse(store))
    return registry
