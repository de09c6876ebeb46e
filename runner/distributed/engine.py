"""The engine on Celery: runtime, dispatch, compare-and-set commits, and child runs.

* :func:`dispatch` sends each ready activation once: a dispatch marker (``HSETNX``)
  per activation and epoch, and a deterministic Celery task id.
* :func:`commit_on_latest` turns a checkpoint builder into a committed checkpoint with
  compare-and-set on the run's sequence, rebuilding on the newest checkpoint after a
  conflict. A commit that stops a child run reports to its parent. The steps a commit
  makes ready are sent by :func:`commit_and_send`: inside the commit's own script when
  the broker is the store's Redis (:mod:`runner.distributed.outbox`), else right after.
* Child runs (a flow method running a crew, see :mod:`runner.flow.children`): the
  parent's in-flight activation is linked to the child (:func:`start_child`) and
  committed with the child's output when the child ends (:func:`on_child_finished`);
  no worker waits meanwhile. :func:`waiting_children` tells the recovery pass which
  activations wait on a live child.

A step's own life (begin, run, settle, commit, send) is :mod:`runner.distributed.step`;
what each outcome means is :mod:`runner.flow.lifecycle`.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner import ids
from runner.errors import (
    ChildRunFailed,
    CommitConflict,
    FlowImportError,
    RunnerError,
    RunNotFound,
    StaleAttempt,
)
from runner.flow import conversation, lifecycle, results
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.attempt import StepResult
from runner.flow.children import ChildRun, child_run_id
from runner.flow.definition import is_declared, refs_allowed_in
from runner.flow.flow import apply_inputs
from runner.flow.loading import load_flow
from runner.flow.orchestrator import Activation
from runner.flow.state import reducers_for
from runner.flow.usage import last_of
from runner.settings import RunnerSettings, get_settings
from runner.store import codec as codecs
from runner.store.base import CommitRequest, DeploymentStore
from runner.store.models import Checkpoint, ParentLink, RunStatus, UsageMetrics
from runner.store.redis import RedisProvider

from . import handoff, outbox, routing, state_copy
from .coord import Coordinator

if TYPE_CHECKING:
    # Only a type here: a process that reads runs (the CLI's read-only commands) never
    # imports Celery; one that sends builds its app (runner.distributed.app) and has it.
    from celery import Celery

log = logging.getLogger("runner.worker")

RECOVER_TASK = "runner.recover"


class FlowNotAllowed(FlowImportError):
    """The run's flow is not in the workers' allow-list (``RUNNER_FLOW_MODULES``)."""


@dataclass
class Runtime:
    """Everything a worker or producer needs: app, store, coordinator, registry."""

    app: Celery
    store: DeploymentStore
    """The deployment's store: the engine asks it only what the protocol says."""
    coord: Coordinator
    settings: RunnerSettings
    flows: dict[str, Any] = field(default_factory=dict)
    allowed_modules: tuple[str, ...] | None = None
    """A worker's allow-list (set when it installs its flows): the only modules a declared
    flow's code references resolve in here; ``None`` (a producer): anywhere."""
    sends_in_commit: bool = False
    """The broker is the store's own Redis: a commit writes the messages of the steps it
    makes ready itself (see :mod:`runner.distributed.outbox`)."""

    @classmethod
    def create(
        cls, app: Celery, settings: RunnerSettings | None = None, *, patient: bool = False
    ) -> Runtime:
        """A runtime on ``app``'s Redis (``patient``: retry Redis errors for seconds)."""
        settings = settings or get_settings()
        store = RedisProvider(
            app.conf.runner_redis_url,
            prefix=settings.prefix,
            patient=patient,
            codec=codecs.of_settings(settings),  # these settings' keys, not the environment's
        )
        return cls(
            app,
            store,
            Coordinator(store, settings.lease_seconds),
            settings,
            # The store's URL names a plain Redis; whether its channel can be recorded is
            # the outbox's to tell at send time.
            sends_in_commit=app.conf.broker_url == store.url and not store.cluster,
        )

    def close(self) -> None:
        """Drop the sender leases still to drop, then close the app's and the store's
        connections: a drop after the store closed would open a connection nobody closes
        (and the lease would lapse instead of going at once)."""
        handoff.flush()
        self.app.close()
        self.store.close()


DECLARED_TASK = "runner.declared"
"""The one task every step of every declared flow goes to (its name has an ``@``): a worker
runs it from the definition its run records (:mod:`runner.crew.declared`), so it needs no
task of its own per declared flow."""


def task_name(flow_name: str, method: str) -> str:
    """The Celery task name of a flow method: ``<Flow>.<method>``; a declared flow's
    (``<name>@<digest>``) steps all go to :data:`DECLARED_TASK`."""
    if "@" in flow_name:
        return DECLARED_TASK
    return f"{flow_name}.{method}"


def task_id(run_id: str, epoch: int, activation: str) -> str:
    """Deterministic task id of an activation."""
    return f"{run_id}:{epoch}:{activation}"


def run_of_task(task: str) -> str:
    """The run id in a :func:`task_id` (neither epoch nor activation id has a ``:``)."""
    return task.rsplit(":", 2)[0]


def kwargs_repr(run_id: str, activation: str, attempt: int = 1) -> str:
    """How a step's arguments read in Flower and the worker log."""
    return f"run={run_id} step={activation}" + (f" attempt={attempt}" if attempt > 1 else "")


# --- dispatch -------------------------------------------------------------------------------


def dispatch(
    rt: Runtime,
    flow_name: str,
    run_id: str,
    epoch: int,
    acts: list[Activation],
    *,
    priority: int | None,
    force: bool = False,
) -> list[str]:
    """Send each activation once (``force`` re-sends) with its run's ``priority``
    (``RunMeta.scheduling.priority``); return the ids sent."""
    if not acts:
        return []
    keys = [ids.activation_key_in(epoch, a.id) for a in acts]
    handoff.hold(rt.coord, run_id, keys)  # a sender dying before the send leaves a lapsing lease
    fresh = [True] * len(acts) if force else rt.coord.mark_dispatched(run_id, keys)
    chosen = [act for act, is_new in zip(acts, fresh, strict=True) if is_new]
    handoff.let_go(
        rt.coord, run_id, [k for k, is_new in zip(keys, fresh, strict=True) if not is_new]
    )
    for act in chosen if force else ():
        rt.coord.redispatch_stamp(run_id, ids.activation_key_in(epoch, act.id))
    return send(rt, flow_name, run_id, epoch, chosen, priority=priority)


def send(
    rt: Runtime,
    flow_name: str,
    run_id: str,
    epoch: int,
    acts: list[Activation],
    *,
    priority: int | None,
) -> list[str]:
    """Send each activation's task (already marked dispatched) with its priority (see
    :func:`.routing.step_priority`; ``priority`` is the run's); return the ids sent.

    The messages (and their ``task-sent`` events) go in one batch: one round trip to a
    Redis broker however many steps a commit made ready (:func:`.broker.publish_batch`;
    with RabbitMQ each is published at once). The message names its deployment (the key
    prefix), so a worker of another deployment that receives it by mistake hands it back
    instead of running it.
    """
    if not acts:
        return []
    from . import broker  # loaded with the app that sends: no cost

    def publish(producer: Any) -> None:
        for act in acts:
            _send_task(rt, flow_name, run_id, epoch, act, producer, priority)

    with broker.priority_queues(rt.app):
        broker.publish_batch(rt.app, publish)
    # The broker has them: from now on the steps are queued, not lost.
    handoff.let_go(rt.coord, run_id, [ids.activation_key_in(epoch, act.id) for act in acts])
    return [act.id for act in acts]


def _send_task(
    rt: Runtime,
    flow_name: str,
    run_id: str,
    epoch: int,
    act: Activation,
    producer: Any,
    run_priority: int | None,
    *,
    recorded: bool = False,
) -> None:
    """Send ``act``'s task through ``producer``; ``recorded``: the producer records the
    publish for the outbox, with :func:`.broker.recorded_send`'s options (nothing reaches
    Redis while it records; the consuming worker declares its queues)."""
    from .broker import recorded_send  # loaded with the app that sends

    name = task_name(flow_name, act.method)
    quiet = recorded_send() if recorded else {}
    rt.app.send_task(
        name,
        kwargs={
            "run_id": run_id,
            "activation": act.id,
            "epoch": epoch,
            "deployment": rt.settings.prefix,
        },
        task_id=task_id(run_id, epoch, act.id),
        kwargsrepr=kwargs_repr(run_id, act.id),
        producer=producer,
        priority=message_priority(rt, name, run_priority),
        # Without results (the default) the sender has nothing to wait for: no subscription
        # to the step's result channel, which Celery otherwise opens on every send.
        ignore_result=not rt.settings.task_results,
        **quiet,
    )


def message_priority(rt: Runtime, task: str, run_priority: int | None) -> int:
    """The priority, in the broker's terms, of the message of a step of ``task`` in a run
    of ``run_priority`` (see :func:`.routing.step_priority`)."""
    from .broker import wire_priority  # loaded with the app that sends

    return wire_priority(rt.app, routing.step_priority(rt.app, task, run_priority))


def dispatch_ready(
    rt: Runtime, flow_cls: Any, ckpt: Checkpoint, acts: list[Activation]
) -> list[str]:
    """Send ``acts``, made ready by committed ``ckpt`` (a start, resume, answer or fork of a
    run of ``flow_cls``), routed as the flow's steps are, with the run's priority."""
    routing.learn(rt.app, flow_cls)
    return dispatch(
        rt,
        flow_cls.flow_name(),
        ckpt.run_id,
        ckpt.meta.epoch,
        acts,
        priority=ckpt.meta.scheduling.priority,
    )


def dispatch_pending(rt: Runtime, latest: Checkpoint) -> list[str]:
    """Dispatch (idempotently) a running run's in-flight steps not yet sent: after a
    redelivery, what the first commit made ready; for a new child run, its starts."""
    if latest.status is not RunStatus.RUNNING:
        return []
    return dispatch_in_epochs(rt, latest, orch.pending(tr.record_of(latest)))


def dispatch_in_epochs(
    rt: Runtime, latest: Checkpoint, acts: list[Activation], *, force: bool = False
) -> list[str]:
    """:func:`dispatch` ``acts`` of ``latest``'s run, each in the epoch whose attempts may
    commit it (:func:`~runner.flow.transition.epoch_of`: the run's, or the one a paused
    run's answer or resume carried it from)."""
    by_epoch: dict[int, list[Activation]] = {}
    for act in acts:
        by_epoch.setdefault(tr.epoch_of(latest, act.id), []).append(act)
    sent: list[str] = []
    for epoch, group in sorted(by_epoch.items()):
        sent += dispatch(
            rt,
            str(latest.meta.name),
            latest.run_id,
            epoch,
            group,
            priority=latest.meta.scheduling.priority,
            force=force,
        )
    return sent


def running_steps(rt: Runtime, latest: Checkpoint) -> set[str]:
    """The activations in flight at ``latest`` that an attempt holds a live lease on (running,
    or held by the worker that received it): what a paused or failed run going on carries
    into its next epoch."""
    leases, now = rt.coord.leases(latest.run_id), time.time()
    return {a for a in latest.in_flight if leases.get(tr.activation_key(latest, a), 0.0) > now}


def first_checkpoint(flow_cls: Any, inputs: dict[str, Any], message: Any = None) -> tr.Transition:
    """A new run's first checkpoint and its start steps, ``inputs`` validated into the
    state (``InvalidInputs`` before anything is stored); the run id is the state's id.
    ``message``: a conversational flow's first turn (its user message in the state)."""
    instance = flow_cls()
    state = apply_inputs(instance, inputs)
    if message is not None:
        state = apply_inputs(instance, {}, conversation.open_turn(flow_cls, state, message))
    return tr.start(
        flow_cls.graph(),
        instance.flow_id,
        state,
        flow=flow_cls.flow_path(),
        name=flow_cls.flow_name(),
    )


# --- commits --------------------------------------------------------------------------------


def commit_on_latest(
    rt: Runtime,
    run_id: str,
    build: Callable[[Checkpoint], Any],
    *,
    first: Checkpoint | None = None,
    send_ready: bool = False,
    released: tuple[str, str] | None = None,
) -> tuple[Checkpoint, Any] | None:
    """Compare-and-set loop: rebuild on the newest checkpoint until the commit lands.

    ``build`` returns a :class:`~runner.flow.transition.Transition` or a
    :class:`~runner.flow.lifecycle.Settled` (or ``None`` to decline); the result is
    the committed checkpoint and what ``build`` returned. ``first`` is a checkpoint
    the caller already read, tried before re-reading. ``send_ready``: the activations
    the commit makes ready are sent (when the run goes on running; see
    :func:`commit_and_send`). ``released``: an attempt's ``(activation key, token)``, its
    lease dropped by the commit (see ``CommitRequest.released``). ``None`` when ``build``
    declines or another attempt of the step committed. Tells waiters when the run stops,
    and the parent when a child run ends.
    """
    latest = first
    for _ in range(200):
        if latest is None:
            latest = rt.coord.read(run_id)
            if latest is None:
                raise RunNotFound(f"no run {run_id}", run_id=run_id)
        built = build(latest)
        if built is None:
            return None
        step = built.transition if isinstance(built, lifecycle.Settled) else built
        try:
            ready = step.ready if send_ready else []
            ckpt = commit_and_send(
                rt,
                step.checkpoint,
                latest.seq,
                ready,
                closing=step.closing,
                announce=True,
                released=released,
            )
        except CommitConflict:
            latest = None
            time.sleep(random.random() / 1000)
            continue
        except StaleAttempt:
            return None
        state_copy.keep_copy(rt.flows, rt.store, ckpt)  # @persist's copy, beyond Redis
        # A commit that stopped the run told its waiters itself (announce).
        if ckpt.status.finished and ckpt.meta.links.parent is not None:
            on_child_finished(rt, ckpt)
        return ckpt, built
    raise CommitConflict(f"run {run_id}: too many concurrent commits", run_id=run_id)


def commit_and_send(
    rt: Runtime,
    checkpoint: Checkpoint,
    expected_seq: int,
    ready: list[Activation],
    *,
    closing: Checkpoint | None = None,
    announce: bool = False,
    released: tuple[str, str] | None = None,
) -> Checkpoint:
    """Commit ``checkpoint`` (compare-and-set on ``expected_seq``), and the run's
    ``closing`` checkpoint after it if it ends the run, and send ``ready``, the
    activations it makes ready, if the run goes on running.

    The same atomic commit marks them dispatched, so they are sent once. Where the broker
    is the store's Redis, the commit's script writes their messages too (the outbox): a
    step is committed ready and queued at once. Otherwise the commit gives them the
    sender's soft lease, and they are sent after it (see :mod:`.handoff`): a committer
    dying in between leaves leases that lapse, and recovery sends them. ``announce``: a
    commit that stops the run tells its waiters (:meth:`~.coord.Coordinator.watch_stopped`)
    in the same round trip where the store can (see ``CommitRequest.announce``);
    ``released`` as in ``CommitRequest``.
    """
    marks: list[str] = []
    epoch, run_id, name = checkpoint.meta.epoch, checkpoint.run_id, str(checkpoint.meta.name)
    if ready and checkpoint.status is RunStatus.RUNNING:
        marks = [ids.activation_key_in(epoch, a.id) for a in ready]
    priority = checkpoint.meta.scheduling.priority
    messages = (
        outbox_commands(rt, name, run_id, epoch, ready, priority=priority)
        if marks and rt.sends_in_commit
        else None
    )
    ckpt = rt.store.commit_request(
        CommitRequest(
            checkpoint,
            expected_seq=expected_seq,
            closing=closing,
            dispatching=marks,
            sender=handoff.sender_token() if marks and messages is None else "",
            sender_lease=rt.settings.lease_seconds,
            outbox=messages or (),
            announce=announce,
            carried=[tr.activation_key(checkpoint, a) for a in checkpoint.meta.carried],
            released=released,
        )
    )
    if marks and messages is None:
        send(rt, name, run_id, epoch, ready, priority=priority)
    return ckpt


def outbox_commands(
    rt: Runtime,
    flow_name: str,
    run_id: str,
    epoch: int,
    acts: list[Activation],
    *,
    priority: int | None,
) -> list[outbox.Command] | None:
    """The Redis commands that would send ``acts`` of a run of ``priority``, unsent
    (``None``: the outbox is off here; send them after the commit)."""

    def publish(producer: Any) -> None:
        for act in acts:
            _send_task(rt, flow_name, run_id, epoch, act, producer, priority, recorded=True)

    return outbox.recorded(rt.app, publish)


def allowed_flow(rt: Runtime, latest: Checkpoint) -> Any | None:
    """The registered flow class that runs ``latest``'s run, or ``None``.

    The run names its flow by display name (the task names' prefix) and import
    path; both must match a class this worker imported from its allow-list.
    """
    flow_cls = rt.flows.get(str(latest.meta.name))
    if flow_cls is None and is_declared(latest.flow):
        # A declared flow is the definition its path carries (its code refs are checked
        # when they run); a worker registers no task of its own for it.
        flow_cls = rt.flows.setdefault(str(latest.meta.name), load_declared(rt, str(latest.flow)))
    if flow_cls is None or flow_cls.flow_path() != latest.flow:
        return None
    return flow_cls


def fail_not_allowed(rt: Runtime, run_id: str, detail: str = "") -> FlowNotAllowed | None:
    """Fail a running run whose flow this worker may not run; the error, if it failed it."""
    latest = rt.coord.read(run_id)
    if latest is None or latest.status is not RunStatus.RUNNING:
        return None
    err = FlowNotAllowed(
        f"flow {latest.flow} is not in this worker's allow-list (RUNNER_FLOW_MODULES)"
        + (f": {detail}" if detail else ""),
        run_id=run_id,
        flow=latest.flow,
    )
    if commit_on_latest(rt, run_id, lambda c: lifecycle.run_failed(c, err)) is None:
        return None
    log.error("run %s failed: %s", run_id, err)
    return err


def ended(run: str, status: RunStatus, stopped: Checkpoint) -> str:
    """How a run ended, in one line: ``<run> failed at STEP: Type: message``.

    ``run`` names the run (``run R``, ``child run R``); ``stopped`` is the checkpoint that
    stopped it with ``status`` (for a failed run, the one that carries the error). A run
    stopped as a whole (its flow not allowed on the worker, a cancel) names no step: one
    stopped before any step had completed says so.
    """
    where = f" at {stopped.step}" if stopped.step else ""
    if not stopped.step and not stopped.completed:
        where = " before any step"
    error = stopped.error
    why = f": {error.type}: {' '.join(error.message.split())}" if error else ""
    return f"{run} {status.value}{where}{why}"


# --- child runs -----------------------------------------------------------------------------


def start_child(
    rt: Runtime, parent_run_id: str, epoch: int, child: ChildRun, result: StepResult
) -> dict[str, Any]:
    """Link the parent's activation of ``result`` to its child run and make sure the
    child runs.

    Idempotent: a redelivered step links the same child again (no new checkpoint), and
    the child's steps are sent once (dispatch markers). A child that already exists is
    not started again: if it succeeded the parent's activation commits now; if it failed
    or was cancelled (the parent is being resumed) it is resumed at its first unfinished
    task, before the link is committed. ``epoch`` is the parent's epoch the attempt ran
    in (a stale attempt changes nothing).
    """
    act = result.activation
    child_id = child_run_id(parent_run_id, act.id)
    reply: dict[str, Any] = {"run_id": parent_run_id, "step": act.id, "child": child_id}
    try:
        child_cls = _flow_class(rt, child.name, child.flow)
    except RunnerError as exc:
        _fail_parent(rt, parent_run_id, act.id, exc, None)
        return {**reply, "failed": type(exc).__name__}
    link = lifecycle.child_link(child, child_id, result)
    parent = rt.store.latest(parent_run_id)
    if (
        parent is None
        or parent.status is not RunStatus.RUNNING
        or not lifecycle.in_flight(parent, epoch, act.id)
    ):
        return {**reply, "skipped": "the activation is no longer waiting"}
    existing = rt.store.latest(child_id)
    # The parent is being resumed: so is its child, at its first unfinished task, and
    # before the parent's link of this epoch is committed. A link that waited on a child
    # still stopped would tell a recovery pass the child ended, and fail the parent.
    resumed = existing is not None and _resume_child(rt, child, existing)
    commit_on_latest(
        rt, parent_run_id, lambda latest: lifecycle.child_linked(latest, epoch, act.id, link)
    )
    parent = rt.store.latest(parent_run_id)
    if (
        parent is None
        or tr.epoch_of(parent, act.id) != epoch
        or lifecycle.waiting_on(parent, act.id) is None
    ):
        return {**reply, "skipped": "the activation is no longer waiting"}
    existing = rt.store.latest(child_id)
    if existing is None:
        first = first_checkpoint(child_cls, {**child.inputs, "id": child_id})
        first.checkpoint.meta = first.checkpoint.meta.updated(
            parent=ParentLink(run_id=parent_run_id, activation=act.id),
            priority=parent.meta.scheduling.priority,  # its steps go as its parent's
        )
        with contextlib.suppress(CommitConflict):  # an earlier attempt created it
            rt.store.commit(first.checkpoint, expected_seq=0)
    elif existing.status.finished:  # it succeeded, or ended again since it was resumed
        return {**reply, "dispatched": on_child_finished(rt, existing)}
    elif resumed:
        return {**reply, "resumed": True}
    created = rt.store.latest(child_id)
    return {**reply, "dispatched": dispatch_pending(rt, created) if created else []}


def _resume_child(rt: Runtime, child: ChildRun, existing: Checkpoint) -> bool:
    """Resume a child run that failed or was cancelled (with its parent) and send its
    steps; whether this call resumed it (``_resume_stopped`` declines any other status)."""
    resumed = commit_on_latest(rt, existing.run_id, _resume_stopped, first=existing)
    if resumed is None:
        return False
    ckpt, step = resumed
    dispatch(
        rt,
        child.name,
        existing.run_id,
        ckpt.meta.epoch,
        step.ready,
        priority=ckpt.meta.scheduling.priority,
    )
    return True


def on_child_finished(rt: Runtime, child: Checkpoint) -> list[str]:
    """After a run ended: if it is a child, commit (or fail) the parent activation waiting
    on it and dispatch what became ready. Returns the activations dispatched.

    Idempotent and safe to call for any checkpoint: it does nothing unless ``child``
    ended a child run whose parent is running and still waits on exactly this child.
    """
    link = child.meta.links.parent
    if link is None or not child.status.finished:
        return []
    parent = rt.store.latest(link.run_id)
    if parent is None or lifecycle.waiting_on(parent, link.activation) != child.run_id:
        return []
    if child.status is not RunStatus.SUCCEEDED:
        err = ChildRunFailed(
            ended(f"child run {child.run_id}", child.status, child),
            run_id=child.run_id,
            step=child.step,
        )
        _fail_parent(rt, link.run_id, link.activation, err, child.run_id, last_of(child))
        return []
    parent_cls = _flow_class(rt, str(parent.meta.name), str(parent.flow))
    child_cls = _flow_class(rt, str(child.meta.name), str(child.flow))
    output = results.result_json(child.status, child, child_cls)
    graph, reducers = parent_cls.graph(), reducers_for(parent_cls.state_type())
    committed = commit_on_latest(
        rt,
        link.run_id,
        lambda latest: lifecycle.child_finished(
            graph, latest, link.activation, child.run_id, output, reducers, last_of(child)
        ),
        send_ready=True,
    )
    if committed is None:
        return []
    ckpt, settled = committed
    lifecycle.announce(settled)
    if ckpt.status is not RunStatus.RUNNING:
        return []
    return [act.id for act in settled.transition.ready]


def waiting_children(rt: Runtime, latest: Checkpoint) -> set[str]:
    """In-flight activations of ``latest``'s run that wait on a live child run.

    For the recovery pass: these must not be re-dispatched. A linked child that already
    ended is reported to the parent here (a lost notification) and also skipped; one that
    does not exist (a crash before it was created) is not waiting, so recovery re-runs
    the parent's method, which creates it.
    """
    found = set()
    for act_id in latest.meta.links.children:
        child_id = lifecycle.waiting_on(latest, act_id)
        if child_id is None:
            continue
        child = rt.store.latest(child_id)
        if child is None:
            continue
        if child.status.finished:
            on_child_finished(rt, child)
        found.add(act_id)
    return found


def _resume_stopped(latest: Checkpoint) -> tr.Transition | None:
    if latest.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
        return None
    return tr.resumed(latest, latest, latest.state)


def _fail_parent(
    rt: Runtime,
    parent_id: str,
    act_id: str,
    error: BaseException,
    child_id: str | None,
    spent: UsageMetrics | None = None,
) -> None:
    """Fail the parent's activation: its child ended badly (having used ``spent``), or
    could not be started."""
    committed = commit_on_latest(
        rt,
        parent_id,
        lambda latest: lifecycle.child_failed(latest, act_id, error, child_id, spent),
    )
    if committed is not None:
        lifecycle.announce(committed[1])
        log.error("run %s failed at %s: %s", parent_id, act_id, lifecycle.described(error))


def load_declared(rt: Runtime, path: str) -> Any:
    """The class of the declared flow ``path`` carries. On a worker, what its definition
    names resolves only in the worker's allow-list (:attr:`Runtime.allowed_modules`) while
    it is built; its declared task runs its steps under the same rule."""
    if rt.allowed_modules is None:
        return load_flow(path)
    with refs_allowed_in(list(rt.allowed_modules)):
        return load_flow(path)


def _flow_class(rt: Runtime, name: str, path: str) -> Any:
    """The registered flow ``name`` if it is the one at ``path``; else import ``path``
    (a producer; a worker runs only allow-listed flows)."""
    known = rt.flows.get(name)
    if known is not None and known.flow_path() == path:
        return known
    if is_declared(path):  # the path carries the definition; its code refs are checked
        return load_declared(rt, path)
    if rt.flows:
        raise FlowNotAllowed(
            f"flow {path} is not in this worker's allow-list (RUNNER_FLOW_MODULES)", flow=path
        )
    return load_flow(path)
