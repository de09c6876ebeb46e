"""Flows whose steps stream (``self.stream_chunk``, ``self.stream_from``, an Agent's LLM), for
the streaming tests, in process and on the test workers (allow-list).

:class:`Tokens` writes ``count`` tokens ``delay`` seconds apart; with ``hold`` its step then
waits until a test sets the Redis key ``streams-tests:<run id>:go`` (so a reader can see the
whole answer before the step commits). ``fail_first`` makes its first attempt raise after
streaming (a retry supersedes it); ``crawl_once`` makes its first execution crawl (a worker is
killed meanwhile).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import redis

from runner import Agent, Flow, FlowState, listen, start
from runner.crew import Crew, Task

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["RUNNER_REDIS_URL"])
    return _client


def go_key(run_id: str) -> str:
    """The key a test sets to let a held step finish."""
    return f"streams-tests:{run_id}:go"


def executions(run_id: str, step: str) -> int:
    """Count one more execution of ``step`` of ``run_id`` (in any process); the count."""
    return int(_redis().incr(f"streams-tests:{run_id}:{step}:runs"))


def token(i: int) -> str:
    return f"t{i} "


class TokenState(FlowState):
    count: int = 500
    delay: float = 0.0
    hold: bool = False
    fail_first: bool = False
    crawl_once: float = 0.0
    """Seconds between tokens of the first execution (the others stream at ``delay``)."""


class Tokens(Flow[TokenState]):
    """``write`` streams ``count`` tokens and a progress line every 100, returns them all."""

    @start(retries=2, retry_backoff=0.05)
    def write(self) -> str:
        run = executions(self.state.id, "write")
        delay = self.state.crawl_once if run == 1 and self.state.crawl_once else self.state.delay
        parts = []
        for i in range(self.state.count):
            parts.append(token(i))
            self.stream_chunk(token(i))
            if i % 100 == 99:
                self.stream_chunk({"done": i + 1, "of": self.state.count}, channel="progress")
            if delay:
                time.sleep(delay)
        if self.state.fail_first and run == 1:
            raise RuntimeError("the first attempt fails after streaming")
        if self.state.hold:
            end = time.monotonic() + 60
            while not _redis().exists(go_key(self.state.id)) and time.monotonic() < end:
                time.sleep(0.02)
        return "".join(parts)

    @listen(write)
    def tally(self, text: str) -> int:
        return len(text.split())


class BadChunk(Flow[FlowState]):
    """Streams something that is not JSON: the step fails, unretried though it has retries."""

    @start(retries=3, retry_backoff=0.05)
    def bad(self) -> str:
        executions(self.state.id, "bad")
        self.stream_chunk("fine so far")
        self.stream_chunk(object())
        return "never"


class StreamingFlow(Flow[TokenState]):
    """CrewAI's ``stream = True``: ``kickoff()`` returns a stream session."""

    stream = True

    @start()
    def first(self) -> str:
        return self.stream_from(token(i) for i in range(self.state.count))

    @listen(first)
    def second(self, text: str) -> str:
        self.stream_chunk("progress line", channel="progress")
        return text.upper()


# -- LLM clients that stream, offline, in real clients' shapes --------------------------------


class LangChainStreaming:
    """A LangChain chat model: ``invoke`` answers whole; ``stream`` yields message chunks (the
    last with ``usage_metadata``)."""

    words = ("Bees ", "make ", "honey.")

    def invoke(self, prompt: str) -> Any:
        return SimpleNamespace(content="".join(self.words))

    def stream(self, prompt: str) -> Iterator[Any]:
        for i, word in enumerate(self.words):
            meta = (
                {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
                if i == len(self.words) - 1
                else None
            )
            yield SimpleNamespace(content=word, usage_metadata=meta)


class OpenAIStreaming:
    """An OpenAI-style callable: ``stream=True`` gives chat completion chunks."""

    words = ("Wasps ", "do ", "not.")

    def __call__(self, prompt: str, stream: bool = False) -> Any:
        if not stream:
            return SimpleNamespace(content="".join(self.words))
        return (
            SimpleNamespace(choices=[SimpleNamespace(delta=SimpleNamespace(content=w))])
            for w in self.words
        )


writer_crew = Crew(
    tasks=[
        Task(
            "Write about {topic}",
            "a line",
            name="draft",
            agent=Agent("Writer", "write", llm=LangChainStreaming()),
        ),
        Task(
            "Answer back about {topic}",
            "a line",
            name="reply",
            agent=Agent("Critic", "answer", llm=OpenAIStreaming()),
        ),
    ],
    name="writer_crew",
)


class CrewStreams(Flow[FlowState]):
    """``stage`` runs :data:`writer_crew` as a child (on workers) or inline (in process)."""

    @start()
    def stage(self) -> Any:
        return self.run_crew(writer_crew, {"topic": "bees"})

    @listen(stage)
    def done(self, out: Any) -> str:
        return str(out["raw"] if isinstance(out, dict) else getattr(out, "raw", out))
