"""The Celery app: configured from the runner settings and ``config/celeryconfig.py``.

The settings a correct run depends on (JSON only, late acks, reject on worker
loss, prefetch 1, task events for Flower) are applied after the user's config
file, so a config file cannot silently turn them off. So is the deployment's queue
(``RUNNER_QUEUE``, default ``runner.<prefix>``): every step is sent to it and its
workers consume only it, so two deployments on one broker never take each other's
steps. Their remote-control and event exchanges are per deployment too, so a
``celery inspect`` or a Flower sees only its own workers and tasks.

Checkpoints live in the shared Redis (:func:`runner.embedded.shared_redis_url`: never
a private one); the steps travel over ``RUNNER_BROKER_URL`` (e.g. RabbitMQ), default
that same Redis.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery

from runner.embedded import mask_url, shared_redis_url
from runner.errors import StoreUnavailable
from runner.settings import RunnerSettings, get_settings
from runner.store import connection

from . import broker, fleet, routing
from .services import services

REQUIRED: dict[str, Any] = {
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
    "worker_send_task_events": True,
    "task_send_sent_event": True,
    "task_track_started": True,
    "result_extended": True,
    "broker_connection_retry_on_startup": True,
}

CONFIG_MODULE = "config.celeryconfig"


def load_config_module() -> dict[str, Any]:
    """Plain names from ``RUNNER_CELERY_CONFIG`` (a module) or ``config/celeryconfig.py``."""
    name = os.environ.get("RUNNER_CELERY_CONFIG", CONFIG_MODULE)
    try:
        module = importlib.import_module(name)
    except ImportError:
        path = Path.cwd() / "config" / "celeryconfig.py"
        if name != CONFIG_MODULE or not path.is_file():
            return {}
        sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(name)
        finally:
            sys.path.pop(0)
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and k.islower()}


def make_app(settings: RunnerSettings | None = None, *, main: str = "runner") -> Celery:
    """A Celery app on the settings' shared Redis (``StoreUnavailable`` if there is none)."""
    settings = settings or get_settings()
    url = shared_redis_url(settings.redis_url)
    if "+cluster://" in url and not settings.broker_url:  # kombu has no Cluster transport
        raise StoreUnavailable(
            f"checkpoints on a Redis Cluster ({mask_url(url)}) need a broker of their own: "
            "set RUNNER_BROKER_URL (a plain Redis or RabbitMQ)"
        )
    app = Celery(main, set_as_current=False)
    # TLS options, ACL credentials and kombu's Sentinel transport: connection's to decide.
    reach = connection.celery_conf(
        settings.broker_url or url, _result_backend(url, settings.broker_url), settings
    )
    conf: dict[str, Any] = {
        **reach,
        "control_exchange": f"celery.{settings.prefix}",
        "event_exchange": f"celeryev.{settings.prefix}",
        # Checkpoints are the record of a step; results cost a backend write per task.
        "task_ignore_result": not settings.task_results,
    }
    conf.update(load_config_module())
    for key in connection.TRANSPORT_OPTIONS:  # a config file's (visibility_timeout) kept
        if key in reach:
            conf[key] = connection.merged_options(conf.get(key) or {}, reach[key])
    conf.update(REQUIRED)
    conf["task_default_queue"] = settings.queue
    app.conf.update(conf)
    app.conf.runner_redis_url = url
    broker.configure_priorities(app)  # every step message carries a priority the broker honours
    routing.install(app, settings)  # before any send: every step goes to its method's queue
    fleet.stamp_sent_at()  # every message says when it was sent: a queue's oldest age
    return app


def _result_backend(url: str, broker_url: str | None) -> str | None:
    """Where results (when kept) go: the checkpoints' Redis, or with checkpoints on a Redis
    Cluster the broker's Redis (none beside a RabbitMQ broker)."""
    if "+cluster://" not in url:
        return url
    return broker_url if broker_url and broker_url.startswith(("redis", "rediss")) else None


def get_app() -> Celery:
    """The process-wide producer app (workers install theirs with :func:`set_app`), kept
    in the process's services."""
    own = services()
    if own.app is None:
        own.app = make_app()
    return own.app


def set_app(app: Celery | None) -> None:
    """Make ``app`` the one :func:`get_app` returns (``None`` forgets it)."""
    services().app = app
