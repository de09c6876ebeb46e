"""Imported by the workers of tests/test_observability.py (it is in their allow-list, not in
the other tests' workers): the SDK's in-memory span exporter, its spans also pushed to a
Redis list as they end (``TELEMETRY_PROBE_KEY``), so the test reads what the worker's pool
processes traced; and a flow whose second step fails until the test lets it pass.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runner import Flow, FlowState, listen, start
from runner.observe.traces import RunIds

KEY_ENV = "TELEMETRY_PROBE_KEY"


class SharedMemoryExporter(InMemorySpanExporter):
    """The in-memory exporter, whose finished spans the test process can read too."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__()
        self.url, self.key = url, key

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = super().export(spans)
        # A client per call: the pool's processes fork after this module is imported.
        with redis.Redis.from_url(self.url) as client:
            client.rpush(self.key, *[json.dumps(json.loads(span.to_json())) for span in spans])
        return result


if os.environ.get(KEY_ENV):
    _provider = TracerProvider(id_generator=RunIds())
    _provider.add_span_processor(
        SimpleSpanProcessor(
            SharedMemoryExporter(os.environ["RUNNER_REDIS_URL"], os.environ[KEY_ENV])
        )
    )
    trace.set_tracer_provider(_provider)


def gate(run_id: str) -> str:
    """The Redis key that lets :class:`Gated`'s ``check`` pass."""
    return f"telemetry-probe:{{{run_id}}}:open"


class GatedState(FlowState):
    """``checked`` is set once ``check`` passes."""

    checked: bool = False


class Gated(Flow[GatedState]):
    """prepare -> check (fails, no retries, until :func:`gate` is set)."""

    @start()
    def prepare(self) -> str:
        return "prepared"

    @listen(prepare)
    def check(self) -> str:
        with redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"]) as client:
            if not client.exists(gate(self.state.id)):
                raise RuntimeError("the gate is closed")
        self.state.checked = True
        return "checked"


class Asking(Flow[dict[str, str]]):
    """question (asks a person, pausing the run on a worker) -> reply."""

    @start()
    def question(self) -> str:
        return str(self.ask("which topic?"))

    @listen(question)
    def reply(self, topic: str) -> str:
        return f"about {topic}"
