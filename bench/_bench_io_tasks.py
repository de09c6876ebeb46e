"""The raw Celery baseline of ``bench/threads.py``: one 1-second I/O-bound task.

``celery -A bench._bench_io_tasks worker -P threads -c 200`` runs it; the app is
:func:`make_app`'s, so broker, result backend, serializers, late acks, prefetch and task events
are the ones the flow workers use.
"""

from __future__ import annotations

import time
from typing import Any

from bench._bench_io import WAIT
from runner.distributed.app import make_app

app = make_app(main="bench_io_tasks")


@app.task(name="bench.io_wait")
def io_wait(*args: Any, **kwargs: Any) -> None:
    """One step's wait, as :class:`bench._bench_io.IOFlow`'s (a chain passes the previous
    result in; it is ignored)."""
    time.sleep(WAIT)
