"""Producer side: submit runs to the workers and follow them.

``submit`` validates inputs and writes the run's first checkpoint before
anything is enqueued, so invalid inputs never reach a worker (nothing is stored)
and a submitted run is always visible in the store. A flow outside the workers'
allow-list is refused before anything is stored whenever this process knows that
list (:func:`allow_list`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from runner.embedded import dev_with_allow_list
from runner.errors import (
    CommitConflict,
    FlowImportError,
    InvalidInputs,
    RunCancelled,
    RunExists,
    RunFailed,
    RunNotFound,
    RunStateError,
    RunTimeout,
)
from runner.flow import conversation, following, results, streaming
from runner.flow.definition import is_declared
from runner.flow.definition import refs as declared_refs
from runner.flow.graph import TRIGGER_PAYLOAD
from runner.flow.loading import load_flow
from runner.flow.plans import check_fields
from runner.flow.rates import priority_problem
from runner.flow.usage import last_of
from runner.store.base import CheckpointStore
from runner.store.models import Checkpoint, RunInfo, RunStatus, UsageMetrics
from runner.store.timers import DEADLINES, STARTS

from . import routing
from .answers import deliver
from .cancel import cancel_run
from .engine import (
    FlowNotAllowed,
    Runtime,
    commit_and_send,
    ended,
    first_checkpoint,
)
from .services import services
from .turns import take_turn


def runtime() -> Runtime:
    """The process-wide producer runtime (app + store) from the settings, kept in the
    process's services."""
    own = services()
    if own.runtime is None:
        from .app import get_app

        own.runtime = Runtime.create(get_app())
    found: Runtime = own.runtime
    return found


def set_runtime(rt: Runtime | None) -> None:
    """Use ``rt`` for submits in this process (tests, embedded demo)."""
    services().runtime = rt


def check_importable(flow_cls: Any) -> None:
    """Refuse, before anything is stored, a flow the workers cannot import: one defined
    in the script that was run (``__main__``)."""
    path = flow_cls.flow_path()
    if path.startswith("__main__:"):
        name = path.partition(":")[2]
        raise FlowImportError(
            f"{name} is defined in the script you ran (__main__), which workers cannot "
            f"import: move it into a module (e.g. flows.py), name that module in "
            f"RUNNER_FLOW_MODULES, and import {name} from it",
            path=path,
        )


def allow_list(rt: Runtime) -> tuple[list[str], str] | None:
    """The modules the deployment's workers run and where that list was read, when this
    process can know it: its own ``RUNNER_FLOW_MODULES``, else the list the live
    ``runner dev`` whose Redis ``rt`` uses published in its ``dev.json``. ``None``
    otherwise (the workers still refuse what they do not run, failing the run)."""
    if rt.settings.flow_modules:
        return list(rt.settings.flow_modules), "RUNNER_FLOW_MODULES"
    dev = dev_with_allow_list(rt.store.url)
    if dev is None:
        return None
    return list(dev.flow_modules), f"`runner dev` in {dev.project}"


def check_allowed(flow_cls: Any, rt: Runtime) -> None:
    """Raise :class:`FlowNotAllowed` for a flow outside the workers' :func:`allow_list`
    (nothing if the list is unknown here); workers import whole modules, so the flow's
    module must be in it."""
    found = allow_list(rt)
    path = flow_cls.flow_path()
    if found is not None and is_declared(path):
        # A declared flow runs from its definition: its code references must be allowed.
        for where, ref in declared_refs(flow_cls.flow_definition()):
            if ref.partition(":")[0] not in found[0]:
                modules, source = found
                raise FlowNotAllowed(
                    f"{where}: {ref} is not in the workers' allow-list "
                    f"({source}: {', '.join(modules)})",
                    path=ref,
                    modules=modules,
                )
        return
    if found is not None and path.partition(":")[0] not in found[0]:
        modules, source = found
        raise FlowNotAllowed(
            f"{path} is not in the workers' allow-list ({source}: {', '.join(modules)})",
            path=path,
            modules=modules,
        )


def failure(store: CheckpointStore, latest: Checkpoint) -> Checkpoint:
    """The checkpoint that carries why ``latest``'s run stopped: ``latest`` itself, or for
    a failed run whose latest checkpoint has no error (a parallel branch committed after
    the failure), the newest one in its history that has one."""
    if latest.error is not None or latest.status is not RunStatus.FAILED:
        return latest
    for ckpt in store.history(latest.run_id, limit=50):
        if ckpt.error is not None:
            return ckpt
    return latest


def split_trigger_payload(inputs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``inputs`` without CrewAI's ``crewai_trigger_payload``, and that payload: it is not
    state; the run keeps it for the methods that take it (``InvalidInputs`` if not JSON)."""
    rest = {key: value for key, value in inputs.items() if key != TRIGGER_PAYLOAD}
    payload = inputs.get(TRIGGER_PAYLOAD)
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputs(f"{TRIGGER_PAYLOAD} is not JSON: {exc}") from None
    return rest, payload


IF_EXISTS = ("return", "reject")
"""What ``submit`` does when a run with the given id exists: hand back that run (when its
flow and inputs are the ones submitted), or refuse."""


def submit(
    flow: str | type,
    inputs: dict[str, Any] | None = None,
    *,
    id: str | None = None,
    if_exists: str = "return",
    countdown: float | None = None,
    eta: datetime | float | None = None,
    deadline: float | None = None,
    priority: int | None = None,
    rt: Runtime | None = None,
) -> RunHandle:
    """Validate ``inputs``, create the run, and enqueue its start on the workers.

    ``id`` names the run (else the state's ``id``, or a new one). A run of that id that
    exists already is handed back when it was submitted with the same flow and inputs
    (``if_exists="return"``, the default: a producer retrying a submission starts one run),
    and refused otherwise, or always with ``if_exists="reject"`` (:class:`RunExists`). The
    run is created by one create-only commit, so of many concurrent submits of one id
    exactly one creates it.

    ``countdown`` (seconds) or ``eta`` (an aware datetime or epoch seconds) delays the
    start: the run is stored at once with no step sent, and shows as scheduled until a
    worker's recovery pass sends its starts after that time (see :mod:`.recovery`); nothing
    of it waits in the broker. ``deadline`` (seconds from now, else the flow's
    ``run_deadline``) cancels the run if it has not finished by then, as ``runner cancel``
    does. ``priority`` (0 lowest to 9 highest) goes with every step of the run, also after a
    recovery, a retry or a resume; without it each step takes its method's ``priority=``,
    else 5. Workers take the steps of higher priority first.
    """
    if if_exists not in IF_EXISTS:
        raise InvalidInputs(
            f"if_exists must be one of {', '.join(IF_EXISTS)}, not {if_exists!r}",
            if_exists=if_exists,
        )
    flow_cls: Any = load_flow(flow) if isinstance(flow, str) else flow
    check_importable(flow_cls)
    inputs, payload = split_trigger_payload(dict(inputs or {}))
    if id is not None:
        if not id:
            raise InvalidInputs("the run id is empty", run_id=id)
        if "id" in inputs and str(inputs["id"]) != id:
            raise InvalidInputs(
                f"id={id!r} and the input id={inputs['id']!r} differ: give one",
                run_id=id,
            )
        inputs["id"] = id
    # A conversational flow's first turn may come with the run (CrewAI's user_message input).
    message = (
        inputs.pop(conversation.USER_MESSAGE, None)
        if conversation.is_conversational(flow_cls)
        else None
    )
    check_fields(flow_cls, inputs)
    if priority is not None and (problem := priority_problem(priority)):
        raise InvalidInputs(problem, priority=priority)
    now = time.time()
    not_before = start_time(now, countdown, eta)
    seconds = flow_cls.run_deadline if deadline is None else deadline
    if seconds is not None and not seconds > 0:
        raise InvalidInputs(f"deadline must be a positive number of seconds, not {seconds!r}")
    rt = rt or runtime()
    check_allowed(flow_cls, rt)
    first = first_checkpoint(flow_cls, inputs, message)
    routing.learn(rt.app, flow_cls)
    submitted = inputs if message is None else {**inputs, conversation.USER_MESSAGE: message}
    digest = submission_digest(flow_cls.flow_path(), submitted, payload, priority)
    first.checkpoint.meta = first.checkpoint.meta.updated(
        trigger_payload=payload,
        submitted=digest,
        not_before=not_before,
        deadline=None if seconds is None else now + seconds,
        priority=priority,
    )
    run_id = first.checkpoint.run_id
    # A store past its high-water mark takes no new run (running ones keep the memory left).
    rt.store.check_room(len(first.checkpoint.model_dump_json()))
    # Timers set before the commit, so no run lacks one; a timer left for a run another
    # submit created is checked against that run's own checkpoint.
    if seconds is not None:
        rt.store.set_timer(DEADLINES, run_id, now + seconds)
    if not_before is not None:
        rt.store.set_timer(STARTS, run_id, not_before)
    try:
        # Created only if new (seq 0), its starts sent once (see commit_and_send). They go
        # straight to their tasks (no hop through a start task): a worker that has not
        # registered the flow (an allow-list unknown here) fails the run with FlowNotAllowed.
        # A delayed run's starts are sent by recovery once due.
        commit_and_send(rt, first.checkpoint, 0, first.ready if not_before is None else [])
    except CommitConflict:
        existing = rt.coord.read(run_id)
        if (
            if_exists == "return"
            and existing is not None
            and existing.meta.scheduling.submitted == digest
        ):
            return RunHandle(run_id, rt)
        why = (
            "if_exists=reject"
            if if_exists == "reject"
            else "it was not submitted with this flow, these inputs and this priority"
        )
        raise RunExists(
            f"run {run_id} already exists ({why}); resume or fork it, or submit another id",
            run_id=run_id,
        ) from None
    return RunHandle(run_id, rt)


def start_time(now: float, countdown: float | None, eta: datetime | float | None) -> float | None:
    """When a run submitted at ``now`` may start, or ``None`` for at once (``InvalidInputs``
    for both options, a negative countdown, or a naive datetime)."""
    if countdown is not None and eta is not None:
        raise InvalidInputs("give countdown or eta, not both")
    if countdown is not None:
        if not countdown >= 0:
            raise InvalidInputs(f"countdown must be seconds >= 0, not {countdown!r}")
        return now + countdown if countdown else None
    if isinstance(eta, datetime):
        if eta.tzinfo is None:
            raise InvalidInputs(f"eta {eta.isoformat()} has no time zone (give one, e.g. UTC)")
        return eta.timestamp()
    return None if eta is None else float(eta)


def submission_digest(
    flow_path: str, inputs: dict[str, Any], payload: Any, priority: int | None = None
) -> str:
    """What identifies a submission: its flow, inputs and priority (a hash of their JSON,
    keys sorted), so a retried submit finds the run it made and a conflicting one does not."""
    identity: dict[str, Any] = {
        "flow": flow_path,
        # Without the id: the run id names the run already, whether given as id= or an input.
        "inputs": {k: v for k, v in inputs.items() if k != "id"},
        "payload": payload,
    }
    if priority is not None:  # only when given, so runs submitted without one keep their digest
        identity["priority"] = priority
    text = json.dumps(
        identity,
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _stopped(status: RunStatus) -> bool:
    """Whether a run of ``status`` is one :meth:`RunHandle.wait` stops waiting for."""
    return status.finished or status is RunStatus.PAUSED


class RunHandle:
    """A submitted run: poll its status, wait for it, read its result, cancel it."""

    def __init__(self, run_id: str, rt: Runtime | None = None) -> None:
        self.run_id = run_id
        self.rt = rt or runtime()

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    def info(self) -> RunInfo:
        """The run's metadata (``RunNotFound`` if it does not exist)."""
        info = self.rt.store.run(self.run_id)
        if info is None:
            raise RunNotFound(f"no run {self.run_id}", run_id=self.run_id)
        return info

    def status(self) -> RunStatus:
        """The run's current status."""
        return self.info().status

    def latest(self) -> Checkpoint:
        """The run's newest checkpoint."""
        ckpt = self.rt.store.latest(self.run_id)
        if ckpt is None:
            raise RunNotFound(f"no run {self.run_id}", run_id=self.run_id)
        return ckpt

    @property
    def usage_metrics(self) -> UsageMetrics:
        """The tokens the run spent since its latest start or resume, its child runs' included
        (``flow.usage_metrics`` of a run on workers; ``latest().meta.usage`` has its total
        and what a resume saved)."""
        return last_of(self.latest())

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> RunStatus:
        """Block until the run stops (succeeded, failed, cancelled or paused).

        Woken by the run's stop notice (pub/sub), and re-reads the status at least
        every ``interval`` seconds in case a notice was missed. A run that has already
        stopped answers from one read, without a subscription (a connection of its own):
        waiting on many handles in turn pays for one only while a run is still going.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        status = self.status()
        if _stopped(status):
            return status
        with self.rt.coord.watch_stopped(self.run_id) as notices:
            while True:
                status = self.status()
                if _stopped(status):
                    return status
                left = interval if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise RunTimeout(
                        f"run {self.run_id} still {status.value} after {timeout}s",
                        run_id=self.run_id,
                    )
                notices.next(min(interval, left))

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then the last method's output; raise if the run did not succeed."""
        status = self.wait(timeout)
        latest = self.latest()
        if status is RunStatus.SUCCEEDED:
            return results.run_result(latest, results.flow_class_of(latest))
        if status is RunStatus.CANCELLED:
            raise RunCancelled(f"run {self.run_id} was cancelled", run_id=self.run_id)
        stopped = failure(self.rt.store, latest)
        raise RunFailed(
            ended(f"run {self.run_id}", status, stopped),
            run_id=self.run_id,
            step=stopped.step,
        )

    def stream(
        self,
        channels: Sequence[str] | None = None,
        from_id: str | None = None,
        *,
        block: float = 0.5,
    ) -> following.RunStream:
        """The run's live stream (what its steps write with ``self.stream_chunk`` and their
        LLMs' tokens): iterate it (``for`` or ``async for``) for :class:`~runner.flow.
        streaming.StreamFrame` objects as they come, ending with a frame of how the run ended;
        then ``.result`` is :meth:`result`. ``channels``: only those (e.g. ``["tokens"]``);
        ``from_id``: resume after the frame id last seen (each entry comes once).
        :class:`~runner.errors.RunNotFound` for an unknown run."""
        frames = following.follow(self.rt.store, self.run_id, channels, from_id, block=block)

        def result(end: streaming.StreamFrame) -> Any:
            return None if end.data.get("status") == RunStatus.PAUSED.value else self.result()

        return following.RunStream(frames, result)

    def resume(
        self,
        feedback: str = "",
        *,
        outcome: str | None = None,
        by: str | None = None,
        step: str | None = None,
    ) -> RunHandle:
        """Give the run the answer it awaits and let it go on: ``feedback`` for the output
        a ``@human_feedback`` step has under review (``outcome``: one of its ``emit`` labels,
        chosen directly) or for a question ``ask`` put; ``by``: who answers. The step that
        waited is sent again; a run that awaits no answer is
        :class:`~runner.errors.RunStateError` (resume a failed or cancelled run with
        ``runner resume RUN``). ``step``: the step whose question was read (refused if the run
        now awaits another)."""
        deliver(self.rt, self.run_id, feedback, by=by, outcome=outcome, step=step)
        return self

    def turn(self, message: str, timeout: float | None = None) -> Any:
        """Give this conversational run the user's ``message`` as its next turn and wait
        for the turn's result (as :meth:`result` does: the reply the turn's handler gave,
        a failed turn raised). Each turn is a new epoch of this run, started from its
        latest checkpoint, so the history is the run's whichever worker takes the turn. A
        run still running its turn, or awaiting an answer, is
        :class:`~runner.errors.RunStateError`; a flow that is not conversational, or an
        empty message, :class:`~runner.errors.InvalidInputs`."""
        take_turn(self.rt, self.run_id, message)
        return self.result(timeout)

    def stream_turn(
        self, message: str, channels: Sequence[str] | None = None, *, block: float = 0.5
    ) -> following.RunStream:
        """:meth:`turn` as a live stream: the frames this turn's steps write (its LLM's
        tokens, ``stream_chunk``), from where the run's stream stood before it, ending with
        a frame of how the turn ended; then ``.result`` is the turn's result."""
        before = self.rt.store.stream_info(self.run_id).last_id
        take_turn(self.rt, self.run_id, message)
        return self.stream(channels, before, block=block)

    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far (the run's ``state.messages``, as CrewAI's
        ``LLMMessage`` dicts)."""
        stored = self.latest().state.get("messages") or []
        return [conversation.as_llm_message(m) for m in stored]

    def cancel(self, reason: str | None = None) -> Checkpoint:
        """Cancel the run and the child runs it waits on: no step is sent after it, the
        steps running are told to stop and commit nothing (:mod:`.cancel`); a resume runs
        them again. ``reason`` is kept as the run's ``cancel_reason`` (who cancelled it)."""
        ckpt = cancel_run(self.rt, self.run_id, reason)
        if ckpt is None:
            raise RunStateError(
                f"run {self.run_id} is already {self.status().value}", run_id=self.run_id
            )
        return ckpt
