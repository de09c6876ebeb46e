"""The one place runner defaults live.

Every field can be overridden by an environment variable named ``RUNNER_<FIELD>``
(for example ``RUNNER_REDIS_URL``), or by a dotenv file named by
``RUNNER_ENV_FILE`` (``config/runner.env`` documents every field).

The settings are a plain pydantic model that reads its own sources, as pydantic-settings'
``BaseSettings`` did for it (``env_prefix="RUNNER_"``, names case-insensitive, values as
given): keywords first, then ``RUNNER_*`` variables, then the dotenv file. pydantic-settings
was most of a cold CLI command's cost beyond its libraries (it imports every source it has:
the CLI parser, cloud secret stores, dotenv); python-dotenv is imported only when a file is
named. ``tests/test_settings_sources.py`` holds them to pydantic-settings' results.

No ``from __future__ import annotations``: pydantic would evaluate each field's annotation
from its string when the model is built (the model is built on every cold command).
"""

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from runner.errors import InvalidSettings
from runner.store.policy import Policy, parse_policy

ENV_PREFIX = "RUNNER_"
"""Every field's variable is this and its name (``RUNNER_REDIS_URL``), in any case."""


class _FromEnvironment(BaseModel):
    """A model whose unset fields come from ``RUNNER_*`` variables, then from the dotenv file
    ``_env_file`` (if given and a file): what pydantic-settings' ``BaseSettings`` with
    ``env_prefix`` did for these flat fields (keywords > variables > dotenv > defaults)."""

    def __init__(self, _env_file: str | os.PathLike[str] | None = None, **values: Any) -> None:
        fields = type(self).model_fields
        found = _env_file_values(_env_file, fields) if _env_file is not None else {}
        found.update(_prefixed(os.environ, fields))
        found.update(values)
        super().__init__(**found)


def _prefixed(variables: Any, fields: dict[str, Any]) -> dict[str, str]:
    """``{field: value}`` of the ``RUNNER_<FIELD>`` among ``variables`` (names compared
    lowercased, the last of two spellings wins; a value of ``None``, a dotenv name without
    ``=``, is no value)."""
    found: dict[str, str] = {}
    for key, value in variables.items():
        name = key.lower()
        field = name[len(ENV_PREFIX) :]
        if name.startswith(ENV_PREFIX.lower()) and field in fields and value is not None:
            found[field] = value
    return found


def _env_file_values(env_file: str | os.PathLike[str], fields: dict[str, Any]) -> dict[str, str]:
    """The fields set by the dotenv file ``env_file`` (none if it is no file)."""
    path = Path(env_file).expanduser()
    if not (path.is_file() or path.is_fifo()):
        return {}
    from dotenv import dotenv_values  # only when a file is named

    return _prefixed(dotenv_values(path, encoding="utf-8"), fields)


class RunnerSettings(_FromEnvironment):
    """Runner configuration; see ``config/runner.env`` for the documented defaults."""

    # As BaseSettings: unknown names ignored, defaults validated too.
    model_config = ConfigDict(extra="ignore", validate_default=True)

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
    store_retry: float = Field(
        default=30.0,
        ge=0,
        description="Seconds a Redis command (a producer's or a worker's) waits (with backoff) "
        "for a restarting Redis or a Sentinel failover before it is StoreUnavailable.",
    )
    max_checkpoints: int = Field(
        default=200, ge=0, description="Checkpoints kept per run (0 = keep all)."
    )
    stream_maxlen: int = Field(
        default=10_000,
        ge=1,
        description="Entries kept in each run's stream of live output (older ones trimmed).",
    )
    stream_linger_ms: float = Field(
        default=5.0,
        ge=0,
        description="Milliseconds a step's stream writer waits to batch chunks into one write.",
    )
    flow_modules: list[str] = Field(
        default=[],  # pydantic copies it; `list` as a factory costs a cold command ~2 ms (RunInfo)
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
    worker_queues: list[str] = Field(
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
    ui_user: str | None = Field(
        default=None,
        description="The name the console records as who answered or cancelled (a basic-auth "
        "login's user name comes first); unset = `console`.",
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
    retention: str = Field(
        default="",
        description="How long finished runs stay in Redis, counted from their end, e.g. "
        "`succeeded=7d,failed=30d,cancelled=7d` (s/m/h/d); a status not named is kept. "
        "Enforced by the workers' recovery pass; a flow's `@retention` overrides it.",
    )
    archive: str = Field(
        default="",
        description="Where finished runs go before Redis drops them: a SQLite file, a JSON "
        "checkpoint directory or a `postgresql://` URL; unset = expired runs are deleted.",
    )
    retention_batch: int = Field(
        default=100,
        ge=1,
        description="Expired runs one recovery pass archives and deletes at most.",
    )
    encryption_keys: SecretStr | None = Field(
        default=None,
        description="`kid:base64key[,kid0:oldkey]`: AES-GCM of every payload the Redis store "
        "writes; the first key seals, all open; unset = payloads stored clear.",
    )
    store_max_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Memory the store may use, in bytes; unset = Redis's maxmemory (if any).",
    )
    store_high_water: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Fraction of the store's memory limit past which a submit is refused "
        "(StoreFull); running runs go on committing.",
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

    @field_validator("retention")
    @classmethod
    def _parse_retention(cls, value: str) -> str:
        parse_policy(value)  # one InvalidSettings line naming RUNNER_RETENTION if bad
        return value

    @field_validator("archive")
    @classmethod
    def _archive_location(cls, value: str) -> str:
        scheme = value.partition("://")[0] if "://" in value else ""
        if scheme and scheme not in ("postgresql", "postgres"):
            raise ValueError(
                f"{scheme}:// is not an archive: give a SQLite file, a JSON directory "
                "or a postgresql:// URL"
            )
        return value

    @property
    def retention_policy(self) -> Policy:
        """:attr:`retention` parsed (status -> seconds kept)."""
        return parse_policy(self.retention)

    @field_validator("encryption_keys", mode="after")
    @classmethod
    def _parse_keys(cls, value: SecretStr | None) -> SecretStr | None:
        # Checked here, so a bad list is one InvalidSettings line in every process; the
        # message never holds a key.
        if value is None or not value.get_secret_value().strip():
            return None
        from runner.store.codec import parse_keys

        parse_keys(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _queue_of_prefix(self) -> "RunnerSettings":
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
    # The names first, the values of ours only: reading every variable's value (os.environ
    # decodes each) cost more than the rest of a call, and callers read the settings often.
    n = len(ENV_PREFIX)
    environment = tuple(
        sorted((k, os.environ[k]) for k in list(os.environ) if k[:n].upper() == ENV_PREFIX)
    )
    cached = _cache.get(environment)
    if cached is not None:
        return cached
    env_file = os.environ.get("RUNNER_ENV_FILE")
    try:
        settings = RunnerSettings(_env_file=env_file) if env_file else RunnerSettings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ENV_PREFIX + "_".join(str(p) for p in err["loc"]).upper()
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
