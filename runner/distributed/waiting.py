"""What a running run's in-flight steps wait for: a limit (deferred, see :mod:`.limits`) or a
queue no live worker consumes (see :mod:`.routing`). Read by ``runner status``, ``runner
steps``, ``runner limits`` and the console; it reads the store only (no Celery), whose
records :mod:`runner.store.limits` and :mod:`runner.store.queues` decode.

How an in-flight step is shown (``running``, or ``waiting`` with what for) is decided by
:func:`runner.views.step_states` from what :func:`waits_of` says."""

from __future__ import annotations

from typing import Any

from runner import ids
from runner.errors import RunnerError
from runner.flow import transition as tr
from runner.flow import versions
from runner.flow.loading import load_flow
from runner.settings import RunnerSettings
from runner.store.base import DeploymentStore
from runner.store.models import Checkpoint, RunStatus

from . import routing


def waits_of(
    store: DeploymentStore, settings: RunnerSettings, latest: Checkpoint, app: Any = None
) -> dict[str, str]:
    """In-flight step -> what it waits for, for the steps of a running run that wait.

    With ``app`` (its Celery app: a Redis broker is read), a step handed to the workers of a
    version none of which is live (:mod:`.routing`) waits ``for a worker of version V``;
    without it, that is told of a run pinned to a version (``RUNNER_VERSION_POLICY=pinned``)
    only."""
    if latest.status is not RunStatus.RUNNING or not latest.in_flight:
        return {}
    found: dict[str, str] = _version_waits(store, settings, latest, app)
    for use in store.limit_uses():
        for run, step, seconds in use.waiting:
            if run == latest.run_id:
                found[step] = f"limit {use.name} ({use.spec}), tries again in {seconds:.1f}s"
    try:
        graph = load_flow(str(latest.flow)).graph()
    except (RunnerError, ImportError):
        return found  # the flow cannot be imported here: its queues are unknown
    for act in latest.in_flight:
        step = ids.activation_of_key(act)
        spec = graph.methods.get(ids.method_of(step))
        if spec is None or spec.queue is None or step in found:
            continue
        if routing.unconsumed(store, settings, spec.queue):
            queue = routing.queue_name(settings, spec.queue)
            found[step] = f"queue {spec.queue} ({queue}): no live worker consumes it"
    return found


def _version_waits(
    store: DeploymentStore, settings: RunnerSettings, latest: Checkpoint, app: Any
) -> dict[str, str]:
    """In-flight step -> ``waiting for a worker of version V`` for each step handed to (or,
    pinned, bound for) the workers of a version none of which is live."""
    wanted = versions.waiting_for(latest, settings.version_policy)
    pinned = settings.version_policy == "pinned"
    if not wanted or (app is None and not pinned):
        return {}
    from .engine import task_id

    try:
        graph = load_flow(str(latest.flow)).graph()
    except (RunnerError, ImportError):
        graph = None  # the default queue: a method's own queue= is unknown here
    found: dict[str, str] = {}
    for act in latest.in_flight:
        step = ids.activation_of_key(act)
        spec = graph.methods.get(ids.method_of(step)) if graph is not None else None
        base = routing.queue_name(settings, spec.queue if spec is not None else None)
        for version in wanted:
            twin = routing.version_queue(base, version)
            if store.queue_consumers(twin):
                continue
            there = None
            if app is not None:
                from .broker import holds

                there = holds(app, twin, task_id(latest.run_id, tr.epoch_of(latest, step), step))
            if there or (there is None and pinned):
                found[step] = f"waiting for a worker of version {version}"
                break
    return found
