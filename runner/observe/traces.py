"""OpenTelemetry traces: one trace per run, a span per step attempt.

Imported only when ``RUNNER_OTEL=true`` (it needs the ``otel`` extra). Every worker derives
a run's trace from its id, with no round trip: the trace id is a hash of the run id, and each
epoch of the run (its start, and every resume) has a run span whose id is a hash of the run
id and the epoch. So every attempt of every step, on any worker, in any retry or resume, is a
span of the same trace, whose parent is its epoch's run span:

* a **step span** (``<Flow>.<method>``) per attempt, with the attributes ``runner.run_id``,
  ``runner.flow``, ``runner.method``, ``runner.step`` (the activation, ``plan#1``),
  ``runner.epoch``, ``runner.attempt``, ``runner.outcome`` and, once committed,
  ``runner.checkpoint_id``; the method's exception is recorded on a failed attempt. It links
  to Celery's consume span of the message (opentelemetry-instrumentation-celery), and the
  messages the step sends are published under it, so Celery's spans hang off the run's. A
  message that carries no context of its run's trace (a run's first step, a resume's or an
  answer's, sent by a producer that traces nothing) is given its epoch's run span as parent
  before Celery's consume span starts (:func:`join_run_trace`): no span of a run is an orphan.
* a **run span** (``run <Flow>``) per epoch, from its start to its end, sent by the worker
  that commits the end (succeeded, failed, or paused for a person's answer: the answer
  opens the next epoch), with ``ERROR`` status for a failed run. An epoch that ends
  cancelled sends none (the cancel is committed by whoever cancels, maybe a process that
  traces nothing); its steps stay in the trace.

Sending the run span with its derived ids takes :class:`RunIds` as the tracer provider's id
generator: the provider made here from the ``OTEL_*`` variables has it; a provider the process
already has (``opentelemetry-instrument``, or set up by your own code) is used as it is, and
sends run spans if it was given ``id_generator=RunIds()``.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
from importlib.metadata import entry_points
from typing import Any

from celery import signals
from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from runner.errors import RunnerError
from runner.flow import events as ev

TRACER = "runner"
SERVICE = "runner-worker"
"""``service.name`` of the provider made here, unless ``OTEL_SERVICE_NAME`` (or
``OTEL_RESOURCE_ATTRIBUTES``) names one."""

EXPORTERS = "opentelemetry_traces_exporter"
"""Entry-point group of the span exporters ``OTEL_TRACES_EXPORTER`` names (the SDK's own)."""


class TracingUnavailable(RunnerError):
    """``RUNNER_OTEL=true`` and the traces cannot be set up as the ``OTEL_*`` variables say."""


# --- ids of a run ----------------------------------------------------------------------------


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def trace_id_of(run_id: str) -> int:
    """The trace id of run ``run_id`` (128 bits of a hash of its id; never 0)."""
    return int.from_bytes(_digest(run_id)[:16], "big") or 1


def run_span_id(run_id: str, epoch: int) -> int:
    """The span id of epoch ``epoch`` of run ``run_id`` (64 bits of a hash; never 0)."""
    return int.from_bytes(_digest(f"{run_id}/{epoch}")[:8], "big") or 1


def run_context(run_id: str, epoch: int) -> context.Context:
    """A context whose current span is the run span of ``epoch``: what a step span is
    started in, on any worker."""
    parent = SpanContext(
        trace_id_of(run_id),
        run_span_id(run_id, epoch),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent), context.Context())


_given: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "runner_run_span_ids", default=None
)


class RunIds(RandomIdGenerator):
    """Random ids, except while :class:`RunSpans` starts a run span: then the trace and span
    ids derived from its run id (:func:`trace_id_of`, :func:`run_span_id`)."""

    def generate_trace_id(self) -> int:
        given = _given.get()
        return given[0] if given else super().generate_trace_id()

    def generate_span_id(self) -> int:
        given = _given.get()
        return given[1] if given else super().generate_span_id()

    def is_trace_id_random(self) -> bool:
        return _given.get() is None


# --- set-up ----------------------------------------------------------------------------------


def configure() -> None:
    """Set up traces in this worker: a tracer provider from the ``OTEL_*`` variables unless
    the process has one, Celery's instrumentation, run spans, and a flush when a pool
    process exits; :class:`TracingUnavailable` if an exporter named is not installed."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider_from_env())
    instrumentor = CeleryInstrumentor()
    # Before the instrumentation's own task_prerun receiver (Celery calls receivers in the
    # order they connected): one already connected (opentelemetry-instrument) is connected
    # again after ours.
    signals.task_prerun.connect(join_run_trace, weak=False, dispatch_uid="runner-join-trace")
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    instrumentor.instrument()
    ev.register(RunSpans())
    # A pool process ends without running atexit hooks: send what it still holds first.
    signals.worker_process_shutdown.connect(_flush, weak=False)


def traceparent_of(run_id: str, epoch: int) -> str:
    """The W3C ``traceparent`` of the run span of ``epoch`` of ``run_id`` (sampled)."""
    return f"00-{trace_id_of(run_id):032x}-{run_span_id(run_id, epoch):016x}-01"


def join_run_trace(task: Any = None, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
    """Celery ``task_prerun``, before the instrumentation's: a step message that carries no
    trace context of its run (sent by a producer that traces nothing, or whose publish span
    is in a trace of the producer's own) is given its epoch's run span as parent, so
    Celery's consume span of it (``run/<Flow>.<method>``) is in the run's trace like every
    other span of the run. Messages sent under a step span (a worker's) keep their parent."""
    kwargs = kwargs or {}
    run_id, epoch = kwargs.get("run_id"), kwargs.get("epoch")
    if task is None or not isinstance(run_id, str) or not isinstance(epoch, int):
        return
    request = getattr(task, "request", None)
    if request is None:
        return
    given = getattr(request, "traceparent", None)
    parts = given.split("-") if isinstance(given, str) else []
    if len(parts) == 4 and parts[1] == f"{trace_id_of(run_id):032x}":
        return  # published under a span of the run already
    request.traceparent = traceparent_of(run_id, epoch)
    request.tracestate = None


def provider_from_env() -> TracerProvider:
    """A tracer provider exporting to what ``OTEL_TRACES_EXPORTER`` names (comma-separated;
    ``otlp`` by default, as the OpenTelemetry specification says; ``none`` for no export),
    with the resource of ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``. The sampler
    is the SDK's (``OTEL_TRACES_SAMPLER``)."""
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": SERVICE})
    provider = TracerProvider(resource=resource, id_generator=RunIds())
    for exporter in _exporters(os.environ.get("OTEL_TRACES_EXPORTER", "otlp")):
        provider.add_span_processor(BatchSpanProcessor(exporter()))
    return provider


def _exporters(names: str) -> list[Any]:
    found = []
    for name in (part.strip() for part in names.split(",")):
        if not name or name == "none":
            continue
        points = entry_points(group=EXPORTERS, name=name)
        if not points:
            package = "opentelemetry-exporter-otlp" if name.startswith("otlp") else "its package"
            raise TracingUnavailable(
                f"OTEL_TRACES_EXPORTER names the span exporter {name!r}, which is not "
                f"installed: install {package}, or set OTEL_TRACES_EXPORTER=console (or none)",
                exporter=name,
            )
        found.append(next(iter(points)).load())
    return found


def _flush(**_: Any) -> None:
    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        flush()


def _tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


# --- spans -----------------------------------------------------------------------------------


class StepSpan:
    """The span of one attempt of a step, current while the attempt runs."""

    def __init__(
        self, task_name: str, run_id: str, activation: str, epoch: int, attempt: int
    ) -> None:
        flow, _, method = task_name.rpartition(".")
        celery_span = trace.get_current_span().get_span_context()
        self.span = _tracer().start_span(
            task_name,
            context=run_context(run_id, epoch),
            links=[Link(celery_span)] if celery_span.is_valid else None,
            attributes={
                "runner.run_id": run_id,
                "runner.flow": flow,
                "runner.method": method,
                "runner.step": activation,
                "runner.epoch": epoch,
                "runner.attempt": attempt,
            },
        )
        self.token = context.attach(trace.set_span_in_context(self.span))

    def end(self, outcome: str, checkpoint: str | None, error: BaseException | None) -> None:
        """End the span: the attempt came to ``outcome``, committed ``checkpoint`` (if any),
        failed with ``error`` (if it did)."""
        context.detach(self.token)
        self.span.set_attribute("runner.outcome", outcome)
        if checkpoint:
            self.span.set_attribute("runner.checkpoint_id", checkpoint)
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.end()


_ENDS = {ev.FLOW_FINISHED: "succeeded", ev.FLOW_FAILED: "failed", ev.FLOW_PAUSED: "paused"}
"""The events that end an epoch (when they carry its ``epoch``), and the status they give."""


class RunSpans(ev.EventListener):
    """Sends an epoch's run span when the epoch ends (``flow_finished``, ``flow_failed``, or
    the ``flow_paused`` of a running run; told by the worker that commits it), with the ids
    every step span named as its parent."""

    def on_event(self, event: ev.FlowEvent) -> None:
        """Send the run span of the epoch ``event`` ends, if it ends one."""
        if event.type not in _ENDS or event.duration is None:
            return
        epoch, opened = event.data.get("epoch"), event.data.get("opened_at")
        provider = trace.get_tracer_provider()
        if epoch is None or opened is None:
            return
        if not isinstance(getattr(provider, "id_generator", None), RunIds):
            return  # a provider of the process's own cannot give the span its id
        token = _given.set((trace_id_of(event.run_id), run_span_id(event.run_id, int(epoch))))
        try:
            span = _tracer().start_span(
                f"run {event.flow}",
                context=context.Context(),  # a root, whatever span is current
                start_time=int(opened * 1e9),
                attributes={
                    "runner.run_id": event.run_id,
                    "runner.flow": event.flow,
                    "runner.epoch": int(epoch),
                    "runner.status": _ENDS[event.type],
                },
            )
        finally:
            _given.reset(token)
        if event.type == ev.FLOW_FAILED:
            span.set_status(Status(StatusCode.ERROR, event.error or "the run failed"))
        span.end(end_time=int((opened + event.duration) * 1e9))  # the closing checkpoint's
