"""``runner chat``: a terminal conversation over stdin with a conversational run on the workers,
every worker killed between turns; ``runner chat RUN`` goes on with the same run later; the
refusals are one line and a non-zero exit."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runner.distributed.client import RunHandle
from tests._dist_support import private_pool
from tests.flows.conversations import NotAChat

pytestmark = pytest.mark.workers

CHAT = "tests.flows.conversations:Chat"


class Repl:
    """``runner chat ...`` in a subprocess: lines written to its stdin, its stdout read as it
    comes (the prompt ``You: `` has no newline, so output is read in chunks)."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "chat", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
        )
        self.seen = ""
        self.chunks: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 4096):
            self.chunks.put(chunk.decode())
        self.chunks.put("")

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()

    def expect(self, text: str, timeout: float = 60) -> None:
        """Wait until stdout has shown ``text`` (the output before it is consumed)."""
        while text not in self.seen:
            chunk = self.chunks.get(timeout=timeout)
            if chunk == "":
                raise AssertionError(f"runner chat ended before {text!r}: {self.seen!r}")
            self.seen += chunk
        self.seen = self.seen.partition(text)[2]

    def end(self, line: str | None = "exit") -> tuple[int, str]:
        """Send ``line`` (``None``: close stdin, end of input); the exit code and stderr."""
        assert self.proc.stdin is not None
        if line is not None:
            self.say(line)
        self.proc.stdin.close()
        code = self.proc.wait(timeout=60)
        self.reader.join(timeout=10)
        assert self.proc.stderr is not None and self.proc.stdout is not None
        err = self.proc.stderr.read().decode()
        self.proc.stderr.close()
        self.proc.stdout.close()
        return code, err


def test_runner_chat_talks_five_turns_across_worker_restarts_and_goes_on_by_run_id(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        worker = pool.start(concurrency=1)
        repl = Repl(env, "--flow", CHAT)
        repl.expect("You: ")
        repl.say("hello")
        repl.expect("Assistant: #1: hello\n")
        for n, text in enumerate(["how are you", "tell me more", "why"], start=2):
            pool.kill(worker)
            worker = pool.start(concurrency=1)
            repl.expect("You: ")
            repl.say(text)
            repl.expect(f"Assistant: #{n}: {text}\n")
        code, err = repl.end("QUIT")
        assert code == 0, err
        run_id = err.strip().splitlines()[0].removeprefix("run ")
        # Later, on another worker again: the same conversation by its run id.
        pool.kill(worker)
        pool.start(concurrency=1)
        again = Repl(env, run_id[:12])
        again.expect("You: ")
        again.say("and the fifth")
        again.expect("Assistant: #5: and the fifth\n")
        code, err = again.end(None)  # end of input ends it too
        assert code == 0, err
        said = RunHandle(run_id, rt).messages()
        assert [m["content"] for m in said][-2:] == ["and the fifth", "#5: and the fifth"]
        assert len(said) == 10


def test_runner_chat_refuses_a_plain_run_and_bad_usage_in_one_line(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        pool.start(concurrency=1)
        plain = NotAChat.submit({}, rt=rt)
        plain.result(timeout=60)
        code, err = Repl(env, plain.run_id).end(None)
        assert code == 2 and err.count("\n") == 1, err
        assert "is only available on conversational flows; NotAChat is not one" in err
        code, err = Repl(env).end(None)
        assert code == 2 and "give a RUN to go on with, or --flow" in err, err
        code, err = Repl(env, "--flow", "tests.flows.conversations:NotAChat").end(None)
        assert code == 2 and "NotAChat is not one" in err, err
