"""Flows and a crew whose steps spend tokens, for the usage tests (in process and on the
test workers).

The LLM clients answer offline, each in the shape of a real client's answer, with fixed
usage: :class:`OpenAIStyle` (a callable returning a chat completion: ``usage.prompt_tokens``,
``prompt_tokens_details.cached_tokens``), :class:`LangChainStyle` (``invoke`` returning a
message with ``usage_metadata``) and :class:`CrewAIStyle` (``call`` returning text, its
usage only in its lifetime counters, ``get_token_usage_summary()``).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import redis
from pydantic import BaseModel

from runner import Agent, Crew, Flow, FlowState, Task, listen, record_usage, start

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"])
    return _client


def first_time(tag: str, what: str) -> bool:
    """True the first time it is asked for ``what`` under ``tag`` (in any process)."""
    return bool(_redis().set(f"usage-tests:{tag}:{what}", 1, nx=True, ex=600))


class OpenAIStyle:
    """A chat completion client: 100 prompt tokens (30 of them cached), 20 completion."""

    def __call__(self, prompt: str) -> Any:
        details = SimpleNamespace(cached_tokens=30)
        usage = SimpleNamespace(
            prompt_tokens=100, completion_tokens=20, total_tokens=120, prompt_tokens_details=details
        )
        return SimpleNamespace(content=f"openai: {len(prompt) > 0}", usage=usage)


class LangChainStyle:
    """A LangChain chat model: 50 input tokens, 10 output (4 of them reasoning)."""

    def invoke(self, prompt: str) -> Any:
        meta = {
            "input_tokens": 50,
            "output_tokens": 10,
            "total_tokens": 60,
            "output_token_details": {"reasoning": 4},
        }
        return SimpleNamespace(content="langchain", usage_metadata=meta)


class Summary(BaseModel):
    """CrewAI's ``UsageMetrics`` as ``LLM.get_token_usage_summary()`` returns it."""

    total_tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    successful_requests: int = 0


class CrewAIStyle:
    """CrewAI's ``LLM``: ``call`` returns text; 30 prompt and 6 completion tokens a call,
    kept in its counters."""

    def __init__(self) -> None:
        self.summary = Summary()

    def call(self, prompt: str) -> str:
        s = self.summary
        self.summary = Summary(
            total_tokens=s.total_tokens + 36,
            prompt_tokens=s.prompt_tokens + 30,
            completion_tokens=s.completion_tokens + 6,
            successful_requests=s.successful_requests + 1,
        )
        return "crewai"

    def get_token_usage_summary(self) -> Summary:
        return self.summary


writers = Crew(
    tasks=[
        Task("Draft on {topic}", "a draft", Agent("drafter", llm=OpenAIStyle()), name="draft"),
        Task("Edit it", "an edit", Agent("editor", llm=LangChainStyle()), name="edit"),
        Task("Polish it", "final", Agent("polisher", llm=CrewAIStyle()), name="polish"),
    ],
    name="usage_writers",
)
"""Three agents, one per client shape: 120 + 60 + 36 = 216 tokens, 3 requests."""

CREW_TOKENS = 216


class Tokens(FlowState):
    tag: str = ""
    fail: bool = False
    topic: str = "bees"
    seen: int = 0
    """What ``self.usage_metrics`` said inside ``write`` (the run's part so far)."""


class Spender(Flow[Tokens]):
    """plan (100 + 20 tokens, a usage dict) -> write (40, keyword counts; with ``fail``, fails
    the first time after spending them) -> review (10, a chat completion's usage object)."""

    @start()
    def plan(self) -> str:
        record_usage(
            {
                "prompt_tokens": 100,
                "completion_tokens": 20,
                "total_tokens": 120,
                "prompt_tokens_details": {"cached_tokens": 30},
            }
        )
        return "planned"

    @listen(plan)
    def write(self) -> str:
        record_usage(prompt_tokens=30, completion_tokens=10)
        self.state.seen = self.usage_metrics.total_tokens
        if self.state.fail and first_time(self.state.tag, "write"):
            raise RuntimeError("planned failure after spending 40 tokens")
        return "written"

    @listen(write)
    def review(self) -> str:
        record_usage(SimpleNamespace(usage=SimpleNamespace(prompt_tokens=8, completion_tokens=2)))
        return "reviewed"


class CrewHost(Flow[Tokens]):
    """intro (15 tokens) -> stage (5 tokens, then the crew as a child run: 216) -> done."""

    @start()
    def intro(self) -> str:
        record_usage(prompt_tokens=10, completion_tokens=5)
        return "intro"

    @listen(intro)
    def stage(self) -> Any:
        record_usage(prompt_tokens=3, completion_tokens=2)
        return self.run_crew(writers, {"topic": self.state.topic})

    @listen(stage)
    def done(self, crew_output: dict[str, Any]) -> str:
        return str(crew_output["raw"])


class Retrying(Flow[Tokens]):
    """``write`` spends 40 tokens an attempt and, with ``fail``, fails its first attempt
    after spending them; ``retries=1`` runs it again: the step's usage is both attempts'."""

    @start(retries=1, retry_backoff=0.05)
    def write(self) -> str:
        record_usage(prompt_tokens=30, completion_tokens=10)
        if self.state.fail and first_time(self.state.tag, "retried-write"):
            raise RuntimeError("planned failure after spending 40 tokens")
        return "written"
