"""This checkout's Celery app, for ``celery -A workers worker`` run from the repository.

Installed deployments point Celery at the package itself (``celery -A runner.worker worker``,
or ``runner worker``); this module only re-exports that app so the checkout's scripts,
benchmarks and tests keep their short name.
"""

from runner.worker import app, runtime

__all__ = ["app", "runtime"]
