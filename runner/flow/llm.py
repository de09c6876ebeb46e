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
needs it registered.

A name nothing is registered under resolves as CrewAI resolves it: through CrewAI's
``LLM(model=name)`` when ``crewai`` is importable, else through ``litellm`` (its
``completion``) when that is; ``"provider/model"`` and bare model names alike, their keys
from the environment as those libraries read them. With neither, the name is a
:class:`~runner.errors.DefinitionError` saying both ways to fix it (a step it fails is not
retried: registering the client, or installing a library, and resuming the run fixes it).
A registered name always wins. The name, never the client, is what a flow keeps (and what a
checkpoint or a flow's definition records): each process resolves it when it calls.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runner.errors import DefinitionError
from runner.flow import streaming, usage
from runner.flow.context import step_context

_clients: dict[str, Any] = {}
_by_library: dict[str, Any] = {}
_lock = threading.Lock()

LIBRARIES = ("crewai", "litellm")
"""What resolves a name nothing is registered under, in this order."""


def is_client(llm: Any) -> bool:
    """Whether ``llm`` is a client :func:`call_llm` can call as it is (not a name)."""
    return callable(llm) or any(callable(getattr(llm, m, None)) for m in ("call", "invoke"))


def is_llm(llm: Any) -> bool:
    """Whether :func:`call_llm` takes ``llm``: a client, a name, or a settings mapping with
    a ``model`` name (both resolved at the call)."""
    return (isinstance(llm, str) and bool(llm.strip())) or is_settings(llm) or is_client(llm)


def is_settings(llm: Any) -> bool:
    """Whether ``llm`` is CrewAI's LLM config mapping: ``{"model": name, ...settings}``."""
    return isinstance(llm, Mapping) and isinstance(llm.get("model"), str) and bool(llm["model"])


def llm_problem(llm: Any) -> str | None:
    """Why ``llm`` (as a definition gives it) cannot be an LLM, ``None`` when it can: a name,
    a mapping with a ``model`` name, or a client. Said when the definition is loaded, not
    when a turn first calls it."""
    if isinstance(llm, Mapping) and not is_settings(llm):
        return "an LLM given as a mapping needs a 'model' key naming the model"
    if not is_llm(llm):
        return f"expected a model name, a mapping with a 'model' key, or an LLM client; got {llm!r}"
    return None


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
    """The client ``llm`` stands for: the one registered under a name, else the client
    CrewAI's ``LLM`` or litellm makes for the name (the first importable), else ``llm``
    itself when it is no name. A name none of these resolves is one
    :class:`~runner.errors.DefinitionError` saying both ways to fix it."""
    if is_settings(llm):
        return settings_client(llm)
    if not isinstance(llm, str):
        return llm
    client = _clients.get(llm)
    if client is not None:
        return client
    with _lock:
        client = _by_library.get(llm)
        if client is None:
            client = library_client(llm)
            if client is not None:
                _by_library[llm] = client
    if client is None:
        known = ", ".join(repr(n) for n in registered_llms()) or "none"
        raise DefinitionError(
            f"no LLM is registered under the name {llm!r} (registered: {known}); register "
            f"your client in a module the workers import: runner.register_llm({llm!r}, client), "
            "or install crewai or litellm to resolve model names through them",
            llm=llm,
        )
    return client


def settings_client(settings: Mapping[str, Any]) -> Any:
    """The client an LLM config mapping (CrewAI's ``{"model": ..., "max_tokens": ...}``)
    stands for: the client registered under its model name (a registered name always wins,
    settings and all), else CrewAI's ``LLM(**settings)`` or a :class:`LiteLLMClient` passing
    the settings to each completion; neither importable is the name's
    :class:`~runner.errors.DefinitionError`."""
    model = str(settings["model"])
    extra = {k: v for k, v in settings.items() if k != "model"}
    if model in _clients or not extra:
        return resolve_llm(model)
    for library in LIBRARIES:
        if importlib.util.find_spec(library) is None:
            continue
        module = importlib.import_module(library)
        if library == "crewai":
            return module.LLM(model=model, **extra)
        return LiteLLMClient(model, module, extra)
    return resolve_llm(model)  # says both ways to fix it


def library_client(name: str) -> Any | None:
    """A client for the model ``name`` from the first of :data:`LIBRARIES` importable here:
    CrewAI's ``LLM(model=name)``, or a :class:`LiteLLMClient`; ``None`` with neither."""
    for library in LIBRARIES:
        if importlib.util.find_spec(library) is None:
            continue
        module = importlib.import_module(library)
        if library == "crewai":
            return module.LLM(model=name)
        return LiteLLMClient(name, module)
    return None


class LiteLLMClient:
    """A model name called through litellm's ``completion`` (one user message); its
    answer's token usage is recorded for the step running it."""

    def __init__(self, model: str, litellm: Any, settings: Mapping[str, Any] | None = None) -> None:
        self.model = model
        """The model name, as litellm takes it (``"provider/model"`` or a bare name)."""
        self.settings = dict(settings or {})
        """What each completion is also given (``max_tokens``, ``temperature``, ...)."""
        self._litellm = litellm

    def __repr__(self) -> str:
        return f"LiteLLMClient(model={self.model!r})"

    def call(self, messages: str | list[dict[str, Any]]) -> str:
        """The model's answer to a prompt, or to chat ``messages`` (role/content dicts)."""
        chat = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
        response = self._litellm.completion(model=self.model, messages=chat, **self.settings)
        usage.record(usage.usage_of(response))
        return str(response.choices[0].message.content or "")


def streams(llm: Any) -> Callable[[str], Any] | None:
    """How to call ``llm`` so that it streams, when it can: LangChain's ``.stream(prompt)``,
    or a callable taking ``stream=`` (OpenAI-style: ``llm(prompt, stream=True)`` gives an
    iterator of chunks); ``None`` for a client that only answers whole."""
    method = getattr(llm, "stream", None)
    if callable(method):
        return method
    target = (
        llm
        if callable(llm) and not any(callable(getattr(llm, m, None)) for m in ("call", "invoke"))
        else None
    )
    if target is None:
        return None
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return None
    if "stream" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return lambda prompt: target(prompt, stream=True)
    return None


def _stream_call(call: Callable[[str], Any], prompt: str) -> Any:
    """Call a streaming client inside a step: each chunk's text goes to the step's stream
    (channel ``llm``, CrewAI's ``llm_stream_chunk`` frames); the whole text is the answer (a
    stream of chunks without text, e.g. structured output, answers its last chunk). The
    usage of the last chunk that reports one is recorded."""
    spent: Any = None
    parts: list[str] = []
    last: Any = None
    for chunk in call(prompt):
        spent = usage.usage_of(chunk) or spent
        last = chunk
        text = streaming.chunk_text(chunk)
        if text is None:
            streaming.stream_chunk(chunk, streaming.LLM, type=streaming.LLM_CHUNK)
        elif text:
            parts.append(text)
            streaming.stream_chunk(text, streaming.LLM, type=streaming.LLM_CHUNK)
    usage.record(spent)
    return "".join(parts) if parts or last is None else last


def messages_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Chat messages as one prompt: a ``role: content`` line each."""
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages)


def takes_messages(llm: Any) -> bool:
    """Whether ``llm.call`` takes chat messages (CrewAI's ``BaseLLM.call(messages, ...)``):
    it names a ``messages`` parameter, or takes any keyword and needs no other argument. A
    ``.call(prompt)`` client is given one prompt string."""
    params = _call_params(llm)
    if params is None:
        return False
    if "messages" in params:
        return True
    required = [
        p
        for p in params.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return not required and any(p.kind is p.VAR_KEYWORD for p in params.values())


def _call_params(llm: Any) -> Mapping[str, inspect.Parameter] | None:
    """The parameters of ``llm.call``, ``None`` without ``.call`` or a signature to read."""
    bound = getattr(llm, "call", None)
    if not callable(bound):
        return None
    try:
        return inspect.signature(bound).parameters
    except (TypeError, ValueError):
        return None


def call_chat(
    llm: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    response_format: type[Any] | None = None,
    stream: bool = False,
) -> Any:
    """Call ``llm`` (a client or a name) with chat ``messages``, as CrewAI's conversational
    flows call theirs: a client whose ``.call`` takes them (:func:`takes_messages`) gets
    ``call(messages=..., response_format=...)`` (``response_model=`` when that is what it
    names) and its answer as it is (a structured answer stays an object); any other client
    gets the messages as one prompt (:func:`messages_text`), through :func:`call_llm`."""
    client = resolve_llm(llm)
    if not takes_messages(client):
        return call_llm(client, messages_text(messages) + "\nassistant:", stream=stream)
    params = _call_params(client) or {}
    extra: dict[str, Any] = {}
    if response_format is not None:
        if "response_format" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            extra["response_format"] = response_format
        elif "response_model" in params:
            extra["response_model"] = response_format
    before = usage.counters(client)
    answer = client.call(messages=[dict(m) for m in messages], **extra)
    usage.record(usage.usage_of(answer) or usage.since(before, usage.counters(client)))
    content = getattr(answer, "content", None)
    return content if isinstance(content, str) else answer


def call_llm(llm: Any, prompt: str, *, stream: bool = False) -> Any:
    """Call any supported LLM client (or the one registered under the name ``llm``) with
    ``prompt``; a chat message gives its ``content``. With ``stream`` (an ``Agent``'s call),
    inside a step, a client that streams (:func:`streams`) is called so, its tokens written to
    the step's stream as they come and the whole text its answer. The call's token usage is
    recorded for the step running it."""
    llm = resolve_llm(llm)
    if stream and step_context() is not None and (stream_call := streams(llm)) is not None:
        return _stream_call(stream_call, prompt)
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
