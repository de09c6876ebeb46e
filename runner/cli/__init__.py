"""The ``runner`` command line: a thin shell over the Python API.

Each command builds a producer runtime from the settings (``RUNNER_REDIS_URL``,
``RUNNER_PREFIX``, ``RUNNER_QUEUE``; ``--redis-url`` overrides the URL), calls one
function of :mod:`runner.distributed.client` / :mod:`runner.distributed.control` /
the store, and prints a rich view or, with ``--json``, the models' JSON dumps.
Errors are one ``error:`` line on stderr; exit codes are in :mod:`runner.cli._session`.
"""

from __future__ import annotations

import os
import sys

from ._app import app

# Importing a module registers its commands; --help lists them in this order.
# isort: off
from . import runs  # noqa: F401
from . import ops  # noqa: F401
from . import history  # noqa: F401

# isort: on

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``runner`` console script."""
    # Like `celery -A`: flow paths (pkg.mod:Flow) resolve against the working directory.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    app(prog_name="runner")


if __name__ == "__main__":
    main()
