"""LLMs by name, resolved as CrewAI resolves them: ``register_llm`` first, then CrewAI's
``LLM`` when ``crewai`` is importable, then ``litellm``, else one line naming both fixes.

This checkout's environment has neither crewai nor litellm, so the error path runs here.
The litellm path runs for real when a directory holding litellm is named by
``RUNNER_TEST_LITELLM`` (``pip install --target DIR litellm``): a subprocess appends it to
its path and calls a model by name through litellm against a local OpenAI-compatible HTTP
server (the model's remote end, not litellm, is what stands in).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from runner import Flow, human_feedback, start
from runner.errors import DefinitionError
from runner.flow.human_feedback import context_for
from runner.flow.llm import register_llm, resolve_llm

NAME = "openai/gpt-4o-mini"


def test_without_crewai_or_litellm_a_name_is_one_line_naming_both_fixes() -> None:
    assert importlib.util.find_spec("crewai") is None
    assert importlib.util.find_spec("litellm") is None
    with pytest.raises(DefinitionError) as caught:
        resolve_llm(NAME)
    text = str(caught.value)
    assert "\n" not in text
    assert f"runner.register_llm({NAME!r}, client)" in text
    assert "install crewai or litellm" in text
    with pytest.raises(DefinitionError):
        resolve_llm("gpt-4o-mini")  # a bare model name alike


def test_a_registered_name_wins() -> None:
    def client(prompt: str) -> str:
        return "registered"

    register_llm(NAME, client)
    try:
        assert resolve_llm(NAME) is client
    finally:
        register_llm(NAME, None)


def test_a_review_records_the_name_not_the_client() -> None:
    class Reviewed(Flow):
        @start()
        @human_feedback(message="ok?", emit=["yes", "no"], llm=NAME)
        def draft(self) -> str:
            return "text"

    flow = Reviewed()
    config = Reviewed.draft.__human_feedback_config__  # type: ignore[attr-defined]
    context = context_for(flow, config, "draft", "text")
    assert context.llm == NAME
    assert context.to_dict()["llm"] == NAME
    definition = Reviewed.flow_definition().to_dict()
    assert definition["methods"]["draft"]["human_feedback"]["llm"] == NAME


class _ChatCompletions(BaseHTTPRequestHandler):
    """An OpenAI-compatible ``/chat/completions`` that answers with the prompt reversed."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": prompt[::-1]},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def model_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _ChatCompletions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


LITELLM_SCRIPT = """
import sys
sys.path.append({where!r})  # litellm's packages after this environment's own
from runner.flow.llm import LiteLLMClient, call_llm, register_llm, resolve_llm
from runner.crew import Agent, Crew, Task

client = resolve_llm("openai/test-model")
assert isinstance(client, LiteLLMClient), client
print(call_llm("openai/test-model", "olleh"))
agent = Agent(role="Echo", goal="echo", backstory="", llm="openai/test-model")
crew = Crew(agents=[agent], tasks=[Task(description="say hi", expected_output="hi", agent=agent)])
out = crew.kickoff()
print(str(out.raw)[:12])
from runner import Flow, start
class Asks(Flow):
    @start()
    def go(self):
        return call_llm("openai/test-model", "abc")
flow = Asks()
flow.kickoff()
print(flow.usage_metrics.total_tokens)
register_llm("openai/test-model", lambda prompt: "registered")
print(call_llm("openai/test-model", "x"))
"""


def test_a_name_resolves_through_litellm_when_it_is_installed(model_server: str) -> None:
    where = os.environ.get("RUNNER_TEST_LITELLM")
    if not where:
        pytest.skip("RUNNER_TEST_LITELLM names no directory holding litellm")
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-local",
        "OPENAI_BASE_URL": model_server,
        "OPENAI_API_BASE": model_server,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LITELLM_SCRIPT.format(where=where))],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "hello"  # the server's answer, through litellm
    assert lines[1] == ".yrammus a t"  # the agent's prompt, reversed by the model
    assert int(lines[2]) >= 10  # the answer's token usage was recorded
    assert lines[3] == "registered"  # a registered name wins over litellm
