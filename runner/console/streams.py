"""A run's stream as Server-Sent Events (``GET /api/runs/{id}/stream``, the run page's live
panel).

Each frame of :func:`runner.flow.streaming.follow` is one event: ``id:`` its entry id (so a
browser's ``EventSource`` reconnects with ``Last-Event-ID`` and gets every entry once),
``data:`` the frame as JSON; the last one (how the run ended, with its result) is an
``end`` event, after which the client closes. One thread per client reads the run's stream
(blocking reads of the store) and hands frames to the event loop, which writes whatever
gathered in one chunk; a comment every :data:`KEEPALIVE` seconds keeps proxies from closing
a quiet stream. A client that left is noticed within :data:`CHECK` seconds by asking the
server (a write to it would fail only at the next keepalive), and its reader stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from runner.flow import streaming
from runner.flow.streaming import StreamFrame

KEEPALIVE = 15.0
"""Seconds of silence after which a comment line is sent."""
CHECK = 1.0
"""Seconds between two checks, while quiet, that the client is still there."""
RETRY_MS = 1000
"""What a browser waits before reconnecting (the ``retry:`` field)."""
_DONE = object()


def event(frame: StreamFrame) -> str:
    """One SSE event of ``frame``."""
    end = frame.channel == streaming.FLOW and frame.type in streaming.ENDINGS.values()
    lines = []
    if frame.id:
        lines.append(f"id: {frame.id}")
    if end:
        lines.append("event: end")
    lines.append(f"data: {json.dumps(frame.to_json(), separators=(',', ':'))}")
    return "\n".join(lines) + "\n\n"


async def events(
    frames: Iterator[StreamFrame],
    stop: threading.Event,
    left: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[str]:
    """The SSE body of ``frames`` (read in a thread of its own; made with ``stop``, which is
    set when the client leaves, so the reading ends too). ``left``: whether the client has
    gone (Starlette's ``Request.is_disconnected``)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def hand(item: Any) -> None:
        # The server may have stopped (its loop closed) while this thread read: nobody reads
        # the stream any more, so what was read goes nowhere.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def pump() -> None:
        try:
            for frame in frames:
                hand(frame)
                if stop.is_set() or loop.is_closed():
                    break
        except Exception as exc:  # the store went away: the client sees one error event
            hand(exc)
        finally:
            close = getattr(frames, "close", None)
            if close is not None:
                close()
            hand(_DONE)

    threading.Thread(target=pump, name="runner-sse", daemon=True).start()
    yield f"retry: {RETRY_MS}\n\n"
    try:
        quiet_since = time.monotonic()
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), CHECK)
            except TimeoutError:
                if left is not None and await left():
                    return
                if time.monotonic() - quiet_since >= KEEPALIVE:
                    quiet_since = time.monotonic()
                    yield ": keepalive\n\n"
                continue
            quiet_since = time.monotonic()
            batch = [item]
            while not queue.empty():
                batch.append(queue.get_nowait())
            out: list[str] = []
            for got in batch:
                if got is _DONE:
                    if out:
                        yield "".join(out)
                    return
                if isinstance(got, Exception):
                    body = {"type": type(got).__name__, "message": str(got)}
                    out.append(f"event: error\ndata: {json.dumps(body)}\n\n")
                else:
                    out.append(event(got))
            yield "".join(out)
    finally:
        stop.set()
