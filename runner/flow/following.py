"""Reading a run's stream: :func:`follow` (frames live from any entry id, then how the run
ended with its result) and :class:`RunStream` (CrewAI's stream session over it). What
``RunHandle.stream()``, ``runner watch --stream``, ``runner submit --wait --stream`` and the
console's ``/api/runs/{id}/stream`` all read; writing is :mod:`runner.flow.streaming`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from runner.errors import RunNotFound
from runner.flow import results
from runner.flow.streaming import ATTEMPT, ENDINGS, FLOW, StreamFrame, frame_of, keeps_streams
from runner.store.models import RunStatus

TRIMMED = "stream_trimmed"
"""The type of the frame a reader gets first when the stream's cap (``RUNNER_STREAM_MAXLEN``)
dropped entries after the id it starts from: it cannot get every entry."""


def follow(
    store: Any,
    run_id: str,
    channels: Sequence[str] | None = None,
    from_id: str | None = None,
    *,
    block: float = 0.5,
    count: int = 500,
    stop: threading.Event | None = None,
) -> Iterator[StreamFrame]:
    """The run's stream from after ``from_id`` (``None``: the start), live until the run
    stops running, then one frame of how it ended (type :data:`ENDINGS`, ``data``: status,
    result, error). ``channels`` keeps only those (attempt and end frames always come).
    :class:`~runner.errors.RunNotFound` for an unknown run; a store without streams gives only
    the end. ``stop``: set it to end the iteration within ``block`` seconds (a reader that
    left), with no end frame."""
    if store.run(run_id) is None:
        raise RunNotFound(f"no run {run_id}", run_id=run_id)
    return _follow(store, run_id, channels, from_id, block, count, stop)


def _follow(
    store: Any,
    run_id: str,
    channels: Sequence[str] | None,
    from_id: str | None,
    block: float,
    count: int,
    stop: threading.Event | None,
) -> Iterator[StreamFrame]:
    wanted = None if channels is None else set(channels)
    after, seq = from_id or "0", 0
    streams = store if keeps_streams(store) else None
    first, quiet, checked = True, True, 0.0
    info: Any = None
    while stop is None or not stop.is_set():
        # The run's status, read before the read it governs: while entries flow it is read at
        # most every ``block`` seconds (one round trip per wake-up, not two).
        if quiet or time.monotonic() - checked >= block:
            info, checked = store.run(run_id), time.monotonic()
        status = info.status if info is not None else RunStatus.CANCELLED
        ending = status not in (RunStatus.PENDING, RunStatus.RUNNING)
        while streams is not None:
            read = streams.read_stream(
                run_id, after, count, None if ending else block, check_trim=first
            )
            if first and read.trimmed is not None:
                # The cap dropped entries this reader never saw: say so, once, first.
                seq += 1
                yield StreamFrame(
                    id="",
                    channel=FLOW,
                    type=TRIMMED,
                    data={"after": after, "first_kept": read.trimmed},
                    run_id=run_id,
                    seq=seq,
                )
            first, quiet = False, not read.entries
            for entry in read.entries:
                after = entry.id
                if wanted is not None and entry.channel not in wanted and entry.type != ATTEMPT:
                    continue
                seq += 1
                frame = frame_of(entry, run_id, read.current)
                frame.seq = seq
                yield frame
            if not ending or len(read.entries) < count:
                break
        if ending:
            data: dict[str, Any] = {"status": status.value, "result": None, "error": None}
            if info is not None:
                data["error"] = info.error
                latest = store.latest(run_id) if status is RunStatus.SUCCEEDED else None
                if latest is not None:
                    data["result"] = results.result_json(
                        status, latest, results.flow_class_of(latest)
                    )
            yield StreamFrame(
                id=after if after != "0" else "",
                channel=FLOW,
                type=ENDINGS.get(status, "flow_finished"),
                data=data,
                run_id=run_id,
                seq=seq + 1,
            )
            return
        if streams is None:
            time.sleep(block)


class RunStream:
    """A run's stream as CrewAI's stream session: iterate it (``for`` or ``async for``) for
    its frames, then ``.result`` is the run's result (raising as ``RunHandle.result()``
    would for a run that did not succeed: what ``result`` raises is given by ``on_end``)."""

    def __init__(
        self,
        frames: Iterator[StreamFrame],
        on_end: Callable[[StreamFrame], Any] | None = None,
    ) -> None:
        self._source = frames
        self._on_end = on_end
        self.frames: list[StreamFrame] = []
        """Every frame yielded so far."""
        self.is_completed = False
        """The run's end frame was read."""
        self._end: StreamFrame | None = None

    def __iter__(self) -> Iterator[StreamFrame]:
        for frame in self._source:
            self.frames.append(frame)
            if frame.type in ENDINGS.values() and not frame.step:
                self._end, self.is_completed = frame, True
            yield frame

    async def __aiter__(self) -> AsyncIterator[StreamFrame]:
        iterator = iter(self)
        while True:
            frame = await asyncio.to_thread(next, iterator, None)
            if frame is None:
                return
            yield frame

    @property
    def ending(self) -> StreamFrame | None:
        """The end frame (how the run ended), once read."""
        return self._end

    @property
    def result(self) -> Any:
        """The run's result, after the stream was consumed (``RuntimeError`` before)."""
        if self._end is None:
            raise RuntimeError("consume the stream before reading its result")
        if self._on_end is not None:
            return self._on_end(self._end)
        return self._end.data.get("result")

    def close(self) -> None:
        """Stop reading (the reader's generator is closed)."""
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> RunStream:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def stream_run(
    store: Any,
    run_id: str,
    channels: Sequence[str] | None = None,
    from_id: str | None = None,
    *,
    block: float = 0.5,
) -> RunStream:
    """The stream of run ``run_id`` kept in ``store`` (e.g. an in-process run's Redis store;
    ``RunHandle.stream()`` for a run on workers): a :class:`RunStream` whose ``.result`` is
    the end frame's result (JSON). :class:`~runner.errors.RunNotFound` for an unknown run."""
    return RunStream(follow(store, run_id, channels, from_id, block=block))
