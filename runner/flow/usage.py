"""Token usage: what the LLM calls of a step spent, kept in its checkpoint and summed per run.

While a step's method runs (either executor), a meter collects what it records: the
``Agent``'s LLM adapter records each answer's usage fields, and :func:`record_usage` is the
public way for any other client. :mod:`runner.flow.lifecycle` settles the step with what its
attempt spent (:func:`charge`): the step checkpoint's ``usage`` and the run's sums
(:class:`~runner.store.models.RunUsage` in ``meta.usage``) change in the one commit that
settles it. A run that runs inside a step (a crew run in process) adds what it spent to that
step's meter when it ends; on workers a child run's spend is added when its parent's
activation settles. A resume starts the run's ``last`` sum again and records what the
completed steps it skips had spent as ``saved``.

Usage fields are read the way CrewAI reads them: OpenAI's ``prompt_tokens`` /
``completion_tokens`` (``prompt_tokens_details.cached_tokens``,
``completion_tokens_details.reasoning_tokens``), Anthropic's ``input_tokens`` /
``output_tokens`` (with their cache counters), Gemini's ``prompt_token_count`` /
``candidates_token_count``, LangChain's ``usage_metadata``, as attributes or dict keys.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Collection, Mapping
from typing import Any

from runner.store.models import (
    COMPLETION_KEYS,
    PROMPT_KEYS,
    Checkpoint,
    RunUsage,
    UsageMetrics,
)

__all__ = ["UsageMetrics", "record_usage", "usage_of"]


class Meter:
    """What one attempt of a step recorded so far (shared by the tasks and threads that
    inherit its context, so additions are locked)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent = UsageMetrics()

    def add(self, usage: UsageMetrics) -> None:
        with self._lock:
            self._spent.add_usage_metrics(usage)

    @property
    def spent(self) -> UsageMetrics:
        """A copy of the counts so far."""
        with self._lock:
            return self._spent.model_copy()


_meter: contextvars.ContextVar[Meter | None] = contextvars.ContextVar(
    "runner_step_usage", default=None
)


def start_meter() -> contextvars.Token[Meter | None]:
    """Start metering the step attempt about to run in this context."""
    return _meter.set(Meter())


def stop_meter(token: contextvars.Token[Meter | None]) -> UsageMetrics | None:
    """Stop the meter :func:`start_meter` started; what the attempt spent (``None``: nothing)."""
    meter = _meter.get()
    _meter.reset(token)
    spent = meter.spent if meter is not None else None
    return None if spent is None or spent.empty else spent


def joined(*parts: UsageMetrics | None) -> UsageMetrics | None:
    """The sum of the usage ``parts`` recorded (``None`` if none)."""
    found = [p for p in parts if p is not None]
    return sum(found[1:], found[0]) if found else None


def running_spend() -> UsageMetrics | None:
    """What the step attempt running in this context has recorded so far, if one runs."""
    meter = _meter.get()
    return meter.spent if meter is not None else None


def record(usage: UsageMetrics | None) -> bool:
    """Add ``usage`` to the step running in this context; whether one runs."""
    meter = _meter.get()
    if meter is None:
        return False
    if usage is not None and not usage.empty:
        meter.add(usage)
    return True


def record_usage(usage: Any = None, /, **counts: int) -> UsageMetrics | None:
    """Record an LLM call's usage in the step running now (any client; the ``Agent`` does
    this by itself).

    ``usage`` is a :class:`UsageMetrics`, a provider's usage dict, the client's response or
    its usage object (OpenAI, Anthropic, Gemini, LangChain fields); or give the counts as
    keywords: ``record_usage(prompt_tokens=120, completion_tokens=40)``. Each call counts
    as one request unless ``successful_requests`` says otherwise. Returns what was
    recorded; ``None`` outside a step (nothing is recorded then). Input with no usage
    fields, or counts that are not whole numbers >= 0, is a :class:`ValueError`.

    Call it from the step's own thread or task: a thread the method starts itself does not
    inherit the step's context (start it with ``contextvars.copy_context().run``).
    """
    if (usage is None) == (not counts):
        raise ValueError(
            "record_usage takes a usage (UsageMetrics, a usage dict or a client's response) "
            "or keyword counts such as prompt_tokens=120, completion_tokens=40"
        )
    found = _from_counts(counts) if counts else usage_of(usage)
    if found is None:
        raise ValueError(f"record_usage found no usage fields in {usage!r}")
    if any(value < 0 for _, value in found):
        raise ValueError(f"record_usage takes counts >= 0, not {found!r}")
    return found if record(found) else None


def _from_counts(counts: dict[str, int]) -> UsageMetrics:
    unknown = sorted(set(counts) - set(UsageMetrics.model_fields))
    if unknown:
        raise ValueError(
            f"record_usage has no count {', '.join(unknown)}; "
            f"it takes {', '.join(UsageMetrics.model_fields)}"
        )
    bad = {k: v for k, v in counts.items() if isinstance(v, bool) or not isinstance(v, int)}
    if bad:
        raise ValueError(f"record_usage takes whole numbers of tokens, not {bad}")
    given = dict(counts)
    given.setdefault("successful_requests", 1)
    prompt, completion = given.get("prompt_tokens", 0), given.get("completion_tokens", 0)
    given.setdefault("total_tokens", prompt + completion)
    return UsageMetrics(**given)


# --- reading a client's usage fields ---------------------------------------------------------


def usage_of(answer: Any) -> UsageMetrics | None:
    """The usage an LLM client's answer reports (one request), or ``None`` if it has none.

    Looked for on the answer itself (a usage dict or object), in its ``usage`` (OpenAI,
    Anthropic, a raw JSON response), ``usage_metadata`` (LangChain messages, Gemini) or
    ``response_metadata["token_usage"]`` (older LangChain). A :class:`UsageMetrics` is
    taken as it is.
    """
    if isinstance(answer, UsageMetrics):
        return answer.model_copy()
    if answer is None or isinstance(answer, str | bytes | int | float):
        return None
    for source in _candidates(answer):
        found = _normalized(_as_dict(source))
        if found is not None:
            return found
    return None


def _candidates(answer: Any) -> list[Any]:
    found = [answer]
    for name in ("usage", "usage_metadata"):
        inner = answer.get(name) if isinstance(answer, Mapping) else getattr(answer, name, None)
        if inner is not None:
            found.append(inner)
    meta = (
        answer.get("response_metadata")
        if isinstance(answer, Mapping)
        else getattr(answer, "response_metadata", None)
    )
    if isinstance(meta, Mapping):
        found += [meta[k] for k in ("token_usage", "usage") if meta.get(k) is not None]
    return found


def _as_dict(value: Any) -> dict[str, Any] | None:
    """A usage object's fields (a mapping, a pydantic model, a plain object)."""
    if isinstance(value, Mapping):
        return dict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            dumped = dump()
        except Exception:  # not a pydantic model's dump: read it no further
            dumped = None
        if isinstance(dumped, Mapping):
            return dict(dumped)
    fields = getattr(value, "__dict__", None)
    return dict(fields) if isinstance(fields, dict) else None


def _normalized(data: dict[str, Any] | None) -> UsageMetrics | None:
    """``data`` read by :meth:`UsageMetrics.from_provider_dict` if it has a prompt or
    completion count (its ``*_details`` may be objects too), else ``None``."""
    if not data or not any(k in data for k in (*PROMPT_KEYS, *COMPLETION_KEYS)):
        return None
    plain = {
        k: _as_dict(v) if k.endswith("_details") and not isinstance(v, Mapping) else v
        for k, v in data.items()
    }
    return UsageMetrics.from_provider_dict(plain)


def counters(llm: Any) -> UsageMetrics | None:
    """An LLM client's lifetime counters, for clients that keep them instead of returning
    usage with each answer (CrewAI's ``LLM.get_token_usage_summary()``)."""
    summary = getattr(llm, "get_token_usage_summary", None)
    if not callable(summary):
        return None
    fields = _as_dict(summary())
    if fields is None:
        return None
    known = {k: v for k, v in fields.items() if k in UsageMetrics.model_fields and v is not None}
    try:
        return UsageMetrics.model_validate(known)
    except ValueError:  # counters that are not counts: nothing to read
        return None


def since(before: UsageMetrics | None, after: UsageMetrics | None) -> UsageMetrics | None:
    """What lifetime counters grew by between two readings (``None``: nothing)."""
    if before is None or after is None:
        return None
    grew = after.delta_since(before)
    return None if grew.empty else grew


# --- a run's sums ----------------------------------------------------------------------------


def charge(
    ckpt: Checkpoint, closing: Checkpoint | None, spent: UsageMetrics | None, done: str | None
) -> None:
    """Record ``spent`` as the step of ``ckpt`` (about to be committed) and add it to the
    run's sums there and in its ``closing`` checkpoint; ``done`` is the method when the
    step completed (what a later resume does not spend again)."""
    ckpt.usage = spent
    if spent is None or spent.empty:
        return
    run = ckpt.meta.usage or RunUsage()
    steps = dict(run.done)
    if done is not None:
        steps[done] = steps[done] + spent if done in steps else spent
    summed = run.model_copy(
        update={"total": run.total + spent, "last": run.last + spent, "done": steps}
    )
    for target in (ckpt, closing):
        if target is not None:
            target.meta = target.meta.updated(usage=summed)


def resumed(
    latest: RunUsage | None, source: RunUsage | None, kept: Collection[str] | None = None
) -> RunUsage | None:
    """The run's sums when it goes on from a checkpoint with ``source``'s sums (``latest``'s
    are the run's newest; ``None`` for a fork, a new run): ``last`` starts again, what the
    completed steps spent is ``saved``; ``kept`` names the methods whose spend is kept when
    not all are (a fork's ``--rerun`` runs the others again)."""
    if latest is None and source is None:
        return None
    done = dict(source.done) if source is not None else {}
    if kept is not None:
        done = {m: spent for m, spent in done.items() if m in kept}
    saved = UsageMetrics()
    for spent in done.values():
        saved.add_usage_metrics(spent)
    total = latest.total if latest is not None else UsageMetrics()
    return RunUsage(total=total, done=done, saved=saved)


def restarted(latest: RunUsage | None) -> RunUsage | None:
    """The run's sums when it starts again from its starts (every step runs again)."""
    return None if latest is None else RunUsage(total=latest.total)


def last_of(ckpt: Checkpoint | None) -> UsageMetrics:
    """What the run of ``ckpt`` spent since its latest start or resume (a new object)."""
    usage = ckpt.meta.usage if ckpt is not None else None
    return usage.last.model_copy() if usage is not None else UsageMetrics()


# --- how the CLI and the console show it ----------------------------------------------------


def run_sums(ckpt: Checkpoint | None) -> dict[str, Any] | None:
    """A run's sums as JSON: ``total`` (the run's life), ``last`` (since its latest start or
    resume) and ``saved`` (what that resume did not spend again; ``None`` if not resumed);
    ``None`` when the run recorded no usage."""
    sums = ckpt.meta.usage if ckpt is not None else None
    if sums is None:
        return None
    saved = sums.saved.model_dump() if sums.saved is not None else None
    return {"total": sums.total.model_dump(), "last": sums.last.model_dump(), "saved": saved}


def tokens_text(usage: UsageMetrics | Mapping[str, Any] | None) -> str:
    """``1,234 tokens (1,000 prompt, 234 completion, 3 requests)``; ``-`` for none."""
    if usage is None:
        return "-"
    u = usage if isinstance(usage, UsageMetrics) else UsageMetrics.model_validate(usage)
    parts = [f"{u.prompt_tokens:,} prompt", f"{u.completion_tokens:,} completion"]
    if u.cached_prompt_tokens:
        parts.append(f"{u.cached_prompt_tokens:,} cached")
    if u.reasoning_tokens:
        parts.append(f"{u.reasoning_tokens:,} reasoning")
    requests = "request" if u.successful_requests == 1 else "requests"
    parts.append(f"{u.successful_requests:,} {requests}")
    return f"{u.total_tokens:,} tokens ({', '.join(parts)})"


def run_sums_text(run_id: str, sums: Mapping[str, Any]) -> str:
    """One line of a run's sums (:func:`run_sums`) for ``runner steps``."""
    text = f"run {run_id}: {tokens_text(sums['total'])} in all"
    if sums["last"] != sums["total"]:
        text += f"; since its latest start or resume {tokens_text(sums['last'])}"
    if sums["saved"] is not None:
        text += (
            f"; saved by that resume (completed steps not run again): {tokens_text(sums['saved'])}"
        )
    return text
