"""A flow the workers will not run is refused at submit, before anything is stored, whenever
the producer can know the workers' allow-list (else it waits for a worker that has it); and
a run the workers refused (a flow posing under an allowed name) says how it ended in plain
words."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from runner import Flow, FlowState, start
from runner.distributed.client import submit
from runner.distributed.engine import FlowNotAllowed, Runtime
from runner.errors import RunFailed
from runner.store.models import RunStatus
from tests.test_cli import Cli, cli  # noqa: F401  (fixture)
from tests.test_cli_errors import snapshot
from tests.test_dev import FLOWS, DevProcess, bare_env, dev_argv, runner


class StrayState(FlowState):
    """State of :class:`StrayFlow`."""

    done: bool = False


class StrayFlow(Flow[StrayState]):
    """Defined in a test module, which no worker imports: outside every allow-list."""

    @start()
    def go(self) -> None:
        self.state.done = True


class Impostor(Flow[StrayState]):
    """Takes the name of an allowed flow (its task names) from a module no worker imports:
    the workers have its tasks but refuse its run (another import path)."""

    name = "DistEcho"

    @start()
    def hello(self) -> int:
        return 0


def unaware(rt: Runtime) -> Runtime:
    """``rt`` as a producer without ``RUNNER_FLOW_MODULES`` (and no `runner dev` here)."""
    return dataclasses.replace(rt, settings=rt.settings.model_copy(update={"flow_modules": []}))


def test_the_python_api_refuses_a_flow_outside_its_allow_list_before_storing(rt: Runtime) -> None:
    before = snapshot(rt)
    with pytest.raises(FlowNotAllowed) as refused:
        submit(StrayFlow, rt=rt)
    message = str(refused.value)
    assert "tests.test_allow_list:StrayFlow is not in the workers' allow-list" in message
    assert "RUNNER_FLOW_MODULES" in message and "tests.flows.cli" in message
    with pytest.raises(FlowNotAllowed):
        StrayFlow.submit()  # the process runtime (the rt fixture made it current)
    assert snapshot(rt) == before


def test_a_run_the_workers_refused_failed_before_any_step_never_at_none(
    rt: Runtime,
    cli: Cli,  # noqa: F811
) -> None:
    handle = submit(Impostor, rt=unaware(rt))
    assert handle.wait(timeout=30) is RunStatus.FAILED
    with pytest.raises(RunFailed) as failed:
        handle.result(timeout=1)
    assert f"run {handle.run_id} failed before any step: FlowNotAllowed: " in str(failed.value)
    watched = cli("watch", handle.run_id)
    assert watched.exit_code == 1
    (line,) = watched.stderr.splitlines()
    assert line.startswith(f"error: run {handle.run_id} failed before any step: FlowNotAllowed")
    assert "at None" not in watched.stdout + watched.stderr + str(failed.value)
    outcome = cli.json("status", handle.run_id)
    assert outcome["last_error"]["type"] == "FlowNotAllowed"


def write_dev_json(folder: Path, url: str, pid: int, modules: list[str]) -> None:
    """What `runner dev` leaves in ``folder/.runner``: its Redis, its pid, its allow-list."""
    (folder / ".runner").mkdir()
    data = {"redis_url": url, "pid": pid, "flow_modules": modules}
    (folder / ".runner" / "dev.json").write_text(json.dumps(data))


def exited_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_a_published_allow_list_counts_while_its_runner_dev_lives_on_the_redis_used(
    rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer = unaware(rt)
    monkeypatch.chdir(tmp_path)
    write_dev_json(tmp_path, rt.store.url, os.getpid(), ["tests.flows.cli"])
    before = snapshot(rt)
    with pytest.raises(FlowNotAllowed, match=r"\(`runner dev` in .*: tests.flows.cli\)"):
        submit(StrayFlow, rt=producer)
    assert snapshot(rt) == before
    # Another Redis than the one `runner dev` serves: its workers are not ours.
    (tmp_path / ".runner" / "dev.json").unlink()
    (tmp_path / ".runner").rmdir()
    write_dev_json(tmp_path, "redis://127.0.0.1:1/0", os.getpid(), ["tests.flows.cli"])
    stored = submit(StrayFlow, rt=producer)  # stored: it waits for a worker that has it
    assert stored.status() is RunStatus.RUNNING
    stored.cancel()
    # A `runner dev` that stopped runs no workers: its list is not theirs any more.
    (tmp_path / ".runner" / "dev.json").unlink()
    (tmp_path / ".runner").rmdir()
    write_dev_json(tmp_path, rt.store.url, exited_pid(), ["tests.flows.cli"])
    stored = submit(StrayFlow, rt=producer)
    assert stored.status() is RunStatus.RUNNING
    stored.cancel()


OTHER = """
from runner import Flow, FlowState, start


class OtherFlow(Flow[FlowState]):
    @start()
    def go(self):
        return "ran"
"""


@pytest.mark.slow
def test_runner_dev_publishes_its_allow_list_and_producers_in_its_folder_obey_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "flows.py").write_text(FLOWS)
    (tmp_path / "other.py").write_text(OTHER)
    dev = DevProcess.start(tmp_path, dev_argv("flows", "--workers", "0"), bare_env())
    try:
        published = json.loads((tmp_path / ".runner" / "dev.json").read_text())
        assert published["flow_modules"] == ["flows"]

        refused = runner(tmp_path, "submit", "other:OtherFlow")
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.splitlines()
        assert line == (
            "error: other:OtherFlow is not in the workers' allow-list "
            f"(`runner dev` in {tmp_path.resolve()}: flows)"
        )
        api = runner_python(tmp_path, "from other import OtherFlow; OtherFlow.submit()")
        assert api.returncode == 1 and "FlowNotAllowed" in api.stderr, api.stderr
        assert json.loads(runner(tmp_path, "runs", "--json").stdout) == []  # nothing stored

        accepted = runner(tmp_path, "submit", "flows:EchoFlow", "--input", "topic=x")
        assert accepted.returncode == 0, accepted.stderr
        listed = json.loads(runner(tmp_path, "runs", "--json").stdout)
        assert [run["run_id"] for run in listed] == [accepted.stdout.strip()]
    finally:
        assert dev.stop(signal.SIGTERM) == 0


def runner_python(cwd: Path, code: str) -> Any:
    """``python -c CODE`` in ``cwd`` with no ``RUNNER_*`` variable (as a user's script)."""
    import subprocess

    env = bare_env()
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), env["PYTHONPATH"]])
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
