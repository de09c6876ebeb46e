"""The raw Celery baseline of ``bench/workers.py``: no-op tasks on the runner's Celery settings.

``celery -A bench._bench_tasks worker`` runs them; the app is :func:`make_app`'s, so broker,
result backend, serializers, late acks, prefetch and task events are the ones the flow
workers use. Its kombu is as released unless ``BENCH_ONE_CLIENT=true``
(:func:`runner.distributed.broker.one_client_per_channel`, which every runner worker has).
"""

from __future__ import annotations

import os
from typing import Any

from runner.distributed import broker
from runner.distributed.app import make_app

app = make_app(main="bench_tasks")

if os.environ.get("BENCH_ONE_CLIENT") == "true":
    # The reference worker of bench/workers.py: kombu's Redis channels keep one client, as a
    # runner worker's do (its pool processes inherit it), so that row compares like for like.
    broker.one_client_per_channel()


@app.task(name="bench.noop")
def noop(*args: Any, **kwargs: Any) -> None:
    """Do nothing (a chain passes the previous result in; it is ignored)."""
