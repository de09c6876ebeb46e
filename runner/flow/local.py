"""The in-process executor behind ``Flow.kickoff``.

Ready methods run on a thread pool (parallel listeners run concurrently); each
finished method is turned into the next checkpoint on this thread, in completion
order, and handed to the flow's sink, which writes it if persistence asks for it.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.checkpointing import CheckpointConfig, Sink, StoreSink
from runner.errors import CheckpointNotFound, GraphChanged, RunNotFound
from runner.flow import events as ev
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.flow.graph import FlowGraph
from runner.flow.orchestrator import Activation
from runner.flow.state import reducers_for
from runner.flow.steps import StepResult, run_step
from runner.settings import get_settings
from runner.store.base import CheckpointStore
from runner.store.models import Checkpoint, Lineage, RunStatus, StepError

log = logging.getLogger("runner.local")


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
        if isinstance(restore, CheckpointConfig) and not isinstance(sink, StoreSink):
            sink = StoreSink(restore.store(), restore.events("flow"), restore.max_checkpoints)
        ckpt = load_restore_point(sink, restore)
        return resume(flow, graph, sink, ckpt, inputs)
    lineage = None
    base = flow._dump()
    if restore_from_state_id is not None:
        source = sink.load_state(restore_from_state_id)
        if source is None and strict:
            raise RunNotFound(
                f"no saved state for {restore_from_state_id}", run_id=restore_from_state_id
            )
        if source is not None:
            base = {**source, "id": inputs.pop("id", None) or str(uuid.uuid4())}
            parent = sink.latest(restore_from_state_id)
            lineage = Lineage(
                parent_run_id=restore_from_state_id,
                parent_checkpoint_id=parent.id if parent else "",
            )
    elif "id" in inputs:
        base = sink.load_state(str(inputs["id"])) or base
    flow._state = flow._apply_inputs(base, inputs)
    state = flow._dump()
    previous = sink.latest(flow.flow_id) if lineage is None else None
    if previous is not None:
        first = tr.restart(graph, previous, state)
    else:
        first = tr.start(
            graph, flow.flow_id, state, flow=flow.flow_path(), name=flow.flow_name()
        )
        first.checkpoint.lineage = lineage
    return LocalRun(flow, graph, sink).run(first)


def resume(
    flow: Any, graph: FlowGraph, sink: Sink, ckpt: Checkpoint, inputs: dict[str, Any]
) -> Any:
    """Continue the run of ``ckpt``: only methods not completed there run."""
    check_graph(graph, ckpt)
    flow._state = flow._apply_inputs(ckpt.state, inputs)
    record = tr.record_of(ckpt)
    if not orch.pending(record):
        return orch.last_output(record)
    latest = sink.latest(ckpt.run_id) or ckpt
    return LocalRun(flow, graph, sink).run(tr.resumed(latest, ckpt, flow._dump()))


def check_graph(graph: FlowGraph, ckpt: Checkpoint) -> None:
    """Refuse a checkpoint whose completed or pending methods no longer exist."""
    if ckpt.fingerprint == graph.fingerprint:
        return
    used = {act.split("#", 1)[0] for act in [*ckpt.completed, *ckpt.in_flight]}
    missing = sorted(used - set(graph.methods))
    if missing:
        raise GraphChanged(
            f"the flow changed since checkpoint {ckpt.id}: "
            f"method(s) {', '.join(missing)} no longer exist",
            checkpoint_id=ckpt.id,
            missing=missing,
        )


def load_restore_point(sink: Sink, restore: CheckpointConfig | str) -> Checkpoint:
    """The checkpoint named by a config's ``restore_from``, an id, a run id or a file."""
    ref = restore.restore_from if isinstance(restore, CheckpointConfig) else restore
    store = sink.store if sink.store is not None else _default_store()
    if ref is None:
        runs = store.runs(limit=1)
        latest = store.latest(runs[0].run_id) if runs else None
        if latest is None:
            raise CheckpointNotFound("no checkpoint to restore from", checkpoint_id=None)
        return latest
    path = Path(str(ref))
    if path.suffix == ".json" and path.is_file():
        return Checkpoint.model_validate_json(path.read_bytes())
    try:
        return store.get(str(ref))
    except CheckpointNotFound:
        latest = store.latest(str(ref))
        if latest is None:
            raise
        return latest


def _default_store() -> CheckpointStore:
    from runner.store.redis import RedisProvider

    return RedisProvider()


@dataclass(frozen=True)
class Paused:
    """What ``kickoff`` returns when a method paused the run for a human."""

    run_id: str
    step: str
    reason: str


class LocalRun:
    """One in-process execution: dispatch ready methods, commit results in order."""

    def __init__(self, flow: Any, graph: FlowGraph, sink: Sink) -> None:
        self.flow = flow
        self.graph = graph
        self.sink = sink
        self.reducers = reducers_for(type(flow).state_type())
        self.settings = get_settings()
        self.latest: Checkpoint | None = None
        self.failure: StepResult | None = None
        self.paused: Paused | None = None

    def run(self, first: tr.Transition) -> Any:
        """Drive the run to its end; raise the first failing method's exception."""
        self.latest = self.sink.write(first.checkpoint)
        began = time.perf_counter()
        self._emit(ev.FLOW_STARTED)
        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="flow") as pool:
            running: dict[Future[StepResult], Activation] = {}
            self._dispatch(pool, running, first.ready)
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    running.pop(future)
                    self._dispatch(pool, running, self._commit(future.result()))
        elapsed = time.perf_counter() - began
        if self.paused is not None:
            self._emit(ev.FLOW_PAUSED, method=self.paused.step, data={"reason": self.paused.reason})
            return self.paused
        if self.failure is not None:
            assert self.failure.error is not None
            self._emit(ev.FLOW_FAILED, duration=elapsed, error=_describe(self.failure.error))
            raise self.failure.error
        assert self.latest is not None
        self.sink.write(tr.status_change(self.latest, ev.FLOW_FINISHED, RunStatus.SUCCEEDED))
        self._emit(ev.FLOW_FINISHED, duration=elapsed)
        return orch.last_output(tr.record_of(self.latest))

    def _dispatch(
        self,
        pool: ThreadPoolExecutor,
        running: dict[Future[StepResult], Activation],
        ready: list[Activation],
    ) -> None:
        if self.failure is not None or self.paused is not None:
            return
        assert self.latest is not None
        record = tr.record_of(self.latest)
        for act in ready:
            arg = orch.argument_for(self.graph, record, act)
            running[pool.submit(self._attempt, act, dict(self.latest.state), arg)] = act

    def _attempt(self, act: Activation, base: dict[str, Any], arg: Any) -> StepResult:
        spec = self.graph.methods[act.method]
        retries = spec.retries if spec.retries is not None else self.settings.step_retries
        backoff = spec.retry_backoff if spec.retry_backoff is not None else 0.0
        for attempt in range(1, retries + 2):
            self._emit(ev.METHOD_STARTED, method=act.method, data={"attempt": attempt})
            result = run_step(self.flow, self.graph, act, base, arg)
            result.attempts = attempt
            if result.error is None or attempt > retries:
                return result
            time.sleep(min(backoff * 2 ** (attempt - 1), 60.0) * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    def _commit(self, result: StepResult) -> list[Activation]:
        assert self.latest is not None
        act = result.activation
        if result.paused is not None:
            self.paused = self.paused or Paused(self.flow.flow_id, act.method, result.paused)
            pause = tr.step_paused(self.latest, act, result.paused)
            self.latest = self.sink.write(pause.checkpoint)
            return []
        if result.error is not None:
            self.failure = self.failure or result
            error = StepError.from_exception(result.error, result.attempts)
            failed = tr.step_failed(self.latest, act, error, status=RunStatus.FAILED)
            self.latest = self.sink.write(failed.checkpoint)
            self._emit(
                ev.METHOD_FAILED,
                method=act.method,
                duration=result.duration,
                error=_describe(result.error),
            )
            return []
        assert result.new_state is not None
        step = tr.step_done(
            self.graph,
            self.latest,
            act,
            base_state=result.base_state,
            new_state=result.new_state,
            output=result.output,
            label=result.label,
            reducers=self.reducers,
            attempt=None,
        )
        self.latest = self.sink.write(step.checkpoint)
        self.flow._set_state(self.latest.state)
        for field in step.conflicts:
            self._emit(ev.STATE_CONFLICT, method=act.method, data={"field": field})
            log.warning("state field %r written by parallel steps; last commit wins", field)
        self._emit(ev.METHOD_FINISHED, method=act.method, duration=result.duration)
        return step.ready

    def _emit(self, kind: str, **fields: Any) -> None:
        ev.emit(
            ev.FlowEvent(type=kind, run_id=self.flow.flow_id, flow=self.flow.flow_name(), **fields),
            self.flow._listeners,
        )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
