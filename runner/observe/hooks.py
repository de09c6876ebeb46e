"""How a worker turns telemetry on, and the one place an attempt of a step is observed.

:func:`install` (called by :func:`runner.distributed.worker.install`) reads the settings:
``RUNNER_LOG_FORMAT=json`` sets the JSON formatter on Celery's log handlers, ``RUNNER_OTEL``
sets up :mod:`.traces`, and ``RUNNER_METRICS_PORT`` serves :mod:`.metrics` from the worker's
main process once it starts (before its pool forks). With none of them nothing is set up,
and an :class:`Attempt` costs two attribute checks.

Every step task's body runs inside an :class:`Attempt`, which sees how the attempt ended
from what :func:`runner.distributed.step.execute` returned or raised (the same reply and
exceptions Celery turns into the task's state) and records it once: the outcome counted,
the duration observed, the span ended.
"""

from __future__ import annotations

import time
from types import ModuleType, TracebackType
from typing import Any

from celery import Celery, signals
from celery.exceptions import Ignore, Retry

from runner.errors import StepFailed
from runner.settings import RunnerSettings

from . import TelemetryUnavailable, logs, metrics

_traces: ModuleType | None = None
""":mod:`.traces` once ``RUNNER_OTEL`` turned it on in this process."""


def install(app: Celery, settings: RunnerSettings) -> None:
    """Turn on what ``settings`` ask for in this worker (see the module docstring);
    :class:`TelemetryUnavailable` if traces are asked for and cannot work."""
    global _traces
    if settings.log_format == "json":
        logs.install_json()
    if settings.otel:
        try:
            from . import traces
        except ImportError as exc:
            raise TelemetryUnavailable(
                f"RUNNER_OTEL=true needs the otel extra ({exc.name} is missing): "
                "pip install 'celery-flows[otel]'"
            ) from None
        traces.configure()
        _traces = traces
    if settings.metrics_port is not None:
        _serve_metrics(app, settings.metrics_port, [settings.queue])


def _serve_metrics(app: Celery, port: int, queues: list[str]) -> None:
    served: list[metrics.WorkerMetrics] = []

    def on_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is app:
            found = metrics.serve_worker(app, port, queues)
            served.extend([found] if found else [])

    def on_shutdown(**_: Any) -> None:
        while served:
            served.pop().close()

    signals.worker_init.connect(on_init, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)


class Attempt:
    """One attempt of a step on a worker, as traces and metrics see it.

    ``with Attempt(...) as seen: return seen.done(execute(...))``: the reply (or the
    exception) tells the outcome, one of :data:`runner.observe.metrics.OUTCOMES`.
    """

    __slots__ = ("activation", "attempt", "epoch", "name", "reply", "run_id", "span", "started")

    def __init__(self, task: Any, run_id: str, activation: str, epoch: int, attempt: int) -> None:
        self.name, self.run_id, self.activation = str(task.name), run_id, activation
        self.epoch, self.attempt = epoch, attempt
        self.reply: dict[str, Any] | None = None
        self.span: Any = None
        self.started = 0.0

    def __enter__(self) -> Attempt:
        on = metrics.recording()
        if on is not None:
            self.started = time.perf_counter()
            on.running.labels(*self._labels()).inc()
        if _traces is not None:
            self.span = _traces.StepSpan(
                self.name, self.run_id, self.activation, self.epoch, self.attempt
            )
        return self

    def done(self, reply: dict[str, Any]) -> dict[str, Any]:
        """Note the attempt's reply (it returned); returns it."""
        self.reply = reply
        return reply

    def __exit__(
        self,
        _type: type[BaseException] | None,
        error: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        on = metrics.recording()
        if on is None and self.span is None:
            return
        outcome = outcome_of(self.reply, error)
        if on is not None:
            labels = self._labels()
            on.running.labels(*labels).dec()
            on.steps.labels(*labels, outcome).inc()
            if outcome in metrics.RAN:
                on.duration.labels(*labels).observe(time.perf_counter() - self.started)
        if self.span is not None:
            checkpoint = (self.reply or {}).get("checkpoint") or getattr(error, "checkpoint", None)
            self.span.end(outcome, checkpoint, _cause(error))

    def _labels(self) -> tuple[str, str]:
        flow, _, method = self.name.rpartition(".")
        return flow, method


def outcome_of(reply: dict[str, Any] | None, error: BaseException | None) -> str:
    """How an attempt ended, from its reply or the exception that ended it (as Celery reads
    them: SUCCESS, RETRY, IGNORED or FAILURE)."""
    if error is None:
        # The replies of runner.distributed.step: a pause, a child run started, a skip, or
        # a commit (which carries the checkpoint).
        return next((key for key in ("paused", "child", "skipped") if key in (reply or {})), "done")
    if isinstance(error, Retry):
        return "retry" if error.exc is not None else "deferred"
    if isinstance(error, Ignore):
        return "duplicate"
    if isinstance(error, StepFailed):
        return "failed"
    return "error"


def _cause(error: BaseException | None) -> BaseException | None:
    """The error to record on the span: the method's own (a retry's, a failure's cause)."""
    if isinstance(error, Retry):
        exc = error.exc
        return exc if isinstance(exc, BaseException) else None
    if isinstance(error, Ignore):
        return None
    if isinstance(error, StepFailed) and error.__cause__ is not None:
        return error.__cause__
    return error
