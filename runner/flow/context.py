"""Where the step running now runs, and what it was given: one :class:`StepContext`.

The step runner (:func:`runner.flow.attempt.run_step`, called by the in-process executor
and by the worker's step task) builds one context per attempt and sets it for the
method's call. Every feature that behaves differently on the two executors reads it,
and only it:

* ``Flow.sleep`` is durable on a worker (the step commits and stops, see :class:`Sleeps`)
  and a plain sleep in process;
* ``Flow.ask`` and ``@human_feedback`` with no provider pause the run durably on a worker
  and ask on the terminal in process;
* ``Flow.run_crew`` starts a child run on a worker (a :class:`~runner.flow.children.ChildRun`
  marker) and runs the crew inline in process;
* the step's recorded answers (:class:`Answers`) and, on a worker, its recorded sleeps.

Outside a step there is no context: the flow is used as a plain object, as in process.

Options only workers honour (``time_limit``, ``rate_limit``, ...) are named once per flow
class when ``kickoff`` runs it here (:func:`warn_unhonoured`).
"""

from __future__ import annotations

import contextvars
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from runner.errors import IgnoredOptionWarning
from runner.flow.graph import FlowGraph, MethodSpec
from runner.flow.orchestrator import Activation

Executor = Literal["process", "worker"]
"""Where a step runs: ``kickoff``'s process, or a Celery worker."""

PROCESS: Executor = "process"
WORKER: Executor = "worker"


@dataclass
class Sleeps:
    """The durable sleeps of a step: the wake-up times recorded by its earlier attempts
    (``RunMeta.replay.sleeps`` of its activation), and how many sleep calls this attempt made."""

    recorded: list[float] = field(default_factory=list)
    calls: int = 0


@dataclass
class Answers:
    """The answers people gave to the step running now (``RunMeta.human.answers`` of its
    activation, in order), and how many of them this attempt consumed so far: its N-th
    ``ask`` takes the N-th answer; ``@human_feedback`` takes the one to its review."""

    recorded: list[Any] = field(default_factory=list)
    """:class:`runner.store.models.Answer` records."""
    calls: int = 0
    review: Any = None
    """The :class:`runner.store.models.Awaiting` of the review the step's output went to
    before (``RunMeta.human.reviews``), if it paused for one."""
    reviewed: Any = None
    """The ``HumanFeedbackResult`` this attempt's review came to (set by ``@human_feedback``)."""


@dataclass
class Patches:
    """The step's patch decisions (:mod:`runner.flow.patches`): those an earlier attempt of
    it recorded (``RunMeta.replay.patches`` of its activation) and those this attempt made."""

    recorded: dict[str, bool] = field(default_factory=dict)
    decided: dict[str, bool] = field(default_factory=dict)


@dataclass
class StepContext:
    """One attempt of one step: which flow object and activation, where it runs, which
    attempt it is, and what earlier attempts and people left it."""

    flow: Any
    """The flow object whose method runs."""
    activation: Activation
    executor: Executor = PROCESS
    attempt: int = 1
    """1 for the first attempt, 2 for the first retry, ..."""
    answers: Answers = field(default_factory=Answers)
    sleeps: Sleeps = field(default_factory=Sleeps)
    state: Any = None
    """The step's own state object (``Flow.state`` inside the method), once made."""
    patches: Patches = field(default_factory=Patches)
    version: str | None = None
    """The code version that wrote the checkpoint the step starts from (its state is read
    through a ``@state_upgrade`` of that version, if this code has one)."""
    outputs: dict[str, Any] | None = None
    """The outputs of the run's steps committed before this one, by method (what a declared
    flow's ``${outputs.step}`` reads); set by the step runner."""
    stream_to: Any = None
    """Where the step's stream chunks go (a :class:`runner.flow.streaming.StreamTarget`, set
    by the executor); ``None``: nowhere (``stream_chunk`` does nothing)."""
    stream: Any = None
    """The attempt's stream writer (:class:`runner.flow.streaming.StepStream`), made at its
    first chunk and closed by the step runner before the attempt settles."""

    @property
    def on_worker(self) -> bool:
        """Whether the step runs on a Celery worker: waits (sleep, a person's answer, a
        child run) are then durable, committed and left, never held in a worker."""
        return self.executor == WORKER

    def runs(self, flow: Any, method: str | None = None) -> bool:
        """Whether this is a step of ``flow`` (the same object), of ``method`` if given."""
        return self.flow is flow and (method is None or self.activation.method == method)


current_step: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "runner_step", default=None
)
"""The context of the step running in this thread or task (``None`` outside a step)."""


def step_context() -> StepContext | None:
    """The context of the step running here, or ``None`` outside a step."""
    return current_step.get()


def on_worker() -> bool:
    """Whether the code calling this runs inside a step on a Celery worker."""
    ctx = current_step.get()
    return ctx is not None and ctx.on_worker


@contextmanager
def running(ctx: StepContext) -> Iterator[StepContext]:
    """Make ``ctx`` the running step's context for the block (the step runner's part)."""
    token = current_step.set(ctx)
    try:
        yield ctx
    finally:
        current_step.reset(token)


WORKER_ONLY: tuple[tuple[str, str], ...] = (
    ("time_limit", "time_limit"),
    ("rate", "rate_limit"),
    ("concurrency", "concurrency"),
    ("limits", "limits"),
    ("queue", "queue"),
    ("priority", "priority"),
)
"""(:class:`MethodSpec` field, option name) of the step options only workers honour."""

_warned: set[tuple[type, str]] = set()
_warned_lock = threading.Lock()


def unhonoured(graph: FlowGraph) -> dict[str, list[str]]:
    """The worker-only options ``graph``'s methods set (option -> methods, in order)."""
    found: dict[str, list[str]] = {}
    for name, spec in graph.methods.items():
        for attr, option in WORKER_ONLY:
            if _set(spec, attr):
                found.setdefault(option, []).append(name)
    return found


def _set(spec: MethodSpec, attr: str) -> bool:
    value = getattr(spec, attr)
    return bool(value) if isinstance(value, tuple) else value is not None


def warn_unhonoured(flow_cls: type, graph: FlowGraph, stacklevel: int = 3) -> None:
    """Warn (:class:`IgnoredOptionWarning`), once per flow class and option, of each
    worker-only option a run of ``flow_cls`` in this process will not honour."""
    for option, methods in unhonoured(graph).items():
        with _warned_lock:
            if (flow_cls, option) in _warned:
                continue
            _warned.add((flow_cls, option))
        warnings.warn(
            f"{flow_cls.__name__}.kickoff() runs in this process, which ignores "
            f"{option}= (set on {', '.join(methods)}): it holds on Celery workers "
            f"({flow_cls.__name__}.submit())",
            IgnoredOptionWarning,
            stacklevel=stacklevel,
        )
