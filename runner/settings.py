"""The one place runner defaults live.

Every field can be overridden by an environment variable named ``RUNNER_<FIELD>``
(for example ``RUNNER_REDIS_URL``), or by a dotenv file named by
``RUNNER_ENV_FILE`` (``config/runner.env`` documents every field).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class RunnerSettings(BaseSettings):
    """Runner configuration; see ``config/runner.env`` for the documented defaults."""

    model_config = SettingsConfigDict(env_prefix="RUNNER_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis for checkpoints and the Celery broker; unset = embedded local Redis.",
    )
    prefix: str = Field(default="runner", description="Key prefix of this deployment.")
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
        default=30.0, gt=0, description="A running step's lease; renewed by a heartbeat."
    )
    recovery_interval: float = Field(
        default=10.0, gt=0, description="Seconds between the workers' recovery passes."
    )
    queue: str = Field(default="celery", description="Celery queue the steps are sent to.")
    embedded_dir: str | None = Field(
        default=None, description="Data directory of the embedded Redis (default: a temp dir)."
    )

    @field_validator("flow_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


@lru_cache(maxsize=1)
def get_settings() -> RunnerSettings:
    """Settings from the environment (and ``RUNNER_ENV_FILE`` if set), cached."""
    env_file = os.environ.get("RUNNER_ENV_FILE")
    if env_file:
        return RunnerSettings(_env_file=env_file)
    return RunnerSettings()


def reset_settings() -> None:
    """Forget cached settings (tests and the CLI call this after changing env vars)."""
    get_settings.cache_clear()
