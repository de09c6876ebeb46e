"""The one place runner defaults live.

Every field can be overridden by an environment variable named ``RUNNER_<FIELD>``
(for example ``RUNNER_REDIS_URL``), or by a dotenv file named by
``RUNNER_ENV_FILE`` (``config/runner.env`` documents every field).
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from runner.errors import InvalidSettings


class RunnerSettings(BaseSettings):
    """Runner configuration; see ``config/runner.env`` for the documented defaults."""

    model_config = SettingsConfigDict(env_prefix="RUNNER_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis for checkpoints (and the broker); unset = the `runner dev` instance.",
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker of the steps (redis:// or amqp://); unset = the Redis URL.",
    )
    prefix: str = Field(default="runner", description="Key prefix of this deployment.")
    redis_username: str | None = Field(
        default=None, description="ACL user of the Redis connections; unset = `default`."
    )
    redis_password: str | None = Field(
        default=None, description="Password of the Redis connections (a URL's own wins)."
    )
    redis_password_file: str | None = Field(
        default=None, description="File whose first line is the Redis password."
    )
    redis_ssl_ca_certs: str | None = Field(
        default=None,
        description="CA bundle a `rediss://` or `rediss+sentinel://` server certificate is "
        "checked against.",
    )
    redis_ssl_certfile: str | None = Field(
        default=None,
        description="Client certificate for `rediss://` and `rediss+sentinel://` (mutual TLS).",
    )
    redis_ssl_keyfile: str | None = Field(
        default=None, description="Private key of the client certificate."
    )
    redis_ssl_cert_reqs: Literal["required", "optional", "none"] = Field(
        default="required",
        description="Whether a `rediss://` or `rediss+sentinel://` server certificate is checked.",
    )
    redis_wait_replicas: int | None = Field(
        default=None,
        ge=0,
        description="Replicas a commit waits for (WAIT); unset = 1 with Sentinel, else 0.",
    )
    redis_wait_timeout: float = Field(
        default=2.0, gt=0, description="Seconds a commit waits for its replicas."
    )
    max_checkpoints: int = Field(
        default=200, ge=0, description="Checkpoints kept per run (0 = keep all)."
    )
    flow_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated modules the workers import; nothing else is ever imported.",
    )
    step_retries: int = Field(default=0, ge=0, description="Default retries of a failing step.")
    retry_backoff: float = Field(default=1.0, ge=0, description="First retry delay in seconds.")
    retry_backoff_max: float = Field(default=60.0, ge=0, description="Longest retry delay.")
    step_time_limit: float | None = Field(
        default=None, gt=0, description="Default soft time limit of a step in seconds."
    )
    lease_seconds: float = Field(
        default=5.0,
        gt=0,
        description="A running step's lease; a heartbeat renews it every third of its length.",
    )
    recovery_interval: float = Field(
        default=2.0, gt=0, description="Seconds between the workers' recovery passes."
    )
    queue: str = Field(
        default="",
        description="Celery queue of the steps; unset = `runner.<prefix>`, one per deployment.",
    )
    worker_queues: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["default"],
        description="Comma-separated queues a worker consumes, by name (`default`: the "
        'deployment\'s queue; `gpu`: the queue of steps with queue="gpu").',
    )
    limits: str = Field(
        default="",
        description="Named rate limits shared by the methods that name them, e.g. "
        "`openai=500/m,search=5/s` (`runner.set_limit` sets one for the whole deployment).",
    )
    task_results: bool = Field(
        default=False,
        description="Store each step task's result in Celery's result backend (checkpoints "
        "are the record; Flower reads events, not results, so this is off by default).",
    )
    embedded_dir: str | None = Field(
        default=None, description="Data directory of the embedded Redis (default: a temp dir)."
    )
    ui_token: str | None = Field(
        default=None, description="Token of the console's actions; unset = read-only console."
    )
    ui_host: str = Field(default="127.0.0.1", description="Address the console listens on.")
    ui_port: int = Field(default=8765, ge=1, le=65535, description="Port of the console.")
    ui_flower_url: str | None = Field(
        default="http://127.0.0.1:5555", description="Flower, linked from the console's steps."
    )
    otel: bool = Field(
        default=False,
        description="OpenTelemetry traces of runs and steps (the `otel` extra; OTEL_* variables "
        "choose the exporter).",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port of each worker's Prometheus /metrics; unset = no metrics server.",
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Worker log lines: text, or one JSON object a line carrying the step's "
        "run id, flow, step and attempt.",
    )
    app_version: str | None = Field(
        default=None,
        description="The code version this deployment's checkpoints record and its workers "
        "announce; unset = a hash of each flow's graph and state schema.",
    )
    version_policy: Literal["pinned", "compatible"] = Field(
        default="compatible",
        description="`pinned`: a run's steps run only on workers of the version that started "
        "it; `compatible`: on any worker whose flow still has the run's methods and reads its "
        "state.",
    )
    dev_dir: str = Field(
        default=".runner",
        description="Folder of `runner dev` (its Redis data and URL file), found from the cwd up.",
    )

    @field_validator("flow_modules", "worker_queues", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _queue_of_prefix(self) -> RunnerSettings:
        # One queue per deployment: workers of another prefix never see (and drop) our steps.
        if not self.queue:
            self.queue = default_queue(self.prefix)
        return self


def default_queue(prefix: str) -> str:
    """The queue of a deployment that sets no ``RUNNER_QUEUE``: ``runner.<prefix>``."""
    return f"runner.{prefix}"


def get_settings() -> RunnerSettings:
    """Settings from the environment (and ``RUNNER_ENV_FILE`` if set), cached for as long as
    the ``RUNNER_*`` variables stay the same (a cold CLI command builds them once).

    A value they reject is one :class:`InvalidSettings` naming the variable, here for every
    process (CLI, worker, console), rather than pydantic's report of the whole model.
    """
    environment = tuple(sorted(i for i in os.environ.items() if i[0].upper().startswith("RUNNER_")))
    cached = _cache.get(environment)
    if cached is not None:
        return cached
    env_file = os.environ.get("RUNNER_ENV_FILE")
    try:
        settings = RunnerSettings(_env_file=env_file) if env_file else RunnerSettings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "RUNNER_" + "_".join(str(p) for p in err["loc"]).upper()
        raise InvalidSettings(f"bad setting {name}: {err['msg']}") from None
    _cache.clear()
    _cache[environment] = settings
    return settings


_cache: dict[tuple[tuple[str, str], ...], RunnerSettings] = {}
"""The settings of the last ``RUNNER_*`` environment read (one entry)."""


def reset_settings() -> None:
    """Forget cached settings (after the env file changed; a changed ``RUNNER_*`` variable
    is noticed without it)."""
    _cache.clear()
