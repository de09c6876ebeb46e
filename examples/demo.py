"""``make demo``: a crash mid-run costs nothing that was already done.

1. uses ``RUNNER_REDIS_URL`` if set, else the Redis of a running ``runner dev`` here, else
   starts one with its data in ``./.runner/`` (as ``runner dev`` does, AOF on);
2. starts a Celery worker (and Flower, if installed) of its own, on the deployment prefix
   ``demo`` (queue ``runner.demo``), so it never mixes with your own runs;
3. submits the research flow (four slow, "costly" stages);
4. SIGKILLs the worker in the middle of stage 3, starts a fresh one;
5. the run finishes: stages 1-2 ran once, stage 3 ran again, nothing else twice;
6. prints the run's checkpoint history and commands to explore it afterwards, which work
   as printed: the data stays in ``./.runner/`` (``rm -rf .runner`` removes it).

Everything it started is stopped before it exits.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

FLOW = "examples.research:ResearchFlow"
PREFIX = "demo"
TASK_SECONDS = 0.4
"""How long each stand-in LLM call takes (a stage is a crew of three tasks)."""


def _say(text: str) -> None:
    print(f"\033[1m==>\033[0m {text}", flush=True)


def _redis(stack: contextlib.ExitStack) -> tuple[str, bool]:
    """The Redis URL, and whether this demo started it (then it stops with the demo)."""
    from runner.embedded import EmbeddedRedis, find_dev, ping, write_dev
    from runner.settings import get_settings

    url = os.environ.get("RUNNER_REDIS_URL")
    if url:
        ping(url)
        _say(f"using Redis at {url}")
        return url, False
    home = Path.cwd() / get_settings().dev_dir
    dev = find_dev()
    if dev is not None and dev.alive:
        ping(dev.redis_url)
        _say(f"using the Redis of `runner dev` at {dev.redis_url}")
        return dev.redis_url, False
    # The port and server of the last `runner dev` here (if any), as `runner dev` reuses them.
    last = dev if dev is not None and dev.path.parent == home else None
    port = int(last.redis_url.rsplit(":", 1)[1].split("/")[0]) if last else 0
    exe = last.redis_server if last and last.redis_server else None
    home.mkdir(parents=True, exist_ok=True)
    server = stack.enter_context(EmbeddedRedis(data_dir=home / "redis", port=port, executable=exe))
    write_dev(home, server)
    _say(f"started an embedded Redis on {server.url} (AOF on, data in {server.data_dir})")
    return server.url, True


def _flower(stack: contextlib.ExitStack, env: dict[str, str]) -> None:
    if importlib.util.find_spec("flower") is None:
        _say("Flower is not installed (it comes with celery-flows: pip install celery-flows)")
        return
    port = os.environ.get("DEMO_FLOWER_PORT", "5555")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "flower", f"--port={port}"],
        env={**os.environ, **env, "FLOWER_UNAUTHENTICATED_API": "true"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stack.callback(_stop, proc)
    _say(f"Flower is at http://127.0.0.1:{port} (every step is a task named <Flow>.<method>)")


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
        url, started = _redis(stack)
        env = {
            "RUNNER_REDIS_URL": url,
            "RUNNER_PREFIX": PREFIX,
            "RUNNER_FLOW_MODULES": FLOW.split(":")[0],
            "RUNNER_LEASE_SECONDS": "2",
            "RUNNER_RECOVERY_INTERVAL": "0.5",
            "RESEARCH_SLEEP": str(TASK_SECONDS),
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
        time.sleep(TASK_SECONDS * 1.5)
        _say(f"{stages[2]} is mid-crew: SIGKILL worker 1 and all its processes")
        first.kill()
        second = WorkerProcess(env).start(rt.app)
        stack.callback(second.stop)
        _say("worker 2 started; its recovery pass finds the lapsed lease and re-dispatches")
        status = handle.wait(timeout=60)
        _say(f"run {handle.run_id}: {status.value}")
        _report(rt, handle, stages, env["RESEARCH_COUNTS_KEY"])
        _explore(rt, handle, stages, started)
        return 0 if status.value == "succeeded" else 1
    return 1


def _report(rt: Any, handle: Any, stages: list[str], counts_key: str) -> None:
    history = list(reversed(rt.store.history(handle.run_id, limit=100)))
    print(f"\n{'seq':>4}  {'event':<26} {'step':<8} checkpoint")
    for ckpt in history:
        print(f"{ckpt.seq:>4}  {ckpt.event:<26} {ckpt.step or '':<8} {ckpt.id}")
    raw = rt.store.client.hgetall(counts_key)
    calls = {k.decode(): int(v) for k, v in raw.items()}
    rt.store.client.delete(counts_key)
    children = history[-1].meta.links.children
    print(f"\n{'stage':<8} {'crew task':<18} {'LLM calls':>9} {'commits':>8}")
    for activation, link in sorted(children.items()):
        child = rt.store.history(link.run_id, limit=100)
        commits = Counter(c.step for c in child if c.event == "method_execution_finished")
        for task in sorted(commits, key=lambda t: min(c.seq for c in child if c.step == t)):
            stage = activation.split("#")[0]
            print(f"{stage:<8} {task:<18} {calls.get(task, 0):>9} {commits[task]:>8}")
    print("\nEvery task committed once; only the task the kill interrupted was called twice.")


def _explore(rt: Any, handle: Any, stages: list[str], started: bool) -> None:
    """Commands to explore the run afterwards, exactly as they work."""
    history = list(reversed(rt.store.history(handle.run_id, limit=100)))
    mid = next(c.id for c in history if c.step == stages[1] and c.event.endswith("finished"))
    from runner import views
    from runner.cli import refs

    # Unique prefixes, as `runner runs` and `runner checkpoints` show them: commands take them.
    run = refs.short_runs(rt, [handle.run_id])[handle.run_id]
    ckpt = views.short_ids([c.id for c in history], refs.MIN_CHECKPOINT)[mid]
    here = f"the data stays in {Path.cwd() / '.runner'} (`rm -rf .runner` removes it)"
    runner = _runner_command()
    workers = f"RUNNER_PREFIX={PREFIX} {runner} dev {FLOW.split(':')[0]}"
    print(
        f"\nExplore it: {here if started else 'the run stays in your Redis'}.\n"
        + (
            f"  {workers}     # in another shell: Redis, workers, Flower\n"
            if started
            else f"  {workers}     # in another shell: workers for fork and resume\n"
        )
        + f"  export RUNNER_PREFIX={PREFIX}\n"
        f"  {runner} steps {run}            # each step: attempts, worker, duration\n"
        f"  {runner} checkpoints {run}\n"
        f"  {runner} show {ckpt}\n"
        f"  {runner} fork {ckpt} --rerun {stages[2]} --wait   # redo stage 3 and what follows\n"
    )


def _runner_command() -> str:
    """``runner`` if the shell finds this install's, else its path (e.g. ``.venv/bin/runner``,
    as after ``make demo`` without an activated venv)."""
    mine = Path(sys.executable).parent / "runner"
    found = shutil.which("runner")
    if found is not None and Path(found).resolve() == mine.resolve():
        return "runner"
    with contextlib.suppress(ValueError):
        return str(mine.relative_to(Path.cwd()))
    return str(mine)


if __name__ == "__main__":
    sys.exit(main())
