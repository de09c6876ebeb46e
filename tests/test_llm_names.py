"""LLMs by name: CrewAI's ``llm="gpt-4o-mini"`` on ``@human_feedback`` and ``Agent``.

A name stands for the client registered under it with ``runner.register_llm`` (a worker
registers by importing an allow-listed module that does: ``tests/flows/llm_names.py``). It
is resolved only when a call is needed, so decorating never fails on it and a review
answered with an explicit outcome (or empty) never needs it. An unknown name, when a call is
needed, fails the step once (not retried) with one line saying how to register it; after
registering, a resume finishes the step, the reviewed method not running again.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

import runner
from runner import Flow, HumanFeedbackPending, flow_config, human_feedback, start
from runner.cli import app
from runner.crew import Agent
from runner.distributed import control
from runner.distributed.client import RunHandle
from runner.errors import DefinitionError, InvalidFeedback, RunFailed
from runner.flow.children import child_run_id
from runner.flow.human_feedback import collapse
from runner.flow.llm import register_llm, registered_llms
from runner.store.models import Checkpoint, RunStatus
from tests._dist_support import private_pool
from tests.conftest import flow_modules
from tests.flows.declared import ECHO
from tests.flows.dist import executions
from tests.flows.llm_names import (
    EDITOR,
    LATE,
    LATE_ENV,
    WRITER,
    CrewByName,
    GhostCrewByName,
    ReviewByEditor,
    ReviewByLate,
    ghost_crew,
    named_crew,
)

STEPS = ("draft", "review", "publish", "shelve")


def as_the_workers() -> None:
    """Register here what the test workers register: every module of their allow-list
    imported (once per process: a module registers its names when first imported)."""
    for module in flow_modules().split(","):
        importlib.import_module(module)


def unknown(name: str) -> str:
    """The one line an unknown ``name`` fails with, in a process registering what the
    test workers register."""
    as_the_workers()
    assert {EDITOR, WRITER, ECHO} <= set(registered_llms())
    known = ", ".join(repr(n) for n in registered_llms())
    return (
        f"no LLM is registered under the name {name!r} (registered: {known}); register your "
        f"client in a module the workers import: runner.register_llm({name!r}, client), "
        "or install crewai or litellm to resolve model names through them"
    )


class Answering:
    """A reviewer who answers at once with ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def request_feedback(self, context: Any, flow: Any) -> str:
        return self.text


class Later:
    """A reviewer who will answer later: the run pauses."""

    def request_feedback(self, context: Any, flow: Any) -> str:
        raise HumanFeedbackPending(context)


@pytest.fixture(autouse=True)
def registry_and_reviewer() -> Iterator[None]:
    """Each test leaves the registry as the flow modules set it, and no reviewer set. The
    modules are imported before the registry is read, so what they register is never taken
    for a test's own registration (and dropped after it)."""
    as_the_workers()
    before = registered_llms()
    assert LATE not in before
    yield
    flow_config.hitl_provider = None
    for name in set(registered_llms()) - set(before):
        register_llm(name, None)


def ran(r: redis.Redis, run_id: str) -> list[int]:
    return [executions(r, run_id, m) for m in STEPS]


# --- in process -----------------------------------------------------------------------------


def test_a_name_is_taken_where_crewai_takes_one_and_bad_llms_are_still_one_error() -> None:
    class Reviewed(Flow):
        @start()
        @human_feedback(message="OK?", emit=["yes", "no"], llm="gpt-4o-mini")
        def work(self) -> str:
            return "w"

        @start()
        @human_feedback(message="Notes?", llm="some-model")
        def other(self) -> str:
            return "o"

    assert Reviewed.work.__human_feedback_config__.llm == "gpt-4o-mini"
    assert Agent(role="Writer", llm="gpt-4o-mini").llm == "gpt-4o-mini"
    assert "register_llm" in runner.__all__ and runner.register_llm is register_llm

    for bad in ("", "  ", 42):
        with pytest.raises(InvalidFeedback, match=r"or a name given to runner\.register_llm"):
            human_feedback(message="OK?", emit=["yes"], llm=bad)
        with pytest.raises(DefinitionError, match=r"or a name given to runner\.register_llm"):
            Agent(role="Writer", llm=bad)
    with pytest.raises(TypeError, match="takes a non-empty name"):
        register_llm("", lambda p: p)
    with pytest.raises(TypeError, match=r"register_llm\('m', \.\.\.\) takes a client"):
        register_llm("m", "gpt-4o-mini")  # a name is no client: no aliases
    assert "m" not in registered_llms()


def test_a_registered_name_collapses_a_review_in_process(redis_client: redis.Redis) -> None:
    for answer, result in (("ship it", "published DRAFT ON OTTERS"), ("too thin", "shelved")):
        flow_config.hitl_provider = Answering(answer)
        flow = ReviewByEditor()
        assert flow.kickoff({"topic": "otters"}) == result
        heard = flow.last_human_feedback
        assert heard is not None
        assert heard.outcome == ("approved" if answer == "ship it" else "rejected")


def test_an_empty_answer_needs_no_llm_even_by_an_unknown_name(redis_client: redis.Redis) -> None:
    flow_config.hitl_provider = Answering("  ")
    flow = ReviewByLate()
    assert flow.kickoff({"topic": "eels"}) == "published DRAFT ON EELS"  # the first label


def test_an_unknown_name_fails_the_review_in_one_line_and_registering_then_resuming_finishes(
    redis_client: redis.Redis,
) -> None:
    flow_config.hitl_provider = Later()
    flow = ReviewByLate()
    assert isinstance(flow.kickoff({"topic": "owls"}), HumanFeedbackPending)
    run_id = flow.flow_id

    with pytest.raises(DefinitionError) as failed:
        ReviewByLate.from_pending(run_id).resume("ship it")
    assert str(failed.value) == unknown(LATE)
    assert failed.value.fields == {"llm": LATE}

    register_llm(LATE, lambda prompt: "approved")
    assert ReviewByLate.from_pending(run_id).resume("ship it") == "published DRAFT ON OWLS"
    assert ran(redis_client, run_id) == [1, 1, 1, 0]  # the reviewed method ran once


def test_a_client_that_raises_falls_back_to_the_first_label_an_unknown_name_does_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def down(prompt: str) -> str:
        raise ConnectionError("provider down")

    register_llm("flaky-model", down)
    with caplog.at_level(logging.WARNING, logger="runner.flow"):
        assert collapse("ship it", ["approved", "rejected"], "flaky-model") == "approved"
    assert "ConnectionError: provider down" in caplog.text
    caplog.clear()
    with pytest.raises(DefinitionError, match="'nobody-registered-me'"):
        collapse("no", ["approved", "rejected"], "nobody-registered-me")
    assert caplog.text == ""  # no guessed label, no warning


def test_an_agents_name_resolves_when_it_works_a_task_in_process() -> None:
    out = named_crew.kickoff({"topic": "moss"})
    assert out.raw == f"You are Writer. A writer. [pid {os.getpid()}]"
    with pytest.raises(DefinitionError) as failed:
        ghost_crew.kickoff({"topic": "moss"})
    assert str(failed.value) == unknown(LATE)


# --- on workers -------------------------------------------------------------------------------


def paused(handle: RunHandle, timeout: float = 30) -> Checkpoint:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = handle.latest()
        if latest.status is RunStatus.PAUSED:
            return latest
        if latest.status is RunStatus.FAILED:
            raise AssertionError(f"run {handle.run_id} failed: {latest.error}")
        time.sleep(0.05)
    raise AssertionError(f"run {handle.run_id} did not pause: {handle.latest().event}")


def test_on_workers_a_registered_name_collapses_and_an_explicit_outcome_needs_none(
    rt: Any, redis_client: redis.Redis
) -> None:
    by_name = ReviewByEditor.submit({"topic": "crows"}, rt=rt)
    by_late = ReviewByLate.submit({"topic": "jays"}, rt=rt)
    paused(by_name)
    paused(by_late)
    control.answer(by_name.run_id, "ship it", rt=rt)
    # LATE is registered nowhere on the test workers: a label chosen outright needs no llm.
    control.answer(by_late.run_id, "not yet", outcome="rejected", rt=rt)
    assert by_name.result(timeout=30) == "published DRAFT ON CROWS"
    assert by_late.result(timeout=30) == "shelved"
    assert ran(redis_client, by_name.run_id) == [1, 1, 1, 0]
    assert ran(redis_client, by_late.run_id) == [1, 1, 0, 1]


def test_on_workers_an_agents_name_resolves_in_the_worker_and_an_unknown_one_fails_once(
    rt: Any,
) -> None:
    handle = CrewByName.submit({"topic": "ferns"}, rt=rt)
    text = handle.result(timeout=30)
    pid = int(text.rsplit("[pid ", 1)[1].rstrip("]"))
    assert text == f"You are Writer. A writer. [pid {pid}]"
    assert pid != os.getpid()  # the worker's registry resolved it

    ghost = GhostCrewByName.submit({"topic": "ferns"}, rt=rt)
    with pytest.raises(RunFailed):
        ghost.result(timeout=30)
    child = rt.store.latest(child_run_id(ghost.run_id, "stage#1"))
    assert child is not None
    failure = child.error
    assert failure is not None
    assert (failure.type, failure.message, failure.attempts) == (
        "DefinitionError",
        unknown(LATE),
        1,
    )


@pytest.mark.slow
def test_on_workers_an_unknown_name_fails_the_review_once_then_register_and_resume_finishes(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        pool.start(concurrency=1)
        handle = ReviewByLate.submit({"topic": "bats"}, rt=rt)
        paused(handle)
        control.answer(handle.run_id, "ship it", by="ana", rt=rt)
        deadline = time.monotonic() + 30
        while handle.latest().status is not RunStatus.FAILED:
            assert time.monotonic() < deadline, handle.latest().event
            time.sleep(0.05)
        failed = handle.latest()
        failure = failed.error
        assert failure is not None
        assert (failure.type, failed.step, failure.attempts) == ("DefinitionError", "review", 1)
        assert failure.message == unknown(LATE)
        assert ran(redis_client, handle.run_id) == [1, 1, 0, 0]

        def cli(*args: str) -> Any:
            return CliRunner().invoke(app, list(args), env=env)

        status = json.loads(cli("status", handle.run_id, "--json").stdout)
        assert status["status"] == "failed"
        assert status["error"] == f"DefinitionError: {unknown(LATE)}"

        # The user registers the client in a module the workers import, and restarts them.
        pool.stop_all()
        pool.env[LATE_ENV] = LATE
        pool.start(concurrency=1)
        done = cli("resume", handle.run_id, "--wait")
        assert done.exit_code == 0, (done.stdout, done.stderr)
        assert "published DRAFT ON BATS" in done.stdout
        assert ran(redis_client, handle.run_id) == [1, 1, 1, 0]  # review ran once, answer kept
        final = handle.latest()
        (kept,) = final.meta.human.feedback
        assert (kept["feedback"], kept["outcome"]) == ("ship it", "approved")
