"""The Celery app users start: ``celery -A runner.worker worker`` (or ``runner worker``).

It reads the runner settings (``RUNNER_REDIS_URL``, ``RUNNER_FLOW_MODULES``, ...),
registers one task per method of every flow in the allow-listed modules, and
runs the recovery pass in the background. Without ``RUNNER_REDIS_URL`` it uses the
Redis of the ``runner dev`` found from the working directory up (and imports the flow
modules from that project too); with neither it refuses to start (one line on stderr),
rather than wait on a Redis nobody shares. Without ``RUNNER_FLOW_MODULES`` it runs the
allow-list of that ``runner dev`` (when its Redis is the one this worker uses), as a submit
there checks against; with no allow-list to be found it refuses to start (one line naming
``RUNNER_FLOW_MODULES``): a worker running no flow would take steps it cannot run.
"""

import sys

from runner.distributed.app import make_app, set_app
from runner.distributed.worker import install
from runner.embedded import dev_with_allow_list, find_dev
from runner.errors import RunnerError
from runner.settings import get_settings

NO_ALLOW_LIST = (
    "no flows to run: set RUNNER_FLOW_MODULES to the flow modules this worker may run "
    "(e.g. RUNNER_FLOW_MODULES=myproject.flows), or start it in the folder of a `runner dev` "
    "that runs them"
)

try:
    settings = get_settings()
    if not settings.redis_url and (dev := find_dev()) is not None:
        sys.path.append(str(dev.project))
    app = make_app(main="runner.worker")  # first: no Redis to share is the first thing to say
    modules = list(settings.flow_modules)
    if not modules and (found := dev_with_allow_list(settings.redis_url)) is not None:
        modules = list(found.flow_modules)
        if str(found.project) not in sys.path:
            sys.path.append(str(found.project))
    if not modules:
        raise RunnerError(NO_ALLOW_LIST)
    set_app(app)
    # Its settings name the allow-list it runs, wherever it came from.
    runtime = install(app, settings=settings.model_copy(update={"flow_modules": modules}))
except RunnerError as exc:
    # Celery would print this as a traceback inside its own "unable to load" message.
    print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
    raise SystemExit(1) from None

__all__ = ["app", "runtime"]
