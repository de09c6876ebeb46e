"""``python -m runner.distributed.worker_command APP [OPTIONS]``: what ``celery -A APP worker
[OPTIONS]`` runs, without Celery's umbrella command (see
:func:`runner.distributed.broker.run_worker_command`). ``runner worker``, ``runner dev`` and
:class:`~runner.distributed.processes.WorkerProcess` start their workers so.
"""

from __future__ import annotations

import sys

import celery

USAGE = "usage: python -m runner.distributed.worker_command APP [celery worker options]"


def main(argv: list[str]) -> None:
    """Start the worker: ``argv`` is the app's module, then Celery's worker options."""
    if not argv or argv[0].startswith("-"):
        sys.exit(USAGE)
    # eventlet's or gevent's patches before the adapter imports kombu, as `celery` does first
    celery.maybe_patch_concurrency(["worker", *argv[1:]])
    from runner.distributed.broker import run_worker_command

    run_worker_command(argv[0], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
