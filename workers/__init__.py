"""The Celery app users start: ``celery -A workers worker``.

It reads the runner settings (``RUNNER_REDIS_URL``, ``RUNNER_FLOW_MODULES``, ...),
registers one task per method of every flow in the allow-listed modules, and
runs the recovery pass in the background.
"""

from runner.distributed.app import make_app, set_app
from runner.distributed.worker import install

app = make_app(main="workers")
set_app(app)
runtime = install(app)

__all__ = ["app", "runtime"]
