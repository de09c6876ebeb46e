"""Conversational flows on workers: each turn a new epoch of the same run, its history in the
run's checkpoints, so a conversation goes on whichever worker takes the next turn (every
worker killed between turns here). Refusals: a turn to a run still running its turn, to a
flow that is not conversational, with no text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.errors import InvalidInputs, RunStateError
from runner.store.models import RunStatus
from tests._dist_support import private_pool
from tests.flows.conversations import Chat, GatedChat, Helpdesk, NotAChat
from tests.flows.dist import client, key

pytestmark = pytest.mark.workers

TURNS = ["hello", "how are you", "tell me more", "why is that", "thanks, bye"]


def test_five_turns_go_on_across_worker_restarts_with_the_history_in_the_run(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        worker = pool.start(concurrency=1)
        handle = Chat.submit({"user_message": TURNS[0]}, rt=rt)
        assert handle.result(timeout=60) == "#1: hello"
        pids = {worker.pid}
        for n, text in enumerate(TURNS[1:], start=2):
            # The worker that took the last turn dies; a new process takes the next.
            pool.kill(worker)
            worker = pool.start(concurrency=1)
            pids.add(worker.pid)
            # The reply counts the user messages the history holds: a lost turn shows.
            assert handle.turn(text, timeout=60) == f"#{n}: {text}"
        assert len(pids) == 5
        said = handle.messages()
        assert [m["content"] for m in said if m["role"] == "user"] == TURNS
        assert [m["content"] for m in said if m["role"] == "assistant"] == [
            f"#{n}: {text}" for n, text in enumerate(TURNS, start=1)
        ]
        latest = handle.latest()
        assert latest.meta.epoch == 4  # one run, a new epoch per turn after the first
        assert latest.run_id == handle.run_id and latest.status is RunStatus.SUCCEEDED


def test_intents_and_a_returned_reply_are_kept_in_the_runs_history_on_workers(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start(concurrency=1)
        handle = Helpdesk.submit({"user_message": "hello there"}, rt=rt)
        assert handle.result(timeout=60) == "nice to chat about 'hello there'"
        assert handle.turn("any rain?", timeout=60).startswith("sunny (turn 2")
        assert handle.turn("bye", timeout=60) == "Conversation ended."
        said = [(m["role"], m["content"]) for m in handle.messages()]
        assert said[1] == ("assistant", "nice to chat about 'hello there'")
        assert len(said) == 6
        assert handle.latest().state["ended"] is True


def test_a_turn_to_a_running_run_a_plain_flow_or_with_no_text_is_one_clear_error(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start(concurrency=2)
        plain = NotAChat.submit({}, rt=rt)
        assert plain.result(timeout=60) == "done"
        with pytest.raises(InvalidInputs, match=f"run {plain.run_id}.*NotAChat is not one"):
            plain.turn("hi")
        gated = GatedChat.submit({"user_message": "wait"}, rt=rt)
        _wait_running(gated)
        with pytest.raises(RunStateError, match="still running its turn"):
            gated.turn("are you there?")
        client().set(key(gated.run_id, "gate", "turn"), 1)
        assert gated.result(timeout=60) == "released"
        with pytest.raises(InvalidInputs, match="empty"):
            gated.turn("  ")
        # The refused turns left nothing; the held turn's returned text became its reply.
        assert gated.turn("now?", timeout=60) == "#2: now?"
        assert [m["content"] for m in gated.messages()] == ["wait", "released", "now?", "#2: now?"]


def _wait_running(handle: Any) -> None:
    from tests._dist_support import eventually

    eventually(lambda: handle.latest().meta.epoch == 0 and handle.status() is RunStatus.RUNNING)


def test_a_declared_conversation_runs_its_turns_on_workers(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    from runner import submit_definition
    from tests.test_conversations import DECLARED

    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start(concurrency=1)
        handle = submit_definition(DECLARED, {"user_message": "hi"}, rt=rt)
        assert handle.result(timeout=60) == "#1: hi"
        assert handle.turn("again", timeout=60) == "#2: again"


def test_stream_turn_on_workers_gives_this_turns_tokens_then_its_result(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.flows.conversations import StreamingChat

    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        pool.start(concurrency=1)
        handle = StreamingChat.submit({"user_message": "first words"}, rt=rt)
        assert handle.result(timeout=60) == "#1: first words"
        stream = handle.stream_turn("second words", channels=["llm"])
        frames = list(stream)
        # Only this turn's tokens: the first turn's are before where the stream stood.
        assert [f.content for f in frames if f.type == "llm_stream_chunk"] == [
            "#2:",
            " second",
            " words",
        ]
        assert frames[-1].data["status"] == "succeeded"
        assert stream.result == "#2: second words"


def test_the_flows_own_start_runs_before_the_router_in_every_epoch_on_workers(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.flows.conversations import Onboarded

    with private_pool(worker_env, str(tmp_path)) as (pool, rt, _env):
        worker = pool.start(concurrency=1)
        handle = Onboarded.submit({"user_message": "hi"}, rt=rt)
        # Had the router run first, prepared would be 0 and the turn would take converse.
        assert handle.result(timeout=60) == "loaded in turn 1; prepared 1"
        pool.kill(worker)
        pool.start(concurrency=1)
        assert handle.turn("again", timeout=60) == "loaded in turn 1; prepared 2"
        assert handle.latest().state["last_intent"] == "answer"
