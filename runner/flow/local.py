"""The in-process executor behind ``Flow.kickoff``.

Ready methods run on a thread pool (parallel listeners run concurrently; a lone sync
method runs on the calling thread); each finished method is turned into the next
checkpoint on the calling thread, in completion order, and handed to the flow's sink,
which writes it if persistence asks for it before any method it made ready starts, with
compare-and-set on the run's sequence as workers commit. Whether a checkpoint may be
resumed here is :func:`runner.flow.plans.plan_resume`'s decision, as everywhere; what the
run returns, :func:`runner.flow.results.run_result`'s.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any

from runner.checkpointing import (
    CheckpointConfig,
    Sink,
    WatchedSink,
    load_restore_point,
    restore_sink,
)
from runner.errors import CommitConflict, RunNotFound, RunStateError
from runner.flow import conversation, lifecycle, plans, results, streaming, usage, versions
from runner.flow import events as ev
from runner.flow import human_feedback as reviewing
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.attempt import Asked, Halted, StepResult, run_step
from runner.flow.context import PROCESS, Answers, Patches, StepContext
from runner.flow.flow import apply_inputs, set_usage_metrics
from runner.flow.graph import FlowGraph
from runner.flow.lifecycle import Outcome
from runner.flow.orchestrator import Activation, ExecutionRecord
from runner.flow.state import reducers_for
from runner.settings import get_settings
from runner.store.base import CoordinatedStore
from runner.store.models import FLOW_RESUMED, Answer, Checkpoint, Lineage, RunStatus

# Who resumes what is decided once, for every executor (the in-process run's checks
# were a copy of the workers' that disagreed).
check_graph = plans.check_graph


def kickoff(
    flow: Any,
    inputs: dict[str, Any],
    restore: CheckpointConfig | str | None,
    restore_from_state_id: str | None,
    strict: bool,
) -> Any:
    """Run ``flow`` here: fresh, resumed by id, forked from a state, or from a checkpoint."""
    graph = flow.graph()
    sink = flow._sink()
    if restore is not None:
        sink = restore_sink(sink, restore)
        ckpt = load_restore_point(sink, restore)
        return resume(flow, graph, WatchedSink(sink, flow._record_output), ckpt, inputs)
    lineage = None
    base = flow._dump()
    # Whether a run with this id may exist: not for an id made up by this flow object.
    known_id = "id" in inputs or not flow._fresh_id
    flow._fresh_id = False
    if restore_from_state_id is not None:
        source = sink.load_state(restore_from_state_id)
        if source is None and strict:
            raise RunNotFound(
                f"no saved state for {restore_from_state_id}", run_id=restore_from_state_id
            )
        if source is not None:
            known_id = "id" in inputs
            base = {**source, "id": inputs.pop("id", None) or str(uuid.uuid4())}
            parent = sink.latest(restore_from_state_id)
            lineage = Lineage(
                parent_run_id=restore_from_state_id,
                parent_checkpoint_id=parent.id if parent else "",
            )
    elif "id" in inputs:
        base = sink.load_state(str(inputs["id"])) or base
    state = apply_inputs(flow, inputs, base)
    previous = sink.latest(flow.flow_id) if known_id else None
    if flow._turn is not None:
        state = apply_inputs(flow, {}, opened_turn(flow, state, previous))
    if previous is not None:
        first = tr.restart(graph, previous, state)
    else:
        first = tr.start(graph, flow.flow_id, state, flow=flow.flow_path(), name=flow.flow_name())
        first.checkpoint.lineage = lineage
    if sink.store is not None:
        sink.follow(flow.flow_id, previous.seq if previous is not None else 0)
    return LocalRun(flow, graph, WatchedSink(sink, flow._record_output)).run(first)


def opened_turn(flow: Any, state: dict[str, Any], previous: Checkpoint | None) -> dict[str, Any]:
    """``state`` with the turn ``flow`` runs (``handle_turn``) opened on it: its message
    appended, after the previous turn's result when that turn's handler said nothing."""
    prior = None
    if previous is not None and previous.status is RunStatus.SUCCEEDED:
        prior = results.run_result(previous, type(flow))
    return conversation.open_turn(type(flow), state, flow._turn.message, prior)


def resume(
    flow: Any, graph: FlowGraph, sink: Sink, ckpt: Checkpoint, inputs: dict[str, Any]
) -> Any:
    """Continue the run of ``ckpt`` as :func:`~runner.flow.plans.plan_resume` decides:
    only methods not completed there run."""
    store = sink.store
    info = store.run(ckpt.run_id) if store is not None else None
    latest = sink.latest(ckpt.run_id)
    here = plans.Here(workers_share_store=isinstance(store, CoordinatedStore))
    plan = plans.plan_resume(
        flow, ckpt, inputs, info=info, latest=latest, here=here, done_is_result=True
    )
    if plan.done:
        return plan.result
    if latest is not None:
        sink.follow(ckpt.run_id, latest.seq)
    return LocalRun(flow, graph, sink).run(plan.opening(latest))


def answer(flow: Any, paused: Checkpoint, given: Answer) -> Any:
    """Go on here with the run ``paused`` for a review, ``given`` its answer (``Flow.resume``):
    the step that waited runs again and finds the answer, in a new epoch."""
    graph = flow.graph()
    plan = plans.plan_answer(
        graph, paused, given.text, by=given.by, outcome=given.outcome, flow_cls=type(flow)
    )
    sink = WatchedSink(flow._sink(), flow._record_output)
    latest = sink.latest(paused.run_id)
    if latest is not None:
        sink.follow(paused.run_id, latest.seq)
    return LocalRun(flow, graph, sink).run(plan.opening(latest))


@dataclass(frozen=True)
class Paused:
    """What ``kickoff`` returns when a method paused the run for a human."""

    run_id: str
    step: str
    reason: str


class LocalRun:
    """One in-process execution: dispatch ready methods, commit results in order.

    Methods run on a thread pool, so parallel listeners run concurrently; a sync method
    that is the only one to run (a chain) runs on this thread, which saves two thread
    switches per step. This thread turns each result into the next checkpoint, in
    completion order, keeping the latest checkpoint and its record in memory.
    """

    def __init__(self, flow: Any, graph: FlowGraph, sink: Sink) -> None:
        self.flow = flow
        self.graph = graph
        self.sink = sink
        self.run_id: str = flow.flow_id
        self.reducers = reducers_for(type(flow).state_type())
        self.settings = get_settings()
        self.latest: Checkpoint | None = None
        self.record: ExecutionRecord | None = None
        self.failure: lifecycle.Settled | None = None
        self.paused: Paused | None = None
        self.loop_here = _event_loop_running()
        self.stream_to = streaming.target(sink.store, self.run_id, flow=flow)
        """Where this run's steps stream (:func:`runner.flow.streaming.target`)."""
        self.here = plans.this_process()
        """What this run's checkpoints record as their ``worker`` (how a resume elsewhere
        tells that this process drives the run: :class:`~runner.flow.plans.Here`)."""

    def run(self, first: tr.Transition) -> Any:
        """Drive the run to its end; raise the first failing method's exception."""
        self._advance(first)
        self._emit(ev.FLOW_STARTED)
        done: SimpleQueue[Future[StepResult]] = SimpleQueue()
        try:
            with ThreadPoolExecutor(max_workers=16, thread_name_prefix="flow") as pool:
                ready, running = first.ready, 0
                while ready or running:
                    if self.failure is not None or self.paused is not None:
                        ready = []
                    if len(ready) == 1 and not running and self._inline(ready[0]):
                        ready = self._settle(self._attempt(*self._call(ready[0])))
                        continue
                    for act in ready:
                        pool.submit(self._attempt, *self._call(act)).add_done_callback(done.put)
                    running += len(ready)
                    ready = []
                    if running:
                        ready = self._settle(done.get().result())
                        running -= 1
        finally:
            if self.latest is not None:
                self.flow._set_state(self.latest.state)
            # A run inside a step (a crew run in process) spent its tokens for that step.
            usage.record(usage.last_of(self.latest))
        if self.failure is not None:
            assert self.failure.error is not None
            raise self.failure.error
        if self.paused is not None:
            assert self.latest is not None
            return reviewing.keep_pending(self.flow, self.sink.store, self.latest) or self.paused
        assert self.latest is not None
        return results.run_result(self.latest, type(self.flow))

    def _advance(self, step: tr.Transition) -> None:
        """Write ``step``'s checkpoint, and the run's closing one if it ends the run (each if
        the sink keeps it); the last becomes the latest. The sink commits with compare-and-set
        on the run's sequence, as workers do: another process that resumed, answered or
        cancelled the run meanwhile stops this one (:class:`RunStateError`)."""
        for ckpt in (step.checkpoint, step.closing):
            if ckpt is not None and ckpt.worker is None:
                ckpt.worker = self.here  # an epoch's opening too: this process drives it
        try:
            self.latest = self.sink.write(step.checkpoint)
            if step.closing is not None:
                self.latest = self.sink.write(step.closing)
        except CommitConflict:
            if self.latest is None and step.checkpoint.event == FLOW_RESUMED:
                # The resume itself: the run moved on since this process read it.
                raise plans.changed_while_resuming(self.run_id, None) from None
            raise RunStateError(
                f"run {self.run_id} changed elsewhere while it ran here (another process "
                "started, resumed, answered or cancelled it); this process stopped it",
                run_id=self.run_id,
            ) from None
        self.record = step.record if step.record is not None else tr.record_of(step.checkpoint)
        set_usage_metrics(self.flow, usage.last_of(self.latest))

    def _inline(self, act: Activation) -> bool:
        """Whether ``act`` may run on this thread: a sync method, and no event loop here
        (a method may start one of its own, as async methods do)."""
        return not self.loop_here and not self.graph.methods[act.method].is_async

    def _call(self, act: Activation) -> tuple[Activation, Checkpoint, Any, dict[str, Any]]:
        """The arguments of :meth:`_attempt` for ``act``: the checkpoint it starts from (its
        base state, the answers people gave it, the review its output went to, its patch
        decisions, the version that wrote it), its argument and the run's outputs so far."""
        assert self.latest is not None and self.record is not None
        arg = orch.argument_for(self.graph, self.record, act)
        return act, self.latest, arg, dict(self.record.outputs)

    def _attempt(
        self,
        act: Activation,
        base: Checkpoint,
        arg: Any,
        outputs: dict[str, Any] | None = None,
    ) -> StepResult:
        """Run ``act`` until it does not ask for a retry (on a pool thread)."""
        spec = self.graph.methods[act.method]
        meta = base.meta
        attempt, spent = 1, None
        while True:
            self._emit(ev.METHOD_STARTED, method=act.method, data={"attempt": attempt})
            ctx = StepContext(
                self.flow,
                act,
                PROCESS,
                attempt,
                Answers(
                    list(meta.human.answers.get(act.id) or ()),
                    review=meta.human.reviews.get(act.id),
                ),
                patches=Patches(dict(meta.replay.patches.get(act.id, {}))),
                version=base.version,
                stream_to=self.stream_to,
                outputs=outputs,
            )
            result = run_step(self.flow, self.graph, ctx, base.state, arg)
            # What retried attempts spent counts too: the step's usage is all its attempts'.
            result.usage = spent = usage.joined(spent, result.usage)
            if lifecycle.decide(result, spec, self.settings) is not Outcome.RETRY:
                return result
            time.sleep(lifecycle.retry_delay(spec, self.settings, attempt, random.random()))
            attempt += 1

    def _settle(self, result: StepResult) -> list[Activation]:
        """Turn a finished attempt into the next checkpoint; the activations it made ready."""
        assert self.latest is not None
        act = result.activation
        spec = self.graph.methods[act.method]
        settled = lifecycle.settle(
            self.graph,
            self.latest,
            result,
            lifecycle.decide(result, spec, self.settings),
            epoch=self.latest.meta.epoch,
            reducers=self.reducers,
            worker=self.here,
            record=self.record,
            version=versions.of(self.graph, self.settings),
        )
        assert settled is not None  # this thread is the run's only committer
        self._advance(settled.transition)
        lifecycle.announce(settled, self.flow._listeners, duration=result.duration)
        if settled.outcome is Outcome.PAUSED and isinstance(result.end, Asked | Halted):
            self.paused = self.paused or Paused(self.run_id, act.method, result.end.reason)
            return []
        if settled.outcome is Outcome.FAILED:
            self.failure = self.failure or settled
            return []
        return settled.transition.ready

    def _emit(self, kind: str, **fields: Any) -> None:
        ev.tell(kind, self.run_id, self.flow.flow_name(), self.flow._listeners, **fields)


def _event_loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
