"""runner's worker app on a kombu with one fault injected before the app loads.

``KOMBU_FAULT=<name> celery -A tests.kombu_faulty_worker worker``; the names are
:data:`tests.kombu_faults.FAULTS`.
"""

import os

from tests import kombu_faults

kombu_faults.inject(os.environ["KOMBU_FAULT"])

from runner.worker import app  # noqa: E402  (kombu is changed first)

__all__ = ["app"]
