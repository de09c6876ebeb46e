"""Workers and queues in view: who consumes what, how busy, and what waits in each queue.

One survey (:func:`survey`) serves ``runner workers``, the console's Workers page and
``GET /api/workers``; :func:`backlog` (the queues alone, no question to the workers) serves
the console's ``/metrics`` at each scrape.

**Workers** come from two sources, joined by name:

* Celery's remote control (its public ``app.control.inspect``), asked once with a short
  timeout: ``stats()`` (pool and concurrency), ``active_queues()`` and ``active()`` (the
  attempts running now: the busy slots). It waits for as many answers as the roster has
  live workers, so a healthy fleet answers in one round trip, and at most ``timeout``
  seconds per question when one does not answer (a ``solo`` pool running a step cannot).
* The runner's roster in the store (:meth:`DeploymentStore.workers
  <runner.store.base.DeploymentStore.workers>`, records of :mod:`runner.store.roster`):
  every runner worker writes what it consumes, its versions and pid, every recovery
  interval. The time of its last write is the worker's **last heartbeat**; a worker whose
  word lapsed is listed as gone.

**Queues** are the deployment's default queue, every queue a live worker consumes, and every
queue a worker's flows route to (a queue nobody consumes is known that way). For each:

* **depth**: on Redis, the length of kombu's list of the queue plus its priority lists
  (:func:`broker.redis_backlog <runner.distributed.broker.redis_backlog>`); on RabbitMQ, a
  passive ``queue_declare`` (:func:`broker.queue_depths
  <runner.distributed.broker.queue_depths>`: the broker's ``message_count``; messages a
  consumer holds unacknowledged are not counted, as on Redis, where they sit in kombu's
  ``unacked`` hash).
* **oldest message's age**: every task message a runner process sends carries the header
  ``sent_at`` (:func:`stamp_sent_at`, Celery's public ``before_task_publish`` signal). On
  Redis the message at the consuming end of each list is read (``LINDEX -1``) and the age
  is now minus the oldest of their ``sent_at``: the age of the next message to be taken,
  i.e. the queue's head (a message sent by a process without the header is not dated). On
  RabbitMQ the age is **not measured**: AMQP shows a queue's messages only by taking them
  (``basic_get``, which would redeliver them and reorder a priority queue), so the survey
  reports ``None`` and ``/metrics`` leaves ``runner_queue_oldest_seconds`` out for that
  queue. Ages use this machine's clock against the sender's: keep clocks in sync (NTP).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from celery import signals

from runner.settings import RunnerSettings
from runner.store.roster import WorkerFacts, WorkerRecord

from . import broker, routing

if TYPE_CHECKING:
    from celery import Celery

    from .engine import Runtime

log = logging.getLogger("runner.fleet")

DEFAULT_TIMEOUT = 1.0
"""Seconds each question to the workers waits for answers."""

RABBITMQ_AGE = (
    "not measured on RabbitMQ: AMQP shows a queued message only by taking it off the queue"
)
REDIS_AGE = (
    "from the sent_at header of the message next in line in each of the queue's priority lists"
)


# --- the sent time of every message ----------------------------------------------------------


def _stamp(headers: Any = None, **_: Any) -> None:
    # Every publish (a first send, the outbox's recorded one, a retry, recovery's re-send):
    # the time this message entered its queue.
    if isinstance(headers, dict):
        headers[broker.SENT_AT] = time.time()


def stamp_sent_at() -> None:
    """Make every task message this process sends carry :data:`broker.SENT_AT` (once per
    process; Celery's public ``before_task_publish`` signal, whose ``headers`` are the
    message's own)."""
    signals.before_task_publish.connect(_stamp, weak=False, dispatch_uid="runner.sent_at")


# --- what the survey finds -------------------------------------------------------------------


@dataclass
class QueueView:
    """One queue of the deployment."""

    queue: str
    """The broker's name (``runner.<prefix>``, ``runner.<prefix>.gpu``)."""
    name: str
    """Its name in ``RUNNER_WORKER_QUEUES`` and ``queue=`` terms (``default``, ``gpu``)."""
    depth: int | None
    """Messages waiting (``None``: the broker could not be read)."""
    oldest_seconds: float | None
    """Age of the oldest waiting message (0 when empty; ``None``: not measured)."""
    consumers: list[str] = field(default_factory=list)
    """Live workers consuming it."""

    def as_json(self) -> dict[str, Any]:
        """A JSON object of the fields."""
        return asdict(self)


@dataclass
class WorkerView:
    """One worker of the deployment."""

    name: str
    queues: list[str]
    """Broker names of the queues it consumes."""
    pool: str | None = None
    """Celery's pool: ``prefork``, ``threads``, ``solo``, ... (``None``: did not answer)."""
    concurrency: int | None = None
    busy: int | None = None
    """Attempts running now (its busy slots), of ``concurrency``."""
    running: list[str] = field(default_factory=list)
    """What runs in those slots: ``<task> <task id>``."""
    last_heartbeat: float | None = None
    """When it last wrote its record in the roster (Unix seconds)."""
    heartbeat_age: float | None = None
    answered: bool = False
    """Whether it answered Celery's remote control within the timeout."""
    pid: int | None = None
    host: str | None = None
    runner_version: str | None = None
    celery_version: str | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON object of the fields."""
        return asdict(self)


@dataclass
class Fleet:
    """What :func:`survey` found."""

    broker: str
    """``redis`` or ``amqp`` (the transport of ``RUNNER_BROKER_URL``)."""
    workers: list[WorkerView]
    queues: list[QueueView]
    gone: list[WorkerView]
    """Workers whose word lapsed in the last hour (killed, or cut off from Redis)."""
    oldest_age: str
    """How the queues' ``oldest_seconds`` is measured on this broker."""
    at: float

    def as_json(self) -> dict[str, Any]:
        """A JSON object (``GET /api/workers``, ``runner workers --json``)."""
        return {
            "broker": self.broker,
            "at": self.at,
            "workers": [w.as_json() for w in self.workers],
            "queues": [q.as_json() for q in self.queues],
            "gone": [w.as_json() for w in self.gone],
            "oldest_age": self.oldest_age,
        }


# --- the survey -----------------------------------------------------------------------------


def survey(rt: Runtime, timeout: float = DEFAULT_TIMEOUT) -> Fleet:
    """The deployment's live workers and its queues, now."""
    now = time.time()
    records = {record.name: record for record in rt.store.workers()}
    live = {name: r for name, r in records.items() if r.live(now)}
    answers = _ask(rt.app, timeout, expected=len(live))
    workers = [
        _worker(name, live.get(name), answers, now) for name in sorted({*live, *answers["stats"]})
    ]
    gone = [
        _worker(name, record, answers, now)
        for name, record in sorted(records.items())
        if name not in live and name not in answers["stats"]
    ]
    queues = backlog(rt.app, rt.settings, records.values(), workers, now=now)
    return Fleet(broker_kind(rt.app), workers, queues, gone, _age_note(rt.app), now)


def backlog(
    app: Celery,
    settings: RunnerSettings,
    records: Iterable[WorkerRecord],
    workers: Iterable[WorkerView] = (),
    *,
    now: float | None = None,
) -> list[QueueView]:
    """Every known queue's depth and oldest message's age (``records``: the roster's, for
    the queues workers consume or route to; ``workers``: who consumes what)."""
    now = time.time() if now is None else now
    known = {settings.queue}
    for record in records:
        known.update(record.queues)
        known.update(record.facts.routes)
    consumers: dict[str, list[str]] = {}
    for worker in workers:
        known.update(worker.queues)
        for queue in worker.queues:
            consumers.setdefault(queue, []).append(worker.name)
    ordered = sorted(known, key=lambda q: (q != settings.queue, q))
    depths = _read_depths(app, ordered, now)
    views = []
    for q in ordered:
        depth, oldest = depths.get(q, (None, None))
        views.append(QueueView(q, _label(settings, q), depth, oldest, consumers.get(q, [])))
    return views


def backlog_reader(rt: Runtime) -> Callable[[], list[tuple[str, int, float | None]]]:
    """For the console's ``/metrics``: a callable returning (queue, depth, oldest message's
    age) of every known queue, read from the roster and the broker when called."""

    def read() -> list[tuple[str, int, float | None]]:
        return [
            (q.queue, q.depth, q.oldest_seconds)
            for q in backlog(rt.app, rt.settings, rt.store.workers())
            if q.depth is not None
        ]

    return read


def broker_kind(app: Celery) -> str:
    """``redis`` for a Redis broker (Sentinel included), else the URL's scheme."""
    if broker.redis_broker(app):
        return "redis"
    return str(app.conf.broker_url or "").partition("://")[0] or "unknown"


def _age_note(app: Celery) -> str:
    return REDIS_AGE if broker.redis_broker(app) else RABBITMQ_AGE


def _label(settings: RunnerSettings, queue: str) -> str:
    if queue == settings.queue:
        return routing.DEFAULT
    own = f"{settings.queue}."
    return queue[len(own) :] if queue.startswith(own) else queue


def _read_depths(app: Celery, queues: list[str], now: float) -> dict[str, tuple[int, float | None]]:
    """Queue -> (depth, oldest message's age); a queue the broker could not answer for is
    left out (and logged)."""
    try:
        if broker.redis_broker(app):
            found = broker.redis_backlog(app, queues)
            return {q: (b.depth, _age(b, now)) for q, b in found.items()}
        depths = broker.queue_depths(app, queues)  # None: unreachable, logged there
        return {q: (depth, None) for q, depth in (depths or {}).items()}
    except Exception as exc:
        log.warning("cannot read the queues of the broker: %s", exc)
        return {}


def _age(found: broker.Backlog, now: float) -> float | None:
    if found.depth == 0:
        return 0.0
    if found.oldest_sent_at is None:
        return None
    return max(0.0, now - found.oldest_sent_at)


# --- Celery's answers -------------------------------------------------------------------------


def _ask(app: Celery, timeout: float, expected: int) -> dict[str, dict[str, Any]]:
    """Celery's ``stats``, ``active_queues`` and ``active`` answers, by worker name."""
    inspect = app.control.inspect(timeout=timeout, limit=expected or None)
    answers: dict[str, dict[str, Any]] = {}
    for question in ("stats", "active_queues", "active"):
        if question != "stats" and not answers["stats"]:
            answers[question] = {}  # nobody answered the first: no wait for the others
            continue
        try:
            answers[question] = getattr(inspect, question)() or {}
        except Exception as exc:  # the broker away: the roster still says who is there
            log.warning("workers did not answer %s: %s", question, exc)
            answers[question] = {}
    return answers


def _worker(
    name: str, record: WorkerRecord | None, answers: dict[str, dict[str, Any]], now: float
) -> WorkerView:
    stats = answers["stats"].get(name) or {}
    pool = stats.get("pool") or {}
    consumed = answers["active_queues"].get(name)
    running = answers["active"].get(name)
    facts = WorkerFacts() if record is None else record.facts
    at = None if record is None else record.at
    return WorkerView(
        name=name,
        queues=sorted(str(q.get("name")) for q in consumed)
        if consumed is not None
        else list(() if record is None else record.queues),
        pool=broker.pool_name(pool.get("implementation")),
        concurrency=pool.get("max-concurrency"),
        busy=None if running is None else len(running),
        running=[f"{t.get('name')} {t.get('id')}" for t in running or ()],
        last_heartbeat=at,
        heartbeat_age=None if at is None else max(0.0, now - at),
        answered=name in answers["stats"],
        pid=stats.get("pid", facts.pid),
        host=facts.host,
        runner_version=facts.runner,
        celery_version=facts.celery,
    )
