"""A run's stream in process: written by ``self.stream_chunk`` / ``stream_from`` / an Agent's
streaming LLM, kept in Redis (one stream per run, tagged, batched, capped), read by
:func:`runner.flow.streaming.follow` from any id; CrewAI's ``stream = True`` sessions; bad
chunks. (On workers, with the CLI and the console: ``tests/test_streaming_workers.py``.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from runner import CheckpointConfig
from runner.errors import RunNotFound
from runner.flow import streaming
from runner.flow.following import follow
from runner.flow.streaming import NotStreamable, StreamFrame
from runner.settings import reset_settings
from runner.store.redis import RedisProvider
from tests.flows.streams import BadChunk, CrewStreams, StreamingFlow, Tokens, token


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    provider = RedisProvider(redis_url, prefix=prefix)
    yield provider
    provider.close()


def _kickoff(flow_cls: Any, store: RedisProvider, **inputs: Any) -> tuple[Any, str]:
    flow = flow_cls(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))
    out = flow.kickoff(inputs=inputs)
    return out, flow.state.id


def _data(frames: list[StreamFrame]) -> list[StreamFrame]:
    return [f for f in frames if f.channel != streaming.FLOW]


def test_an_in_process_run_with_a_store_streams_into_redis_tagged_and_batched(
    store: RedisProvider,
) -> None:
    out, run = _kickoff(Tokens, store, count=500)
    assert out == 500
    frames = list(follow(store, run, block=0.05))
    tokens = [f for f in frames if f.channel == "tokens"]
    assert [f.content for f in tokens] == [token(i) for i in range(500)]
    assert {(f.step, f.attempt, f.type, f.run_id, f.superseded) for f in tokens} == {
        ("write#1", 1, "chunk", run, False)
    }
    progress = [f.data for f in frames if f.channel == "progress"]
    assert progress == [{"done": n, "of": 500} for n in (100, 200, 300, 400, 500)]
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    end = frames[-1]
    assert (end.channel, end.type, end.data["status"], end.data["result"]) == (
        "flow",
        "flow_finished",
        "succeeded",
        500,
    )
    # Entry ids grow; the stream holds exactly what was written.
    ids = [f.id for f in frames[:-1]]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert store.stream_info(run).length == 505


def test_a_step_writing_faster_than_a_round_trip_writes_many_tokens_per_round_trip(
    store: RedisProvider,
) -> None:
    flow = Tokens(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))
    writers: list[Any] = []
    original = streaming.StepStream.close

    def spy(self: streaming.StepStream) -> None:
        original(self)
        writers.append(self)

    streaming.StepStream.close = spy  # type: ignore[method-assign]
    try:
        flow.kickoff(inputs={"count": 500})
    finally:
        streaming.StepStream.close = original  # type: ignore[method-assign]
    (writer,) = writers
    assert writer.entries == 505
    assert writer.batches <= 20, writer.batches  # measured: a handful of round trips


def test_a_reader_resuming_from_the_last_id_it_saw_gets_every_entry_once(
    store: RedisProvider,
) -> None:
    _, run = _kickoff(Tokens, store, count=300)
    first: list[StreamFrame] = []
    for frame in follow(store, run, count=50):
        first.append(frame)
        if len(first) == 120:
            break
    rest = list(follow(store, run, from_id=first[-1].id, count=50))
    everything = _data(first + rest)
    assert [f.id for f in everything] == [f.id for f in _data(list(follow(store, run)))]
    assert len({f.id for f in everything}) == len(everything) == 303


def test_channels_select_what_a_reader_gets(store: RedisProvider) -> None:
    _, run = _kickoff(Tokens, store, count=200)
    frames = list(follow(store, run, channels=["progress"]))
    assert [f.channel for f in frames] == ["progress", "progress", "flow"]


def test_the_stream_is_capped_by_stream_maxlen(
    store: RedisProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNNER_STREAM_MAXLEN", "100")
    reset_settings()
    try:
        _, run = _kickoff(Tokens, store, count=1000)
    finally:
        monkeypatch.delenv("RUNNER_STREAM_MAXLEN")
        reset_settings()
    assert store.stream_info(run).length == 100
    kept = [f.content for f in _data(list(follow(store, run))) if f.channel == "tokens"]
    assert kept == [token(i) for i in range(1000)][-len(kept) :]
    assert len(kept) == 99  # the last 100 entries: t901 ... t999 and the progress at 1000
    # A reader from the start is told first that it cannot get every entry; one resuming
    # after an entry still kept is not.
    frames = list(follow(store, run))
    assert frames[0].type == "stream_trimmed" and frames[0].data["after"] == "0"
    assert next(f.type for f in follow(store, run, from_id=frames[50].id)) == "chunk"


def test_the_stream_is_deleted_with_its_run(store: RedisProvider, redis_url: str) -> None:
    _, run = _kickoff(Tokens, store, count=10)
    assert store.stream_info(run).length == 10
    assert store.delete_run(run)
    client = redis.Redis.from_url(redis_url)
    assert client.keys(f"{store.keys.prefix}:{{{run}}}:*") == []
    client.close()


def test_a_chunk_that_is_not_json_fails_its_step_at_once_naming_it(store: RedisProvider) -> None:
    flow = BadChunk(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))
    with pytest.raises(NotStreamable, match="stream_chunk in step bad: the payload is not JSON"):
        flow.kickoff()
    run = flow.state.id
    assert store.run(run).status.value == "failed"  # type: ignore[union-attr]
    chunks = [f.content for f in _data(list(follow(store, run)))]
    assert chunks == ["fine so far"]  # written before the bad one, once: no retry


def test_a_reader_of_an_unknown_run_gets_run_not_found(store: RedisProvider) -> None:
    with pytest.raises(RunNotFound, match="no run nope"):
        follow(store, "nope")


def test_a_stream_true_flow_kickoff_returns_a_crewai_stream_session() -> None:
    session = StreamingFlow().kickoff(inputs={"count": 5})
    frames = list(session)
    assert session.is_completed and session.frames == frames
    assert session.result == "".join(token(i) for i in range(5)).upper()
    assert [f.content for f in frames if f.channel == "tokens"] == [token(i) for i in range(5)]
    kinds = [
        (f.channel, f.type, f.event.get("method_name") if f.channel == "flow" else f.step)
        for f in frames
    ]
    assert kinds[0] == ("flow", "flow_started", None)
    assert ("flow", "method_execution_started", "first") in kinds
    assert ("progress", "chunk", "second#1") in kinds
    assert kinds[-1] == ("flow", "flow_finished", None)
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))


def test_a_stream_true_flow_kickoff_async_returns_an_async_session() -> None:
    async def main() -> tuple[list[str], Any]:
        session = await StreamingFlow().kickoff_async(inputs={"count": 3})
        seen = [f.content async for f in session if f.channel == "tokens"]
        return seen, session.result

    seen, result = asyncio.run(main())
    assert seen == [token(i) for i in range(3)]
    assert result == "T0 T1 T2 "


def test_reading_the_result_before_the_stream_is_consumed_is_an_error() -> None:
    session = StreamingFlow().kickoff(inputs={"count": 2})
    with pytest.raises(RuntimeError, match="consume the stream"):
        _ = session.result
    list(session)


def test_a_crew_run_inline_streams_its_agents_llm_tokens_tagged_with_its_run(
    store: RedisProvider,
) -> None:
    flow = CrewStreams(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))
    out, run = flow.kickoff(), flow.state.id
    assert out == "Wasps do not."
    # The usage the streamed answer reported (on its last chunk) is recorded.
    assert (flow.usage_metrics.prompt_tokens, flow.usage_metrics.completion_tokens) == (7, 3)
    frames = _data(list(follow(store, run)))
    assert {(f.channel, f.type) for f in frames} == {("llm", "llm_stream_chunk")}
    assert "".join(f.content for f in frames) == "Bees make honey.Wasps do not."
    children = {f.run_id for f in frames}
    assert len(children) == 1 and run not in children  # the crew's own run id
    assert [f.step for f in frames] == ["draft#1"] * 3 + ["reply#1"] * 3


def test_stream_chunk_outside_a_step_does_nothing() -> None:
    Tokens().stream_chunk("nobody listens")


def test_chunk_text_reads_the_chunks_of_the_usual_clients() -> None:
    from types import SimpleNamespace as NS

    from runner.flow.streaming import chunk_text

    openai = NS(choices=[NS(delta=NS(content="Hi"))])
    openai_dict = {"choices": [{"delta": {"content": " there"}}]}
    last = NS(choices=[NS(delta=NS(content=None))])  # the finishing chunk has no text
    langchain = NS(content="!", usage_metadata=None)
    assert [chunk_text(c) for c in (openai, openai_dict, last, langchain, "s", {"x": 1})] == [
        "Hi",
        " there",
        "",
        "!",
        "s",
        None,
    ]


def test_an_in_process_retry_supersedes_the_first_attempts_entries(store: RedisProvider) -> None:
    out, run = _kickoff(Tokens, store, count=5, fail_first=True)
    assert out == 5
    frames = list(follow(store, run))
    assert [(f.type, f.attempt, f.superseded) for f in frames if f.step] == [
        *[("chunk", 1, True)] * 5,
        ("attempt", 2, False),
        *[("chunk", 2, False)] * 5,
    ]


@pytest.mark.processes
def test_runner_watch_stream_on_a_terminal_shows_the_steps_text_under_the_live_table(
    store: RedisProvider, redis_url: str
) -> None:
    """An in-process run with a Redis store, watched by ``runner watch --stream`` on a pty."""
    import os
    import pty
    import re
    import select
    import subprocess
    import sys
    import threading

    flow = Tokens(checkpoint=CheckpointConfig(provider=store, on_events=["*"]))
    run = flow.state.id
    worker = threading.Thread(target=flow.kickoff, kwargs={"inputs": {"count": 60, "delay": 0.02}})
    worker.start()
    while store.run(run) is None:
        time.sleep(0.01)
    env = {**os.environ, "RUNNER_REDIS_URL": redis_url, "RUNNER_PREFIX": store.keys.prefix}
    env.update(COLUMNS="200", LINES="50", TERM="xterm")
    main, side = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "watch", run, "--stream"],
        env=env,
        stdin=side,
        stdout=side,
        stderr=side,
    )
    os.close(side)
    out = b""
    while True:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                got = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not got:
                break
            out += got
        elif proc.poll() is not None:
            break
    os.close(main)
    worker.join()
    assert proc.wait(timeout=30) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    assert "write#1" in text and "tally#1" in text, text[-3000:]  # the table and the panel
    missing = [i for i in range(60) if token(i) not in text]
    assert not missing, (missing, text[-3000:])
    assert text.rstrip().endswith("succeeded: 60"), text[-3000:]
