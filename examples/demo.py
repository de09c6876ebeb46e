"""``make demo``: a crash mid-run costs nothing that was already done.

1. uses ``RUNNER_REDIS_URL`` if set, else starts an embedded Redis (AOF on);
2. starts a Celery worker (and Flower, if installed) of its own;
3. submits the research flow (four slow, "costly" stages);
4. SIGKILLs the worker in the middle of stage 3, starts a fresh one;
5. the run finishes: stages 1-2 ran once, stage 3 ran again, nothing else twice;
6. prints the run's checkpoint history and the commands to resume or fork by hand.

Everything it started is stopped before it exits.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any

FLOW = "examples.research:ResearchFlow"
STAGE_SECONDS = "1.5"


def _say(text: str) -> None:
    print(f"\033[1m==>\033[0m {text}", flush=True)


def _redis(stack: contextlib.ExitStack) -> str:
    from runner.embedded import EmbeddedRedis, ping

    url = os.environ.get("RUNNER_REDIS_URL")
    if url:
        ping(url)
        _say(f"using Redis at {url}")
        return url
    server = stack.enter_context(EmbeddedRedis())
    _say(f"started an embedded Redis on {server.url} (AOF on, data in {server.data_dir})")
    return server.url


def _flower(stack: contextlib.ExitStack, env: dict[str, str]) -> None:
    if importlib.util.find_spec("flower") is None:
        _say("Flower is not installed (pip install 'runner[flower]'); skipping it")
        return
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "flower", "--port=5555"],
        env={**os.environ, **env, "FLOWER_UNAUTHENTICATED_API": "true"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stack.callback(_stop, proc)
    _say("Flower is at http://127.0.0.1:5555 (every step is a task named <Flow>.<method>)")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _wait_for_step(handle: Any, step: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = handle.latest()
        if step in {a.split("#")[0] for a in latest.completed}:
            return
        time.sleep(0.05)
    raise RuntimeError(f"step {step} did not finish within {timeout}s")


def main() -> int:
    """Run the demo; return the process exit code."""
    with contextlib.ExitStack() as stack:
        url = _redis(stack)
        env = {
            "RUNNER_REDIS_URL": url,
            "RUNNER_PREFIX": "demo",
            "RUNNER_QUEUE": f"demo-{uuid.uuid4().hex[:6]}",
            "RUNNER_FLOW_MODULES": FLOW.split(":")[0],
            "RUNNER_LEASE_SECONDS": "2",
            "RUNNER_RECOVERY_INTERVAL": "0.5",
            "RESEARCH_STAGE_SECONDS": STAGE_SECONDS,
            "RESEARCH_COUNTS_KEY": f"demo:starts:{uuid.uuid4().hex[:6]}",
        }
        os.environ.update(env)
        from runner.distributed.client import load_flow, runtime
        from runner.distributed.processes import WorkerProcess
        from runner.settings import reset_settings

        reset_settings()
        rt = runtime()
        first = WorkerProcess(env).start(rt.app)
        stack.callback(first.stop)
        _say(f"worker 1 started (pid {first.proc.pid if first.proc else '?'})")
        _flower(stack, env)
        flow_cls = load_flow(FLOW)
        stages = list(flow_cls.graph().methods)
        handle = flow_cls.submit({"topic": "durable LLM pipelines"})
        _say(f"submitted run {handle.run_id} ({len(stages)} stages: {', '.join(stages)})")
        _wait_for_step(handle, stages[1])
        time.sleep(float(STAGE_SECONDS) / 2)
        _say(f"stage {stages[2]} is running: SIGKILL worker 1 and all its processes")
        first.kill()
        second = WorkerProcess(env).start(rt.app)
        stack.callback(second.stop)
        _say("worker 2 started; its recovery pass finds the lapsed lease and re-dispatches")
        status = handle.wait(timeout=60)
        _say(f"run {handle.run_id}: {status.value}")
        _report(rt, handle, stages, env["RESEARCH_COUNTS_KEY"])
        return 0 if status.value == "succeeded" else 1
    return 1


def _report(rt: Any, handle: Any, stages: list[str], counts_key: str) -> None:
    history = list(reversed(rt.store.history(handle.run_id, limit=100)))
    print(f"\n{'seq':>4}  {'event':<26} {'step':<12} checkpoint")
    for ckpt in history:
        print(f"{ckpt.seq:>4}  {ckpt.event:<26} {ckpt.step or '':<12} {ckpt.id}")
    committed = Counter(c.step for c in history if c.event == "method_execution_finished")
    raw = rt.store.client.hgetall(counts_key)
    started = {k.decode(): int(v) for k, v in raw.items()}
    print(f"\n{'stage':<12} {'started':>8} {'committed':>10}")
    for stage in stages:
        print(f"{stage:<12} {started.get(stage, 0):>8} {committed.get(stage, 0):>10}")
    rt.store.client.delete(counts_key)
    mid = next(c.id for c in history if c.step == stages[1] and c.event.endswith("finished"))
    print(
        "\nOnly the stage that was killed ran twice; it committed once.\n"
        "Against a Redis you keep (RUNNER_REDIS_URL=... RUNNER_PREFIX=demo), by hand:\n"
        f"  runner checkpoints {handle.run_id}\n"
        f"  runner resume {handle.run_id} --wait          # a failed or cancelled run\n"
        f"  runner fork {mid} --rerun {stages[2]} --wait  # re-run from stage 3 on\n"
    )


if __name__ == "__main__":
    sys.exit(main())
