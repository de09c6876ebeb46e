"""A run's stream of live output: what its steps write while they run (tokens, progress).

One Redis Stream per run, ``P:{T}:stream``, under the run's hash tag (one Cluster slot with
the rest of the run), and beside it the hash ``P:{T}:stream-attempts`` that says which attempt
of each step wrote last. This module owns both keys, the script that writes them and the
decoding of what is read (:class:`StreamEntry`).

* **Writes come in batches.** :meth:`StreamBook.append` writes any number of entries of one
  attempt in one EVALSHA (one round trip), :meth:`StreamBook.append_many` the batches of
  several attempts (of any runs) in one pipeline; the process's writer in the flow core
  (:mod:`runner.flow.streaming`) groups chunks so that a token costs no round trip of its own.
* **Attempts.** The first batch of an attempt (a ``writer`` token the hash has not seen for
  the step) numbers it: 1 for the step's first writer, then 2, ... A number above 1 is
  announced by an ``attempt`` entry (channel ``flow``), so a reader following live learns
  that the step's earlier entries are superseded; a reader always gets the newest number of
  each step with what it reads (:class:`StreamRead`). Nothing is ever deleted by a retry.
* **Bounded.** Every ``XADD`` trims the stream to ``maxlen`` entries (exactly: a reader that
  falls further behind than the cap misses the oldest); the stream and its hash are deleted
  with the run (``DELETE_RUN`` names every per-run key).

Entry fields: ``s`` the step (activation id), ``a`` the attempt's number, ``c`` channel,
``t`` type, ``d`` the payload (JSON), ``r`` the run that wrote it when it is not the stream's
own run (a child run's steps write into their parent's stream).
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from functools import cached_property
from typing import Any, NamedTuple

import redis

from .keys import Keys, RedisHandle

APPEND = """
-- Append a batch of one attempt's entries to a run's stream.
-- KEYS[1] the stream   KEYS[2] the stream's attempts hash
-- ARGV[1] step   ARGV[2] writer token   ARGV[3] maxlen   ARGV[4] writing run ('' = own)
-- ARGV[5..] channel, type, payload JSON: three per entry
-- Returns {attempt number, last entry id}.
local step, maxlen = ARGV[1], ARGV[3]
local akey = step
if ARGV[4] ~= '' then akey = ARGV[4] .. '/' .. step end
local mine = akey .. '|' .. ARGV[2]
local n = tonumber(redis.call('HGET', KEYS[2], mine))
local last = ''
if not n then
  n = redis.call('HINCRBY', KEYS[2], akey, 1)
  redis.call('HSET', KEYS[2], mine, n)
  if n > 1 then
    last = redis.call('XADD', KEYS[1], 'MAXLEN', maxlen, '*', 's', step, 'a', n, 'c', 'flow',
      't', 'attempt', 'd', '{"supersedes":' .. (n - 1) .. '}')
  end
end
for i = 5, #ARGV, 3 do
  if ARGV[4] == '' then
    last = redis.call('XADD', KEYS[1], 'MAXLEN', maxlen, '*', 's', step, 'a', n,
      'c', ARGV[i], 't', ARGV[i + 1], 'd', ARGV[i + 2])
  else
    last = redis.call('XADD', KEYS[1], 'MAXLEN', maxlen, '*', 's', step, 'a', n,
      'c', ARGV[i], 't', ARGV[i + 1], 'd', ARGV[i + 2], 'r', ARGV[4])
  end
end
return {n, last}
"""


class StreamAppend(NamedTuple):
    """One attempt's batch for :meth:`StreamBook.append_many`."""

    run_id: str
    step: str
    writer: str
    entries: list[tuple[str, str, str]]
    maxlen: int
    writer_run: str = ""


class StreamEntry(NamedTuple):
    """One entry of a run's stream, decoded."""

    id: str
    """The entry's id (``<ms>-<n>``): resume reading after it."""
    step: str
    attempt: int
    channel: str
    type: str
    data: Any
    """The payload (JSON)."""
    run_id: str = ""
    """The run that wrote it, when not the stream's own (a child run)."""

    @property
    def timestamp(self) -> float:
        """When Redis added it (unix seconds, from the id)."""
        return int(self.id.partition("-")[0]) / 1000

    @property
    def attempt_key(self) -> str:
        """The key of :attr:`StreamRead.current` that says whether this entry is superseded."""
        return attempt_key(self.run_id, self.step)

    def superseded(self, current: dict[str, int]) -> bool:
        """Whether a newer attempt of this entry's step wrote to the stream since."""
        return self.attempt < current.get(self.attempt_key, self.attempt)


def attempt_key(writer_run: str, step: str) -> str:
    """How the attempts hash names a step: ``step``, or ``<child run>/step`` for a child's."""
    return f"{writer_run}/{step}" if writer_run else step


class StreamRead(NamedTuple):
    """What one read of a stream found: its entries after the id asked for, and the newest
    attempt number of every step that wrote (entries of an older attempt are superseded)."""

    entries: list[StreamEntry]
    current: dict[str, int]
    trimmed: str | None = None
    """With ``check_trim``: the first entry the cap kept, when the cap trimmed entries and the
    id asked for is older than it (the reader missed entries), else ``None``."""


class StreamInfo(NamedTuple):
    """A stream's size and ends."""

    length: int
    first_id: str | None
    last_id: str | None


class StreamBook:
    """The runs' streams in a deployment's Redis (``client`` and ``keys`` of one store)."""

    def __init__(self, store: RedisHandle) -> None:
        self.client: Any = store.client
        self.keys = store.keys
        self._append = self.client.register_script(APPEND)

    def append(
        self,
        run_id: str,
        step: str,
        writer: str,
        entries: list[tuple[str, str, str]],
        maxlen: int,
        writer_run: str = "",
    ) -> tuple[int, str]:
        """Append ``entries`` (channel, type, payload JSON) of the attempt ``writer`` of
        ``step`` to ``run_id``'s stream; the attempt's number and the last entry's id."""
        args: list[Any] = [step, writer, max(1, maxlen), writer_run]
        for channel, kind, payload in entries:
            args += [channel, kind, payload]
        keys = [self.keys.stream(run_id), self.keys.stream_attempts(run_id)]
        number, last = self._append(keys=keys, args=args)
        return int(number), _text(last)

    def append_many(self, appends: list[StreamAppend]) -> list[tuple[int, str]]:
        """:meth:`append` of several attempts' batches (of any runs) in one round trip (a
        pipeline); each one's attempt number and last entry id, in order."""
        pipe = self.client.pipeline(transaction=False)
        for a in appends:
            args: list[Any] = [a.step, a.writer, max(1, a.maxlen), a.writer_run]
            for channel, kind, payload in a.entries:
                args += [channel, kind, payload]
            keys = [self.keys.stream(a.run_id), self.keys.stream_attempts(a.run_id)]
            self._append(keys=keys, args=args, client=pipe)
        return [(int(number), _text(last)) for number, last in pipe.execute()]

    def read(
        self,
        run_id: str,
        after: str = "0",
        count: int = 500,
        block: float | None = None,
        check_trim: bool = False,
    ) -> StreamRead:
        """Entries after the id ``after`` (``"0"``: from the start), at most ``count``;
        ``block`` seconds waits for one to come when there is none yet; ``check_trim`` says
        whether the cap trimmed entries after ``after`` (Redis 7's ``entries-added``)."""
        key = self.keys.stream(run_id)
        trimmed = self._trimmed(key, after) if check_trim else None
        pipe = self.client.pipeline(transaction=False)
        if block is None:
            pipe.xread({key: after}, count=count)
        else:
            pipe.xread({key: after}, count=count, block=max(1, int(block * 1000)))
        pipe.hgetall(self.keys.stream_attempts(run_id))
        found, attempts = pipe.execute()
        entries: list[StreamEntry] = []
        for _key, items in found or ():
            entries.extend(_entry(raw_id, fields) for raw_id, fields in items)
        current = {_text(k): int(v) for k, v in (attempts or {}).items() if b"|" not in k}
        return StreamRead(entries, current, trimmed)

    def info(self, run_id: str) -> StreamInfo:
        """The length and first and last ids of ``run_id``'s stream (0 and ``None``s if none)."""
        key = self.keys.stream(run_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.xlen(key)
        pipe.xrange(key, count=1)
        pipe.xrevrange(key, count=1)
        length, first, last = pipe.execute()
        return StreamInfo(
            int(length),
            _text(first[0][0]) if first else None,
            _text(last[0][0]) if last else None,
        )

    def _trimmed(self, key: str, after: str) -> str | None:
        try:
            info = self.client.xinfo_stream(key)
        except redis.ResponseError:  # no stream yet
            return None
        added, first = info.get("entries-added"), info.get("first-entry")
        if added is None or first is None or int(added) <= int(info.get("length", 0)):
            return None  # Redis < 7, or nothing trimmed
        kept = _text(first[0])
        return kept if _id(kept) > _id(after) else None


def _entry(raw_id: Any, fields: dict[bytes, bytes]) -> StreamEntry:
    get = fields.get
    data = get(b"d")
    return StreamEntry(
        id=_text(raw_id),
        step=_text(get(b"s", b"")),
        attempt=int(get(b"a", b"1")),
        channel=_text(get(b"c", b"")),
        type=_text(get(b"t", b"")),
        data=None if data is None else json.loads(data),
        run_id=_text(get(b"r", b"")),
    )


def _id(text: str) -> tuple[int, int]:
    ms, _, n = text.partition("-")
    return int(ms or 0), int(n or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StreamRecords:
    """The Redis side of :class:`~runner.store.base.StreamStore`: a mixin of
    :class:`~runner.store.redis.RedisProvider` handing over to :class:`StreamBook`, Redis
    errors wrapped as the provider wraps its own."""

    client: Any
    keys: Keys

    def _wrapped(self) -> AbstractContextManager[None]:  # the provider's own
        raise NotImplementedError

    @cached_property
    def _streams(self) -> StreamBook:
        return StreamBook(self)

    def append_stream(
        self,
        run_id: str,
        step: str,
        writer: str,
        entries: list[tuple[str, str, str]],
        maxlen: int,
        writer_run: str = "",
    ) -> tuple[int, str]:
        """See :meth:`StreamBook.append`."""
        with self._wrapped():
            return self._streams.append(run_id, step, writer, entries, maxlen, writer_run)

    def append_streams(self, appends: list[StreamAppend]) -> list[tuple[int, str]]:
        """See :meth:`StreamBook.append_many`."""
        with self._wrapped():
            return self._streams.append_many(appends)

    def read_stream(
        self,
        run_id: str,
        after: str = "0",
        count: int = 500,
        block: float | None = None,
        check_trim: bool = False,
    ) -> StreamRead:
        """See :meth:`StreamBook.read`."""
        with self._wrapped():
            return self._streams.read(run_id, after, count, block, check_trim)

    def stream_info(self, run_id: str) -> StreamInfo:
        """See :meth:`StreamBook.info`."""
        with self._wrapped():
            return self._streams.info(run_id)
