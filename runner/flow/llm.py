"""Calling the LLM clients users pass (an ``Agent``'s ``llm``, ``@human_feedback``'s ``llm``).

The runner prescribes no LLM library and makes no network call itself: ``llm`` is whatever
the user passes, called with one prompt string. Supported shapes, tried in this order: an
object with ``.call(prompt)`` (CrewAI's ``LLM``), with ``.invoke(prompt)`` (LangChain chat
models; a message's ``.content`` is used), or any callable ``llm(prompt)``. Each call's token
usage is recorded for the step running it (:mod:`runner.flow.usage`).

**LLMs by name.** CrewAI code passes a model name (``llm="gpt-4o-mini"``) and CrewAI builds
its client from it. Here a name stands for the client the user registered under it with
:func:`register_llm`, a process-wide registry (as ``set_flow_persistence_factory`` is):
register at import of a module the workers import (their allow-list), so every process
that runs the flow resolves the same names. A name is resolved only when a call is needed
(:func:`call_llm`), so a flow whose reviews are all answered with an explicit outcome never
needs it registered. An unregistered name is a :class:`~runner.errors.DefinitionError`
(a step it fails is not retried: registering the client and resuming the run fixes it).
"""

from __future__ import annotations

from typing import Any

from runner.errors import DefinitionError
from runner.flow import usage

_clients: dict[str, Any] = {}


def is_client(llm: Any) -> bool:
    """Whether ``llm`` is a client :func:`call_llm` can call as it is (not a name)."""
    return callable(llm) or any(callable(getattr(llm, m, None)) for m in ("call", "invoke"))


def is_llm(llm: Any) -> bool:
    """Whether :func:`call_llm` takes ``llm``: a client, or a name (resolved at the call)."""
    return (isinstance(llm, str) and bool(llm.strip())) or is_client(llm)


def register_llm(name: str, client: Any) -> None:
    """Make ``name`` (e.g. ``"gpt-4o-mini"``) stand for ``client`` in this process, wherever
    an ``llm`` is given by name; registering a name again replaces its client, ``None``
    removes it. Call it at import of a module the workers import."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"register_llm takes a non-empty name, not {name!r}")
    if client is None:
        _clients.pop(name, None)
        return
    if not is_client(client):
        raise TypeError(
            f"register_llm({name!r}, ...) takes a client: callable, or with .call() or "
            f".invoke(); got {client!r}"
        )
    _clients[name] = client


def registered_llms() -> list[str]:
    """The names registered in this process, sorted."""
    return sorted(_clients)


def resolve_llm(llm: Any) -> Any:
    """The client ``llm`` stands for: the one registered under a name, else ``llm`` itself.
    An unregistered name is one :class:`~runner.errors.DefinitionError` saying how to fix it."""
    if not isinstance(llm, str):
        return llm
    client = _clients.get(llm)
    if client is None:
        known = ", ".join(repr(n) for n in registered_llms()) or "none"
        raise DefinitionError(
            f"no LLM is registered under the name {llm!r} (registered: {known}); register "
            f"your client in a module the workers import: runner.register_llm({llm!r}, client)",
            llm=llm,
        )
    return client


def call_llm(llm: Any, prompt: str) -> Any:
    """Call any supported LLM client (or the one registered under the name ``llm``) with
    ``prompt``; a chat message gives its ``content``. The call's token usage is recorded for
    the step running it."""
    llm = resolve_llm(llm)
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
