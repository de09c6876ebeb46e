"""``@human_feedback``: a person reviews a method's output before the flow goes on (CrewAI's).

After the decorated method returns, its output goes to a reviewer: the decorator's
``provider``, else ``flow_config.hitl_provider``, else the terminal in process. The answer
becomes a :class:`HumanFeedbackResult` in ``flow.last_human_feedback`` and
``flow.human_feedback_history``. Without ``emit`` that result is the method's output (its
listeners receive it). With ``emit`` the method is a router: ``llm`` (anything an ``Agent``
takes: a callable, ``.call`` or ``.invoke``, or the name of one given to
:func:`~runner.flow.llm.register_llm`, as CrewAI's ``llm="gpt-4o-mini"``) collapses the
answer to one of the labels, an empty answer gives ``default_outcome`` (else the first
label), that label's listeners run, and the method's output stays what it returned. An
answer that picks its label (``outcome``: the console's label buttons, ``--outcome``) or is
empty needs no ``llm`` call, so a name needs registering only where text is collapsed.

**Durable waiting.** A provider raising :class:`HumanFeedbackPending`, or on workers a
review nobody answers at once (no provider), pauses the run: the method's state changes and
its output under review are committed with the pause (``meta.human.awaiting``), and no process
waits. The answer comes back through ``Flow.from_pending(...).resume(feedback)`` in process,
or ``runner resume RUN --feedback``, ``RunHandle.resume(feedback=)``, the console or the API
(:func:`runner.distributed.control.answer`); the step is then sent again and finds the
answer recorded for it (``meta.human.answers``): the method does **not** run again, its output
under review is taken from the pause.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar, runtime_checkable

from runner.checkpointing import persistable
from runner.errors import AwaitInput, InvalidFeedback, NoPendingFeedback, RunnerError
from runner.flow import events as ev
from runner.flow.attempt import Routed, run_awaitable, to_json
from runner.flow.context import step_context
from runner.flow.decorators import REVIEW_ATTR, STEP_ATTR, router
from runner.flow.input_provider import ConsoleProvider, flow_config
from runner.flow.llm import call_llm, is_llm, resolve_llm
from runner.store.base import CheckpointStore
from runner.store.models import Answer, Awaiting, Checkpoint
from runner.store.pending import FEEDBACK, PendingFeedbackContext, pending_checkpoint, state_json
from runner.store.persistence import store_of
from runner.store.persistence_factory import default_flow_persistence

log = logging.getLogger("runner.flow")

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_ATTR = REVIEW_ATTR
"""The attribute a reviewed method carries its :class:`HumanFeedbackConfig` under (CrewAI's)."""

__all__ = [
    "ConsoleProvider",
    "HumanFeedbackConfig",
    "HumanFeedbackPending",
    "HumanFeedbackProvider",
    "HumanFeedbackResult",
    "PendingFeedbackContext",
    "human_feedback",
]


@dataclass
class HumanFeedbackResult:
    """A person's review of a method's output."""

    output: Any
    """What the method returned (what the reviewer saw)."""
    feedback: str
    """What the reviewer said; ``""`` for no answer."""
    outcome: str | None = None
    """The ``emit`` label the answer came to; ``None`` without ``emit``."""
    timestamp: datetime = field(default_factory=datetime.now)
    """When the answer was given."""
    method_name: str = ""
    """The reviewed method."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The decorator's ``metadata``."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HumanFeedbackResult:
        """The result a checkpoint keeps as JSON (the output of a method without ``emit``)."""
        stamp = data.get("timestamp")
        return cls(
            output=data.get("output"),
            feedback=data.get("feedback") or "",
            outcome=data.get("outcome"),
            timestamp=datetime.fromisoformat(stamp) if isinstance(stamp, str) else datetime.now(),
            method_name=data.get("method_name") or "",
            metadata=data.get("metadata") or {},
        )


@dataclass
class HumanFeedbackConfig:
    """What ``@human_feedback`` was given (kept on the method under :data:`CONFIG_ATTR`)."""

    message: str
    """What the reviewer is asked."""
    emit: Sequence[str] | None = None
    """The labels the answer is collapsed to (the method is then a router)."""
    llm: Any = None
    """What collapses an answer to a label: a callable, ``.call`` or ``.invoke``, or the name
    it is registered under (resolved when a collapse is needed)."""
    default_outcome: str | None = None
    """The label of an empty answer (default: the first)."""
    metadata: dict[str, Any] | None = None
    """Passed on to the provider and kept in the result."""
    provider: Any = None
    """Who is asked (:class:`HumanFeedbackProvider`); ``None``: see the module docstring."""


class HumanFeedbackPending(RunnerError):
    """Raised by a provider that asked someone and will not wait for the answer: the run
    pauses durably, and ``kickoff()`` returns this exception instead of raising it."""

    def __init__(
        self,
        context: PendingFeedbackContext,
        callback_info: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> None:
        if message is None:
            message = (
                f"Human feedback pending for flow '{context.flow_id}' "
                f"at method '{context.method_name}'"
            )
        super().__init__(message, context=context, callback_info=callback_info or {})
        self.context = context
        self.callback_info: dict[str, Any] = callback_info or {}


@runtime_checkable
class HumanFeedbackProvider(Protocol):
    """Who reviews: ``request_feedback`` returns the answer, or raises
    :class:`HumanFeedbackPending` to pause the run until the answer comes back."""

    def request_feedback(self, context: PendingFeedbackContext, flow: Any) -> str:
        """The reviewer's answer to ``context`` (``""``: none)."""
        ...


def human_feedback(
    message: str,
    emit: Sequence[str] | None = None,
    llm: Any = None,
    default_outcome: str | None = None,
    metadata: dict[str, Any] | None = None,
    provider: Any = None,
) -> Callable[[F], F]:
    """Have a person review the decorated method's output (see the module docstring).

    Stacks with ``@start``/``@listen`` in either order. ``emit`` needs an ``llm``;
    ``default_outcome`` must be one of ``emit``. A bad combination is
    :class:`~runner.errors.InvalidFeedback` (a ``ValueError`` too, as CrewAI raises).
    """
    labels = _checked(message, emit, llm, default_outcome, provider)
    config = HumanFeedbackConfig(message, labels, llm, default_outcome, metadata, provider)

    def decorate(fn: F) -> F:
        return _reviewed(fn, config)

    return decorate


_LLM_SHAPES = "a client (callable, .call() or .invoke()) or a name given to runner.register_llm"


def _checked(
    message: str, emit: Sequence[str] | None, llm: Any, default_outcome: str | None, provider: Any
) -> list[str] | None:
    def bad(why: str) -> InvalidFeedback:
        return InvalidFeedback(f"@human_feedback: {why}")

    if not isinstance(message, str):
        raise bad(f"message must be a string, not {message!r}")
    if provider is not None and not callable(getattr(provider, "request_feedback", None)):
        raise bad(f"provider must have request_feedback(context, flow); got {provider!r}")
    if emit is None:
        if default_outcome is not None:
            raise bad("default_outcome requires emit to be specified")
        if llm is not None and not is_llm(llm):
            raise bad(f"llm must be {_LLM_SHAPES}; got {llm!r}")
        return None
    if isinstance(emit, str) or not emit or not all(isinstance(e, str) and e for e in emit):
        raise bad(f"emit takes a list of labels (non-empty strings), not {emit!r}")
    if llm is None:
        raise bad("llm is required when emit is specified (it collapses an answer to a label)")
    if not is_llm(llm):
        raise bad(
            f"llm must be {_LLM_SHAPES}; got {llm!r} (the runner makes no network call: pass "
            "your client, e.g. CrewAI's LLM(model=...), or register it under a name)"
        )
    if default_outcome is not None and default_outcome not in emit:
        raise bad(
            f"default_outcome {default_outcome!r} must be one of the emit options {list(emit)}"
        )
    return list(emit)


def _reviewed(fn: F, config: HumanFeedbackConfig) -> F:
    """``fn`` with its output reviewed when it runs as a step of a flow (a direct call
    returns what ``fn`` returns); a step answered already takes the output under review
    from the pause instead of running ``fn`` again."""
    name = getattr(fn, "__name__", repr(fn))

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def review_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not _in_step(self, name):
                return await fn(self, *args, **kwargs)
            answer, under_review = _answer(), _under_review()
            if under_review is None:
                output = await fn(self, *args, **kwargs)
            else:
                output = under_review.output
            return review(self, config, name, output, answer)

        wrapper: Any = review_async
    else:

        @functools.wraps(fn)
        def review_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not _in_step(self, name):
                return fn(self, *args, **kwargs)
            answer, under_review = _answer(), _under_review()
            output = fn(self, *args, **kwargs) if under_review is None else under_review.output
            return review(self, config, name, output, answer)

        wrapper = review_sync
    setattr(wrapper, CONFIG_ATTR, config)
    if config.emit is not None:
        declared = getattr(wrapper, STEP_ATTR, None)
        if declared is not None and declared.is_router:
            # A review over a router returns the review's outcome, so its emit labels are
            # the router's (CrewAI: the review's emit wins over the router's).
            setattr(wrapper, STEP_ATTR, replace(declared, labels=frozenset(config.emit)))
        else:
            # The reviewed method routes: a router with the emit labels, stacked as @router is.
            wrapper = router(emit=config.emit)(wrapper)
    return wrapper


def _in_step(flow: Any, method: str) -> bool:
    ctx = step_context()
    return ctx is not None and ctx.runs(flow, method)


def _answer() -> Answer | None:
    """The answer recorded for this step's review (the latest), if any."""
    ctx = step_context()
    given = [a for a in (ctx.answers.recorded if ctx else ()) if a.awaited.kind == FEEDBACK]
    return given[-1] if given else None


def _under_review() -> Awaiting | None:
    """The review this step's output went to already (its method then never runs again):
    the one answered, else the one it paused on before, if any."""
    answer = _answer()
    if answer is not None:
        return answer.awaited
    ctx = step_context()
    return None if ctx is None else ctx.answers.review


def review(
    flow: Any, config: HumanFeedbackConfig, method: str, output: Any, answer: Answer | None
) -> Any:
    """What the reviewed step returns: ``output``'s result once answered (``answer``, or the
    reviewer's answer now), a :class:`~runner.flow.attempt.Routed` output with ``emit``.
    Raises :class:`~runner.errors.AwaitInput` when the answer is to come later."""
    if answer is not None:
        at = datetime.fromtimestamp(answer.at)
        result = finalize(flow, config, method, output, answer.text or "", answer.outcome, at)
    else:
        result = finalize(flow, config, method, output, ask_reviewer(flow, config, method, output))
    return Routed(output, result.outcome) if config.emit is not None else result


def context_for(
    flow: Any, config: HumanFeedbackConfig, method: str, output: Any
) -> PendingFeedbackContext:
    """What a reviewer of ``method``'s ``output`` is given."""
    return PendingFeedbackContext(
        flow_id=flow.flow_id,
        flow_class=flow.flow_path(),
        method_name=method,
        method_output=output,
        message=config.message,
        emit=list(config.emit) if config.emit is not None else None,
        default_outcome=config.default_outcome,
        metadata=dict(config.metadata or {}),
        llm=config.llm if isinstance(config.llm, str) else None,  # the name, never a client
    )


def ask_reviewer(flow: Any, config: HumanFeedbackConfig, method: str, output: Any) -> str:
    """The reviewer's answer now, or :class:`~runner.errors.AwaitInput` (the run pauses)
    when it is to come later: the provider raised :class:`HumanFeedbackPending`, or the
    step runs on a worker with no provider to ask."""
    context = context_for(flow, config, method, output)
    provider = config.provider if config.provider is not None else flow_config.hitl_provider
    data = {"message": config.message, "output": context.awaiting().output, "emit": context.emit}
    _tell(flow, ev.FEEDBACK_REQUESTED, method, data)
    try:
        if provider is not None:
            answer = provider.request_feedback(context, flow)
            if inspect.isawaitable(answer):
                answer = run_awaitable(answer)
        elif (ctx := step_context()) is not None and ctx.on_worker:  # nobody to ask here
            raise HumanFeedbackPending(context)
        else:
            answer = flow._request_human_feedback(
                message=config.message,
                output=output,
                metadata=config.metadata,
                emit=config.emit,
                method_name=method,
            )
    except HumanFeedbackPending as pending:
        flow._feedback_pending = pending  # what an in-process kickoff returns
        awaiting = context.awaiting().model_copy(update={"output": to_json(output, method)})
        raise AwaitInput(awaiting) from pending
    return "" if answer is None else str(answer)


def finalize(
    flow: Any,
    config: HumanFeedbackConfig,
    method: str,
    output: Any,
    feedback: str,
    outcome: str | None = None,
    at: datetime | None = None,
) -> HumanFeedbackResult:
    """The result of ``feedback`` on ``output`` (``outcome``: a label chosen directly),
    recorded in the flow's history."""
    emit = list(config.emit) if config.emit is not None else None
    if emit is None:
        outcome = None
    elif outcome not in emit:
        if feedback.strip():
            outcome = flow._collapse_to_outcome(feedback=feedback, outcomes=emit, llm=config.llm)
        else:
            outcome = config.default_outcome or emit[0]
    result = HumanFeedbackResult(
        output=output,
        feedback=feedback,
        outcome=outcome,
        timestamp=at or datetime.now(),
        method_name=method,
        metadata=dict(config.metadata or {}),
    )
    flow.human_feedback_history.append(result)
    flow.last_human_feedback = result
    ctx = step_context()
    if ctx is not None:  # kept with the step's commit (meta.human.feedback)
        ctx.answers.reviewed = result
    _tell(flow, ev.FEEDBACK_RECEIVED, method, {"feedback": feedback, "outcome": outcome})
    return result


def _tell(flow: Any, kind: str, method: str, data: dict[str, Any]) -> None:
    ev.tell(kind, flow.flow_id, flow.flow_name(), flow._listeners, method=method, data=data)


_COLLAPSE = """A person reviewed a piece of work and answered:

{feedback}

Which one of these outcomes does the answer mean: {outcomes}?
Reply with the outcome alone, exactly as written."""


def collapse(feedback: str, outcomes: Sequence[str], llm: Any) -> str:
    """The one of ``outcomes`` ``llm`` reads ``feedback`` as. Its reply is matched as it
    is, as JSON ``{"outcome": ...}``, then by the first outcome it mentions; a reply that
    names none, or an ``llm`` that fails, gives the first outcome (with a warning), as
    CrewAI does. A name nobody registered is no failing ``llm`` but a mistake in the set-up:
    its :class:`~runner.errors.DefinitionError` fails the step, which a resume retries once
    the name is registered (a guessed label would route the run for good)."""
    prompt = _COLLAPSE.format(feedback=feedback, outcomes=", ".join(outcomes))
    client = resolve_llm(llm)
    try:
        reply = call_llm(client, prompt)
    except Exception as exc:
        log.warning(
            "collapsing feedback to %s failed (%s: %s); taking %r",
            list(outcomes),
            type(exc).__name__,
            exc,
            outcomes[0],
        )
        return outcomes[0]
    found = match_outcome(reply, outcomes)
    if found is None:
        log.warning(
            "the llm's reply %r names none of %s; taking %r", reply, list(outcomes), outcomes[0]
        )
        return outcomes[0]
    return found


def match_outcome(reply: Any, outcomes: Sequence[str]) -> str | None:
    """The outcome an LLM's ``reply`` names, or ``None``."""
    text = reply if isinstance(reply, str) else str(getattr(reply, "outcome", reply))
    text = text.strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("outcome"), str):
        text = parsed["outcome"].strip()
    lowered = text.strip("\"'`. ").lower()
    for outcome in outcomes:
        if outcome.lower() == lowered:
            return outcome
    for outcome in outcomes:
        if outcome.lower() in lowered:
            return outcome
    return None


def as_output(method_fn: Any, output: Any) -> Any:
    """A committed ``output`` of a step as its method gave it: the :class:`HumanFeedbackResult`
    of a reviewed method without ``emit`` (a checkpoint keeps it as JSON)."""
    config = getattr(method_fn, CONFIG_ATTR, None)
    if isinstance(config, HumanFeedbackConfig) and config.emit is None and isinstance(output, dict):
        return HumanFeedbackResult.from_json(output)
    return output


# -- in process: keeping a pause for review, and finding it again ------------------------------


def keep_pending(flow: Any, store: CheckpointStore | None, paused: Checkpoint) -> Any:
    """What an in-process ``kickoff`` whose run paused at ``paused`` returns: the
    :class:`HumanFeedbackPending` when it waits for a review (else ``None``), the pause kept
    where ``from_pending`` finds it. ``store`` is where the run's checkpoints went; a run
    that kept none keeps its pause in the flow's persistence, else the default one (which
    the flow then keeps, as CrewAI's does)."""
    context = PendingFeedbackContext.of(paused)
    if context is None:
        return None
    if store is None:
        if flow._persistence is None:
            # the one @persist gives the class (or its methods), else the default
            given = getattr(flow._sink(), "persistence", None)
            flow._persistence = default_flow_persistence() if given is None else given
        store = store_of(flow._persistence)
        if store is None:  # a CrewAI-style backend keeps the review its own way
            flow._persistence.save_pending_feedback(paused.run_id, context, dict(paused.state))
    if store is not None:
        stored = store.latest(paused.run_id)
        if stored is None or PendingFeedbackContext.of(stored) is None:
            paused = store.commit(persistable(paused))
    flow._feedback_checkpoint = paused
    raised, flow._feedback_pending = flow._feedback_pending, None
    if raised is not None and raised.context.method_name == context.method_name:
        return raised
    return HumanFeedbackPending(context)


def find_pending(
    flow_id: str, persistence: Any, store: CheckpointStore | None
) -> tuple[Checkpoint, Any]:
    """Run ``flow_id``'s checkpoint paused for a review and the persistence it is kept in:
    ``persistence``'s, else ``store`` (the flow's), else the default persistence's. A
    CrewAI-style backend without a store gives its state and context, made a checkpoint
    here. :class:`~runner.errors.NoPendingFeedback` if the run waits for no review."""
    if persistence is None and store is None:
        persistence = default_flow_persistence()
    if persistence is not None:
        store = store_of(persistence)
    if store is not None:
        latest = store.latest(flow_id)
        if latest is not None and PendingFeedbackContext.of(latest) is not None:
            return latest, persistence
    else:
        loaded = persistence.load_pending_feedback(flow_id)
        if loaded is not None:
            state, context = loaded
            return pending_checkpoint(None, context, state_json(flow_id, state)), persistence
    raise NoPendingFeedback(f"No pending feedback found for flow_id: {flow_id}", run_id=flow_id)


def check_still_pending(store: CheckpointStore | None, paused: Checkpoint) -> None:
    """Refuse to answer ``paused`` when its run went on since (answered or resumed
    elsewhere): :class:`~runner.errors.NoPendingFeedback`."""
    latest = None if store is None else store.latest(paused.run_id)
    if latest is not None and latest.id != paused.id:
        raise NoPendingFeedback(
            f"run {paused.run_id} no longer waits for this review (now at {latest.event}): "
            "it was answered or resumed elsewhere",
            run_id=paused.run_id,
        )


def restore_history(flow: Any, kept: list[dict[str, Any]]) -> None:
    """Give a flow object made for one step on a worker the run's reviews so far
    (``meta.human.feedback``) as its ``human_feedback_history`` and ``last_human_feedback``."""
    flow.human_feedback_history = [HumanFeedbackResult.from_json(r) for r in kept]
    flow.last_human_feedback = flow.human_feedback_history[-1] if kept else None
