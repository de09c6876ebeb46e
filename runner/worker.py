"""The Celery app users start: ``celery -A runner.worker worker`` (or ``runner worker``).

It reads the runner settings (``RUNNER_REDIS_URL``, ``RUNNER_FLOW_MODULES``, ...),
registers one task per method of every flow in the allow-listed modules, and
runs the recovery pass in the background. Without ``RUNNER_REDIS_URL`` it uses the
Redis of the ``runner dev`` found from the working directory up (and imports the flow
modules from that project too); with neither it refuses to start (one line on stderr),
rather than wait on a Redis nobody shares.
"""

import sys

from runner.distributed.app import make_app, set_app
from runner.distributed.worker import install
from runner.embedded import find_dev
from runner.errors import RunnerError
from runner.settings import get_settings

try:
    if not get_settings().redis_url and (dev := find_dev()) is not None:
        sys.path.append(str(dev.project))
    app = make_app(main="runner.worker")
    set_app(app)
    runtime = install(app)
except RunnerError as exc:
    # Celery would print this as a traceback inside its own "unable to load" message.
    print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
    raise SystemExit(1) from None

__all__ = ["app", "runtime"]
