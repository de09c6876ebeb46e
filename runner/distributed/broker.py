"""The broker boundary: the one module that reaches inside kombu and Celery.

Written against **kombu 5.7.0 and Celery 5.7.0**; ``pyproject.toml`` bounds both to those
minor versions, and ``make test-latest`` runs the broker conformance suite
(``tests/test_broker_conformance.py``) on the newest releases before a bound is raised.
What the runner takes from them that is not their public API, and what it expects:

* **Publish recording**, for the outbox (:mod:`.outbox`): kombu's ``Producer.batch()``
  asks the producer's channel for a session (``_ProducerBatchState._get_session`` reads
  ``create_publish_batch`` off the channel *instance*) and hands it each prepared message;
  the session's ``publish`` calls the Redis channel's ``basic_publish`` with the private
  keyword ``_publish_batch``, and the channel hands the session its final commands with
  ``add(name, key, value)``: ``lpush`` of the message, ``pexpire`` of a queue with an
  expiry, ``publish`` of a fanout event (Celery's ``task-sent``). :func:`recording` shadows
  the instance's factory with a session that keeps the commands instead of running them.
* **The unacked view**, for recovery (:class:`BrokerView`): kombu's Redis ``QoS.append``
  records a message a consumer took in the hash ``unacked`` (delivery tag -> JSON
  ``[message, exchange, routing key]``) and the sorted set ``unacked_index`` (delivery tag
  scored by the time it was taken), and deletes both when it is acknowledged; a queue is a
  list, its priority ``p > 0`` messages in ``<queue><sep><p>``. Key names, separator and
  priority steps are kombu's own (``kombu.transport.redis.Channel``), overridden by the
  transport options of the same names. A message's task id is Celery's protocol-2
  ``headers.id``.
* **Worker state** (:func:`in_pool`, :func:`held`): ``celery.worker.state`` keeps the
  requests the pool runs (``active_requests``), prefetched ones (``reserved_requests``) and
  ones waiting for an ETA or a countdown (``scheduled_requests``).
* **Routing** (:func:`queue_of`): ``app.amqp.router.route`` names the queue of a task;
  ``app.amqp.queues.select``, ``deselect`` and ``consume_from`` choose and list the queues a
  worker consumes (:func:`consume_only`, :func:`set_aside`, :func:`consuming`); Celery's
  remote control changes them in a running worker (:func:`consume_now`).
* **Sending** (:func:`publish_batch`): kombu's ``Producer.batch()`` and its
  ``BatchPublishError``; :func:`queue_depths` reads a queue's length by kombu's passive
  ``queue_declare`` (``ChannelError`` for one that does not exist); :data:`CONNECTION_ERRORS`
  are kombu's and redis-py's errors of a lost connection.
* **Queues and workers in view** (:func:`redis_backlog`, :func:`pool_name`), for
  ``runner workers``: the Redis transport's lists of a queue, read at their consuming end
  (the section's own comment says how), and ``celery.concurrency.ALIASES`` to name a
  worker's pool as ``-P`` does.
* **Priorities** (:func:`configure_priorities`, :func:`wire_priority`): every step message
  carries a priority, in the broker's terms. kombu's Redis transport keeps a queue's
  messages of priority ``p`` in the list ``<queue><sep><p>`` (``p`` rounded down to one of
  ``priority_steps``; ``p = 0``, or none given, in the queue's own list) and pops the lists
  in the order of the steps: **0 first**, so the runner's 9 (the highest) is sent as 0, and
  ``priority_steps`` is every value 0-9 (one list each) unless the broker's transport options
  say otherwise. RabbitMQ takes the highest first from a queue declared with
  ``x-max-priority`` (Celery's ``task_queue_max_priority`` declares every task queue so); a
  queue that exists without it cannot be redeclared with it (406 PRECONDITION_FAILED), which
  :class:`QueueWithoutPriorities` says in one line with the fix
  (:func:`check_priority_queues` at a worker's start, :func:`priority_queues` around sends).
  A retry or a deferral (Celery's ``Task.retry``) republishes the message with the priority
  it came with (Celery 5.7 copies ``delivery_info['priority']``); ``pytest -m broker`` checks
  both orders on real brokers.
* **One client per channel** (:func:`one_client_per_channel`): kombu's Redis ``Channel``
  builds the clients it runs commands on with ``_create_client(asynchronous=False)``, from
  its ``Client`` factory on its ``pool``; a worker's channels keep the one they built.
* **A lost connection's second close** (:func:`guard_closed_channels`): a worker survives
  Celery closing a dead connection twice, where kombu's Redis channel would read a client
  the first close dropped.
* **The consumer's reconnects** (:class:`Consumer`, Celery's ``worker_consumer``): Celery's
  consumer reconnects through ``Connection.ensure_connection`` at kombu's default intervals
  (2 s growing to 30 s); the runner's subclass passes shorter ones (:data:`RECONNECT`), so a
  worker takes steps again within about a second of its broker answering.
* **Messages of tasks a worker lacks** (:func:`on_unknown_tasks`): Celery's consumer
  (``celery.worker.consumer.Consumer``, named by the public ``worker_consumer`` setting) calls
  its ``on_unknown_task(body, message, exc)`` for them; the runner's :class:`Consumer` hands
  runner steps on.
* **Log records** (:data:`CONNECTION_LOGGERS` and the messages after it): the worker turns
  Celery's and kombu's records of a lost connection into one WARNING of its own.
* **The worker command** (:func:`run_worker_command`): Celery's ``worker`` command
  (``celery.bin.worker.worker``) run with the ``celery.bin.base.CLIContext`` its umbrella
  command would give it, without the umbrella, which first loads every ``celery.commands``
  plugin (Flower's) and ``celery amqp``'s prompt_toolkit; the umbrella runs instead, said at
  WARNING, when either is not as expected.

Each of the first three is checked before the process first relies on it, against what
kombu itself does: :func:`outbox_ready` records one publish through a Redis client that
refuses any command (every command must reach the session, none run); :func:`unacked_view_ready`
has kombu take two probe messages off a private queue without acknowledging them and reads
back through this view what kombu wrote; :func:`worker_state_readable` looks for the three
sets. If one differs, the process logs one WARNING naming kombu's version and what differed,
and uses the path that needs no internals for its life (:data:`FALLBACKS`): never a silent
fallback, never a message published before its commit. ``docs/delivery.md`` states the
delivery model this serves.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import celery
import kombu
import redis
from celery import Celery
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Exchange, Producer, Queue
from kombu.exceptions import BatchPublishError, ChannelError, OperationalError
from kombu.transport.redis import Channel as RedisChannel

from runner.errors import RunnerError
from runner.flow.rates import PRIORITIES
from runner.store import connection
from runner.store.base import OUTBOX_COMMANDS, OutboxCommand

from .processes import exec_celery_worker
from .services import services

log = logging.getLogger("runner.broker")

WRITTEN_AGAINST = {"kombu": "5.7.0", "celery": "5.7.0"}
"""The releases whose internals this module was written against (pyproject bounds their
minor versions)."""

OUTBOX = "outbox"
UNACKED_VIEW = "unacked view"
WORKER_STATE = "worker state"
ONE_CLIENT = "one client per channel"
FALLBACKS = {
    OUTBOX: "steps are sent after their commit, under the sender's lease",
    UNACKED_VIEW: "recovery goes by leases only (a message a worker took and died with "
    "comes back after kombu's visibility timeout)",
    WORKER_STATE: "messages a worker holds without running them get no receiving worker's "
    "lease (should it die, RabbitMQ requeues them and recovery reads a Redis broker for them)",
    ONE_CLIENT: "kombu builds a Redis client for each command it runs (the same commands, "
    "more CPU)",
}
"""What the process does for its life when a capability is not as this module expects."""

PROBE_PREFIX = "runner.probe."
"""Queues (and task ids) of the start-up checks: private to one check, deleted after it."""

QUEUE_READ_LIMIT = 1000
"""Longest queue the recovery pass reads to tell a lost message from a queued one."""

_CONNECTION_ERRORS = (redis.RedisError, OperationalError, OSError)

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    OperationalError,
)
"""What kombu and redis-py raise (and Celery logs) when the broker's or the result
backend's connection is lost."""


# --- the checks' verdicts -------------------------------------------------------------------


class Checks:
    """What this process found of each capability: ``None`` (as expected) or what differed.

    One check each, for the process's life; a pool process forked later inherits them.
    """

    def __init__(self) -> None:
        self.found: dict[str, str | None] = {}
        self.lock = threading.RLock()
        services().adopt(self)

    def after_fork(self) -> None:
        """A pool child forked while another thread checks must not inherit a held lock
        (the verdicts it inherits stand)."""
        self.lock = threading.RLock()

    def ready(self, capability: str, probe: Callable[[], str | None]) -> bool:
        """Whether ``capability`` is as expected, running ``probe`` (``None``: as expected,
        else what differed) the first time. ``False`` without a verdict when the broker
        cannot be reached: the caller takes the fallback path this once, and the next call
        checks again."""
        if capability not in self.found:
            with self.lock:
                if capability not in self.found:
                    try:
                        differed = probe()
                    except Exception as exc:
                        if isinstance(exc, _CONNECTION_ERRORS) or isinstance(
                            exc.__cause__, _CONNECTION_ERRORS
                        ):
                            log.debug("cannot check the %s now: %s", capability, exc)
                            return False
                        differed = f"checking it raised {type(exc).__name__}: {exc}"
                    if differed is None:
                        self.found[capability] = None
                    else:
                        self.differs(capability, differed)
        return self.found[capability] is None

    def differs(self, capability: str, what: str) -> None:
        """``capability`` is not as expected: its fallback from now on, with one WARNING."""
        with self.lock:
            if self.found.get(capability) is not None:
                return
            self.found[capability] = what
        log.warning(
            "runner's broker adapter (written against kombu %s, celery %s) finds kombu %s / "
            "celery %s not as it expects: %s; for the life of this process, %s",
            WRITTEN_AGAINST["kombu"],
            WRITTEN_AGAINST["celery"],
            kombu.__version__,
            celery.__version__,
            what,
            FALLBACKS[capability],
        )


checks = Checks()
"""This process's verdicts (tests replace it with a fresh :class:`Checks`)."""


def redis_broker(app: Celery) -> bool:
    """Whether ``app``'s broker is a Redis (the transport whose internals are used)."""
    # kombu's Sentinel transport is its Redis transport on the group's primary: same keys.
    schemes = ("redis://", "rediss://", "unix://", "sentinel://")
    return str(app.conf.broker_url or "").startswith(schemes)


# --- publish recording (the outbox) ---------------------------------------------------------


class NotRecordable(Exception):
    """kombu did not hand a publish to the recording session as expected (nothing was sent)."""


class _Session:
    """kombu's publish-batch session, keeping the commands rather than running them.

    kombu 5.7 calls ``publish(message, **kwargs)`` for each prepared message; the Redis
    channel's ``basic_publish`` (given ``_publish_batch=self``) calls ``add(name, key,
    value)`` for each final command; ``flush``/``discard``/``close`` at the batch's end.
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.commands: list[OutboxCommand] = []

    def publish(self, message: Any, **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        if name not in OUTBOX_COMMANDS or len(args) != 2:
            raise NotRecordable(f"kombu publishes with {name}/{len(args)}")
        self.commands.append((name, str(args[0]), args[1]))

    def flush(self) -> None:
        """Nothing to run: the commit runs the commands."""

    def discard(self) -> None:
        self.commands.clear()

    def close(self) -> None:
        """Nothing held."""


def unrecordable(producer: Any) -> str | None:
    """Why the publishes of ``producer`` (on a Redis channel) cannot be recorded by this
    broker configuration, or ``None``: a key prefix (kombu's client applies it when it runs
    the commands, the commit's script would not) or retries on timeout (kombu then does not
    batch, ``Producer.supports_batch_publish`` is false)."""
    if getattr(producer.channel, "global_keyprefix", ""):
        return "the broker's transport options set a global_keyprefix"
    if not getattr(producer, "supports_batch_publish", False):
        return "the broker connection retries on timeout (kombu does not batch its publishes)"
    return None


def recorded_send() -> dict[str, Any]:
    """The options of a ``send_task`` whose publish :func:`recording` records: no kombu
    retry wrapper and no queue declaration, so kombu needs nothing of the producer's
    connection (a fresh dict a call: Celery is handed its own ``declare`` list)."""
    return {"retry": False, "declare": []}


@contextmanager
def recording(producer: Any) -> Iterator[list[OutboxCommand] | None]:
    """Catch the commands of what ``producer`` publishes inside the block.

    Yields the list they are added to, or ``None`` when this configuration cannot be
    recorded (:func:`unrecordable`; the caller sends the usual way). The producer must be
    the caller's alone for the block (as one from Celery's producer pool is), and the block
    must publish, a task with :func:`recorded_send`'s options: then kombu needs nothing of
    the producer's connection (a recording works on one from before a Redis restart, whose
    commands the commit runs on the store's client). ``NotRecordable`` if kombu asked for
    an unexpected command or did not hand the publishes to the session: kombu's own batch
    is then discarded, nothing sent.
    """
    if unrecordable(producer) is not None:
        yield None
        return
    channel = producer.channel
    session = _Session(channel)
    # kombu 5.7 reads the factory off the channel instance: shadowed for this block only.
    channel.create_publish_batch = lambda max_size: session
    try:
        with producer.batch():
            yield session.commands
            if not session.commands:
                # Raised inside the batch, so a session kombu made itself is discarded.
                raise NotRecordable("kombu did not hand the publish to the recording session")
    finally:
        del channel.create_publish_batch


def outbox_ready(app: Celery) -> bool:
    """Whether this process may record publishes for the outbox (checked once: one publish
    recorded through a client that refuses to run any command, compared with the expected
    commands)."""
    return checks.ready(OUTBOX, lambda: _probe_outbox(app))


class _DirectWrite(Exception):
    """kombu ran a command on Redis itself instead of handing it to the session."""


def _refusing(make_client: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for a channel's client factory whose clients run no command at all."""

    def refusing_client(**kwargs: Any) -> Any:
        client = make_client(**kwargs)

        def refuse(*args: Any, **_: Any) -> NoReturn:
            raise _DirectWrite(str(args[0]) if args else "a command")

        def pipeline(*_: Any, **__: Any) -> Any:
            pipe = client.__class__.pipeline(client, transaction=False)

            def execute(*_: Any, **__: Any) -> NoReturn:
                raise _DirectWrite(", ".join(str(c[0][0]) for c in pipe.command_stack))

            pipe.execute = execute
            return pipe

        client.execute_command = refuse
        client.pipeline = pipeline
        return client

    return refusing_client


def _probe_outbox(app: Celery) -> str | None:
    """Record one ``send_task`` to a private queue; ``None`` if kombu handed the session
    exactly the expected commands and ran none itself, else what differed. (Celery's
    publish signals fire for it, as for any send: its task is ``runner.probe.task``.)"""
    queue = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    if not isinstance(getattr(Producer, "supports_batch_publish", None), property):
        return "kombu's Producer has no supports_batch_publish"
    try:
        differed = _record_probe(app, queue)
    finally:
        # Whatever kombu ran itself (it should run nothing) is not left behind.
        written = broker_client(app).delete(*Layout.of(app).queue_keys(queue))
    if differed is None and written:
        differed = "kombu wrote the probe message to Redis itself"
    return differed


def _record_probe(app: Celery, queue: str) -> str | None:
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        if not callable(getattr(type(channel), "create_publish_batch", None)):
            return f"{type(channel).__name__} has no create_publish_batch"
        # kombu 5.7: Channel.__init__ sets ``Client``; every client the channel makes to
        # publish (``conn_or_acquire``, a batch's pipeline) comes from it.
        channel.Client = _refusing(channel.Client)
        producer = Producer(channel)
        if unrecordable(producer) is not None:
            return None  # this configuration sends the usual way: nothing of kombu's to rely on
        try:
            with recording(producer) as commands:
                assert commands is not None
                app.send_task(
                    f"{PROBE_PREFIX}task",
                    task_id=queue,
                    producer=producer,
                    queue=Queue(queue, Exchange(queue), routing_key=queue),
                    ignore_result=True,
                    **recorded_send(),
                )
        except _DirectWrite as exc:
            return f"kombu ran {exc} on Redis itself instead of handing it to the publish batch"
        except BatchPublishError as exc:
            if isinstance(exc.__cause__, _DirectWrite):
                return f"kombu ran {exc.__cause__} itself instead of handing it to the session"
            raise
        except NotRecordable as exc:
            return str(exc)
    return _compare(commands, queue, bool(app.conf.task_send_sent_event))


def _compare(commands: list[OutboxCommand], queue: str, sent_event: bool) -> str | None:
    """What differs between the recorded ``commands`` of one task sent to ``queue`` and
    the expected ``lpush`` of its message (then a ``publish`` of its ``task-sent`` event)."""
    shape = [f"{name} {target}" for name, target, _ in commands]
    names = [name for name, _, _ in commands]
    if names != ["lpush", "publish"][: 1 + sent_event] or commands[0][1] != queue:
        expected = f"lpush {queue}" + (", then a publish of its task-sent event" * sent_event)
        return f"kombu recorded {shape} for one task message, expected {expected}"
    if task_id_of(commands[0][2]) != queue:
        return "the recorded message has no task id in headers.id"
    return None


# --- the unacked view (recovery) ------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where kombu's Redis transport keeps queues and unacknowledged messages."""

    prefix: str
    unacked: str
    index: str
    sep: str
    steps: tuple[int, ...]

    @classmethod
    def of(cls, app: Celery) -> Layout:
        """``app``'s layout: kombu's defaults (class attributes of its Redis ``Channel`` in
        5.7), overridden by the broker's transport options of the same names."""
        options = app.conf.broker_transport_options or {}
        prefix = options.get("global_keyprefix", "")
        return cls(
            prefix,
            prefix + options.get("unacked_key", RedisChannel.unacked_key),
            prefix + options.get("unacked_index_key", RedisChannel.unacked_index_key),
            options.get("sep", RedisChannel.sep),
            tuple(options.get("priority_steps", RedisChannel.priority_steps)),
        )

    def queue_keys(self, queue: str) -> list[str]:
        """The lists that hold ``queue``'s messages: its own, then one per priority step."""
        queue = self.prefix + queue
        return [queue] + [f"{queue}{self.sep}{p}" for p in self.steps if p]


def task_id_of(raw: Any, *, nested: bool = False) -> str | None:
    """The Celery task id (protocol 2: ``headers.id``) of a raw Redis-transport message
    (an ``unacked`` entry wraps it in a list: ``nested``); ``None`` if it has none."""
    try:
        message = json.loads(raw)
        task = (message[0] if nested else message)["headers"]["id"]
    except (TypeError, ValueError, KeyError, IndexError):
        return None  # gone since, or not a Celery task message
    return str(task)


def read_unacked(client: redis.Redis, layout: Layout, before: float) -> dict[str, float]:
    """Task id -> when taken, for the unacknowledged messages taken before ``before``."""
    tags: list[tuple[bytes, float]] = list(
        client.zrangebyscore(layout.index, 0, before, withscores=True)  # type: ignore[arg-type]
    )
    raws: list[Any] = list(client.hmget(layout.unacked, [t for t, _ in tags])) if tags else []
    taken: dict[str, float] = {}
    for (_tag, at), raw in zip(tags, raws, strict=True):
        task = task_id_of(raw, nested=True)
        if task is not None:
            taken[task] = float(at)
    return taken


def holds(app: Celery, queue: str, task: str) -> bool | None:
    """Whether ``app``'s Redis broker has the message of ``task`` waiting in ``queue``
    (``None``: it cannot tell: another broker, a queue too long to read, Redis away)."""
    if not (redis_broker(app) and unacked_view_ready(app)):
        return None
    try:
        found = read_queue(broker_client(app), Layout.of(app), queue)
    except redis.RedisError:
        return None
    return None if found is None else task in found


def read_queue(client: redis.Redis, layout: Layout, queue: str) -> set[str] | None:
    """Task ids of the messages in ``queue`` (``None``: longer than :data:`QUEUE_READ_LIMIT`)."""
    names = layout.queue_keys(queue)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.llen(name)
    if sum(pipe.execute()) > QUEUE_READ_LIMIT:
        return None
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.lrange(name, 0, -1)
    return {t for raws in pipe.execute() for raw in raws if (t := task_id_of(raw)) is not None}


def unacked_view_ready(app: Celery) -> bool:
    """Whether recovery may read ``app``'s Redis broker (checked once: kombu takes probe
    messages without acknowledging them, and this view must read back what it wrote)."""
    return checks.ready(UNACKED_VIEW, lambda: _probe_unacked(app))


def _probe_unacked(app: Celery) -> str | None:
    layout, client = Layout.of(app), broker_client(app)
    queue = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    top = max(layout.steps)
    tasks = {f"{queue}:{p}": p for p in {0, top}}  # a plain and a priority message
    try:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            producer = Producer(channel)
            for task, priority in tasks.items():
                producer.publish(
                    {},
                    exchange="",
                    routing_key=queue,
                    headers={"id": task},
                    priority=priority,
                    serializer="json",
                    retry=False,
                )
            queued = read_queue(client, layout, queue)
            if queued != set(tasks):
                return f"read {sorted(queued or ())} from the lists {layout.queue_keys(queue)}"
            began = time.time()
            messages = [channel.basic_get(queue, no_ack=False) for _ in tasks]
            ended = time.time()
            tags = [m.delivery_tag for m in messages if m is not None]
            try:
                differed = _compare_taken(client, layout, tasks, tags, (began, ended))
            finally:
                for message in messages:
                    if message is not None:
                        message.ack()
    finally:
        client.delete(*layout.queue_keys(queue))
    if differed is None and set(read_unacked(client, layout, float("inf"))) & set(tasks):
        differed = "messages kombu acknowledged stay in its unacked hash"
    return differed


def _compare_taken(
    client: redis.Redis,
    layout: Layout,
    tasks: Collection[str],
    tags: list[str],
    between: tuple[float, float],
) -> str | None:
    """What differs between what this view reads of the unacknowledged probe messages
    (``tasks``, delivery ``tags``, taken ``between`` two times) and what kombu took."""
    if len(tags) != len(tasks):
        return f"kombu gave back {len(tags)} of the {len(tasks)} probe messages it was sent"
    taken = {t: at for t, at in read_unacked(client, layout, float("inf")).items() if t in tasks}
    if set(taken) != set(tasks):
        raws: list[Any] = [raw for raw in client.hmget(layout.unacked, tags) if raw]
        return (
            f"read {sorted(taken)} back of the probe messages kombu took without acknowledging "
            f"them; its entries in {layout.unacked!r} read {[raw[:100] for raw in raws]}"
        )
    late = {t: at for t, at in taken.items() if not between[0] - 1 <= at <= between[1] + 1}
    if late:
        return f"the unacked index scores {late} are not the times the messages were taken"
    return None


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

    It knows nothing (recovery goes by leases) of another broker (RabbitMQ requeues what a
    dead consumer held, and loses nothing between a queue and a consumer), nor in a process
    whose check found kombu's layout changed (:func:`unacked_view_ready`).
    """

    def __init__(self, app: Celery, lease_seconds: float, default_queue: str) -> None:
        self.app, self.lease_seconds, self.default_queue = app, lease_seconds, default_queue
        self.layout = Layout.of(app)
        self._client: redis.Redis | None = None
        self._checked = False
        self._queues: dict[str, set[str] | None] = {}
        self._taken: set[str] | None = None
        self._taken_read = False
        self._long_ago: dict[str, float] | None = None

    @property
    def client(self) -> redis.Redis | None:
        """The broker's Redis, or ``None``: nothing to read (the check runs on first use)."""
        if not self._checked:
            self._checked = True  # once per pass, even when the broker cannot be reached
            if redis_broker(self.app) and unacked_view_ready(self.app):
                self._client = broker_client(self.app)
        return self._client

    def taken_long_ago(self) -> dict[str, float]:
        """Task id -> when a worker took its message, for messages taken more than
        ``lease_seconds`` ago and not acknowledged."""
        if self._long_ago is None:
            self._long_ago = self._unacked(time.time() - self.lease_seconds) or {}
        return self._long_ago

    def lost(self, task: str, name: str, versions: Collection[str] = ()) -> bool:
        """Whether the message of ``task`` (a task ``name``) is nowhere in the broker: not
        in the queue Celery routes ``name`` to, nor in its twin of one of ``versions`` (a
        step handed to the workers of a version, :mod:`.routing`), not taken.

        ``False`` when that cannot be told (another broker, a queue too long to read, Redis
        unreachable). A message caught in a live worker's hands between its pop and its
        record (a moment) looks lost: recovery looks again (:meth:`lost_afresh`) before it
        sends it again.
        """
        client = self.client
        if client is None:
            return False
        queue = queue_of(self.app, name, self.default_queue)
        queues = [queue, *(f"{queue}@{v}" for v in versions)]  # routing.version_queue's form
        for one in queues:
            if one not in self._queues:
                # The queues first, then what was taken: a message moves from the one to the
                # other, so read in this order it is seen at least once.
                try:
                    self._queues[one] = read_queue(client, self.layout, one)
                except redis.RedisError as exc:
                    log.warning("recovery could not read the broker's queue %s: %s", one, exc)
                    self._queues[one] = None
                self._taken_read = False
        found = [self._queues[one] for one in queues]
        if all(q is not None for q in found) and not self._taken_read:
            self._taken_read = True
            taken = self._unacked(float("inf"))
            self._taken = None if taken is None else set(taken)
        if any(q is None for q in found) or self._taken is None:
            return False
        return all(task not in q for q in found if q is not None) and task not in self._taken

    def lost_afresh(self, task: str, name: str, versions: Collection[str] = ()) -> bool:
        """:meth:`lost`, with the queues and what was taken read again (not this pass's
        earlier reads): the second look at a message found nowhere the first time."""
        self._queues.clear()
        self._taken_read = False
        return self.lost(task, name, versions)

    def _unacked(self, before: float) -> dict[str, float] | None:
        """Task id -> when taken, for messages taken before ``before`` (``None``: unread)."""
        client = self.client
        if client is None:
            return {}
        try:
            return read_unacked(client, self.layout, before)
        except redis.RedisError as exc:
            log.warning("recovery could not read the broker's unacknowledged messages: %s", exc)
            return None


def broker_client(app: Celery) -> redis.Redis:
    """A plain client on ``app``'s Redis broker (one per URL and process: a forked child
    makes its own); on a Sentinel group's current primary for kombu's ``sentinel://`` form."""
    url = str(app.conf.get(connection.BROKER_REDIS_URL) or app.conf.broker_url)
    # TLS and ACL as configured
    client: redis.Redis = services().one((BROKER_CLIENT, url), lambda: connection.client(url))
    return client


BROKER_CLIENT = "broker.client"
"""The key of this process's clients on a Redis broker in its services (with the URL)."""


def queue_of(app: Celery, name: str, default: str) -> str:
    """The queue Celery sends task ``name`` to (``default`` unless routed)."""
    try:
        # Celery 5.7: ``app.amqp.router.route(options, name, args, kwargs)`` returns the
        # options with the chosen ``queue`` (a kombu Queue).
        return str(app.amqp.router.route({}, name, (), {})["queue"].name)
    except Exception:  # a user's router that needs arguments: the default queue
        return default


def consume_only(app: Celery, queues: Collection[str]) -> None:
    """Make a worker of ``app`` consume ``queues`` (before it starts; ``-Q`` on the command
    line is applied after this)."""
    app.amqp.queues.select(list(queues))


def consuming(app: Celery) -> list[str]:
    """The queues a started worker of ``app`` consumes, by name."""
    return sorted(str(q) for q in app.amqp.queues.consume_from)


def set_aside(app: Celery, queues: Collection[str]) -> None:
    """Have a worker of ``app`` start without consuming ``queues``, which stay declared
    (Celery's ``Queues.deselect``): :func:`consume_now` takes one up by name."""
    app.amqp.queues.deselect(list(queues))


def consume_now(app: Celery, worker: str, queue: str) -> None:
    """Tell the running worker ``worker`` (its node name) to consume ``queue`` too: Celery's
    remote control (``add_consumer``), which its event loop carries out; nothing if it already
    does."""
    app.control.add_consumer(queue, destination=[worker], reply=False)


def stop_consuming_now(app: Celery, worker: str, queue: str) -> None:
    """Tell the running worker ``worker`` to stop consuming ``queue`` (``cancel_consumer``);
    a message it already took is still run and acknowledged."""
    app.control.cancel_consumer(queue, destination=[worker], reply=False)


def remote_control(app: Celery) -> bool:
    """Whether a worker of ``app`` takes remote control commands (Celery's
    ``worker_enable_remote_control``, on unless configured off)."""
    return bool(app.conf.worker_enable_remote_control)


def publish_batch(app: Celery, publish: Callable[[Any], None]) -> None:
    """Run ``publish(producer)``, whose sends go in one batch: one round trip to a Redis
    broker however many messages (kombu's ``Producer.batch``; with RabbitMQ each is
    published at once). If the batch's round trip fails, which messages arrived is unknown:
    ``publish(None)`` sends each again on its own, under the publish retry policy (the
    receiver turns a duplicate away)."""
    try:
        with app.producer_or_acquire() as producer, producer.batch():
            publish(producer)
    except BatchPublishError:
        publish(None)


def queue_depths(app: Celery, queues: Collection[str]) -> dict[str, int] | None:
    """The messages waiting in each of ``queues`` (kombu's passive declare, on Redis and
    RabbitMQ alike); ``None`` when the broker cannot be reached (logged)."""
    try:
        with app.connection_for_read() as conn:
            return {queue: _depth(conn, queue) for queue in queues}
    except (OperationalError, OSError) as exc:
        log.warning("cannot read the queue depth (%s)", exc)
        return None


def _depth(conn: Any, queue: str) -> int:
    # A channel of its own: a passive declare of a queue that does not exist (an empty
    # queue on Redis has no key) closes a RabbitMQ channel.
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except ChannelError:
        return 0
    finally:
        channel.close()


# --- priorities -----------------------------------------------------------------------------

TOP_PRIORITY = max(PRIORITIES)


def configure_priorities(app: Celery) -> None:
    """Make ``app``'s broker take messages by priority: on Redis one list per priority
    (kombu's ``priority_steps``, unless the broker's transport options set them), on
    RabbitMQ task queues declared with ``x-max-priority`` (unless the config sets one)."""
    if redis_broker(app):
        options = dict(app.conf.broker_transport_options or {})
        options.setdefault("priority_steps", list(PRIORITIES))
        app.conf.broker_transport_options = options
    elif app.conf.task_queue_max_priority is None:
        app.conf.task_queue_max_priority = TOP_PRIORITY


def wire_priority(app: Celery, priority: int) -> int:
    """A step's ``priority`` (0 lowest, 9 highest) as ``app``'s broker reads it: reversed on
    Redis, whose transport takes 0 first (so the mapping is its own inverse)."""
    return TOP_PRIORITY - priority if redis_broker(app) else priority


class QueueWithoutPriorities(RunnerError):
    """A RabbitMQ queue exists without ``x-max-priority`` and cannot take the runner's."""


def _without_priorities(exc: BaseException) -> str | None:
    """The queue a broker error says exists without priorities, or ``None`` (another error)."""
    # py-amqp 5: PreconditionFailed (reply code 406) "... inequivalent arg 'x-max-priority'
    # for queue 'NAME' in vhost ...".
    text = str(exc)
    if getattr(exc, "reply_code", None) != 406 or "x-max-priority" not in text:
        return None
    _, _, rest = text.partition("for queue '")
    return rest.partition("'")[0] or "?"


def _refused(queue: str) -> QueueWithoutPriorities:
    return QueueWithoutPriorities(
        f"the RabbitMQ queue {queue!r} exists without the runner's priorities (x-max-priority "
        f"{TOP_PRIORITY}), as an earlier runner declared it, and RabbitMQ refuses to declare it "
        "again with them "
        f"(406 PRECONDITION_FAILED): stop its workers once it is empty, delete it "
        f"(rabbitmqctl delete_queue {queue}) and start them again; they declare it anew",
        queue=queue,
    )


@contextmanager
def priority_queues(app: Celery) -> Iterator[None]:
    """Around a send: a queue that exists without priorities is :class:`QueueWithoutPriorities`
    (one line naming it and the fix) instead of py-amqp's ``PreconditionFailed``."""
    try:
        yield
    except Exception as exc:
        causes = (e for e in (exc, exc.__cause__, exc.__context__) if e is not None)
        queue = next((q for e in causes if (q := _without_priorities(e))), None)
        if queue is None:
            raise
        raise _refused(queue) from None


def check_priority_queues(app: Celery, queues: Collection[str]) -> None:
    """At a worker's start on RabbitMQ: declare ``queues`` as Celery will
    (:class:`QueueWithoutPriorities` for one that exists without priorities). Nothing to
    check on Redis; a broker that cannot be reached now is left to Celery's own start."""
    if redis_broker(app):
        return
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
            for name in queues:
                with priority_queues(app):
                    app.amqp.queues[name](conn.channel()).declare()
    except QueueWithoutPriorities:
        raise
    except Exception as exc:  # unreachable, refused: Celery's own start reports the broker
        log.debug("could not check the queues' priorities now: %s", exc)


def queue_length(app: Celery, queue: str) -> int:
    """How many messages a Redis broker's ``queue`` holds, in all its priority lists."""
    pipe = broker_client(app).pipeline(transaction=False)
    for name in Layout.of(app).queue_keys(queue):
        pipe.llen(name)
    return int(sum(pipe.execute()))


# --- worker state ---------------------------------------------------------------------------

_WORKER_SETS = ("active_requests", "reserved_requests", "scheduled_requests")


def worker_state_readable() -> bool:
    """Whether Celery's worker state has the three sets of requests :func:`in_pool` and
    :func:`held` read (checked once)."""
    return checks.ready(WORKER_STATE, _probe_worker_state)


def _probe_worker_state() -> str | None:
    missing = [
        name
        for name in _WORKER_SETS
        if not isinstance(getattr(worker_state, name, None), Collection)
    ]
    return f"celery.worker.state has no {', '.join(missing)}" if missing else None


def in_pool(request: Any) -> bool:
    """Whether the worker's pool took ``request`` (its attempt is starting or running)."""
    # Celery 5.7: the pool's requests are in the set ``active_requests`` from the moment the
    # pool accepts one until it ends.
    return worker_state_readable() and request in worker_state.active_requests


def held(request: Any) -> bool:
    """Whether this worker still holds ``request``'s message without running it
    (prefetched, or waiting for an ETA); ``False`` once an attempt ended it, or when Celery's
    worker state cannot be read (the receiving worker's lease is then never taken)."""
    # Celery 5.7: a prefetched request is in ``reserved_requests``, one waiting for its ETA
    # or countdown in ``scheduled_requests``; both drop it when the pool takes it or it ends.
    return worker_state_readable() and (
        request in worker_state.reserved_requests or request in worker_state.scheduled_requests
    )


# --- a lost connection's second close -------------------------------------------------------

_closed_guard = threading.Lock()


def guard_closed_channels() -> None:
    """Keep a worker alive through the double close of a lost connection (kombu 5.7.0,
    Celery 5.7.0).

    On a lost connection Celery's consumer ``collect()``s the connection (which closes its
    default channel and drops the transport's ``client``), then ``close()``s it again. When
    the first close of the channel failed part way (it was waiting on BRPOP and reading the
    dead socket raised), the second one restores the channel's unacknowledged messages
    through ``Channel._connparams``, which reads the dropped client: an AttributeError,
    which Celery reports as "Unrecoverable error" and stops the worker. Here that read
    raises the Redis connection error it stands for; kombu's close ignores it, as the
    restore through the dead connection would have failed anyway (the messages stay in
    kombu's ``unacked`` hash, which recovery reads: :class:`BrokerView`). Idempotent."""
    with _closed_guard:
        original = getattr(RedisChannel, "_connparams", None)
        if original is None or getattr(original, "runner_guarded", False):
            return  # another kombu: nothing of this shape to guard

        def connparams(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.connection.client is None:
                raise redis.ConnectionError("the broker connection is closed")
            return original(self, *args, **kwargs)

        connparams.runner_guarded = True  # type: ignore[attr-defined]
        RedisChannel._connparams = connparams  # type: ignore[method-assign]


# --- one Redis client per channel ------------------------------------------------------------

_KEPT = "_runner_client"
"""The channel instance's attribute holding its kept client: (factory, pool, client)."""


def one_client_per_channel() -> bool:
    """Have kombu's Redis channels keep one client instead of building one per command.

    kombu 5.7's Redis ``Channel`` runs every command outside its consumer's own connection
    (a publish, a fanout event, an acknowledgement, the ``unacked`` bookkeeping of a
    message taken) through ``conn_or_acquire``, which builds a new ``redis.Redis`` on the
    channel's pool each time; with redis-py 8 that costs about as much as the command
    (its response-callback table is built anew), a fifth of a worker's main process.
    A ``redis.Redis`` on a pool is safe to share between threads, so each channel keeps
    the one its ``_create_client`` built, for as long as the channel's client factory
    (``Channel.Client``, which the outbox check replaces on a channel of its own) and pool
    are the same: after a reconnect kombu makes a new pool, and so a new client.
    Installed once per process, for every Redis channel (a worker calls it before its
    consumer connects; its pool processes inherit it). ``False`` (one WARNING) when
    ``_create_client`` is not the method this expects: kombu's own behaviour stays."""
    return checks.ready(ONE_CLIENT, _keep_one_client)


def _keep_one_client() -> str | None:
    original = getattr(RedisChannel, "_create_client", None)
    if original is None:
        return "kombu's Redis Channel has no _create_client"
    if getattr(original, "runner_kept", False):
        return None
    params = list(inspect.signature(original).parameters)
    if params != ["self", "asynchronous"]:
        return f"kombu's Redis Channel._create_client takes {params}, not (self, asynchronous)"

    def create_client(self: Any, asynchronous: bool = False) -> Any:
        if asynchronous:  # kombu keeps its one asynchronous client itself
            return original(self, asynchronous=True)
        factory, pool = self.Client, self.pool
        kept = self.__dict__.get(_KEPT)
        if kept is None or kept[0] is not factory or kept[1] is not pool:
            kept = (factory, pool, original(self))
            self.__dict__[_KEPT] = kept  # two threads racing each build one: either serves
        return kept[2]

    create_client.runner_kept = True  # type: ignore[attr-defined]
    create_client.runner_original = original  # type: ignore[attr-defined]
    RedisChannel._create_client = create_client  # type: ignore[method-assign]
    return None


# --- the consumer's reconnects --------------------------------------------------------------

RECONNECT = {"interval_start": 0.0, "interval_step": 0.5, "interval_max": 1.0}
"""How often a worker's consumer tries the broker again after losing it: at once, then
0.5 s, then every second. Celery's consumer takes kombu's default (2 s, then 2 s longer at
each try up to 30 s: tries 2, 6, 12, 20, 30 s after the loss), so a broker back after 7 s
was found only at 12 s, one back after 13 s at 20 s: runs stood still for up to 8 s (more,
the longer the outage) with Redis answering. Celery has no setting for these."""


def patient_connections(app: Celery, seconds: float) -> None:
    """Make every use of a lost broker connection in ``app`` (a producer's channel, Celery's
    send) wait for the broker up to ``seconds``, trying on :data:`RECONNECT`'s schedule.

    kombu reconnects a connection it finds lost (``Connection.default_channel``) for its
    ``connect_timeout`` only (Celery's ``broker_connection_timeout``, 4 s) at 2 s, then 4 s
    apart: a step finishing during a longer restart failed its send with
    ``OperationalError`` (and a traceback), though its commit would have waited. kombu's
    transport options ``connect_retries_timeout`` and ``interval_*`` set both (kombu 5.7.0,
    ``Connection._extract_failover_opts``); a config file's own are kept."""
    options = dict(app.conf.broker_transport_options or {})
    options.setdefault("connect_retries_timeout", seconds)
    for key, value in RECONNECT.items():
        options.setdefault(key, value)
    app.conf.broker_transport_options = options


WORKER_CONSUMER = "runner.distributed.broker:Consumer"
"""Celery's ``worker_consumer`` setting naming :class:`Consumer`."""


def _kombu_schedule(retries: int) -> float:
    """Seconds kombu's default schedule (2, 4, ... 30 s apart) waits over ``retries`` tries."""
    return float(sum(min(2 + 2 * k, 30) for k in range(retries)))


class Consumer(CeleryConsumer):
    """Celery's worker consumer, reconnecting on :data:`RECONNECT`'s schedule (kombu 5.7.0,
    Celery 5.7.0: ``Consumer.ensure_connected`` calls the connection's
    ``ensure_connection(errback, max_retries, callback=...)`` with kombu's default
    intervals). ``broker_connection_max_retries`` keeps its meaning in time: the worker gives
    up when kombu's default schedule would have (about 46 minutes at Celery's default 100
    tries), not after 100 tries a second apart; ``None`` still retries forever. A message of
    a task the worker lacks goes to :func:`on_unknown_tasks`' handler first."""

    def ensure_connected(self, conn: Any) -> Any:
        ensure = conn.ensure_connection

        def sooner(errback: Any = None, max_retries: int | None = None, **kwargs: Any) -> Any:
            if max_retries is not None and max_retries <= 0:
                return ensure(errback, max_retries, **kwargs)  # no retries: nothing to hasten
            budget = None if max_retries is None else _kombu_schedule(max_retries)
            return ensure(errback, None, **RECONNECT, timeout=budget, **kwargs)

        conn.ensure_connection = sooner  # this call only: the instance's own attribute
        try:
            return super().ensure_connected(conn)
        finally:
            del conn.ensure_connection

    def on_unknown_task(self, body: Any, message: Any, exc: Any) -> None:
        handle = _unknown_handlers.get(self.app)
        name = str((getattr(message, "headers", None) or {}).get("task", ""))
        if handle is None or not name:
            super().on_unknown_task(body, message, exc)
            return
        try:
            handled = handle(name, message)
        except Exception as err:  # the store or the broker away: it comes back later
            log.warning("a message of task %s went back to its queue: %s", name, err)
            message.reject(requeue=True)
            return
        if handled:
            message.ack()
        else:
            super().on_unknown_task(body, message, exc)


# --- log records of a lost connection -------------------------------------------------------

# Celery 5.7 / kombu 5.7 wording. Should it change, the worker logs their records as they
# are (more lines during an outage); nothing else depends on it.
CONNECTION_LOGGERS = ("celery.worker.consumer", "celery.backends", "kombu")
"""Loggers whose records of a lost connection the worker folds into its own WARNING."""
CONNECTION_LOST = (
    "consumer: Cannot connect to",
    "consumer: Connection to broker lost",
    "Connection to Redis lost",
)
"""How those records begin (Celery's consumer, its Redis result backend)."""
ACK_LOST = ("celery.worker.request", "Couldn't ack")
"""Celery's record (logger, how it begins; CRITICAL, with a traceback) of a step's message
acknowledged after the connection it came on was lost: the ack cannot reach the broker,
the message stays in kombu's ``unacked`` hash, and recovery finds its step committed."""
RECONNECTED = "Connected to"
"""How Celery's consumer says it reconnected (``celery.worker.consumer``)."""
CANCEL_ON_CONNECTION_LOSS = "worker_cancel_long_running_tasks_on_connection_loss"
"""Named in the warning Celery 5 gives at every connection loss (Celery 6 will cancel
running tasks instead; config/celeryconfig.py keeps them running)."""


# --- queues and workers in view (runner workers, the console's Workers page, /metrics) -----
# Kept apart from the sections above: what ``runner.distributed.fleet`` reads of a Redis
# broker's queues and of Celery's names for a worker's pool. kombu 5.7's Redis transport
# ``LPUSH``es a message onto its queue's list (``<queue><sep><p>`` for priority ``p > 0``)
# and takes it with ``BRPOP``: the message at index -1 of each list is the next one taken
# from it, the one pushed longest ago (kombu puts a restored message back at that end too).
# The message is JSON whose ``headers`` are the Celery protocol-2 headers, where
# :data:`SENT_AT` is the runner's own.

SENT_AT = "sent_at"
"""The header every task message of a runner process carries: when it was sent (Unix
seconds, the sender's clock), set by :func:`runner.distributed.fleet.stamp_sent_at`."""


def sent_at_of(raw: Any) -> float | None:
    """The :data:`SENT_AT` header of a raw Redis-transport message, or ``None`` (none, or
    not a Celery task message)."""
    try:
        value = json.loads(raw)["headers"][SENT_AT]
    except (TypeError, ValueError, KeyError):
        return None
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class Backlog:
    """A Redis broker queue's messages: how many (every priority list), and when the
    oldest of the lists' next messages was sent (``None``: empty, or none says)."""

    depth: int
    oldest_sent_at: float | None


def redis_backlog(app: Celery, queues: Collection[str]) -> dict[str, Backlog]:
    """Each of ``queues`` of ``app``'s Redis broker, read in one round trip (two commands a
    priority list: its length and the message at its consuming end)."""
    layout, client = Layout.of(app), broker_client(app)
    names = {queue: layout.queue_keys(queue) for queue in queues}
    pipe = client.pipeline(transaction=False)
    for keys in names.values():
        for key in keys:
            pipe.llen(key)
            pipe.lindex(key, -1)
    replies = iter(pipe.execute())
    found: dict[str, Backlog] = {}
    for queue, keys in names.items():
        depth, sent = 0, []
        for _ in keys:
            length, last = next(replies), next(replies)
            depth += int(length)
            if last is not None and (at := sent_at_of(last)) is not None:
                sent.append(at)
        found[queue] = Backlog(depth, min(sent) if sent else None)
    return found


def run_worker_command(app_module: str, args: list[str]) -> NoReturn:
    """Run Celery's ``worker`` command with ``args`` on the app ``app_module`` names, as
    ``celery -A app_module worker ARGS`` does, but without Celery's umbrella command: it
    imports every plugin of ``celery.commands`` first (Flower's, which imports tornado and
    Flower's views) and ``celery amqp``'s prompt_toolkit, 0.1-0.25 s of CPU at each worker's
    start on a 2-core machine, which neither the worker nor ``runner dev``'s restarts need.

    Celery 5.7's umbrella gives its subcommands a ``celery.bin.base.CLIContext`` of the app
    (after adding the app's ``worker`` user options to the command); the same is done here.
    Should either not be as expected, the umbrella command runs (``os.execv``), said at
    WARNING. Variables ``CELERY_WORKER_<OPTION>`` set options, as under the umbrella.
    """
    try:
        import click
        from celery.app.utils import find_app
        from celery.bin.base import CLIContext
        from celery.bin.worker import worker as command

        usable = isinstance(command, click.Command) and {"app", "no_color", "workdir"} <= set(
            inspect.signature(CLIContext).parameters
        )
    except ImportError:
        usable = False
    if not usable:
        log.warning(
            "Celery %s's worker command is not as runner expects it (written against %s): "
            "started through `celery -A %s worker` instead",
            celery.__version__,
            WRITTEN_AGAINST["celery"],
            app_module,
        )
        exec_celery_worker(app_module, args)
    app = find_app(app_module)
    command.params.extend(app.user_options.get("worker", ()))
    context = CLIContext(app=app, no_color=None, workdir=None)
    command.main(
        args=args, obj=context, prog_name="celery worker", auto_envvar_prefix="CELERY_WORKER"
    )
    sys.exit(0)  # click's main exits on its own; this is for the type checker


def pool_name(implementation: Any) -> str | None:
    """Celery's ``-P`` name of the pool class a worker reports in its ``stats`` (its
    ``pool.implementation``: ``celery.concurrency.thread:TaskPool`` is ``threads``)."""
    if not implementation:
        return None
    import celery.concurrency

    aliases = getattr(celery.concurrency, "ALIASES", {})  # name -> "module:Class", no import
    named = [name for name, path in aliases.items() if path == str(implementation)]
    if named:
        return str(named[0])  # in Celery's order: prefork before its alias processes
    module = str(implementation).partition(":")[0]
    return module.rpartition(".")[2] or module


# --- messages of tasks a worker lacks -------------------------------------------------------

UnknownTaskHandler = Callable[[str, Any], bool]
"""``handle(task name, message)``: whether it dealt with the message (handed it on)."""

_unknown_handlers: weakref.WeakKeyDictionary[Celery, UnknownTaskHandler] = (
    weakref.WeakKeyDictionary()
)


def on_unknown_tasks(app: Celery, handle: UnknownTaskHandler) -> None:
    """Have the workers of ``app`` call ``handle`` for a message of a task they have not
    registered, instead of Celery's own handling when it returns True: the message is then
    acknowledged, and Celery neither logs it (its ERROR dumps the whole message body) nor
    records the task as failed. A message ``handle`` declines (False) gets Celery's handling;
    one it could not deal with (it raised: Redis away) goes back to its queue.

    Celery has no public hook that runs *instead of* its handling (``task_unknown`` is sent
    after the message was dropped and the failure recorded): the worker's consumer class is
    a public setting (``worker_consumer``), its ``on_unknown_task(body, message, exc)``
    method (Celery 5.7) is not.
    """
    _unknown_handlers[app] = handle
    app.conf.worker_consumer = WORKER_CONSUMER
