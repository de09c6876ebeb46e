"""What a deployment watches its workers through: traces, metrics and logs for machines.

* :mod:`.traces`: OpenTelemetry traces (``RUNNER_OTEL=true``, the ``otel`` extra): one trace
  per run, a span per step attempt. Imported only when on.
* :mod:`.metrics`: Prometheus metrics, served by each worker on ``RUNNER_METRICS_PORT`` and
  by the console at ``/metrics``.
* :mod:`.logs`: ``RUNNER_LOG_FORMAT=json``, one JSON object a line carrying the step's run id,
  flow, step and attempt.
* :mod:`.hooks`: how a worker turns them on, and the one place an attempt of a step is
  observed (:class:`~.hooks.Attempt`, around every step task's body).
"""

from runner.errors import RunnerError


class TelemetryUnavailable(RunnerError):
    """A setting turns telemetry on that cannot work here (a missing extra or exporter)."""
