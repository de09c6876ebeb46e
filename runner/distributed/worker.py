"""Worker side: import the allow-listed flow modules and register their tasks.

Only modules named in ``RUNNER_FLOW_MODULES`` are imported, at start-up; a
message can name a task, never a module. Each flow method becomes the task
``<Flow>.<method>``. A message for a task this worker has not registered (a flow
outside its allow-list, or of another version) goes to the workers of the version that
can run it, and waits there for one (never a failed run); a step whose run names another
import path than the registered flow fails its run with :class:`FlowNotAllowed`.

The worker's main process also runs the recovery pass every ``recovery_interval``,
holds a soft lease on every step message it keeps without running it (prefetched, or a
retry's countdown) until an attempt begins (:mod:`runner.distributed.handoff`), settles
attempts the pool killed at Celery's hard time limit
(:func:`~runner.distributed.step.hard_time_limit`), and reports a lost connection to
Redis or the broker once (a WARNING, no traceback) and its return once (an INFO),
however many parts of the worker noticed. Before its pool starts, it checks the kombu and
Celery internals it relies on (:mod:`runner.distributed.broker`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from celery import Celery, signals
from celery.exceptions import TimeLimitExceeded

from runner import ids
from runner.embedded import mask_url
from runner.errors import DefinitionError, FlowImportError, RunnerError, StoreUnavailable
from runner.flow import versions
from runner.flow.definition import is_declared, refs_allowed_in
from runner.flow.loading import load_flow
from runner.observe import hooks as observe
from runner.settings import RunnerSettings, get_settings

from . import broker, handoff, outage, routing
from .coord import OK
from .engine import (
    DECLARED_TASK,
    RECOVER_TASK,
    Runtime,
    allowed_flow,
    fail_not_allowed,
    task_name,
)
from .recovery import recover
from .step import execute, hard_time_limit

log = logging.getLogger("runner.worker")

PATIENT_PUBLISH = {"max_retries": 30, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
"""Celery's publish retry policy on workers: about 25 s of retries."""


def install(
    app: Celery, modules: list[str] | None = None, settings: RunnerSettings | None = None
) -> Runtime:
    """Register the runner's tasks and the allow-listed flows on ``app``."""
    settings = settings or get_settings()
    rt = Runtime.create(app, settings, patient=True)  # a Redis blip must not fail a step
    # Nor must a broker blip fail the send of the steps a commit made ready (Celery's default
    # gives up after ~1 s): retry for about half a minute, then their senders' leases lapse
    # and recovery sends them.
    app.conf.task_publish_retry_policy = PATIENT_PUBLISH
    # And its consumer tries a lost broker again every second, not at kombu's 2, 6, 12, 20,
    # 30 s after the loss (a Redis back after 7 s was taken from only at 12 s).
    app.conf.worker_consumer = broker.WORKER_CONSUMER
    # And a step that finishes while Redis restarts waits for its broker connection as its
    # commit waits for the store (RUNNER_STORE_RETRY), rather than failing at kombu's 4 s.
    broker.patient_connections(app, settings.store_retry)
    _register_builtins(app, rt)
    routing.serve(app, rt.store, settings)
    allowed = list(settings.flow_modules if modules is None else modules)
    rt.allowed_modules = tuple(allowed)
    for name in allowed:
        for flow_cls in flows_in(name):
            register_flow(app, rt, flow_cls)
    # The version twins of its queues: steps handed to this worker's version reach it there.
    routing.consume_versions(app, routing.worker_versions(settings, rt.flows.values()))
    _register_declared(app, rt)
    # After the flow modules: a tracer provider one of them set up is used as it is.
    observe.install(app, settings)
    watch = outage.speak_here(f"Redis at {mask_url(rt.store.url)}")
    _check_broker_at_start(app, rt)
    _start_recovery_on_ready(app, rt, watch)
    _hand_back_unknown_tasks(app, rt)
    _hold_received_steps(app, rt)
    _settle_hard_time_limits(app, rt)
    _quiet_reconnects(watch)
    return rt


def flows_in(module_name: str) -> list[type]:
    """The Flow subclasses defined in ``module_name`` (imported here)."""
    from runner.flow.flow import Flow

    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise FlowImportError(
            f"cannot import flow module {module_name}: {exc}", module=module_name
        ) from None
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, Flow)
        and obj is not Flow
        and obj.__module__ == module.__name__
    ]
    # Crews (objects with ``as_flow``) run as flows of their tasks.
    found += [
        obj.as_flow()
        for obj in vars(module).values()
        if not inspect.isclass(obj) and callable(getattr(obj, "as_flow", None))
    ]
    return found


def register_flow(app: Celery, rt: Runtime, flow_cls: Any) -> list[str]:
    """One task per method of ``flow_cls``; returns the task names."""
    name = flow_cls.flow_name()
    known = rt.flows.get(name)
    if known is not None and known.flow_path() != flow_cls.flow_path():
        raise DefinitionError(
            f"two flows are named {name}: {known.flow_path()} and {flow_cls.flow_path()}; "
            "task names (<Flow>.<method>) must be unique, so rename one (Flow.name)",
            flow=name,
        )
    rt.flows[name] = flow_cls
    routing.learn(app, flow_cls)
    names = []
    for method, spec in flow_cls.graph().methods.items():
        limit = spec.time_limit or rt.settings.step_time_limit

        def body(
            task: Any,
            run_id: str,
            activation: str,
            epoch: int = 0,
            attempt: int = 1,
            deployment: str | None = None,
            spent: dict[str, Any] | None = None,
            version: str | None = None,
        ) -> dict[str, Any]:
            return _attempt(
                rt, task, flow_cls, run_id, activation, epoch, attempt, deployment, spent, version
            )

        body.__name__ = body.__qualname__ = f"{name}__{method}"
        app.task(name=task_name(name, method), **step_task_options(limit))(body)
        names.append(task_name(name, method))
    return names


def step_task_options(limit: float | None) -> dict[str, Any]:
    """Celery options of every step task (a flow method's and the declared flows' one):
    late acks, rejected on worker loss, the step's soft time limit and Celery's hard one
    (1.5x + 5 s, so the soft limit's exception is the one a step sees), retries ours."""
    return {
        "bind": True,
        "acks_late": True,
        "reject_on_worker_lost": True,
        "soft_time_limit": limit,
        "time_limit": limit * 1.5 + 5 if limit else None,
        "max_retries": None,
    }


def _attempt(
    rt: Runtime,
    task: Any,
    flow_cls: Any,
    run_id: str,
    activation: str,
    epoch: int,
    attempt: int,
    deployment: str | None,
    spent: dict[str, Any] | None,
    version: str | None,
) -> dict[str, Any]:
    """One attempt of a step, observed (span, metrics, log fields): what every step task,
    a flow method's or a declared flow's, runs."""
    with observe.Attempt(task, run_id, activation, epoch, attempt) as seen:
        return seen.done(
            execute(
                rt, task, flow_cls, run_id, activation, epoch, attempt, deployment, spent, version
            )
        )


def _register_declared(app: Celery, rt: Runtime) -> None:
    """The task of every declared flow's steps (:data:`DECLARED_TASK`): it runs the flow
    the run's path carries; the flow's code references resolve only in the worker's
    allow-list (:attr:`Runtime.allowed_modules`)."""
    allowed = list(rt.allowed_modules or ())
    limit = rt.settings.step_time_limit

    @app.task(name=DECLARED_TASK, **step_task_options(limit))
    def declared_step(
        task: Any,
        run_id: str,
        activation: str,
        epoch: int = 0,
        attempt: int = 1,
        deployment: str | None = None,
        spent: dict[str, Any] | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        latest = rt.coord.read(run_id)
        if latest is None or not is_declared(latest.flow):
            detail = f"run {run_id} names no declared flow"
            fail_not_allowed(rt, run_id, detail)
            return {"run_id": run_id, "step": activation, "skipped": detail}
        with refs_allowed_in(allowed):  # only while this step runs, only in this context
            flow_cls = load_flow(str(latest.flow))
            rt.flows.setdefault(flow_cls.flow_name(), flow_cls)
            return _attempt(
                rt, task, flow_cls, run_id, activation, epoch, attempt, deployment, spent, version
            )


def _register_builtins(app: Celery, rt: Runtime) -> None:
    @app.task(name=RECOVER_TASK)
    def recover_task() -> dict[str, list[str]]:
        return recover(rt, force=True)


def _check_broker_at_start(app: Celery, rt: Runtime) -> None:
    """Check the kombu and Celery internals this worker relies on once it has logged in
    and before its pool starts, so the pool processes inherit the verdicts (and a WARNING
    about one is logged once, see :mod:`runner.distributed.broker`)."""

    def on_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", app) is not app:
            return
        broker.worker_state_readable()
        broker.guard_closed_channels()
        if rt.sends_in_commit:
            broker.outbox_ready(app)
        if broker.redis_broker(app):
            broker.one_client_per_channel()
            broker.unacked_view_ready(app)

    signals.celeryd_after_setup.connect(on_setup, weak=False)


def _start_recovery_on_ready(app: Celery, rt: Runtime, watch: outage.Watch) -> None:
    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is not app:
            return
        thread = threading.Thread(
            target=_recovery_loop, args=(rt, watch), daemon=True, name="recover"
        )
        thread.start()

    signals.worker_ready.connect(on_ready, weak=False)


def _hand_back_unknown_tasks(app: Celery, rt: Runtime) -> None:
    """A step message for a task this worker lacks (nothing is imported) is never a failed
    run: it goes to the workers of the version its run was pinned to or last written by,
    when that is not this worker's (a rolling deploy, or a worker whose allow-list lacks the
    flow: :mod:`.routing`), else (this version wrote the latest checkpoint, in a parallel
    branch) of the version whose commit made the step ready. With no live worker of that
    version the step waits in that version's queue (``waiting for a worker of version V``)
    and runs once one starts. One WARNING line says so; the message body is never logged. Only
    a step handed to this worker's own version (workers of one ``RUNNER_APP_VERSION`` with
    different allow-lists), or of a run that names no version, fails its run: no worker
    that runs it can be named."""

    def on_unknown(name: str, message: Any) -> bool:
        try:
            _args, kwargs, *_rest = message.payload
            run_id = kwargs["run_id"]
        except Exception:
            return False  # not a runner step: Celery's own handling
        latest = rt.coord.read(str(run_id))
        if latest is None or not name.startswith(f"{latest.meta.name}."):
            return False  # not one of this deployment's runs, or not its flow's task
        mine = routing.worker_versions(rt.settings, rt.flows.values())
        policy = rt.settings.version_policy
        wanted = [v for v in versions.waiting_for(latest, policy) if v not in mine]
        if not wanted and policy != "pinned":
            # This worker's version wrote the latest checkpoint (it ran a parallel branch):
            # the step is another version's, the one whose commit made it ready.
            wanted = _senders(rt, latest.run_id, str(kwargs.get("activation", "")), mine)
        base = str((getattr(message, "delivery_info", None) or {}).get("routing_key") or "")
        base = base or rt.settings.queue
        carried = kwargs.get("version")
        if wanted and carried not in mine:
            _hand_unknown(app, rt, name, message, kwargs, base, wanted[0])
        else:
            # Handed to this worker's own version, which lacks the flow (workers of one
            # RUNNER_APP_VERSION with different allow-lists), or no version known: no
            # worker can be named that runs it.
            fail_not_allowed(rt, latest.run_id, f"this worker has no task {name}")
        return True

    broker.on_unknown_tasks(app, on_unknown)


def _senders(rt: Runtime, run_id: str, activation: str, mine: list[str]) -> list[str]:
    """The versions other than ``mine`` that wrote ``run_id``'s recent checkpoints, most
    likely to have ``activation``'s task first: the version of the oldest checkpoint that
    has it in flight (the commit that made it ready knew its method), then the others,
    newest first."""
    history = rt.store.history(run_id)  # newest first
    ready = [
        c.version
        for c in history
        if any(ids.activation_of_key(key) == activation for key in c.in_flight or ())
    ]
    found = [*reversed(ready), *(c.version for c in history)]
    return list(dict.fromkeys(v for v in found if v and v not in mine))


def _hand_unknown(
    app: Celery,
    rt: Runtime,
    name: str,
    message: Any,
    kwargs: dict[str, Any],
    base: str,
    version: str,
) -> None:
    """Send the step message of task ``name`` (acknowledged here once sent), received from
    queue ``base``, to the workers of ``version``, as
    :func:`runner.distributed.step._hand_over` does for a known task."""
    headers = getattr(message, "headers", None) or {}
    queue = routing.version_queue(base, version)
    priority = (getattr(message, "properties", None) or {}).get("priority")
    app.send_task(
        name,
        kwargs={**kwargs, "version": version},
        task_id=headers.get("id"),
        queue=queue,
        priority=priority,
        ignore_result=not rt.settings.task_results,
    )
    # A WARNING: workers log at that level by default, and the step waits until a worker of
    # that version runs (one line, never the message body).
    log.warning(
        "step %s of run %s: this worker has no task %s; handed to a worker of version %s",
        kwargs.get("activation"),
        kwargs["run_id"],
        name,
        version,
    )


def _recovery_loop(rt: Runtime, watch: outage.Watch) -> None:
    stop, interval = threading.Event(), rt.settings.recovery_interval
    while not stop.wait(interval):
        try:
            resent = recover(rt)
        except Exception as exc:
            if not outage.report(exc):  # a lost connection is said once, per worker
                log.exception("recovery pass failed; retrying in %ss", interval)
            continue
        watch.back()
        if resent:
            log.warning("recovery re-dispatched %s", resent)


# --- messages this worker holds -------------------------------------------------------------


class _Receipts:
    """Soft leases on the step messages this worker holds and no attempt began yet.

    A message is noted when it arrives (prefetched, or a retry waiting for its
    countdown); every third of a lease, a thread takes the receiving worker's lease of
    each noted message the worker still holds and the pool has not taken, renews the
    leases it took while the worker still holds their messages, and lets the rest lapse.
    An attempt that begins takes the lease over (see :mod:`runner.distributed.handoff`).
    A message whose attempt begins before the thread comes round costs no round trip;
    one that waits gets its lease within a third of a lease, well before recovery reads
    a Redis broker's unacknowledged messages as lost (after a whole lease).
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.held: dict[int, _Receipt] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def received(self, request: Any) -> None:
        kwargs = request.kwargs or {}
        if "run_id" not in kwargs or "activation" not in kwargs:
            return
        if kwargs.get("deployment", self.rt.settings.prefix) != self.rt.settings.prefix:
            return
        key = ids.activation_key_in(int(kwargs.get("epoch", 0)), str(kwargs["activation"]))
        receipt = _Receipt(weakref.ref(request), str(kwargs["run_id"]), key)
        with self.lock:
            self.held[id(receipt)] = receipt
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True, name="receipts")
                self.thread.start()

    def _loop(self) -> None:
        while True:
            time.sleep(self.rt.settings.lease_seconds / 3)
            self.tick()

    def tick(self) -> None:
        """Take, renew or drop the lease of each noted message (see the class docstring)."""
        with self.lock:
            held = list(self.held.items())
        for ident, receipt in held:
            try:
                kept = receipt.keep(self.rt)
            except StoreUnavailable as exc:
                outage.report(exc)
                continue
            except RunnerError as exc:  # e.g. a corrupt run: the attempt will quarantine it
                log.warning(
                    "run %s step %s: no lease on receipt (%s)", receipt.run_id, receipt.key, exc
                )
                kept = False
            if not kept:
                with self.lock:
                    self.held.pop(ident, None)


@dataclass
class _Receipt:
    """A step message this worker received, and the lease it took for it (if any)."""

    request: weakref.ref[Any]
    run_id: str
    key: str
    token: str = ""

    def keep(self, rt: Runtime) -> bool:
        """Take or renew the lease while the worker holds the message and the pool has not
        taken it; whether to look again at the next tick."""
        request = self.request()
        # Done with the message and no attempt took the lease over (a pool child killed
        # before it began, ...): Celery requeued the message, or dropped it (it does, for a
        # message redelivered before). Which, we cannot tell, so a lease is left to lapse:
        # recovery sends the step again if it is not committed by then; a duplicate message
        # is harmless, a lost one is not.
        if request is None or not broker.held(request):
            return False
        if self.token:
            return rt.coord.renew(self.run_id, self.key, self.token)
        if broker.in_pool(request):
            return True  # in the pool: its attempt takes the lease as it begins
        token = handoff.soft_token("recv")
        # A sender's lease gives way (it has sent); an attempt's, or another worker's
        # holding a copy of the message, does not: they answer for the step.
        if rt.coord.claim(self.run_id, [self.key], token) != [OK]:
            return False
        self.token = token
        return True


def _hold_received_steps(app: Celery, rt: Runtime) -> None:
    receipts = _Receipts(rt)

    def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is app and request is not None:
            receipts.received(request)

    signals.task_received.connect(on_received, weak=False)


# --- hard time limits -----------------------------------------------------------------------


def _settle_hard_time_limits(app: Celery, rt: Runtime) -> None:
    """When the pool kills an attempt at its hard time limit, settle it as a failed attempt.

    Celery sends ``task_failure`` from the main process just before the pool kills the
    attempt, so the work is done in a thread that waits for the attempt to be gone.
    """

    def on_failure(sender: Any = None, exception: Any = None, kwargs: Any = None, **_: Any) -> None:
        if not isinstance(exception, TimeLimitExceeded) or getattr(sender, "app", None) is not app:
            return
        flow_cls = rt.flows.get(str(sender.name).rpartition(".")[0])
        if sender.name == DECLARED_TASK and isinstance(kwargs, dict) and "run_id" in kwargs:
            latest = rt.coord.read(str(kwargs["run_id"]))
            flow_cls = None if latest is None else allowed_flow(rt, latest)
        if flow_cls is None or not isinstance(kwargs, dict) or "run_id" not in kwargs:
            return
        threading.Thread(
            target=_settle_killed,
            args=(rt, flow_cls, dict(kwargs), exception),
            daemon=True,
            name="time-limit",
        ).start()

    signals.task_failure.connect(on_failure, weak=False)


def _settle_killed(rt: Runtime, flow_cls: Any, kwargs: dict[str, Any], error: Any) -> None:
    try:
        hard_time_limit(rt, flow_cls, kwargs, error)
    except Exception:
        log.exception(
            "run %s step %s: could not settle the attempt killed at its hard time limit; "
            "recovery re-sends it when its lease lapses",
            kwargs.get("run_id"),
            kwargs.get("activation"),
        )


# --- connection losses ----------------------------------------------------------------------


_CONNECTION_LOGS = (*broker.CONNECTION_LOGGERS, "runner.worker")
REPORTED_FOR = 60.0
"""Seconds after an outage ended in which Celery's own "Connected to" is left unsaid."""


class _QuietReconnects(logging.Filter):
    """Turns the worker's many connection-error records (Celery's consumer, the result
    backend, lease heartbeats, with tracebacks) into :class:`outage.Watch` calls.

    Installed on the root logger's handlers in the main process, and inherited by the
    pool processes, which stay silent (:func:`outage.speaks`): the main process notices
    every outage too (its consumer and its recovery pass use the same servers) and reports
    it once. Records of steps that fail (``celery.app.trace``) are never touched.
    """

    def __init__(self, watch: outage.Watch) -> None:
        super().__init__()
        self.watch = watch

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "py.warnings":
            # Running steps ride through a lost broker connection (config/celeryconfig.py);
            # Celery 5 warns at every loss that Celery 6 will cancel them instead.
            return broker.CANCEL_ON_CONNECTION_LOSS not in record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        ack_lost = record.name == broker.ACK_LOST[0] and message.startswith(broker.ACK_LOST[1])
        if not ack_lost and not record.name.startswith(_CONNECTION_LOGS):
            return True
        if ack_lost or _is_connection_error(exc) or message.startswith(broker.CONNECTION_LOST):
            self.watch.lost(exc if exc is not None else message)  # silent in a pool child
            return False
        if message.startswith(broker.RECONNECTED) and record.name.startswith("celery.worker"):
            # Celery's consumer reconnected: after an outage our INFO says it, once.
            self.watch.back()
            return time.monotonic() - self.watch.back_at > REPORTED_FOR
        return True


def _is_connection_error(exc: BaseException | None) -> bool:
    return outage.is_connection_error(exc) or isinstance(exc, broker.CONNECTION_ERRORS)


def _quiet_reconnects(watch: outage.Watch) -> None:
    quiet = _QuietReconnects(watch)

    def on_logging(logger: Any = None, **_: Any) -> None:
        for handler in getattr(logger, "handlers", []):
            if quiet not in handler.filters:
                handler.addFilter(quiet)

    signals.after_setup_logger.connect(on_logging, weak=False)
