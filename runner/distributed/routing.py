"""Routing: the queue each step goes to, and the queues a worker consumes.

A method with ``queue="gpu"`` sends its steps to the deployment's queue of that name,
``<RUNNER_QUEUE>.gpu`` (the default queue is ``RUNNER_QUEUE``, ``runner.<prefix>``), so two
deployments never take each other's steps. One Celery router (:class:`Routes`, the first of
the app's ``task_routes``) decides it for every send: a step's first send (through the
outbox or after its commit), recovery's re-send, a retry, a resume. A worker consumes
``RUNNER_WORKER_QUEUES`` (``default`` names the default queue) and says so in Redis every
recovery interval, so ``runner status`` can tell a step that waits for a queue no live worker
consumes (:func:`unconsumed`).

Priorities go the same way: a step's is its run's (``submit(priority=...)``, kept in the
run's meta), else its method's ``priority=``, else :data:`~runner.flow.rates.DEFAULT_PRIORITY`
(:func:`step_priority`, for every send that routing decides: first send, outbox, recovery,
resume). Every step message carries one, in the broker's own terms
(:func:`runner.distributed.broker.wire_priority`); a retry or a deferral keeps the message's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from runner.flow.rates import DEFAULT_PRIORITY, check_name, parse_limits
from runner.settings import RunnerSettings
from runner.store.base import DeploymentStore
from runner.store.roster import WorkerFacts

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("runner.worker")

DEFAULT = "default"
"""The name of a deployment's default queue in ``RUNNER_WORKER_QUEUES`` and ``queue=``."""


def queue_name(settings: RunnerSettings, name: str | None) -> str:
    """The broker queue of the queue ``name`` of this deployment."""
    return settings.queue if name in (None, DEFAULT) else f"{settings.queue}.{name}"


def consumed(settings: RunnerSettings) -> list[str]:
    """The broker queues a worker with these settings consumes."""
    return [
        queue_name(settings, check_name(n, "RUNNER_WORKER_QUEUES")) for n in settings.worker_queues
    ]


class Routes:
    """A Celery router: task ``<Flow>.<method>`` -> the queue its method names."""

    def __init__(self, settings: RunnerSettings) -> None:
        self.settings = settings
        self.queues: dict[str, str] = {}
        self.priorities: dict[str, int] = {}

    def learn(self, flow_cls: Any) -> None:
        """Route the tasks of ``flow_cls``'s methods that name a queue or a priority."""
        name = flow_cls.flow_name()
        for method, spec in flow_cls.graph().methods.items():
            if spec.queue is not None:
                self.queues[f"{name}.{method}"] = queue_name(self.settings, spec.queue)
            if spec.priority is not None:
                self.priorities[f"{name}.{method}"] = spec.priority

    def __call__(self, name: str, *_: Any, **__: Any) -> dict[str, str] | None:
        queue = self.queues.get(name)
        return None if queue is None else {"queue": queue}


def install(app: Celery, settings: RunnerSettings) -> Routes:
    """Make a new :class:`Routes` the first router of ``app`` (before any send)."""
    routes = Routes(settings)
    theirs = app.conf.task_routes
    more = [] if theirs is None else list(theirs) if isinstance(theirs, list | tuple) else [theirs]
    app.conf.task_routes = (routes, *more)
    return routes


def routes_of(app: Celery) -> Routes:
    """``app``'s :class:`Routes` (apps from :func:`runner.distributed.app.make_app` have one)."""
    found = (app.conf.task_routes or (None,))[0]
    if not isinstance(found, Routes):
        raise TypeError("this Celery app was not made by runner.distributed.app.make_app")
    return found


def learn(app: Celery, flow_cls: Any) -> None:
    """Route ``flow_cls``'s steps on ``app`` (call before sending any of them)."""
    routes_of(app).learn(flow_cls)


def task_queue(app: Celery, task: str) -> str:
    """The queue a task of this deployment is sent to."""
    routes = routes_of(app)
    return routes.queues.get(task, routes.settings.queue)


def step_priority(app: Celery, task: str, run_priority: int | None) -> int:
    """The priority (0 lowest, 9 highest) of a step of task ``task`` in a run of
    ``run_priority``: the run's, else its method's, else the default."""
    if run_priority is not None:
        return run_priority
    return routes_of(app).priorities.get(task, DEFAULT_PRIORITY)


# --- versions -------------------------------------------------------------------------------
#
# A worker also consumes, for each queue it consumes, that queue's version-suffixed twin
# ``<queue>@<version>`` for every code version it runs (``RUNNER_APP_VERSION``, else each of
# its flows' code hashes, :mod:`runner.flow.versions`), and announces it as it announces the
# others: the consumers of ``<queue>@V`` are the live workers of version V. A worker that
# cannot run a step it received (its flow or method unknown here, its state unreadable, or
# pinned to another version: :func:`runner.flow.versions.hand_to`) hands it to the queue of
# the version that can (:func:`version_queue`), never failing the run; with no live worker of
# that version the step waits there, shown as ``waiting for a worker of version V``. On a
# Redis broker a worker takes from a twin only while it holds steps (:class:`WaitingTwins`).

VERSION_MARK = "@"


def version_queue(queue: str, version: str) -> str:
    """The version-suffixed twin of ``queue`` (a twin's twin is another version's twin)."""
    return f"{queue.partition(VERSION_MARK)[0]}{VERSION_MARK}{version}"


def worker_versions(settings: RunnerSettings, flows: Any) -> list[str]:
    """The code versions a worker running ``flows`` (flow classes) runs."""
    from runner.flow import versions

    if settings.app_version:
        return [settings.app_version]
    return sorted({versions.of(flow_cls.graph(), settings) for flow_cls in flows})


TWINS = "runner_version_twins"
"""The app setting where :func:`consume_versions` leaves a worker's twins for :func:`serve`."""


def consume_versions(app: Celery, versions: list[str]) -> list[str]:
    """In a worker, before it starts: consume the version twins of the queues it consumes
    (on a Redis broker, set aside until they hold steps: :class:`WaitingTwins`); returns
    them."""
    from .broker import consume_only, consuming, set_aside

    base = [q for q in consuming(app) if VERSION_MARK not in q]
    twins = [version_queue(q, v) for q in base for v in versions]
    consume_only(app, [*base, *twins])
    if WaitingTwins.apply(app):
        set_aside(app, twins)
    app.conf[TWINS] = twins
    return twins


class WaitingTwins:
    """The version twins a worker on a Redis broker takes from only while they hold steps.

    kombu's Redis transport fetches with one ``BRPOP`` naming every queue the worker
    consumes, once per priority list: a worker of three code versions that consumed its
    queue's three twins named 40 lists in every fetch instead of 10, and both the worker and
    Redis paid for them on every step (about 6% of its steps per second, ``bench/workers.py``).
    A twin holds only steps handed to its version (a rolling deploy, a pinned run), so at
    each :meth:`check` (every recovery interval) the worker reads its twins' depths in one
    round trip and consumes a twin holding steps (Celery's remote control, to itself) until
    it has been empty for :attr:`IDLE` checks. A step handed to a live worker's version
    waits about one recovery interval more than it would in the worker's own queue (and up
    to a second more, until kombu's blocking fetch under way returns).

    On RabbitMQ, which pushes messages to consumers, or with Celery's remote control off, a
    worker consumes its twins from the start (:meth:`apply`).
    """

    IDLE = 3
    """Empty checks in a row after which a worker stops consuming a twin."""

    def __init__(self, app: Celery, worker: str, twins: list[str]) -> None:
        self.app, self.worker = app, worker
        self.idle: dict[str, int | None] = dict.fromkeys(twins)
        """Each twin's empty checks in a row while the worker consumes it; ``None``: it
        does not."""

    @staticmethod
    def apply(app: Celery) -> bool:
        """Whether a worker of ``app`` takes from its twins only while they hold steps."""
        from .broker import redis_broker, remote_control

        return redis_broker(app) and remote_control(app)

    def check(self) -> None:
        """Consume the twins that hold steps; stop consuming those empty for a while."""
        from .broker import consume_now, redis_backlog, stop_consuming_now

        if not self.idle:
            return
        for twin, backlog in redis_backlog(self.app, list(self.idle)).items():
            if backlog.depth:
                # Said again at each check while steps wait: a command the worker missed
                # (its broker connection was down) is made good; one more changes nothing.
                consume_now(self.app, self.worker, twin)
                self.idle[twin] = 0
            elif (idle := self.idle[twin]) is not None:
                if idle + 1 < self.IDLE:
                    self.idle[twin] = idle + 1
                else:
                    stop_consuming_now(self.app, self.worker, twin)
                    self.idle[twin] = None


def version_waits(
    store: DeploymentStore, settings: RunnerSettings, queue: str, versions: list[str]
) -> str | None:
    """The first of ``versions`` no live worker runs (no consumer of ``queue``'s twin)."""
    return next((v for v in versions if not store.queue_consumers(version_queue(queue, v))), None)


# --- who consumes what ----------------------------------------------------------------------


def unconsumed(store: DeploymentStore, settings: RunnerSettings, name: str | None) -> bool:
    """Whether the queue ``name`` (a method's ``queue=``) has no live consumer (the records
    are :mod:`runner.store.queues`')."""
    return not store.queue_consumers(queue_name(settings, name))


def version_of_queue(queue: str) -> tuple[str, str | None]:
    """A queue's base name and, for a version twin ``<queue>@<version>``, the version."""
    base, mark, version = queue.partition(VERSION_MARK)
    return (base, version) if mark else (queue, None)


def version_queue_base(queue: str) -> str:
    """The queue a version twin is the twin of (a queue that is none: itself)."""
    return version_of_queue(queue)[0]


def about_this_worker(app: Celery, twins: list[str]) -> WorkerFacts:
    """What a worker says of itself in the roster beside its queues: the queues its flows
    route to (so a queue no worker consumes is still known), its pid, host, the runner's and
    Celery's versions, and the code versions of the app it runs (those of its queue
    ``twins``: :func:`consume_versions`)."""
    import os
    import socket

    versions = (version_of_queue(q)[1] for q in twins)
    return WorkerFacts(
        routes=tuple(sorted(set(routes_of(app).queues.values()))),
        pid=os.getpid(),
        host=socket.gethostname(),
        runner=_version("celery-flows"),
        celery=_version("celery"),
        app=tuple(sorted({v for v in versions if v})),
    )


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # a checkout that was never installed
        return "unknown"


def serve(app: Celery, store: DeploymentStore, settings: RunnerSettings) -> list[str]:
    """In a worker: check ``RUNNER_LIMITS`` and (on RabbitMQ) the queues' priorities,
    consume the queues of ``RUNNER_WORKER_QUEUES`` (unless the command line names queues
    with ``-Q``, which Celery applies after this) and, once the worker is ready, say so in
    Redis every recovery interval until it shuts down. Returns the queues."""
    import threading

    from celery import signals

    from .broker import check_priority_queues, consume_only, consuming

    queues = consumed(settings)
    parse_limits(settings.limits)  # a bad RUNNER_LIMITS stops the worker here, in one line
    consume_only(app, queues)
    # A RabbitMQ queue declared without priorities stops it here too, naming the fix.
    check_priority_queues(app, queues)
    stop = threading.Event()
    ttl = max(3 * settings.recovery_interval, 2.0)

    def announcing(worker: str, mine: list[str], about: WorkerFacts, waiting: WaitingTwins) -> None:
        while True:
            try:
                waiting.check()
            except Exception as exc:  # the broker away: checked again at the next round
                log.debug("could not look into the version queues of %s: %s", worker, exc)
            if stop.wait(settings.recovery_interval):
                return
            try:
                store.announce_queues(mine, worker, ttl, about)
            except Exception as exc:  # Redis away: the word lapses, said again on return
                log.debug("could not announce the queues of %s: %s", worker, exc)

    def ready(sender: Any = None, **_: Any) -> None:
        worker = str(getattr(sender, "hostname", "") or "worker")
        now = consuming(app)
        # Its twins: those set aside, of the queues it consumes (``-Q`` may have chosen
        # others), are taken from as they fill, so it announces them with the others.
        aside = WaitingTwins.apply(app)
        twins = [
            q
            for q in app.conf.get(TWINS) or ()
            if q in now or (aside and version_queue_base(q) in now)
        ]
        mine = sorted({*now, *twins})
        about = about_this_worker(app, twins)
        store.announce_queues(mine, worker, ttl, about)
        store.forget_dead_workers()
        waiting = WaitingTwins(app, worker, [q for q in twins if q not in now])
        thread = threading.Thread(
            target=announcing, args=(worker, mine, about, waiting), name="queues", daemon=True
        )
        thread.start()

        def shutdown(**_: Any) -> None:
            stop.set()
            # An announcement under way would land after the retirement and list a stopped
            # worker as live until it lapsed: let it finish first (a Redis away: not for long).
            thread.join(timeout=5.0)
            store.retire_queues(mine, worker)

        signals.worker_shutdown.connect(shutdown, weak=False)

    signals.worker_ready.connect(ready, weak=False)
    return queues
