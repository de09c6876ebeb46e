"""Calling the LLM clients users pass (an ``Agent``'s ``llm``, ``@human_feedback``'s ``llm``).

The runner prescribes no LLM library and makes no network call itself: ``llm`` is whatever
the user passes, called with one prompt string. Supported shapes, tried in this order: an
object with ``.call(prompt)`` (CrewAI's ``LLM``), with ``.invoke(prompt)`` (LangChain chat
models; a message's ``.content`` is used), or any callable ``llm(prompt)``. Each call's token
usage is recorded for the step running it (:mod:`runner.flow.usage`).
"""

from __future__ import annotations

from typing import Any

from runner.flow import usage


def is_llm(llm: Any) -> bool:
    """Whether ``llm`` is a client :func:`call_llm` can call."""
    return callable(llm) or any(callable(getattr(llm, m, None)) for m in ("call", "invoke"))


def call_llm(llm: Any, prompt: str) -> Any:
    """Call any supported LLM client with ``prompt``; a chat message gives its ``content``.
    The call's token usage is recorded for the step running it."""
    before = usage.counters(llm)
    for method in ("call", "invoke"):
        bound = getattr(llm, method, None)
        if callable(bound):
            answer = bound(prompt)
            break
    else:
        answer = llm(prompt)
    usage.record(usage.usage_of(answer) or usage.since(before, usage.counters(llm)))
    content = getattr(answer, "content", None)
    return content if isinstance(content, str) else answer
