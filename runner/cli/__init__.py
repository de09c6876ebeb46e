"""The ``runner`` command line: a thin shell over the Python API.

Each command reads its settings (``RUNNER_REDIS_URL``, ``RUNNER_PREFIX``, ``RUNNER_QUEUE``;
``--redis-url`` overrides the URL), builds the deployment's store alone when it only reads
(no Celery app: see :mod:`runner.cli._session`) or the producer runtime when it sends,
calls one function of :mod:`runner.distributed.client` / :mod:`runner.distributed.control` /
the store, and prints a rich view or, with ``--json``, the models' JSON dumps.
Errors are one ``error:`` line on stderr; exit codes are in :mod:`runner.cli._session`.
"""

from __future__ import annotations

import os
import sys

from runner.embedded import find_dev
from runner.errors import RunnerError

# The group imports a command's module when the command is called (or listed by --help):
# see runner.cli._app.COMMANDS.
from ._app import app

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``runner`` console script."""
    # Like `celery -A`: flow paths (pkg.mod:Flow) resolve against the working directory,
    # and against the project of the `runner dev` found from there, as its workers' do.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    project = _dev_project()
    if project is not None and project not in sys.path:
        sys.path.insert(1, project)
    app(prog_name="runner")


def _dev_project() -> str | None:
    try:
        dev = find_dev()
    except RunnerError:  # an unreadable dev.json: the command reports it when it needs Redis
        return None
    return str(dev.project) if dev is not None else None


if __name__ == "__main__":
    main()
