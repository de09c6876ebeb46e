"""Traces, metrics and logs of real workers: a worker's /metrics scraped over HTTP under the
prefork pool, the console's /metrics, spans a worker's pool processes sent to the SDK's
in-memory exporter (tests/telemetry_probe.py), the console exporter chosen by
OTEL_TRACES_EXPORTER, and JSON log lines carrying the step."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from examples.fanout import FanoutFlow
from examples.linear import LinearFlow
from runner.distributed import control
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime
from runner.distributed.processes import WorkerProcess
from runner.observe.traces import run_span_id, trace_id_of
from runner.store.models import RunStatus
from tests._dist_support import eventually, history, private_pool
from tests.chaos_support import free_port
from tests.console_support import serving
from tests.flows.dist import DistFlaky
from tests.flows.flow_control import RatedFlow
from tests.telemetry_probe import KEY_ENV, gate

FANOUT_STEPS = ["plan", *(f"branch_{i}" for i in range(10)), "join"]


def _scrape(url: str, token: str | None = None) -> dict[tuple[str, frozenset[Any]], float]:
    """Sample (name, labels) -> value of a /metrics page."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(url, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def _value(samples: dict[tuple[str, frozenset[Any]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _settled(
    samples: dict[tuple[str, frozenset[Any]], float], steps: int
) -> dict[tuple[str, frozenset[Any]], float] | None:
    """``samples`` once ``steps`` attempts are counted and none is running, else ``None``."""
    counted = sum(v for (name, _), v in samples.items() if name == "runner_steps_total")
    running = sum(v for (name, _), v in samples.items() if name == "runner_steps_running")
    return samples if counted >= steps and running == 0 else None


def _pool_pids(worker: WorkerProcess) -> set[int]:
    return set(worker.children())


# --- off by default ------------------------------------------------------------------------


@pytest.mark.processes
def test_a_worker_sets_up_no_telemetry_unless_asked(redis_url: str) -> None:
    code = (
        "import sys, runner.worker\n"
        "from runner.observe import metrics\n"
        "assert metrics.recording() is None\n"
        "loaded = [m for m in ('runner.observe.traces', 'opentelemetry.instrumentation.celery')"
        " if m in sys.modules]\n"
        "print(loaded)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "RUNNER_REDIS_URL": redis_url, "RUNNER_FLOW_MODULES": "examples.linear"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.processes
def test_a_worker_asked_for_an_exporter_that_is_not_installed_refuses_in_one_line(
    redis_url: str,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "runner.worker", "worker", "-P", "solo"],
        env={
            **env,
            "RUNNER_REDIS_URL": redis_url,
            "RUNNER_FLOW_MODULES": "tests.flows.dist",  # else it refuses for want of flows
            "RUNNER_OTEL": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: OTEL_TRACES_EXPORTER names the span exporter 'otlp', which is not installed: "
        "install opentelemetry-exporter-otlp, or set OTEL_TRACES_EXPORTER=console (or none)"
    ]
    assert "Traceback" not in done.stderr


# --- metrics -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_serves_exact_step_counts_over_http_across_its_pool_processes(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    # A lease long enough that no step is re-sent while the replaced pool processes start on
    # a loaded machine: the test counts recovery's re-sends as none.
    with private_pool(
        worker_env, str(tmp_path), RUNNER_METRICS_PORT=str(port), RUNNER_LEASE_SECONDS="30"
    ) as (pool, rt, env):
        pool.start(concurrency=2)
        worker = pool.workers[0]
        assert submit(FanoutFlow, {}, rt=rt).result(timeout=30) == "10 notes"
        assert submit(DistFlaky, {}, rt=rt).result(timeout=30) == "after 3 attempts"
        # Every pool process is killed and replaced: the counts they made stay. Killed idle:
        # a result is out when its step commits, before the attempt ends and acks its message.
        eventually(lambda: _settled(_scrape(url), len(FANOUT_STEPS) + 3))
        killed = _pool_pids(worker)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        eventually(lambda: len(_pool_pids(worker) - killed) == 2, timeout=30)
        assert submit(FanoutFlow, {}, rt=rt).result(timeout=30) == "10 notes"

        # The result is out when the last step commits; its attempt is counted just after.
        samples = eventually(lambda: _settled(_scrape(url), 2 * len(FANOUT_STEPS) + 4))
        for method in FANOUT_STEPS:
            labels = {"flow": "FanoutFlow", "method": method}
            assert _value(samples, "runner_steps_total", **labels, outcome="done") == 2, method
            assert _value(samples, "runner_step_duration_seconds_count", **labels) == 2
            assert _value(samples, "runner_steps_running", **labels) == 0
        flaky = {"flow": "DistFlaky", "method": "flaky"}
        assert _value(samples, "runner_steps_total", **flaky, outcome="retry") == 2
        assert _value(samples, "runner_steps_total", **flaky, outcome="done") == 1
        assert _value(samples, "runner_step_duration_seconds_count", **flaky) == 3
        assert _value(samples, "runner_step_duration_seconds_bucket", **flaky, le="+Inf") == 3
        steps = sum(v for (name, _), v in samples.items() if name == "runner_steps_total")
        assert steps == 2 * len(FANOUT_STEPS) + 4  # and no other outcome of any step
        for name in ("recovered_steps", "takeovers", "quarantined_runs"):
            assert (f"runner_{name}_total", frozenset()) in samples
            assert _value(samples, f"runner_{name}_total") == 0
        assert _value(samples, "runner_queue_depth", queue=env["RUNNER_QUEUE"]) == 0

        # The console's /metrics: every run of the deployment by status.
        token = uuid.uuid4().hex
        with serving(rt, token=token) as base:
            console = _scrape(f"{base}/metrics", token)
            assert httpx.get(f"{base}/metrics", timeout=10).status_code == 401
        assert _value(console, "runner_runs", status="succeeded") == 3
        assert _value(console, "runner_runs", status="running") == 0
        assert _value(console, "runner_queue_depth", queue=env["RUNNER_QUEUE"]) == 0
        directory = _metrics_dir(worker)
        pool.stop_all()  # a warm shutdown, as an operator's
    assert not directory.exists()  # the worker removed it when it stopped


def _metrics_dir(worker: WorkerProcess) -> Path:
    assert worker.proc is not None
    found = list(Path("/tmp").glob(f"runner-metrics-{worker.proc.pid}-*"))
    assert len(found) == 1
    return found[0]


def test_the_console_counts_runs_by_status_and_waiting_messages(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    # No worker consumes this deployment's queue: its runs stay running, their starts queued.
    with private_pool(worker_env, str(tmp_path)) as (_pool, rt, env), serving(rt) as base:
        for _ in range(3):
            submit(LinearFlow, {}, rt=rt)
        samples = _scrape(f"{base}/metrics")
    assert _value(samples, "runner_runs", status="running") == 3
    assert _value(samples, "runner_runs", status="succeeded") == 0
    statuses = {dict(labels)["status"] for name, labels in samples if name == "runner_runs"}
    assert statuses == {status.value for status in RunStatus}
    assert _value(samples, "runner_queue_depth", queue=env["RUNNER_QUEUE"]) == 3


# --- traces --------------------------------------------------------------------------------


def _spans(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(key, 0, -1)]


def _of_run(spans: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["attributes"].get("runner.run_id") == run_id]


def _hex(number: int, width: int) -> str:
    return f"0x{number:0{width}x}"


@pytest.mark.slow
def test_a_run_is_one_trace_with_a_span_per_step_attempt_under_its_run_span(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    key = f"telemetry-probe:{uuid.uuid4().hex}"
    modules = f"{worker_env['RUNNER_FLOW_MODULES']},tests.telemetry_probe"
    overrides = {"RUNNER_OTEL": "true", KEY_ENV: key, "RUNNER_FLOW_MODULES": modules}
    with private_pool(worker_env, str(tmp_path), **overrides) as (pool, rt, _env):
        pool.start(concurrency=2)
        fan = submit(FanoutFlow, {}, rt=rt)
        assert fan.result(timeout=30) == "10 notes"
        flaky = submit(DistFlaky, {}, rt=rt)
        assert flaky.result(timeout=30) == "after 3 attempts"
        gated = submit("tests.telemetry_probe:Gated", {}, rt=rt)
        assert gated.wait(timeout=30) is RunStatus.FAILED
        redis_client.set(gate(gated.run_id), 1)
        assert control.resume(gated.run_id, rt=rt).wait(timeout=30) is RunStatus.SUCCEEDED
        asking = submit("tests.telemetry_probe:Asking", {}, rt=rt)
        assert asking.wait(timeout=30) is RunStatus.PAUSED
        assert control.answer(asking.run_id, "eels", rt=rt).result(timeout=30) == "about eels"

        def run_spans(run_id: str, count: int) -> list[dict[str, Any]]:
            found = _of_run(_spans(redis_client, key), run_id)
            return found if len(found) >= count else []

        fan_spans = eventually(lambda: run_spans(fan.run_id, 13), timeout=20)
        flaky_spans = eventually(lambda: run_spans(flaky.run_id, 5), timeout=20)
        gated_spans = eventually(lambda: run_spans(gated.run_id, 5), timeout=20)
        everything = _spans(redis_client, key)
        _fanout_is_one_trace(rt, fan.run_id, fan_spans, everything)
        _retries_join_the_trace(flaky.run_id, flaky_spans)
        _resumes_join_the_trace(rt, gated.run_id, gated_spans)
        asking_spans = eventually(lambda: run_spans(asking.run_id, 5), timeout=20)
        _a_pause_ends_its_epoch_s_run_span(asking.run_id, asking_spans)
        # Celery's consume spans too, of steps a resume or an answer sent from this process
        # (which traces nothing) included: each step span's link is in its run's trace.
        handles = (fan, flaky, gated, asking)

        def with_linked() -> list[dict[str, Any]]:  # a consume span ends after its step's
            found = _spans(redis_client, key)
            ids = {s["context"]["span_id"] for s in found}
            linked = {
                link["context"]["span_id"]
                for h in handles
                for span in _of_run(found, h.run_id)
                for link in span["links"]
            }
            return found if linked <= ids else []

        everything = eventually(with_linked, timeout=20)
        by_id = {s["context"]["span_id"]: s for s in everything}
        for handle in handles:
            for span in _of_run(everything, handle.run_id):
                for link in span["links"]:
                    consumed = by_id[link["context"]["span_id"]]
                    assert consumed["context"]["trace_id"] == _hex(trace_id_of(handle.run_id), 32)


def _fanout_is_one_trace(
    rt: Runtime, run_id: str, spans: list[dict[str, Any]], everything: list[dict[str, Any]]
) -> None:
    trace_id = _hex(trace_id_of(run_id), 32)
    assert {s["context"]["trace_id"] for s in spans} == {trace_id}
    [root] = [s for s in spans if s["name"] == "run FanoutFlow"]
    assert root["parent_id"] is None
    assert root["context"]["span_id"] == _hex(run_span_id(run_id, 0), 16)
    assert root["status"]["status_code"] == "UNSET"
    steps = [s for s in spans if s is not root]
    assert sorted(s["attributes"]["runner.step"] for s in steps) == sorted(
        f"{m}#1" for m in FANOUT_STEPS
    )
    committed = {c.activation: c.id for c in history(rt, run_id) if c.activation}
    for span in steps:
        attrs = span["attributes"]
        assert span["name"] == f"FanoutFlow.{attrs['runner.method']}"
        assert span["parent_id"] == root["context"]["span_id"]
        assert attrs["runner.flow"] == "FanoutFlow"
        assert (attrs["runner.attempt"], attrs["runner.epoch"]) == (1, 0)
        assert attrs["runner.outcome"] == "done"
        assert attrs["runner.checkpoint_id"] == committed[attrs["runner.step"]]
        # The run span ends with the commit of the join; the join's span just after it.
        assert root["start_time"] <= span["start_time"] <= root["end_time"]
    # Each step span links to Celery's consume span of its message. The messages of the
    # branches and the join were published (by Celery, so traced) under the span of the
    # step whose commit sent them: Celery's spans are in the run's trace too.
    by_id = {s["context"]["span_id"]: s for s in everything}
    for span in steps:
        [link] = span["links"]
        consumed = by_id[link["context"]["span_id"]]
        assert consumed["name"] == f"run/{span['name']}"
        assert consumed["kind"] == "SpanKind.CONSUMER"
        method = span["attributes"]["runner.method"]
        if method == "plan":  # sent by the test process, which traces nothing: under the run
            assert consumed["context"]["trace_id"] == trace_id
            assert consumed["parent_id"] == root["context"]["span_id"]
            continue
        published = by_id[consumed["parent_id"]]
        assert published["name"] == f"apply_async/{span['name']}"
        assert consumed["context"]["trace_id"] == published["context"]["trace_id"] == trace_id
        sender = by_id[published["parent_id"]]["attributes"]["runner.method"]
        assert sender == "plan" if method != "join" else sender.startswith("branch_")


def _retries_join_the_trace(run_id: str, spans: list[dict[str, Any]]) -> None:
    flaky = sorted(
        (s for s in spans if s["name"] == "DistFlaky.flaky"),
        key=lambda s: s["attributes"]["runner.attempt"],
    )
    assert [s["attributes"]["runner.attempt"] for s in flaky] == [1, 2, 3]
    assert [s["attributes"]["runner.outcome"] for s in flaky] == ["retry", "retry", "done"]
    for span, n in zip(flaky[:2], (1, 2), strict=True):
        assert span["status"] == {
            "status_code": "ERROR",
            "description": f"RuntimeError: flaky attempt {n}",
        }
        [event] = span["events"]
        assert event["name"] == "exception"
        assert event["attributes"]["exception.message"] == f"flaky attempt {n}"
    assert {s["context"]["trace_id"] for s in spans} == {_hex(trace_id_of(run_id), 32)}
    assert {s["parent_id"] for s in flaky} == {_hex(run_span_id(run_id, 0), 16)}


def _resumes_join_the_trace(rt: Runtime, run_id: str, spans: list[dict[str, Any]]) -> None:
    assert {s["context"]["trace_id"] for s in spans} == {_hex(trace_id_of(run_id), 32)}
    runs = {s["attributes"]["runner.epoch"]: s for s in spans if s["name"] == "run Gated"}
    assert sorted(runs) == [0, 1]
    assert runs[0]["status"]["status_code"] == "ERROR"
    assert "RuntimeError: the gate is closed" in runs[0]["status"]["description"]
    assert runs[1]["status"]["status_code"] == "UNSET"
    checks = {s["attributes"]["runner.epoch"]: s for s in spans if s["name"] == "Gated.check"}
    assert checks[0]["attributes"]["runner.outcome"] == "failed"
    assert checks[0]["parent_id"] == runs[0]["context"]["span_id"]
    assert checks[0]["events"][0]["attributes"]["exception.type"] == "RuntimeError"
    failure = next(c for c in history(rt, run_id) if c.error is not None)
    assert checks[0]["attributes"]["runner.checkpoint_id"] == failure.id
    assert checks[1]["attributes"]["runner.outcome"] == "done"
    assert checks[1]["parent_id"] == runs[1]["context"]["span_id"]
    assert runs[1]["context"]["span_id"] == _hex(run_span_id(run_id, 1), 16)


def _a_pause_ends_its_epoch_s_run_span(run_id: str, spans: list[dict[str, Any]]) -> None:
    """The epoch a question paused has its run span, ended by the pause; the answer's epoch
    has the next, and each attempt of the asking step hangs under its own epoch's."""
    runs = {s["attributes"]["runner.epoch"]: s for s in spans if s["name"] == "run Asking"}
    assert sorted(runs) == [0, 1]
    assert runs[0]["attributes"]["runner.status"] == "paused"
    assert runs[0]["status"]["status_code"] == "UNSET"
    assert runs[0]["context"]["span_id"] == _hex(run_span_id(run_id, 0), 16)
    assert runs[1]["attributes"]["runner.status"] == "succeeded"
    asks = {s["attributes"]["runner.epoch"]: s for s in spans if s["name"] == "Asking.question"}
    assert asks[0]["attributes"]["runner.outcome"] == "paused"
    assert asks[0]["parent_id"] == runs[0]["context"]["span_id"]
    assert asks[0]["start_time"] <= runs[0]["end_time"]
    assert asks[1]["parent_id"] == runs[1]["context"]["span_id"]


@pytest.mark.slow
def test_the_first_step_is_in_the_run_s_trace_when_the_producer_traces_nothing(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    key = f"telemetry-probe:{uuid.uuid4().hex}"
    modules = f"{worker_env['RUNNER_FLOW_MODULES']},tests.telemetry_probe"
    overrides = {"RUNNER_OTEL": "true", KEY_ENV: key, "RUNNER_FLOW_MODULES": modules}
    with private_pool(worker_env, str(tmp_path), **overrides) as (pool, rt, env):
        pool.start(concurrency=2)
        # The producer: `runner submit` in a process of its own, with no OTel at all (no
        # RUNNER_OTEL, no OTEL_*, no tracer provider), so its message carries no trace context.
        plain = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "OTEL_"))}
        producer = {k: v for k, v in env.items() if k not in ("RUNNER_OTEL", KEY_ENV)}
        code = (
            "import sys\n"
            "from runner.cli import app\n"
            "try:\n"
            "    app(['submit', 'examples.fanout:FanoutFlow', '--json'])\n"
            "finally:\n"
            "    assert 'opentelemetry.instrumentation.celery' not in sys.modules\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**plain, **producer},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
        handle = RunHandle(run_id, rt)
        assert handle.result(timeout=30) == "10 notes"
        trace_id = _hex(trace_id_of(run_id), 32)

        def of_trace() -> list[dict[str, Any]]:
            found = [s for s in _spans(redis_client, key) if s["context"]["trace_id"] == trace_id]
            consumed = [s for s in found if s["kind"] == "SpanKind.CONSUMER"]
            return found if len(consumed) >= len(FANOUT_STEPS) else []

        spans = eventually(of_trace, timeout=20)
    everything = _spans(redis_client, key)
    by_id = {s["context"]["span_id"]: s for s in everything}
    run_span = _hex(run_span_id(run_id, 0), 16)
    # Every consume span of the run's steps, the first's included, is in the run's trace.
    consumed = {s["name"]: s for s in spans if s["kind"] == "SpanKind.CONSUMER"}
    assert sorted(consumed) == sorted(f"run/FanoutFlow.{m}" for m in FANOUT_STEPS)
    first = consumed["run/FanoutFlow.plan"]
    assert first["parent_id"] == run_span  # the run span: no publish span was sent
    # ... and nothing of the run is in another trace: each step span links to its consume
    # span, which is in the run's trace.
    steps = [s for s in _of_run(everything, run_id) if s["kind"] == "SpanKind.INTERNAL"]
    assert {s["context"]["trace_id"] for s in steps} == {trace_id}
    for step in steps:
        if step["name"].startswith("run "):
            continue
        [link] = step["links"]
        assert by_id[link["context"]["span_id"]]["context"]["trace_id"] == trace_id
    assert [s for s in everything if s["name"] == "run/FanoutFlow.plan"] == [first]


@pytest.mark.slow
def test_otel_traces_exporter_console_prints_a_runs_spans_in_the_worker_log(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    overrides = {
        "RUNNER_OTEL": "true",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "observability-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    with private_pool(worker_env, str(tmp_path), **overrides) as (pool, rt, _env):
        pool.start(concurrency=2)
        handle = submit(LinearFlow, {}, rt=rt)
        handle.result(timeout=30)
        log = Path(tmp_path) / "worker-0.log"
        trace_id = _hex(trace_id_of(handle.run_id), 32)
        printed = eventually(lambda: log.read_text().count(f'"trace_id": "{trace_id}"') >= 4)
        pool.stop_all()  # a warm shutdown flushes the spans still batched
    assert printed
    text = log.read_text()
    assert '"name": "run LinearFlow"' in text
    assert '"service.name": "observability-test"' in text


# --- logs ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_json_worker_logs_carry_the_run_flow_step_and_attempt_of_every_line_about_a_step(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with private_pool(worker_env, str(tmp_path)) as (_pool, rt, env):
        worker = WorkerProcess({**env, "RUNNER_LOG_FORMAT": "json"}, log=log, loglevel="info")
        worker.start(rt.app)
        try:
            handle = submit(DistFlaky, {}, rt=rt)
            assert handle.result(timeout=30) == "after 3 attempts"
            succeeded = f"DistFlaky.flaky[{handle.run_id}:0:flaky#1] succeeded"
            eventually(lambda: succeeded in log.read_text())
        finally:
            worker.stop()
    # Every line naming the run is one JSON object (Celery prints its banner as text).
    about = [json.loads(line) for line in log.read_text().splitlines() if handle.run_id in line]
    assert len(about) >= 10
    for record in about:
        assert record["run_id"] == handle.run_id, record
        assert record["flow"] == "DistFlaky", record
        assert record["step"] in ("setup#1", "flaky#1"), record
        assert {"time", "level", "logger", "process"} <= set(record)
    retrying = [r for r in about if "retrying in" in r["message"]]
    assert [(r["level"], r["attempt"]) for r in retrying] == [("WARNING", 1), ("WARNING", 2)]
    received = [r for r in about if r["message"].endswith("received") and r["step"] == "flaky#1"]
    assert [r["attempt"] for r in received] == [1, 2, 3]
    [done] = [r for r in about if succeeded in r["message"]]
    # Logged by a pool process; "received" by the worker's main process.
    assert done["attempt"] == 3 and done["process"] != received[0]["process"]


# --- deploy/ -------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _metric_names() -> set[str]:
    """Every series name the workers and the console serve."""
    from prometheus_client import CollectorRegistry

    from runner.observe.metrics import Instruments

    registry = CollectorRegistry()
    Instruments(registry)
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    names = {f.name + end for f in registry.collect() for end in suffixes[f.type]}
    return {*names, "runner_queue_depth", "runner_queue_oldest_seconds", "runner_runs"}


def test_the_grafana_dashboard_queries_only_metrics_the_runner_serves() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for query in queries for name in re.findall(r"\brunner_\w+", query)}
    assert used <= _metric_names()
    # Every metric has a panel (the histogram through its buckets).
    assert {name.removesuffix("_bucket") for name in used} >= {
        "runner_steps_total",
        "runner_step_duration_seconds",
        "runner_steps_running",
        "runner_recovered_steps_total",
        "runner_takeovers_total",
        "runner_quarantined_runs_total",
        "runner_queue_depth",
        "runner_queue_oldest_seconds",
        "runner_runs",
    }


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@pytest.mark.processes
def test_compose_scrapes_every_worker_and_the_console_only_under_the_metrics_profile() -> None:
    secrets = {"REDIS_PASSWORD": "x1", "FLOWER_BASIC_AUTH": "a:b", "RUNNER_UI_TOKEN": "t0ken"}

    def compose(*args: str) -> str:
        done = subprocess.run(
            ["docker-compose", "--project-directory", str(ROOT), "-f", "compose.yaml", *args],
            cwd=ROOT,
            env={**os.environ, **secrets},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    resolved = compose("config")
    worker = resolved.split("\n  worker:\n", 1)[1]
    port = re.search(r"RUNNER_METRICS_PORT: '?(\d+)'?", worker)
    assert port is not None
    scrape = (ROOT / "deploy" / "prometheus.yml").read_text()
    assert f"port: {port.group(1)}" in scrape  # the port the workers serve
    assert 'targets: ["ui:8765"]' in scrape and "credentials_file: /tmp/ui-token" in scrape
    prometheus = resolved.split("\n  prometheus:\n", 1)[1].split("\n  redis:\n", 1)[0]
    assert "profiles:\n    - metrics\n" in prometheus  # plain `docker compose up` leaves it
    assert "/tmp/ui-token" in prometheus and "RUNNER_UI_TOKEN: t0ken" in prometheus
    assert "127.0.0.1:9090:9090" in prometheus  # Prometheus asks no password: loopback only


@pytest.mark.slow
def test_a_step_a_rate_limit_holds_back_counts_as_deferred_then_done(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    with private_pool(worker_env, str(tmp_path), RUNNER_METRICS_PORT=str(port)) as (
        pool,
        rt,
        _,
    ):
        pool.start(concurrency=2)
        group = uuid.uuid4().hex
        # 5/s allows a burst of five: the other seven wait for their turn, off the pool (some
        # of them get it by the time they are taken when the machine is slow to submit).
        handles = [submit(RatedFlow, {"group": group}, rt=rt) for _ in range(12)]
        assert all(h.wait(timeout=30) is RunStatus.SUCCEEDED for h in handles)
        samples = _scrape(f"http://127.0.0.1:{port}/metrics")
    labels = {"flow": "RatedFlow", "method": "call"}
    assert _value(samples, "runner_steps_total", **labels, outcome="done") == 12
    assert _value(samples, "runner_steps_total", **labels, outcome="deferred") >= 3
