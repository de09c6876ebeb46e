"""``python -m runner.distributed.worker_command APP [OPTIONS]``: what ``celery -A APP worker
[OPTIONS]`` runs, without Celery's umbrella command (see
:func:`runner.distributed.broker.run_worker_command`). ``runner worker``, ``runner dev`` and
:class:`~runner.distributed.processes.WorkerProcess` start their workers so.
"""

from __future__ import annotations

import sys

from runner.distributed.processes import exec_celery_worker

USAGE = "usage: python -m runner.distributed.worker_command APP [celery worker options]"
PATCHING_POOLS = ("eventlet", "gevent")
"""Pools whose libraries Celery's own entry point patches in before anything else is
imported: with one named anywhere in the options, the worker starts through that entry."""


def main(argv: list[str]) -> None:
    """Start the worker: ``argv`` is the app's module, then Celery's worker options."""
    if not argv or argv[0].startswith("-"):
        sys.exit(USAGE)
    app_module, options = argv[0], argv[1:]
    if any(pool in option for option in options for pool in PATCHING_POOLS):
        exec_celery_worker(app_module, options)
    from runner.distributed.broker import run_worker_command

    run_worker_command(app_module, options)


if __name__ == "__main__":
    main(sys.argv[1:])
