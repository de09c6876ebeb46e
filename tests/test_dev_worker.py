"""A second worker beside ``runner dev``, started the README's way: it takes ``runner dev``'s
allow-list (or, with none to be found, refuses in one line); a step of a flow a worker lacks
waits for one that has it and then runs, never a failed run nor Celery's body dump; and
``runner dev`` itself: its Redis restarted when it dies, a stop that never waits out the
workers' grace (within 5 s on an idle machine; :data:`STOPPED_WITHIN` bounds it here, where
the suite's other processes share the cores), Flower's history kept across restarts,
``workers ready`` after a reload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from runner.cli.dev import STOP_GRACE
from tests.test_dev import FLOWS, DevProcess, _free_port, bare_env, dev_argv, runner

STOPPED_WITHIN = 10.0
"""Seconds a stop of ``runner dev`` may take in these tests: less than the workers' warm
shutdown grace (:data:`~runner.cli.dev.STOP_GRACE`), so a stop that waited it out fails, with
room for a machine the suite keeps busy (alone, a stop takes a few seconds)."""
assert STOPPED_WITHIN < STOP_GRACE

pytestmark = pytest.mark.workers  # `runner dev` and hand-started workers

GPU_FLOWS = """
from runner import Flow, FlowState, listen, start


class G(FlowState):
    item: str = ""


class GpuFlow(Flow[G]):
    @start()
    def load(self):
        return f"loaded {self.state.item}"

    @listen(load, queue="gpu")
    def embed(self, loaded):
        return f"embedded {loaded}"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "devflows.py").write_text(FLOWS)
    (tmp_path / "gpuflows.py").write_text(GPU_FLOWS)
    return tmp_path


def hand_worker(cwd: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``runner worker -c 1`` started by hand in ``cwd``, its output in ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runner.cli", "worker", "-c", "1", "-l", "warning",
             "--without-gossip", "--without-mingle"],
            cwd=cwd, env=bare_env(**env), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_a_worker_with_no_allow_list_to_be_found_refuses_in_one_line(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runner.cli", "worker", "-c", "1"],
        cwd=tmp_path, env=bare_env(RUNNER_REDIS_URL=redis_url, RUNNER_PREFIX=prefix),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: no flows to run: set RUNNER_FLOW_MODULES"), done.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_second_worker_takes_runner_devs_allow_list_and_a_step_waits_for_a_worker_that_has_its_flow(  # noqa: E501
    project: Path,
) -> None:
    dev = DevProcess.start(project, [*dev_argv("devflows", "gpuflows"), "--no-reload"], bare_env())
    gpu_log = project / "gpu-worker.log"
    gpu = hand_worker(project, gpu_log, RUNNER_WORKER_QUEUES="gpu")
    try:
        # The README's second worker: only its queue given; runner dev's allow-list taken.
        done = runner(project, "submit", "gpuflows:GpuFlow", "--input", "item=cats", "--wait")
        assert done.returncode == 0, done.stderr + gpu_log.read_text()
        assert done.stdout.splitlines()[-1] == "succeeded: embedded loaded cats"
        stop(gpu)

        # A worker whose own allow-list lacks the flow gets its gpu step: the step goes to
        # the queue of the flow's version and waits there, visibly; no failed run.
        lacking_log = project / "lacking-worker.log"
        lacking = hand_worker(
            project, lacking_log, RUNNER_WORKER_QUEUES="gpu", RUNNER_FLOW_MODULES="devflows"
        )
        try:
            sent = runner(project, "submit", "gpuflows:GpuFlow", "--input", "item=owls")
            assert sent.returncode == 0, sent.stderr
            run_id = sent.stdout.split()[0]
            deadline = time.monotonic() + 60
            while True:
                status = runner(project, "status", run_id, "--json")
                assert status.returncode == 0, status.stderr
                shown = json.loads(status.stdout)
                assert shown["status"] == "running", shown
                # (Until the worker consumes the gpu queue, the step waits for that.)
                waits = list((shown.get("waiting") or {}).values())
                if any(w.startswith("waiting for a worker of version ") for w in waits):
                    break
                assert time.monotonic() < deadline, (shown, lacking_log.read_text())
                time.sleep(0.2)
            log = lacking_log.read_text()
            assert "this worker has no task GpuFlow.embed; handed to a worker of version" in log
            assert "unregistered" not in log and "'item'" not in log and "owls" not in log
        finally:
            stop(lacking)

        # A worker that can run it starts: the run finishes.
        gpu = hand_worker(project, gpu_log, RUNNER_WORKER_QUEUES="gpu")
        waited = runner(project, "watch", run_id, "--timeout", "60")
        assert waited.returncode == 0, waited.stderr + gpu_log.read_text()
        final = json.loads(runner(project, "status", run_id, "--json").stdout)
        assert final["status"] == "succeeded" and final["result"] == "embedded loaded owls"
    finally:
        stop(gpu)
        assert dev.stop() == 0


def flower_tasks(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/tasks", timeout=10) as reply:
        return dict(json.load(reply))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_runner_dev_restarts_its_redis_stops_promptly_keeps_flowers_history_and_says_workers_ready(
    project: Path,
) -> None:
    port = _free_port()
    argv = [*dev_argv("devflows", flower=True), "--flower-port", str(port)]
    dev = DevProcess.start(project, argv, bare_env())
    try:
        done = runner(project, "submit", "devflows:EchoFlow", "--input", "topic=bees", "--wait")
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 30
        while not (seen := flower_tasks(port)):
            assert time.monotonic() < deadline, "Flower saw no task"
            time.sleep(0.2)

        # A reload says when the workers are back.
        flows = project / "devflows.py"
        flows.write_text(flows.read_text() + "\n# changed\n")
        dev.wait_for(r"^runner dev: workers ready \(1\) on the new code$")

        # Its Redis killed: started again on the same data and port, said in one line.
        server = json.loads((project / ".runner" / "dev.json").read_text())
        redis_port = dev.url.rsplit(":", 1)[1].split("/")[0]
        pid = int(
            subprocess.run(
                ["pgrep", "-f", f"redis-server 127.0.0.1:{redis_port}"],
                capture_output=True, text=True, check=True,
            ).stdout.split()[0]
        )  # fmt: skip
        assert server["redis_url"] == dev.url
        os.kill(pid, signal.SIGKILL)
        (line,) = dev.wait_for(r"^runner dev: its Redis .* exited; started it again")
        assert line.endswith(dev.url)
        again = runner(project, "submit", "devflows:EchoFlow", "--input", "topic=ants", "--wait")
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[-1] == "succeeded: report from plan of ants"
    finally:
        dev.proc.send_signal(signal.SIGTERM)
        try:
            code = dev.proc.wait(timeout=STOPPED_WITHIN)  # the stop itself
        finally:
            dev.stop()
    assert code == 0

    # Restarted: Flower still knows the tasks it saw before.
    back = DevProcess.start(project, argv, bare_env())
    try:
        assert set(seen) <= set(flower_tasks(port))
    finally:
        assert back.stop() == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_runner_dev_stops_promptly_when_the_redis_its_workers_use_is_gone(
    project: Path,
) -> None:
    from runner.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        env = bare_env(RUNNER_REDIS_URL=server.url)
        dev = DevProcess.start(project, [*dev_argv("devflows"), "--no-reload"], env)
    # The Redis is gone (a configured one, which runner dev does not restart): the workers'
    # warm shutdown would wait on it for their whole grace.
    dev.proc.send_signal(signal.SIGTERM)
    try:
        assert dev.proc.wait(timeout=STOPPED_WITHIN) == 0
    finally:
        dev.stop()


def test_the_cli_and_a_second_runner_dev_give_the_same_advice_when_its_redis_is_stuck(
    project: Path,
) -> None:
    (project / ".runner").mkdir()
    dead = "redis://127.0.0.1:1/0"  # nothing listens there
    record = {"redis_url": dead, "pid": os.getpid(), "flow_modules": ["devflows"]}
    (project / ".runner" / "dev.json").write_text(json.dumps(record))
    advice = f"does not answer: stop `runner dev` (pid {os.getpid()}) and start it again"
    listed = runner(project, "runs")
    assert listed.returncode == 1
    (line,) = listed.stderr.splitlines()
    assert advice in line, line
    second = runner(project, "dev", "devflows", "--no-flower", "--no-ui")
    assert second.returncode == 1
    (line,) = second.stderr.splitlines()
    assert "`runner dev` already runs here, but its Redis" in line and advice in line, line
