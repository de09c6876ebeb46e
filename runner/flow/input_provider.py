"""``Flow.ask``: a question to a person from inside a step, CrewAI's way and durable.

In process (``kickoff``) the question goes to an **input provider**, found in this order:
the flow's ``input_provider`` (a class or instance attribute), ``flow_config.input_provider``
(process-wide), else :class:`ConsoleProvider` (the terminal). A provider is any object with
``request_input(message, flow, metadata=None)`` returning the answer (``str``), an
:class:`InputResponse` (the answer and what the provider knows about it) or ``None`` (no
answer). ``ask`` blocks until it answers or ``timeout`` seconds passed; a timeout, a provider
error (a terminal that is not there: ``EOFError``) or ``None`` make ``ask`` return ``None``,
as in CrewAI. Before it waits, the state so far is saved to the flow's own ``FlowPersistence``
(CrewAI's ``_ask_checkpoint``).

On workers nobody is at the terminal and no worker may wait for a person: an ``ask`` of a flow
with no provider of its own (neither attribute nor ``flow_config``) pauses the run with the
state so far (``AwaitInput``; the run's ``awaiting`` holds the question, its metadata and the
deadline ``asked_at + timeout``). An answer (``runner resume RUN --feedback TEXT``,
``RunHandle.resume(feedback=)``, the console, or ``None`` from the recovery pass once the
deadline passed) is recorded in the run and the step runs again **from the start of the
method**, as after a durable sleep: its N-th ``ask`` returns the N-th answer recorded for it
(in both executors), and the first ``ask`` past them asks again. So the code before an
``ask`` runs again after it: keep it idempotent, or ask first. A provider the flow names is
asked on workers too (it is the user's choice; it holds the worker while it waits).

Every ``ask`` tells ``flow_input_requested`` when it asks someone and ``flow_input_received``
with the answer it returns (once per answer recorded on workers), and appends to the flow
object's ``_input_history``, as CrewAI does.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from pydantic_core import to_jsonable_python

from runner.checkpointing import PersistSink
from runner.errors import AwaitInput, NotSerializable
from runner.flow import events as ev
from runner.flow.context import step_context
from runner.store.models import Answer, Awaiting

log = logging.getLogger("runner.flow")

ASK = "ask"
"""``Awaiting.kind`` of a run paused by ``ask``."""


@dataclass
class InputResponse:
    """What a provider may return instead of a plain string: the answer (``None``: none)
    and what it knows about it (who answered, a thread id, ...), kept in the flow's
    ``_input_history`` and told in ``flow_input_received``; ``ask`` returns ``text``."""

    text: str | None
    metadata: dict[str, Any] | None = field(default=None)


@runtime_checkable
class InputProvider(Protocol):
    """Where ``Flow.ask`` sends its question in process (a web socket, Slack, a test's
    scripted answers): ``request_input`` blocks until the answer, ``None`` if there is none.
    ``metadata`` is the ``ask``'s own (who to ask, a channel); a provider that takes only
    ``(message, flow)`` is called that way when ``ask`` was given no metadata."""

    def request_input(
        self, message: str, flow: Any, metadata: dict[str, Any] | None = None
    ) -> str | InputResponse | None:
        """The answer to ``message``."""
        ...


class ConsoleProvider:
    """The default provider: the question on the terminal, the answer read from it
    (stripped; Enter alone gives ``""``). ``verbose`` prints the question on its own line
    and prompts ``>>> ``; otherwise the question is the prompt."""

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose

    def request_input(self, message: str, flow: Any, metadata: dict[str, Any] | None = None) -> str:
        """Ask on the terminal; ``metadata`` is not used (a terminal has one person)."""
        if self.verbose:
            print(f"\n{message}\n", flush=True)
            answer = input(">>> ")
        else:
            answer = input(f"{message} ")
        return answer.strip()

    def request_feedback(self, context: Any, flow: Any) -> str:
        """``@human_feedback``'s review on the terminal: the output under review (when
        ``verbose``), the message, then the feedback read (stripped; Enter alone: none)."""
        if self.verbose:
            rule = "=" * 50
            print(f"\n{rule}\n  OUTPUT FOR REVIEW\n{rule}\n\n{context.method_output}\n", flush=True)
        print(f"{context.message}\n(Press Enter to skip, or type your feedback)\n", flush=True)
        return input("Your feedback: ").strip()


class FlowConfig:
    """Process-wide flow settings a deployment sets at start-up (CrewAI's ``flow_config``)."""

    def __init__(self) -> None:
        self.input_provider: InputProvider | None = None
        """Where ``ask`` goes for flows with no ``input_provider`` of their own; ``None``:
        :class:`ConsoleProvider` in process, a durable pause on workers."""
        self.hitl_provider: Any = None
        """``@human_feedback``'s provider for methods that name none; ``None``: the
        console in process, a durable pause on workers."""


flow_config = FlowConfig()
"""The process's :class:`FlowConfig`."""


def resolve_provider(flow: Any) -> InputProvider | None:
    """The provider the flow names (its ``input_provider``, else ``flow_config``'s), or
    ``None`` when it names none."""
    own = getattr(flow, "input_provider", None)
    return own if own is not None else flow_config.input_provider


def ask(
    flow: Any,
    message: str,
    timeout: float | None = None,
    metadata: dict[str, Any] | None = None,
) -> str | None:
    """``Flow.ask`` (see the module docstring)."""
    if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
        raise ValueError(f"ask takes timeout=None or seconds >= 0, not {timeout!r}")
    ctx = step_context()
    method = ctx.activation.method if ctx is not None else "unknown"
    tell = _teller(flow, method, message, metadata)
    recorded = _next_answer()
    if recorded is not None:
        answer, latest = recorded
        by = {"by": answer.by} if answer.by is not None else None
        return _received(flow, tell, method, message, metadata, answer.text, by, latest)
    tell(ev.INPUT_REQUESTED)
    on_worker = ctx is not None and ctx.on_worker
    if on_worker and resolve_provider(flow) is None:
        deadline = None if timeout is None else time.time() + timeout
        raise AwaitInput(
            Awaiting(kind=ASK, message=message, metadata=_json(metadata, method), deadline=deadline)
        )
    if not on_worker:
        _save_state_so_far(flow)
    raw = _request(flow._resolve_input_provider(), flow, message, timeout, metadata)
    if isinstance(raw, InputResponse):
        text, about = raw.text, raw.metadata
    else:
        text, about = (raw if isinstance(raw, str) else None), None
    return _received(flow, tell, method, message, metadata, text, about, True)


def _json(metadata: dict[str, Any] | None, method: str) -> dict[str, Any]:
    """``metadata`` as the JSON the run keeps while it waits, or :class:`NotSerializable`."""
    try:
        kept: dict[str, Any] = to_jsonable_python(metadata or {})
    except Exception as exc:
        raise NotSerializable(
            f"the metadata of {method}'s ask is not JSON-serializable: {exc}", where=method
        ) from None
    return kept


def _next_answer() -> tuple[Answer, bool] | None:
    """The answer recorded for this ``ask`` (the step's N-th ask takes the N-th answer
    given to its asks) and whether it is the newest one, or ``None``."""
    ctx = step_context()
    if ctx is None:
        return None
    answers = ctx.answers
    asked = [a for a in answers.recorded if a.awaited.kind == ASK]
    index = answers.calls
    if index >= len(asked):
        return None
    answers.calls += 1
    return asked[index], index == len(asked) - 1


ASK_SAVE = "_ask_checkpoint"
"""The method name under which ``ask`` saves the state so far to a flow's persistence."""


def _save_state_so_far(flow: Any) -> None:
    """Save the step's state so far to the flow's own ``FlowPersistence`` before ``ask``
    waits in process (under :data:`ASK_SAVE`, as CrewAI does), so a process that dies while
    waiting leaves it to ``load_state``. Not to a store-backed persistence: it keeps whole
    checkpoints of the run, which a bare state saved mid-step would stand in for."""
    sink = flow._sink()
    if isinstance(sink, PersistSink) and sink.store is None:
        state = flow._dump_state(flow.state)
        sink.persistence.save_state(str(state["id"]), ASK_SAVE, state)


def _request(
    provider: Any,
    flow: Any,
    message: str,
    timeout: float | None,
    metadata: dict[str, Any] | None,
) -> Any:
    """What ``provider`` answered; ``None`` after ``timeout`` or when it raised."""
    box: list[Any] = [None]
    done = threading.Event()

    def call() -> None:
        try:
            if metadata is None:
                box[0] = provider.request_input(message, flow)
            else:
                box[0] = provider.request_input(message, flow, metadata=metadata)
        except Exception as exc:
            # CrewAI's ask answers None when its provider fails (a terminal that is not
            # there reads EOF); say why in one line rather than nothing.
            log.warning(
                "input provider %s failed (%s: %s); ask returns None",
                type(provider).__name__,
                type(exc).__name__,
                exc,
            )
        finally:
            done.set()

    if timeout is None:
        call()
        return box[0]
    # A daemon thread: a provider still blocked after the timeout (``input()``) must not
    # keep the process from exiting; its late answer is dropped. It runs in this step's
    # context, so the provider reads the step's ``flow.state``.
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(call,), name="runner-ask", daemon=True).start()
    return box[0] if done.wait(timeout) else None


def _teller(flow: Any, method: str, message: str, metadata: dict[str, Any] | None) -> Any:
    """A function telling an ``ask`` event of this question (with extra ``data``)."""
    state = flow.state
    run_id = str(state["id"] if isinstance(state, dict) else state.id)

    def tell(kind: str, **data: Any) -> None:
        fields = {"message": message, "metadata": metadata, **data}
        ev.tell(kind, run_id, flow.flow_name(), flow._listeners, method=method, data=fields)

    return tell


def _received(
    flow: Any,
    tell: Any,
    method: str,
    message: str,
    metadata: dict[str, Any] | None,
    text: str | None,
    about: dict[str, Any] | None,
    new: bool,
) -> str | None:
    """Record the answer ``ask`` returns in the flow's history and tell it when ``new``."""
    flow._input_history.append(
        {
            "message": message,
            "response": text,
            "method_name": method,
            "timestamp": datetime.now(),
            "metadata": metadata,
            "response_metadata": about,
        }
    )
    if new:
        tell(ev.INPUT_RECEIVED, response=text, response_metadata=about)
    return text
