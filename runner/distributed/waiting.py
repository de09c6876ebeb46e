"""What a running run's in-flight steps wait for: a limit (deferred, see :mod:`.limits`) or a
queue no live worker consumes (see :mod:`.routing`). Read by ``runner status``, ``runner
steps``, ``runner limits`` and the console; it reads the store only (no Celery), whose
records :mod:`runner.store.limits` and :mod:`runner.store.queues` decode."""

from __future__ import annotations

from runner.errors import RunnerError
from runner.flow.loading import load_flow
from runner.settings import RunnerSettings
from runner.store.base import DeploymentStore
from runner.store.models import Checkpoint, RunStatus

from . import routing


def waits_of(
    store: DeploymentStore, settings: RunnerSettings, latest: Checkpoint
) -> dict[str, str]:
    """In-flight step -> what it waits for, for the steps of a running run that wait."""
    if latest.status is not RunStatus.RUNNING or not latest.in_flight:
        return {}
    found: dict[str, str] = {}
    for use in store.limit_uses():
        for run, step, seconds in use.waiting:
            if run == latest.run_id:
                found[step] = f"limit {use.name} ({use.spec}), tries again in {seconds:.1f}s"
    try:
        graph = load_flow(str(latest.flow)).graph()
    except (RunnerError, ImportError):
        return found  # the flow cannot be imported here: its queues are unknown
    for act in latest.in_flight:
        step = act.rpartition("/")[2]
        spec = graph.methods.get(step.partition("#")[0])
        if spec is None or spec.queue is None or step in found:
            continue
        if routing.unconsumed(store, settings, spec.queue):
            queue = routing.queue_name(settings, spec.queue)
            found[step] = f"queue {spec.queue} ({queue}): no live worker consumes it"
    return found
