"""Live output of a running step: written by ``self.stream_chunk``, read by anyone, durable.

**Writing.** Inside a step, ``self.stream_chunk(text_or_json, channel="tokens")`` (or the
module's :func:`stream_chunk`) appends one entry to the run's stream; ``self.stream_from(
iterable)`` streams each chunk of an iterator (an OpenAI-style ``stream=True`` response,
LangChain's ``.stream``, any iterator of text) and returns the full text; our ``Agent``'s LLM
adapter does the same for a client that streams (:func:`runner.flow.llm.call_llm`). Each
attempt of a step writes through its own :class:`StepStream`, made at its first chunk and
flushed before the attempt settles (so every entry is in the store before the step's commit):

* **batched**: a chunk goes to its attempt's buffer and the call returns; one sender thread
  per process (``runner-stream``), woken by a buffer's first chunk, waits
  ``RUNNER_STREAM_LINGER_MS`` for more, then sends every attempt's buffer (of every step
  running in the process) in one round trip (:meth:`runner.store.base.StreamStore.
  append_streams`: a pipeline of one script call per attempt); chunks written meanwhile go in
  its next round. A token costs no round trip of its own: a step writing faster than a round
  trip, or many steps streaming in one process, share round trips (:attr:`StepStream.batches`);
* **tagged** with the step (activation id), the attempt's number (1, 2, ... in the order
  attempts first wrote: a retry, or a step re-run after its worker was killed, supersedes
  the earlier attempts without deleting what they wrote), the channel and a type;
* **JSON only**: a payload that is not JSON-serialisable fails the step at once, unretried
  (:class:`NotStreamable`, naming the step), as other non-JSON output does;
* a **child run**'s steps (a crew inside a flow) write into their parent's stream, each entry
  carrying the child's run id; an in-process run inside a step (a crew run inline) writes to
  where that step writes.

Where there is no stream store (an in-process run without a Redis store) chunks reach only
the in-process readers (a ``stream = True`` flow's session, :class:`FlowStreamSession`).

**Reading** is :mod:`runner.flow.following`: frames live from any entry id (every entry
once), ending with how the run ended and its result, for ``RunHandle.stream()``, ``runner
watch --stream``, ``runner submit --wait --stream`` and the console's
``/api/runs/{id}/stream``.

**CrewAI's** ``stream = True`` **flows.** ``kickoff()`` of such a flow returns a
:class:`FlowStreamSession` (``kickoff_async()`` an :class:`AsyncFlowStreamSession`): the run
goes on in a thread and the session yields its frames in order: lifecycle events (channel
``flow``), the steps' chunks (LLM chunks as ``llm_stream_chunk`` frames on channel ``llm``),
then ``.result`` is what ``kickoff()`` would have returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import to_json, to_jsonable_python

from runner.errors import DefinitionError, NotSerializable
from runner.flow import events as ev
from runner.flow.context import StepContext, step_context
from runner.settings import get_settings
from runner.store.base import StreamStore
from runner.store.models import RunStatus
from runner.store.streams import StreamAppend, StreamEntry

log = logging.getLogger("runner.stream")

TOKENS = "tokens"
"""The default channel of ``stream_chunk``."""
LLM = "llm"
"""The channel of LLM chunks (CrewAI's)."""
FLOW = "flow"
"""The channel of lifecycle frames: attempts, a run's end (CrewAI's)."""
CHUNK = "chunk"
"""The type of a text chunk written by ``stream_chunk``."""
DATA = "data"
"""The type of a JSON chunk written by ``stream_chunk``."""
LLM_CHUNK = "llm_stream_chunk"
"""The type of an LLM's chunk (CrewAI's ``LLMStreamChunkEvent``)."""
ATTEMPT = "attempt"
"""The type of the frame saying a step's newer attempt began writing (the older ones are
superseded)."""
ENDINGS = {
    RunStatus.SUCCEEDED: "flow_finished",
    RunStatus.FAILED: "flow_failed",
    RunStatus.CANCELLED: "flow_cancelled",
    RunStatus.PAUSED: "flow_paused",
    RunStatus.CORRUPT: "flow_failed",
}
"""The type of the last frame of a run's stream, by how the run ended."""


class NotStreamable(NotSerializable, DefinitionError):
    """A chunk given to ``stream_chunk`` is not JSON: the step fails, unretried."""


# -- frames -----------------------------------------------------------------------------------


@dataclass
class StreamFrame:
    """One item of a stream (CrewAI's ``StreamFrame``): where it comes from, its channel and
    type, printable ``content`` and the structured ``data`` (``event``)."""

    id: str
    """The entry's id in the run's stream (resume after it: ``from_id``, ``Last-Event-ID``);
    empty for frames that are not stored (a session's lifecycle frames)."""
    channel: str
    type: str
    content: str = ""
    """Printable text of a token-like frame, else ``""``."""
    data: Any = None
    """The payload: a chunk's text or JSON, or what a lifecycle frame is about."""
    run_id: str = ""
    """The run that wrote it (a child run's id for its entries in the parent's stream)."""
    step: str = ""
    """The step (activation id) that wrote it."""
    attempt: int = 0
    """Which attempt of the step (1, 2, ...) wrote it."""
    superseded: bool = False
    """A newer attempt of the step wrote to the stream since (as known when it was read)."""
    timestamp: float = field(default_factory=time.time)
    seq: int = 0
    """Order in this reader (1, 2, ...)."""

    @property
    def event(self) -> Any:
        """The structured payload (CrewAI's alias of ``data``)."""
        return self.data

    def to_json(self) -> dict[str, Any]:
        """The frame as JSON (what the console's SSE and ``--json`` outputs send)."""
        return {
            "id": self.id,
            "channel": self.channel,
            "type": self.type,
            "content": self.content,
            "data": self.data,
            "run_id": self.run_id,
            "step": self.step,
            "attempt": self.attempt,
            "superseded": self.superseded,
            "timestamp": self.timestamp,
        }


def frame_of(entry: StreamEntry, run_id: str, current: dict[str, int]) -> StreamFrame:
    """The frame of a stream entry of ``run_id``'s stream."""
    data = entry.data
    return StreamFrame(
        id=entry.id,
        channel=entry.channel,
        type=entry.type,
        content=data if isinstance(data, str) else "",
        data=data,
        run_id=entry.run_id or run_id,
        step=entry.step,
        attempt=entry.attempt,
        superseded=entry.superseded(current),
        timestamp=entry.timestamp,
    )


# -- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamTarget:
    """Where a step's chunks go: a run's stream in ``store`` (if any), as run ``writer_run``
    (a child's id, else empty), and an in-process ``tap`` (a session's)."""

    store: StreamStore | None
    run_id: str
    writer_run: str = ""
    tap: Callable[[StreamFrame], None] | None = None

    def child(self, child_run: str) -> StreamTarget:
        """Where a run started inside this target's step writes (its entries keep its id)."""
        return StreamTarget(self.store, self.run_id, child_run, self.tap)


def target(
    store: Any, run_id: str, parent_run: str | None = None, flow: Any = None
) -> StreamTarget:
    """Where the steps of run ``run_id`` write: inside a step of an in-process run (a crew
    run inline) where that step writes; else ``store``'s stream (when it keeps streams) of the
    parent run if it has one (a child on workers), else its own; with ``flow``'s session tap."""
    outer = step_context()
    if outer is not None and outer.stream_to is not None:
        return outer.stream_to.child(run_id)
    streams = store if keeps_streams(store) else None
    tap = _taps.get(flow) if flow is not None else None
    if parent_run:
        return StreamTarget(streams, parent_run, run_id, tap)
    return StreamTarget(streams, run_id, "", tap)


def keeps_streams(store: Any) -> bool:
    """Whether ``store`` keeps runs' streams (:class:`StreamStore`): decided once per store
    type, since every step asks and a check against the protocol looks up each of its
    methods."""
    kind = type(store)
    known = _streaming_types.get(kind)
    if known is None:
        known = _streaming_types[kind] = issubclass(kind, StreamStore)
    return known


_streaming_types: dict[type, bool] = {}


_taps: weakref.WeakKeyDictionary[Any, Callable[[StreamFrame], None]] = weakref.WeakKeyDictionary()
"""Flow object -> its stream session's receiver (in-process ``stream = True`` runs)."""


class StepStream:
    """The writer of one attempt of one step (see the module docstring): it buffers the
    attempt's chunks; the process's :class:`_Sender` sends them."""

    def __init__(self, to: StreamTarget, step: str, maxlen: int, linger: float) -> None:
        self.to = to
        self.step = step
        self.maxlen = maxlen
        self.linger = linger
        self.writer = uuid.uuid4().hex
        self.attempt = 0
        """This attempt's number in the stream (set by its first write)."""
        self.batches = 0
        """Round trips that carried this attempt's entries."""
        self.entries = 0
        """Entries written."""
        self.last_id = ""
        self._pending: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._sending = threading.Lock()
        """Held while a batch of this attempt is on its way: batches land in order."""

    def write(self, channel: str, kind: str, payload: Any) -> None:
        """Add one entry (``payload`` already JSON-safe)."""
        if self.to.tap is not None:
            self.to.tap(
                StreamFrame(
                    id="",
                    channel=channel,
                    type=kind,
                    content=payload if isinstance(payload, str) else "",
                    data=payload,
                    run_id=self.to.writer_run or self.to.run_id,
                    step=self.step,
                )
            )
        if self.to.store is None:
            return
        encoded = to_json(payload).decode()
        with self._lock:
            self._pending.append((channel, kind, encoded))
            first = len(self._pending) == 1
        if first:
            _sender().wake(self)

    def take(self) -> StreamAppend | None:
        """This attempt's pending entries as one batch (none left pending), or ``None``."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return None
        to = self.to
        return StreamAppend(to.run_id, self.step, self.writer, batch, self.maxlen, to.writer_run)

    def sent(self, batch: StreamAppend, number: int, last: str) -> None:
        """Record that ``batch`` is in the stream."""
        self.attempt, self.last_id = number, last
        self.batches += 1
        self.entries += len(batch.entries)

    def close(self) -> None:
        """Write what is left, after any batch on its way (before the attempt settles)."""
        if self.to.store is None:
            return
        with self._sending:
            batch = self.take()
            if batch is not None:
                _send(self.to.store, [(self, batch)])


def _send(store: StreamStore, batches: list[tuple[StepStream, StreamAppend]]) -> None:
    """Send ``batches`` (their writers' ``_sending`` held) in one round trip."""
    try:
        found = store.append_streams([b for _w, b in batches])
    except Exception as exc:  # a stream write never fails a step; say what was lost
        for writer, batch in batches:
            log.warning(
                "run %s step %s: %d stream entries not written: %s",
                batch.run_id,
                writer.step,
                len(batch.entries),
                exc,
            )
        return
    for (writer, batch), (number, last) in zip(batches, found, strict=True):
        writer.sent(batch, number, last)


class _Sender:
    """The process's stream sender (thread ``runner-stream``): woken by an attempt's first
    pending chunk, it waits ``linger`` for more (of that attempt and of any other running in
    this process), then sends every pending batch, one pipeline per store: one round trip
    for all. Chunks written while it sends go in its next round."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._waiting: dict[StepStream, None] = {}
        self._thread = threading.Thread(target=self._run, name="runner-stream", daemon=True)
        self._thread.start()

    def wake(self, writer: StepStream) -> None:
        with self._cond:
            self._waiting[writer] = None
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting:
                    self._cond.wait()
                linger = max(w.linger for w in self._waiting)
            if linger:
                time.sleep(linger)  # let a burst gather into this round
            with self._cond:
                writers, self._waiting = list(self._waiting), {}
            by_store: dict[int, tuple[StreamStore, list[StepStream]]] = {}
            for writer in writers:
                store = writer.to.store
                if store is not None:
                    by_store.setdefault(id(store), (store, []))[1].append(writer)
            for store, group in by_store.values():
                self._round(store, group)

    @staticmethod
    def _round(store: StreamStore, writers: list[StepStream]) -> None:
        held: list[StepStream] = []
        batches: list[tuple[StepStream, StreamAppend]] = []
        try:
            for writer in writers:
                writer._sending.acquire()
                held.append(writer)
                batch = writer.take()
                if batch is not None:
                    batches.append((writer, batch))
            if batches:
                _send(store, batches)
        finally:
            for writer in held:
                writer._sending.release()


_the_sender: _Sender | None = None
_sender_lock = threading.Lock()


def _sender() -> _Sender:
    """This process's sender (a forked child starts its own)."""
    global _the_sender
    with _sender_lock:
        if _the_sender is None or _the_sender.pid != os.getpid():
            _the_sender = _Sender()
        return _the_sender


def _writer(ctx: StepContext) -> StepStream | None:
    """The attempt's writer, made at its first chunk."""
    if ctx.stream is None:
        to = ctx.stream_to
        if to is None:
            return None
        settings = get_settings()
        ctx.stream = StepStream(
            to, ctx.activation.id, settings.stream_maxlen, settings.stream_linger_ms / 1000
        )
    writer: StepStream = ctx.stream
    return writer


def finish(ctx: StepContext) -> None:
    """Flush and close the attempt's writer, if it wrote (the step runner calls it)."""
    writer = ctx.stream
    if writer is not None:
        writer.close()


def stream_chunk(content: Any, channel: str = TOKENS, *, type: str | None = None) -> None:
    """Append ``content`` (text, or anything JSON-serialisable) to the running step's stream on
    ``channel``; nothing outside a step. A payload that is not JSON fails the step, unretried
    (:class:`NotStreamable`)."""
    ctx = step_context()
    if ctx is None:
        return
    if not isinstance(channel, str) or not channel:
        raise NotStreamable(
            f"stream_chunk in step {ctx.activation.method}: channel must be a non-empty "
            f"string, not {channel!r}",
            where=ctx.activation.method,
        )
    if isinstance(content, str):
        payload: Any = content
        kind = type or CHUNK
    else:
        try:
            payload = to_jsonable_python(content)
        except Exception as exc:
            raise NotStreamable(
                f"stream_chunk in step {ctx.activation.method}: the payload is not "
                f"JSON-serialisable ({type_name(content)}): {exc}",
                where=ctx.activation.method,
            ) from None
        kind = type or DATA
    writer = _writer(ctx)
    if writer is not None:
        writer.write(channel, kind, payload)


def type_name(value: Any) -> str:
    return f"{value.__class__.__module__}.{value.__class__.__qualname__}"


def chunk_text(chunk: Any) -> str | None:
    """The text of one streamed chunk: a string; an OpenAI-style chunk (``choices[0].delta.
    content``, as an object or a dict); a LangChain message chunk (``.content``); a dict
    with ``content`` or ``text``. ``None`` for anything else (streamed as JSON)."""
    if isinstance(chunk, str):
        return chunk
    if isinstance(chunk, dict):
        choices = chunk.get("choices")
        if isinstance(choices, list):
            if not choices:
                return ""
            delta = choices[0].get("delta") or choices[0].get("message") or {}
            return str(delta.get("content") or "")
        for name in ("content", "text"):
            if isinstance(chunk.get(name), str):
                return str(chunk[name])
        return None
    choices = getattr(chunk, "choices", None)
    if isinstance(choices, list | tuple):
        if not choices:
            return ""
        delta = getattr(choices[0], "delta", None) or getattr(choices[0], "message", None)
        return str(getattr(delta, "content", None) or "")
    for name in ("content", "text"):
        value = getattr(chunk, name, None)
        if isinstance(value, str):
            return value
    return None


def stream_from(chunks: Iterable[Any], channel: str = TOKENS, *, type: str | None = None) -> str:
    """Stream each chunk of ``chunks`` (see :func:`chunk_text`) and return the full text
    (chunks without text are streamed as JSON and are not part of it)."""
    parts: list[str] = []
    for chunk in chunks:
        text = chunk_text(chunk)
        if text is None:
            stream_chunk(chunk, channel, type=type)
        elif text:
            parts.append(text)
            stream_chunk(text, channel, type=type)
    return "".join(parts)


_END = object()


# -- CrewAI's stream = True flows, in process -------------------------------------------------


class _Lifecycle(ev.EventListener):
    """Turns the flow's events into lifecycle frames of its session."""

    def __init__(self, put: Callable[[StreamFrame], None]) -> None:
        self.put = put

    def on_event(self, event: ev.FlowEvent) -> None:
        data = {"method_name": event.method, "flow_name": event.flow, **event.data}
        if event.error:
            data["error"] = event.error
        self.put(
            StreamFrame(
                id="",
                channel=FLOW,
                type=event.type,
                data=data,
                run_id=event.run_id,
                step=event.method or "",
                timestamp=event.timestamp,
            )
        )


class FlowStreamSession:
    """What ``kickoff()`` of a ``stream = True`` flow returns (CrewAI's stream session): its
    frames in order as the run goes on (in a thread of this process), then ``.result``."""

    def __init__(self, flow: Any, run: Callable[[], Any]) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.frames: list[StreamFrame] = []
        self.is_completed = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._seq = 0
        self._lock = threading.Lock()
        listener = _Lifecycle(self._put)
        flow._listeners.append(listener)
        _taps[flow] = self._put

        def body() -> None:
            try:
                self._result = run()
            except BaseException as exc:  # handed to the reader
                self._error = exc
            finally:
                _taps.pop(flow, None)
                with contextlib.suppress(ValueError):
                    flow._listeners.remove(listener)
                self._queue.put(_END)

        self._thread = threading.Thread(target=body, name="runner-flow-stream", daemon=True)
        self._thread.start()

    def _put(self, frame: StreamFrame) -> None:
        with self._lock:
            self._seq += 1
            frame.seq = self._seq
        self._queue.put(frame)

    def _next(self) -> Any:
        item = self._queue.get()
        if item is _END:
            self._thread.join()
            self.is_completed = True
        else:
            self.frames.append(item)
        return item

    def __iter__(self) -> Iterator[StreamFrame]:
        while not self.is_completed:
            item = self._next()
            if item is not _END:
                yield item

    @property
    def events(self) -> Iterator[StreamFrame]:
        """The frames in order (CrewAI's ``StreamSession.events``; iterating the session
        is the same)."""
        return iter(self)

    def __enter__(self) -> FlowStreamSession:
        return self

    def __exit__(self, *_: Any) -> None:
        for _frame in self:  # let the run finish
            pass

    @property
    def result(self) -> Any:
        """What ``kickoff()`` returned (its exception raised), once the stream is consumed."""
        if not self.is_completed:
            raise RuntimeError("consume the stream before reading its result")
        if self._error is not None:
            raise self._error
        return self._result


class AsyncFlowStreamSession(FlowStreamSession):
    """What ``await kickoff_async()`` of a ``stream = True`` flow returns: ``async for``."""

    @property
    def events(self) -> AsyncIterator[StreamFrame]:  # type: ignore[override]
        """The frames in order, for ``async for`` (CrewAI's async ``events``)."""
        return self.__aiter__()

    async def __aiter__(self) -> AsyncIterator[StreamFrame]:
        while not self.is_completed:
            item = await asyncio.to_thread(self._next)
            if item is not _END:
                yield item
