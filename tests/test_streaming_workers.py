"""A run's stream on real workers: read live by ``handle.stream()`` (sync and async), by
``runner watch --stream`` and ``runner submit --wait --stream`` (subprocesses), resumed from
an id; a retry and a SIGKILLed worker's attempt superseded, nothing written before the kill
lost; a crew child's entries in its parent's stream. (The console's panel in Chromium:
``tests/test_streaming_console.py``.)"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from typing import Any

import redis

from runner.distributed.client import RunHandle, submit
from runner.store.models import RunStatus
from tests._dist_support import private_pool
from tests.flows.streams import BadChunk, CrewStreams, Tokens, executions, go_key, token

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _release(redis_url: str, run_id: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(go_key(run_id), 1, ex=600)
    client.close()


def test_a_step_streaming_500_tokens_is_read_live_by_handle_stream(rt: Any, redis_url: str) -> None:
    handle = submit(Tokens, {"count": 500, "delay": 0.002, "hold": True}, rt=rt)
    stream = handle.stream(channels=["tokens"])
    seen: list[str] = []
    frames = iter(stream)
    for frame in frames:
        seen.append(frame.content)
        if len(seen) == 500:
            break
    assert seen == [token(i) for i in range(500)]
    # Every token arrived while the step still runs: it has not committed.
    assert handle.status() is RunStatus.RUNNING
    assert all(c.step != "write" for c in rt.store.history(handle.run_id))
    _release(redis_url, handle.run_id)
    rest = list(frames)
    assert [f.type for f in rest] == ["flow_finished"]
    assert stream.is_completed and stream.result == 500 == rest[0].data["result"]


def test_handle_stream_is_an_async_iterator_too_and_resumes_from_an_id(rt: Any) -> None:
    handle = submit(Tokens, {"count": 60, "delay": 0.005}, rt=rt)

    async def first_part() -> list[Any]:
        got = []
        async for frame in handle.stream():
            got.append(frame)
            if len(got) == 25:
                break
        return got

    first = asyncio.run(first_part())
    again = handle.stream(from_id=first[-1].id)
    rest = list(again)
    ids = [f.id for f in first + rest[:-1]]
    assert len(ids) == len(set(ids)) == 60
    tokens = [f.content for f in first + rest if f.channel == "tokens"]
    assert tokens == [token(i) for i in range(60)]
    assert again.result == 60


def test_a_retried_step_supersedes_its_first_attempts_entries(rt: Any) -> None:
    handle = submit(Tokens, {"count": 20, "fail_first": True}, rt=rt)
    live = list(handle.stream())
    marks = [f for f in live if f.type == "attempt"]
    assert [(m.step, m.attempt, m.data) for m in marks] == [("write#1", 2, {"supersedes": 1})]
    after = list(handle.stream())
    tokens = [f for f in after if f.channel == "tokens"]
    assert [(f.attempt, f.superseded) for f in tokens] == [(1, True)] * 20 + [(2, False)] * 20
    assert after[-1].data["result"] == 20


def test_a_crew_childs_entries_are_in_its_parents_stream_with_the_childs_run_id(rt: Any) -> None:
    handle = submit(CrewStreams, {}, rt=rt)
    frames = [f for f in handle.stream() if f.channel == "llm"]
    assert "".join(f.content for f in frames) == "Bees make honey.Wasps do not."
    (child,) = {f.run_id for f in frames}
    assert child != handle.run_id
    assert rt.store.run(child) is not None
    assert handle.result() == "Wasps do not."


def test_a_chunk_that_is_not_json_fails_the_step_on_a_worker_unretried(rt: Any) -> None:
    handle = submit(BadChunk, {}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.FAILED
    info = handle.info()
    assert info.error is not None and "stream_chunk in step bad" in info.error
    assert executions(handle.run_id, "bad") == 2  # this call made it 2: the step ran once
    frames = list(handle.stream())
    assert [f.content for f in frames if f.channel == "tokens"] == ["fine so far"]
    assert frames[-1].type == "flow_failed"


def _cli(env: dict[str, str], *args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_runner_watch_stream_prints_tokens_while_the_step_runs(
    rt: Any, worker_env: dict[str, str], redis_url: str
) -> None:
    handle = submit(Tokens, {"count": 500, "delay": 0.002, "hold": True}, rt=rt)
    proc = _cli(worker_env, "watch", handle.run_id, "--stream")
    assert proc.stdout is not None
    text = ""
    deadline = time.monotonic() + 60
    while token(499) not in text:
        assert time.monotonic() < deadline, text[-500:]
        text += os.read(proc.stdout.fileno(), 4096).decode()  # what is there, not 64 chars
    assert handle.status() is RunStatus.RUNNING  # printed before the step committed
    _release(redis_url, handle.run_id)
    out, err = proc.communicate(timeout=60)
    text += out
    assert proc.returncode == 0, err
    assert re.findall(r"t\d+ ", text) == [token(i) for i in range(500)]
    assert '[write#1 progress] {"done": 500, "of": 500}' in text
    assert text.rstrip().endswith("succeeded: 500")


def test_runner_submit_wait_stream_prints_tokens_then_the_result(
    rt: Any, worker_env: dict[str, str]
) -> None:
    proc = _cli(
        worker_env,
        "submit",
        "tests.flows.streams:Tokens",
        "--input",
        "count=40",
        "--wait",
        "--stream",
    )
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert re.findall(r"t\d+ ", out) == [token(i) for i in range(40)]
    assert out.rstrip().endswith("succeeded: 40")


def test_runner_watch_stream_of_an_unknown_run_is_one_line(worker_env: dict[str, str]) -> None:
    proc = _cli(worker_env, "watch", "no-such-run", "--stream")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert err.strip().count("\n") == 0 and "no-such-run" in err, err


def test_a_worker_killed_mid_stream_leaves_its_entries_superseded_by_the_retrys(
    worker_env: dict[str, str], tmp_path: Any
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, prt, _env):
        victim = pool.start(concurrency=1)
        handle = RunHandle(submit(Tokens, {"count": 100, "crawl_once": 0.1}, rt=prt).run_id, prt)
        seen = []
        for frame in handle.stream(channels=["tokens"]):
            seen.append(frame)
            if len(seen) == 15:
                break
        pool.kill(victim)
        pool.start(concurrency=1)
        assert handle.wait(timeout=60) is RunStatus.SUCCEEDED
        frames = list(handle.stream())
        by_id = {f.id: f for f in frames}
        # Nothing the killed attempt wrote before the kill is lost; it is superseded.
        assert all(f.id in by_id and by_id[f.id].superseded for f in seen)
        assert [(f.content, f.attempt) for f in seen] == [(token(i), 1) for i in range(15)]
        marks = [f for f in frames if f.type == "attempt"]
        assert [(m.attempt, m.data) for m in marks] == [(2, {"supersedes": 1})]
        current = [f.content for f in frames if f.channel == "tokens" and not f.superseded]
        assert current == [token(i) for i in range(100)]
        assert frames[-1].data["result"] == 100
