"""The raw Celery baseline of ``bench/workers.py``: no-op tasks on the runner's Celery settings.

``celery -A bench._bench_tasks worker`` runs them; the app is :func:`make_app`'s, so broker,
result backend, serializers, late acks, prefetch and task events are the ones the flow
workers use.
"""

from __future__ import annotations

from typing import Any

from runner.distributed.app import make_app

app = make_app(main="bench_tasks")


@app.task(name="bench.noop")
def noop(*args: Any, **kwargs: Any) -> None:
    """Do nothing (a chain passes the previous result in; it is ignored)."""
