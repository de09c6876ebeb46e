"""The recovery pass: re-send in-flight steps that nobody answers for and no message will bring.

Run by every worker every ``recovery_interval`` (one at a time, by a lock) and by
``runner recover`` (no lock). How a step in flight is told apart:

* **running, or about to**: it has a live lease. The attempt that runs it holds one
  (renewed by a heartbeat); so does the sender between the commit that made it ready and
  the broker accepting its message, and a worker holding the message without running it
  (prefetched, or a retry's countdown) until an attempt begins
  (:mod:`runner.distributed.handoff`).
* **lost**: its lease expired. Whoever held it died (a worker, a pool child, a sender)
  or was cut off from Redis for the whole lease: it is re-sent.
* **queued**: it was marked sent and has no lease. Its message is in the broker's queue
  (a backlog), and is never re-sent, however long it waits there. With a Redis broker, two
  exceptions, read from the broker (:class:`BrokerView`): a message a worker took off the
  queue more than ``lease_seconds`` ago and never acknowledged, with no lease recorded for
  it (that worker died between taking it and recording it), and a message sent more than
  ``lease_seconds`` ago that is neither queued nor taken (a worker died with it in the
  reply to its ``BRPOP``). Either is re-sent, once (RabbitMQ requeues such messages itself).
* **never sent**: no marker and no lease (a resume or fork whose caller died before
  dispatching): re-sent ``lease_seconds`` after the run's latest checkpoint.

So a pass reads only the runs where one of these can show (:meth:`Coordinator.runs_to_check
<runner.distributed.coord.Coordinator.runs_to_check>`, and those with a message a dead worker
took): a run that committed within the last lease and has no lapsed lease has none.

A run whose data cannot be read (a corrupt snapshot, missing keys, a checkpoint naming no
flow) is **quarantined**: its status becomes ``corrupt`` (``runner runs --status
corrupt``), it leaves the set of running runs, and one ERROR names it. Nothing about one
run stops the pass over the others.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis

from runner.errors import CorruptCheckpoint, RunNotFound, StoreUnavailable
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.orchestrator import Activation
from runner.store.models import Checkpoint, RunStatus

from .engine import (
    Runtime,
    allowed_flow,
    dispatch,
    run_of_task,
    task_id,
    task_name,
    waiting_children,
)

log = logging.getLogger("runner.worker")

QUARANTINED = "quarantined"
"""Event recorded on the metadata of a run that recovery quarantined."""


class Unreadable(Exception):
    """A run's data cannot be read; the message says what is wrong (never leaves this module)."""


def recover(rt: Runtime, *, force: bool = False) -> dict[str, list[str]]:
    """Re-dispatch in-flight steps whose lease expired or that were never sent.

    ``force``: no lock (``runner recover``). Runs of flows this worker did not
    register are left to workers that did. Returns run id -> re-sent ids.
    """
    interval = rt.settings.recovery_interval
    if not force and not rt.coord.try_lock(interval * 0.9):
        return {}
    resent: dict[str, list[str]] = {}
    broker = BrokerView(rt)
    # Only runs where a step can be lost are read: a lapsed lease, no commit for a whole
    # lease (a step never sent, or whose message was lost, shows only then), or a message
    # taken by a dead worker. A busy deployment's runs commit all the time and cost the
    # pass one pipeline.
    held_by_dead = {run_of_task(task) for task in broker.taken_long_ago()}
    for run_id in rt.coord.runs_to_check(time.time(), held_by_dead):
        try:
            sent = _recover_run(rt, run_id, broker)
        except StoreUnavailable:
            raise  # Redis is gone for every run: the caller retries the pass
        except (CorruptCheckpoint, Unreadable) as exc:
            quarantine(rt, run_id, str(exc))
            continue
        except Exception:
            # A bug, not bad data: name the run and go on with the others.
            log.exception("recovery of run %s failed; the pass goes on", run_id)
            continue
        if sent:
            resent[run_id] = sent
    return resent


def quarantine(rt: Runtime, run_id: str, reason: str) -> bool:
    """Mark ``run_id`` corrupt and take it out of the running runs; ``True`` if this call did.

    Logged once, at ERROR, with the run's id: a run already marked is left as it is.
    Its keys are kept for an operator to inspect (``runner status``) or delete.
    """
    info = rt.store.run(run_id)
    if info is not None and info.status is RunStatus.CORRUPT:
        return False
    why = f"{CorruptCheckpoint.__name__}: {reason}"
    try:
        rt.store.update_run(run_id, status=RunStatus.CORRUPT, event=QUARANTINED, error=why)
    except RunNotFound:
        log.error("run %s is in the running set but has no metadata: %s", run_id, reason)
        return False
    log.error("run %s quarantined (status corrupt), its data cannot be read: %s", run_id, reason)
    return True


QUEUE_READ_LIMIT = 1000
"""Longest queue the recovery pass reads to tell a lost message from a queued one."""
PRIORITY_STEPS = [0, 3, 6, 9]
"""Kombu's default priority steps: a queue's messages of priority ``p > 0`` are kept in a
list of their own, ``<queue><PRIORITY_SEPARATOR><p>``."""
PRIORITY_SEPARATOR = "\x06\x16"


class BrokerView:
    """What a Redis broker holds of step messages, for one recovery pass.

    Kombu's Redis transport pops a message off the queue (``BRPOP``) and then records it in
    its ``unacked`` hash, where it stays until acknowledged and comes back only after the
    visibility timeout (an hour). So a worker that dies in between leaves nothing: the
    message was in the reply on its socket. And one that dies holding messages it has
    recorded leaves them in ``unacked`` for the hour. This view finds both:

    * :meth:`taken_long_ago`: messages taken more than ``lease_seconds`` ago and not
      acknowledged (a live worker holding one holds the step's lease), read once;
    * :meth:`lost`: a message neither in ``unacked`` nor in the queue Celery routes it to
      (each queue read once, when it holds at most :data:`QUEUE_READ_LIMIT` messages, and
      ``unacked`` read again after it; a longer queue is left for a later pass).

    Other brokers know nothing here: RabbitMQ requeues what a dead consumer held, and
    loses nothing between a queue and a consumer.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        url = str(rt.app.conf.broker_url or "")
        redis_broker = url.startswith(("redis://", "rediss://", "unix://"))
        self.client = _broker_client(url) if redis_broker else None
        options = rt.app.conf.broker_transport_options or {}
        self.prefix = options.get("global_keyprefix", "")
        self.index = self.prefix + options.get("unacked_index_key", "unacked_index")
        self.table = self.prefix + options.get("unacked_key", "unacked")
        self.priorities = options.get("priority_steps", PRIORITY_STEPS)
        self._queues: dict[str, set[str] | None] = {}
        self._taken: set[str] | None = None
        self._taken_read = False
        self._long_ago: dict[str, float] | None = None

    def taken_long_ago(self) -> dict[str, float]:
        """Task id -> when a worker took its message, for messages taken more than
        ``lease_seconds`` ago and not acknowledged."""
        if self._long_ago is None:
            cutoff = time.time() - self.rt.settings.lease_seconds
            self._long_ago = self._unacked(cutoff) or {}
        return self._long_ago

    def lost(self, task: str, name: str) -> bool:
        """Whether the message of ``task`` (a task ``name``) is nowhere in the broker: not
        in the queue Celery routes ``name`` to, not taken.

        ``False`` when that cannot be told (another broker, a queue too long to read, Redis
        unreachable). A message caught in a live worker's hands between its pop and its
        record (a moment) looks lost: it is sent again, and the step's begin turns the
        duplicate away.
        """
        if self.client is None:
            return False
        queue = self._queue_of(name)
        if queue not in self._queues:
            # The queue first, then what was taken: a message moves from the one to the
            # other, so read in this order it is seen at least once.
            self._queues[queue] = self._queued(queue)
            self._taken_read = False
        queued = self._queues[queue]
        if queued is not None and not self._taken_read:
            self._taken_read = True
            taken = self._unacked(float("inf"))
            self._taken = None if taken is None else set(taken)
        if queued is None or self._taken is None:
            return False
        return task not in queued and task not in self._taken

    def _unacked(self, before: float) -> dict[str, float] | None:
        """Task id -> when taken, for messages taken before ``before`` (``None``: unread)."""
        if self.client is None:
            return {}
        try:
            tags: list[tuple[bytes, float]] = list(
                self.client.zrangebyscore(self.index, 0, before, withscores=True)  # type: ignore[arg-type]
            )
            raws: list[Any] = (
                list(self.client.hmget(self.table, [t for t, _ in tags])) if tags else []
            )
        except redis.RedisError as exc:
            log.warning("recovery could not read the broker's unacknowledged messages: %s", exc)
            return None
        taken: dict[str, float] = {}
        for (_tag, at), raw in zip(tags, raws, strict=True):
            task = _task_id(raw, nested=True)
            if task is not None:
                taken[task] = float(at)
        return taken

    def _queue_of(self, name: str) -> str:
        """The queue Celery sends task ``name`` to (the deployment's, unless routed)."""
        try:
            return str(self.rt.app.amqp.router.route({}, name, (), {})["queue"].name)
        except Exception:  # a user's router that needs arguments: the default queue
            return self.rt.settings.queue

    def _queued(self, queue: str) -> set[str] | None:
        """Task ids of the messages in ``queue`` (``None``: too long, or unreadable)."""
        assert self.client is not None
        queue = self.prefix + queue
        names = [queue] + [f"{queue}{PRIORITY_SEPARATOR}{p}" for p in self.priorities if p]
        try:
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.llen(name)
            if sum(pipe.execute()) > QUEUE_READ_LIMIT:
                return None
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.lrange(name, 0, -1)
            lists = pipe.execute()
        except redis.RedisError as exc:
            log.warning("recovery could not read the broker's queue %s: %s", queue, exc)
            return None
        return {t for raws in lists for raw in raws if (t := _task_id(raw)) is not None}


def _task_id(raw: Any, *, nested: bool = False) -> str | None:
    """The Celery task id of a raw Redis-transport message (``unacked`` wraps it in a list)."""
    try:
        message = json.loads(raw)
        task = (message[0] if nested else message)["headers"]["id"]
    except (TypeError, ValueError, KeyError, IndexError):
        return None  # gone since, or not a Celery task message
    return str(task)


_broker_clients: dict[str, redis.Redis] = {}


def _broker_client(url: str) -> redis.Redis:
    client = _broker_clients.get(url)
    if client is None:
        client = _broker_clients[url] = redis.Redis.from_url(url)
    return client


def _recover_run(rt: Runtime, run_id: str, broker: BrokerView) -> list[str]:
    latest = rt.coord.read(run_id)
    if latest is None:
        raise Unreadable(f"run {run_id} is running but its latest checkpoint is missing")
    if latest.status is not RunStatus.RUNNING:
        return []
    if not latest.meta.name or not latest.flow:
        raise Unreadable(f"checkpoint {latest.id} of run {run_id} names no flow")
    flow_cls = allowed_flow(rt, latest)
    if flow_cls is None:
        return []
    try:
        pending = orch.pending(tr.record_of(latest))
    except (KeyError, TypeError, ValueError) as exc:
        raise Unreadable(f"checkpoint {latest.id} of run {run_id}: bad record ({exc!r})") from None
    stale = _stale(rt, latest, pending, broker)
    if stale and latest.meta.children:
        waiting = waiting_children(rt, latest)
        stale = [act for act in stale if act.id not in waiting]
    if not stale:
        return []
    return dispatch(rt, flow_cls.flow_name(), run_id, latest.meta.epoch, stale, force=True)


def _stale(
    rt: Runtime, latest: Checkpoint, pending: list[Activation], broker: BrokerView
) -> list[Activation]:
    """The activations of ``pending`` nobody answers for (see the module docstring)."""
    now = time.time()
    found = rt.coord.coordination(latest.run_id)
    leases, marked = found.leases, found.markers
    epoch, stale = latest.meta.epoch, []
    for act in pending:
        key, task = tr.activation_key_in(epoch, act.id), task_id(latest.run_id, epoch, act.id)
        expiry = leases.get(key)
        if expiry is not None:
            if expiry <= now:
                stale.append(act)  # lost: its holder died
        elif key not in marked:
            if now - latest.created_at >= rt.settings.lease_seconds:
                stale.append(act)  # never sent
        elif marked[key] <= broker.taken_long_ago().get(task, 0.0):
            # Taken off the queue by a worker that died before recording it, and not
            # re-sent since (a re-send stamps the marker later than that delivery).
            stale.append(act)
        elif now - marked[key] >= rt.settings.lease_seconds and broker.lost(
            task, task_name(str(latest.meta.name), act.method)
        ):
            stale.append(act)  # sent a lease ago and in nobody's hands: lost in the hand-off
    return stale
