"""``runner dev --pool threads --concurrency 50 --queues ...``: a thread-pool worker for
I/O-bound steps, consuming the queues named; bad values refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.distributed.processes import WORKER_COMMAND, children
from tests.test_dev import FLOWS, DevProcess, bare_env, dev_argv, runner

pytestmark = pytest.mark.workers  # `runner dev` starts workers


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "devflows.py").write_text(FLOWS)
    return tmp_path


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--pool", "gevent"], "--pool 'gevent': must be one of prefork, threads"),
        (["--queues", "gpu,no way"], "--queues='no way': must be a name"),
    ],
)
def test_runner_dev_refuses_a_bad_pool_or_queue_in_one_line(
    project: Path, args: list[str], needle: str
) -> None:
    done = runner(project, "dev", "devflows", *args, "--no-flower", "--no-ui")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and needle in line, done.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_runner_dev_starts_a_thread_pool_worker_on_the_queues_named(project: Path) -> None:
    argv = dev_argv("devflows", "--pool", "threads", "--concurrency", "50", "--queues", "default")
    dev = DevProcess.start(project, [*argv, "--no-reload"], bare_env())
    try:
        (worker,) = [
            cmd
            for pid in children(dev.proc.pid)
            if WORKER_COMMAND in (cmd := Path(f"/proc/{pid}/cmdline").read_text().split("\0"))
        ]
        assert worker[worker.index("-P") + 1] == "threads"
        assert worker[worker.index("-c") + 1] == "50"
        done = runner(project, "submit", "devflows:EchoFlow", "--input", "topic=bees", "--wait")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "succeeded: report from plan of bees"
    finally:
        assert dev.stop() == 0
