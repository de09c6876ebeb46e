"""Token usage (issue 21, point 4): ``flow.usage_metrics`` over the last kickoff or resume,
recorded by the ``Agent``'s LLM adapter and ``record_usage``, kept per step in its
checkpoint, summed over a run and its child runs, shown by ``runner steps`` and the console,
with what a resume saved; in process and on real workers.

The flows are :mod:`tests.flows.tokens`: ``Spender`` spends 120 (plan), 40 (write) and 10
(review) tokens; ``CrewHost`` spends 15, then 5 and a crew of three agents (216) in one step.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from runner import (
    CheckpointConfig,
    Flow,
    HumanFeedbackPending,
    PendingFeedbackContext,
    SQLiteFlowPersistence,
    UsageMetrics,
    and_,
    human_feedback,
    listen,
    record_usage,
    start,
)
from runner.distributed import control
from runner.distributed.client import submit
from runner.flow.children import child_run_id
from runner.flow.usage import usage_of
from runner.store.base import CheckpointStore
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider
from tests._dist_support import history, runner_cli
from tests.console_support import serving
from tests.flows.tokens import CREW_TOKENS, CrewHost, Retrying, Spender


def _tag() -> str:
    return uuid.uuid4().hex[:10]


def _steps(ckpts: list[Checkpoint]) -> dict[str, int | None]:
    """Step -> the tokens its checkpoint recorded (step commits, failures), oldest first."""
    kinds = ("method_execution_finished", "method_execution_failed")
    return {
        f"{c.step}:{c.event.rsplit('_', 1)[1]}": (c.usage.total_tokens if c.usage else None)
        for c in ckpts
        if c.event in kinds
    }


def _store_history(store: CheckpointStore, run_id: str) -> list[Checkpoint]:
    return list(reversed(store.history(run_id, limit=1000)))


@pytest.fixture
def store(redis_url: str, prefix: str) -> Any:
    made = RedisProvider(redis_url, prefix=prefix)
    yield made
    made.close()


def _runner(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``runner ARGS`` as a user runs it: a subprocess, wide enough not to fold the table."""
    done = runner_cli(env, *args, COLUMNS="200", NO_COLOR="1")
    assert done.returncode == 0, done.stderr
    return done


# --- reading usage and recording it ------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # OpenAI's chat completion usage, cached tokens in its details
        (
            {
                "usage": {
                    "prompt_tokens": 100,
                    "completion_tokens": 50,
                    "total_tokens": 150,
                    "prompt_tokens_details": {"cached_tokens": 30},
                    "completion_tokens_details": {"reasoning_tokens": 7},
                }
            },
            UsageMetrics(
                total_tokens=150,
                prompt_tokens=100,
                completion_tokens=50,
                cached_prompt_tokens=30,
                reasoning_tokens=7,
                successful_requests=1,
            ),
        ),
        # Anthropic: input_tokens is the uncached part; the prompt adds the cache counters
        (
            {
                "input_tokens": 12,
                "output_tokens": 8,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20,
            },
            UsageMetrics(
                total_tokens=140,
                prompt_tokens=132,
                completion_tokens=8,
                cached_prompt_tokens=100,
                cache_creation_tokens=20,
                successful_requests=1,
            ),
        ),
        # Gemini's usage_metadata
        (
            {
                "usage_metadata": {
                    "prompt_token_count": 30,
                    "candidates_token_count": 20,
                    "thoughts_token_count": 5,
                }
            },
            UsageMetrics(
                total_tokens=50,
                prompt_tokens=30,
                completion_tokens=20,
                reasoning_tokens=5,
                successful_requests=1,
            ),
        ),
        # LangChain's usage_metadata with its details
        (
            {
                "content": "x",
                "usage_metadata": {
                    "input_tokens": 40,
                    "output_tokens": 9,
                    "input_token_details": {"cache_read": 4},
                },
            },
            UsageMetrics(
                total_tokens=49,
                prompt_tokens=40,
                completion_tokens=9,
                cached_prompt_tokens=4,
                successful_requests=1,
            ),
        ),
        # garbage counts are 0, as CrewAI reads them; the request still counts
        (
            {"prompt_tokens": "n/a", "completion_tokens": None, "total_tokens": 7},
            UsageMetrics(successful_requests=1),
        ),
        ("a plain answer", None),
        ({"answer": 42}, None),
    ],
    ids=["openai", "anthropic", "gemini", "langchain", "garbage", "text", "no-usage"],
)
def test_a_clients_usage_fields_are_read_as_crewai_reads_them(answer: Any, expected: Any) -> None:
    assert usage_of(answer) == expected


def test_usage_metrics_has_crewais_methods() -> None:
    assert UsageMetrics.from_provider_dict(None) is None
    assert UsageMetrics.from_provider_dict({}) is None
    assert UsageMetrics.from_provider_dict({"prompt_tokens": 4, "completion_tokens": 6}) == (
        UsageMetrics(total_tokens=10, prompt_tokens=4, completion_tokens=6, successful_requests=1)
    )
    spent = UsageMetrics(total_tokens=10, prompt_tokens=4, successful_requests=1)
    spent.add_usage_metrics(UsageMetrics(total_tokens=5, completion_tokens=5))
    assert spent == UsageMetrics(
        total_tokens=15, prompt_tokens=4, completion_tokens=5, successful_requests=1
    )
    later = UsageMetrics(total_tokens=40, prompt_tokens=30, successful_requests=3)
    assert later.delta_since(spent) == UsageMetrics(
        total_tokens=25, prompt_tokens=26, successful_requests=2
    )


def test_record_usage_outside_a_step_records_nothing_and_bad_input_is_one_error() -> None:
    assert record_usage(prompt_tokens=5) is None
    with pytest.raises(ValueError, match="found no usage fields"):
        record_usage({"answer": 1})
    with pytest.raises(ValueError, match="no count prompt"):
        record_usage(prompt=5)
    with pytest.raises(ValueError, match=">= 0"):
        record_usage(prompt_tokens=-1)
    with pytest.raises(ValueError, match="whole numbers"):
        record_usage(prompt_tokens="12")
    with pytest.raises(ValueError, match="takes a usage"):
        record_usage()


# --- in process ----------------------------------------------------------------------------------


def test_in_process_usage_is_kept_per_step_and_summed_over_the_last_kickoff(
    store: RedisProvider,
) -> None:
    flow = Spender(checkpoint=CheckpointConfig(provider=store))
    assert flow.kickoff({"tag": _tag()}) == "reviewed"
    assert flow.usage_metrics == UsageMetrics(
        total_tokens=170,
        prompt_tokens=138,
        completion_tokens=32,
        cached_prompt_tokens=30,
        successful_requests=3,
    )
    assert flow.state.seen == 160  # inside write: plan's 120 committed, its own 40 so far
    steps = _steps(_store_history(store, flow.flow_id))
    assert steps == {"plan:finished": 120, "write:finished": 40, "review:finished": 10}
    latest = store.latest(flow.flow_id)
    assert latest is not None and latest.meta.usage is not None
    assert latest.meta.usage.total.total_tokens == latest.meta.usage.last.total_tokens == 170
    copy = flow.usage_metrics
    copy.total_tokens = 1
    assert flow.usage_metrics.total_tokens == 170  # a copy, as CrewAI's

    flow.kickoff()  # the same run again from its starts: the last kickoff's sum only
    assert flow.usage_metrics.total_tokens == 170
    latest = store.latest(flow.flow_id)
    assert latest is not None and latest.meta.usage is not None
    assert latest.meta.usage.total.total_tokens == 340


def test_in_process_a_retried_step_keeps_what_every_attempt_spent(store: RedisProvider) -> None:
    flow = Retrying(checkpoint=CheckpointConfig(provider=store))
    assert flow.kickoff({"tag": _tag(), "fail": True}) == "written"
    assert _steps(_store_history(store, flow.flow_id)) == {"write:finished": 80}
    assert flow.usage_metrics.total_tokens == 80


class Branches(Flow):
    """Parallel branches, one async, recording on their own threads and event loop."""

    @start()
    def fan(self) -> None:
        record_usage(prompt_tokens=1)

    @listen(fan)
    async def left(self) -> None:
        await asyncio.sleep(0.01)
        record_usage(prompt_tokens=10)

    @listen(fan)
    def right(self) -> None:
        time.sleep(0.01)
        record_usage(prompt_tokens=100)

    @listen(and_(left, right))
    def join(self) -> None:
        record_usage(prompt_tokens=1000)


def test_in_process_parallel_and_async_steps_each_keep_their_own_usage() -> None:
    flow = Branches()
    flow.kickoff()
    assert flow.usage_metrics == UsageMetrics(
        total_tokens=1111, prompt_tokens=1111, successful_requests=4
    )


class Later:
    """A feedback provider that lets the run pause for a person elsewhere."""

    def request_feedback(self, context: PendingFeedbackContext, flow: Any) -> str:
        raise HumanFeedbackPending(context)


def judge(prompt: str) -> Any:
    """The review's llm: an OpenAI-style answer (7 tokens) naming a label."""
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    return SimpleNamespace(content="approved", usage=usage)


class Reviewed(Flow):
    """draft (100 tokens) -> review (50, then waits for a person; the answer's label costs
    the llm 7) -> publish (5)."""

    @start()
    def draft(self) -> str:
        record_usage(prompt_tokens=100)
        return "draft"

    @listen(draft)
    @human_feedback(message="Ship it?", emit=["approved", "rejected"], llm=judge, provider=Later())
    def review(self) -> str:
        record_usage(prompt_tokens=50)
        return "article"

    @listen("approved")
    def publish(self) -> str:
        record_usage(prompt_tokens=5)
        return "published"


def test_in_process_a_review_pause_keeps_what_the_reviewed_method_spent(tmp_path: Path) -> None:
    persistence = SQLiteFlowPersistence(tmp_path / "flows.db")
    flow = Reviewed(persistence=persistence)
    pending = flow.kickoff()
    assert isinstance(pending, HumanFeedbackPending)
    assert flow.usage_metrics.total_tokens == 150
    run_id = pending.context.flow_id

    answered = Reviewed.from_pending(run_id, persistence)
    assert answered.resume("looks good") == "published"
    assert answered.usage_metrics.total_tokens == 12  # the llm's label and publish
    ckpts = _store_history(persistence.store, run_id)
    paused = [c.usage.total_tokens for c in ckpts if c.event == "flow_paused" and c.usage]
    assert paused == [50]
    sums = ckpts[-1].meta.usage
    assert sums is not None and sums.saved is not None
    # The reviewed method never runs again: the answer's resume saved it with the draft.
    assert (sums.total.total_tokens, sums.saved.total_tokens) == (162, 150)


def test_in_process_a_crews_usage_is_summed_into_the_step_that_ran_it(
    store: RedisProvider,
) -> None:
    flow = CrewHost(checkpoint=CheckpointConfig(provider=store))
    flow.kickoff({"tag": _tag()})
    assert flow.usage_metrics == UsageMetrics(
        total_tokens=15 + 5 + CREW_TOKENS,
        prompt_tokens=10 + 3 + 100 + 50 + 30,
        completion_tokens=5 + 2 + 20 + 10 + 6,
        cached_prompt_tokens=30,
        reasoning_tokens=4,
        successful_requests=5,
    )
    parent = _steps(_store_history(store, flow.flow_id))
    assert parent == {
        "intro:finished": 15,
        "stage:finished": 5 + CREW_TOKENS,
        "done:finished": None,
    }
    child_id = child_run_id(flow.flow_id, "stage#1")
    child = _steps(_store_history(store, child_id))
    assert child == {"draft:finished": 120, "edit:finished": 60, "polish:finished": 36}
    latest = store.latest(child_id)
    assert latest is not None and latest.meta.usage is not None
    assert latest.meta.usage.total.total_tokens == CREW_TOKENS


@pytest.mark.processes
def test_in_process_a_resume_spends_only_the_steps_left_and_shows_what_it_saved(
    store: RedisProvider, redis_url: str, prefix: str
) -> None:
    cfg = CheckpointConfig(provider=store)
    flow = Spender(checkpoint=cfg)
    with pytest.raises(RuntimeError, match="planned failure"):
        flow.kickoff({"tag": _tag(), "fail": True})
    assert flow.usage_metrics.total_tokens == 160  # the failed attempt's 40 were spent too
    run_id = flow.flow_id

    again = Spender(checkpoint=cfg)
    assert again.kickoff(from_checkpoint=run_id) == "reviewed"
    assert again.usage_metrics.total_tokens == 50  # write and review, not plan
    latest = store.latest(run_id)
    assert latest is not None and latest.meta.usage is not None
    sums = latest.meta.usage
    assert (sums.total.total_tokens, sums.last.total_tokens) == (210, 50)
    assert sums.saved is not None and sums.saved.total_tokens == 120
    assert _steps(_store_history(store, run_id)) == {
        "plan:finished": 120,
        "write:failed": 40,
        "write:finished": 40,
        "review:finished": 10,
    }

    out = _runner({"RUNNER_REDIS_URL": redis_url, "RUNNER_PREFIX": prefix}, "steps", run_id).stdout
    assert "tokens" in out.splitlines()[0]
    rows = {line.split()[0]: line.split() for line in out.splitlines() if "#" in line}
    assert rows["plan#1"][-1] == "120" and rows["review#1"][-1] == "10"
    assert f"run {run_id}: 210 tokens (" in out
    assert "since its latest start or resume 50 tokens" in out
    saved = "saved by that resume (completed steps not run again): 120 tokens (100 prompt, "
    assert saved + "20 completion, 30 cached, 1 request)" in out


# --- on workers ------------------------------------------------------------------------------


def test_on_workers_usage_is_kept_per_step_and_summed_per_run(rt: Any) -> None:
    handle = submit(Spender, {"tag": _tag()}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.SUCCEEDED
    ckpts = history(rt, handle.run_id)
    assert _steps(ckpts) == {"plan:finished": 120, "write:finished": 40, "review:finished": 10}
    latest = ckpts[-1]
    assert latest.state["seen"] == 160  # self.usage_metrics inside a step on a worker
    assert latest.meta.usage is not None
    assert latest.meta.usage.last == UsageMetrics(
        total_tokens=170,
        prompt_tokens=138,
        completion_tokens=32,
        cached_prompt_tokens=30,
        successful_requests=3,
    )


def test_on_workers_a_retried_step_keeps_what_every_attempt_spent(rt: Any) -> None:
    handle = submit(Retrying, {"tag": _tag(), "fail": True}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.SUCCEEDED
    ckpts = history(rt, handle.run_id)
    assert _steps(ckpts) == {"write:finished": 80}  # the failed attempt's 40 and the retry's
    assert ckpts[-1].meta.usage is not None
    assert ckpts[-1].meta.usage.last.total_tokens == 80


def test_on_workers_a_crew_child_runs_usage_is_summed_into_its_parent(rt: Any) -> None:
    handle = submit(CrewHost, {"tag": _tag()}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.SUCCEEDED
    parent = history(rt, handle.run_id)
    assert _steps(parent) == {
        "intro:finished": 15,
        "stage:finished": 5 + CREW_TOKENS,
        "done:finished": None,
    }
    child = history(rt, child_run_id(handle.run_id, "stage#1"))
    assert _steps(child) == {"draft:finished": 120, "edit:finished": 60, "polish:finished": 36}
    sums = parent[-1].meta.usage
    assert sums is not None and sums.total.total_tokens == 15 + 5 + CREW_TOKENS
    assert handle.usage_metrics == sums.last == sums.total
    assert handle.usage_metrics.successful_requests == 5


def test_on_workers_a_resume_shows_what_it_saved_in_runner_steps_and_the_console(
    rt: Any, worker_env: dict[str, str]
) -> None:
    handle = submit(Spender, {"tag": _tag(), "fail": True}, rt=rt)
    assert handle.wait(timeout=30) is RunStatus.FAILED
    failed = handle.latest().meta.usage
    assert failed is not None and failed.total.total_tokens == 160
    assert control.resume(handle.run_id, rt=rt).wait(timeout=30) is RunStatus.SUCCEEDED
    sums = handle.latest().meta.usage
    assert sums is not None and sums.saved is not None
    assert (sums.total.total_tokens, sums.last.total_tokens, sums.saved.total_tokens) == (
        210,
        50,
        120,
    )
    assert handle.usage_metrics.total_tokens == 50

    out = _runner(worker_env, "steps", handle.run_id).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith("write")]
    assert [(r[2], r[-1]) for r in rows] == [("failed", "40"), ("done", "40")]
    assert "saved by that resume (completed steps not run again): 120 tokens" in out

    with serving(rt) as url:
        detail = httpx.get(f"{url}/api/runs/{handle.run_id}", timeout=10).json()
        page = httpx.get(f"{url}/runs/{handle.run_id}", timeout=10).text
    assert detail["usage"]["saved"]["total_tokens"] == 120
    assert detail["usage"]["total"]["total_tokens"] == 210
    tokens = [row["usage"]["total_tokens"] for row in detail["timeline"] if row["usage"]]
    assert sorted(tokens) == [10, 40, 40, 120]
    assert 'id="usage-total" data-tokens="210"' in page
    assert 'id="usage-last" data-tokens="50"' in page
    assert 'id="usage-saved" data-tokens="120"' in page

    # A fork is a new run: it spends what it runs again; the steps it keeps saved the rest.
    fork = control.fork(handle.run_id, rerun=["review"], rt=rt)
    assert fork.wait(timeout=30) is RunStatus.SUCCEEDED
    forked = fork.latest().meta.usage
    assert forked is not None and forked.saved is not None
    assert (forked.total.total_tokens, forked.saved.total_tokens) == (10, 160)
    assert [c.usage for c in history(rt, fork.run_id) if c.event == "forked"] == [None]
