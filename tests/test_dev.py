"""``runner dev`` and the processes that find it, driven as a user would: real subprocesses
in a fresh project folder, with no ``RUNNER_*`` variable set; its reload when the code
changes; its console's login link in a real browser; and ``make demo``'s commands to
explore the run afterwards, run as printed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.workers  # `runner dev` starts workers

ROOT = Path(__file__).resolve().parents[1]

FLOWS = """
from runner import Flow, FlowState, listen, start


class S(FlowState):
    topic: str = ""


class EchoFlow(Flow[S]):
    @start()
    def plan(self):
        return f"plan of {self.state.topic}"

    @listen(plan)
    def write(self, plan):
        return f"report from {plan}"
"""


def bare_env(**extra: str) -> dict[str, str]:
    """This environment without any ``RUNNER_*`` variable; the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return {**env, **extra}


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    kids = [int(p) for p in out.stdout.split()]
    return kids + [g for k in kids for g in descendants(k)]


@dataclass
class DevProcess:
    """A ``runner dev`` in the background; ``url`` from the export line it printed."""

    proc: subprocess.Popen[str]
    url: str
    export: str
    log: Path
    """Its stderr: the ``runner dev: ...`` lines."""

    @classmethod
    def start(
        cls, cwd: Path, argv: list[str], env: dict[str, str], timeout: float = 90
    ) -> DevProcess:
        log_path = cwd / "dev-stderr.log"
        log = open(log_path, "a")  # noqa: SIM115  (owned by the process)
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        log.close()
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith("export "):
            proc.kill()
            proc.wait()
            proc.stdout.close()
            raise AssertionError(f"no export line: {line!r}; {log_path.read_text()}")
        match = re.search(r"RUNNER_REDIS_URL=(\S+)", line)
        assert match is not None, line
        dev = cls(proc, match.group(1), line, log_path)
        dev.wait_for("^runner dev: ready")  # from here on, Ctrl-C stops it in order
        return dev

    def lines(self, pattern: str) -> list[str]:
        """The lines it printed on stderr so far that match ``pattern`` (a regex)."""
        return [line for line in self.log.read_text().splitlines() if re.search(pattern, line)]

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 60) -> list[str]:
        """Wait until ``count`` lines matching ``pattern`` were printed; all of them."""
        deadline = time.monotonic() + timeout
        while len(found := self.lines(pattern)) < count:
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, f"no {pattern!r} in {self.log.read_text()}"
            time.sleep(0.1)
        return found

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop it as a user would; its exit code. One that does not stop within a minute is
        killed with every process below it (so a failing test leaves none running), and the
        test fails."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            for pid in [*descendants(self.proc.pid), self.proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(
                f"runner dev did not stop on {signal.Signals(sig).name}: {self.log.read_text()}"
            ) from None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        return code


RESTARTED = r"^runner dev: (.*) changed; restarting the workers$"
"""The line ``runner dev`` prints when it reloads; group 1 names the files."""


def console_link(dev: DevProcess) -> str:
    """The console's login link ``runner dev`` printed (``http://...?token=...``)."""
    (line,) = dev.lines(r"^runner dev: console http")
    return line.split()[-1]


def runner(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """``runner ARGS`` as a subprocess in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "runner.cli", *args],
        cwd=cwd,
        env=env if env is not None else bare_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def dev_argv(*args: str, flower: bool = False, ui: bool = False) -> list[str]:
    """``runner dev ARGS``, without Flower and the console unless asked for."""
    argv = [sys.executable, "-m", "runner.cli", "dev", *args]
    return argv + ([] if flower else ["--no-flower"]) + ([] if ui else ["--no-ui"])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A new project folder with one flow module, ``devflows.py``."""
    (tmp_path / "devflows.py").write_text(FLOWS)
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    return tmp_path


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_runner_dev_serves_every_process_of_the_project_and_survives_a_restart(
    project: Path,
) -> None:
    dev = DevProcess.start(project, dev_argv("devflows", "--workers", "2"), bare_env())
    try:
        assert dev.export == f"export RUNNER_REDIS_URL={dev.url}"
        recorded = json.loads((project / ".runner" / "dev.json").read_text())
        assert recorded["redis_url"] == dev.url and recorded["pid"] == dev.proc.pid
        info = redis.Redis.from_url(dev.url).info("persistence")
        assert info["aof_enabled"] == 1
        assert (project / ".runner" / "redis" / "appendonlydir").is_dir()

        # The CLI, from a folder below the project, with nothing configured.
        below = project / "sub" / "deeper"
        done = runner(below, "submit", "devflows:EchoFlow", "--input", "topic=bees", "--wait")
        assert done.returncode == 0, done.stderr
        run_id, outcome = done.stdout.splitlines()
        assert outcome == "succeeded: report from plan of bees"

        # runner.submit and Flow.submit from a script.
        script = project / "produce.py"
        script.write_text(
            "import runner\nfrom devflows import EchoFlow\n"
            "print(runner.submit('devflows:EchoFlow', {'topic': 'ants'}).result(timeout=60))\n"
            "print(EchoFlow.submit({'topic': 'owls'}).result(timeout=60))\n"
        )
        produced = subprocess.run(
            [sys.executable, str(script)], cwd=below, env=bare_env(), capture_output=True,
            text=True, timeout=90, check=False,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stderr
        assert produced.stdout.splitlines() == [
            "report from plan of ants",
            "report from plan of owls",
        ]

        # A worker started by hand finds it too.
        name = f"hand-{uuid.uuid4().hex[:6]}@%h"
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", "worker", "-n", name, "-c", "1",
             "--without-gossip", "--without-mingle", "-l", "warning"],
            cwd=below, env=bare_env(RUNNER_FLOW_MODULES="devflows"), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            from runner.distributed.app import make_app
            from runner.settings import RunnerSettings

            probe = make_app(RunnerSettings(redis_url=dev.url))
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    replies = probe.control.ping(timeout=0.5)
                    if any(name.startswith("hand-") for reply in replies for name in reply):
                        break
                    assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
                else:
                    raise AssertionError("the hand-started worker never answered")
            finally:
                probe.close()
        finally:
            worker.terminate()
            worker.communicate(timeout=30)
    finally:
        pid = dev.proc.pid
        assert dev.stop() == 0
    assert descendants(pid) == []

    # Stopped: its file remains, and says so.
    stale = runner(project, "runs")
    assert stale.returncode == 1
    assert stale.stderr.count("\n") == 1 and "is not running" in stale.stderr

    # Restarted: same URL, the runs are still there.
    again = DevProcess.start(project, dev_argv("devflows"), bare_env())
    try:
        assert again.url == dev.url
        status = runner(project, "status", run_id, "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["status"] == "succeeded"
        twice = runner(project, "dev", "devflows", "--no-flower", "--no-ui")
        assert twice.returncode == 1 and "already runs here" in twice.stderr
    finally:
        again.stop(signal.SIGINT)


def test_without_runner_dev_workers_and_producers_refuse_with_one_line(project: Path) -> None:
    worker = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "workers", "worker"],
        cwd=project, env=bare_env(RUNNER_FLOW_MODULES="devflows"), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert worker.returncode == 1
    assert worker.stderr.splitlines() == [
        "error: no Redis to share: run `runner dev` in this project (a producer and its "
        "workers must share one Redis), or set RUNNER_REDIS_URL"
    ]
    cli = runner(project, "submit", "devflows:EchoFlow", "--input", "topic=x")
    assert cli.returncode == 1
    assert cli.stderr.splitlines() == [worker.stderr.strip()]

    script = (
        "from runner.errors import StoreUnavailable\nfrom devflows import EchoFlow\n"
        "print(EchoFlow().kickoff(inputs={'topic': 'here'}))\n"
        "try:\n    EchoFlow.submit({'topic': 'x'})\n"
        "except StoreUnavailable as exc:\n    print('refused:', exc)\n"
    )
    produced = subprocess.run(
        [sys.executable, "-c", script], cwd=project, env=bare_env(), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    kicked, refused = produced.stdout.splitlines()
    assert kicked == "report from plan of here"  # in process: a private embedded Redis
    assert refused.startswith("refused: no Redis to share")


def test_submitting_a_flow_defined_in_main_fails_before_anything_is_stored(
    project: Path, redis_url: str, prefix: str
) -> None:
    script = FLOWS + (
        "\nfrom runner.errors import FlowImportError\n"
        "try:\n    EchoFlow.submit({'topic': 'x'})\n"
        "except FlowImportError as exc:\n    print(exc)\n"
    )
    (project / "script.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "script.py"], cwd=project,
        env=bare_env(RUNNER_REDIS_URL=redis_url, RUNNER_PREFIX=prefix), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert message.startswith("EchoFlow is defined in the script you ran (__main__)"), message
    assert "move it into a module" in message
    client = redis.Redis.from_url(redis_url)
    assert list(client.scan_iter(f"{prefix}:*")) == []
    client.close()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "name the flow modules the workers may run"),
        (["no_such_module_here"], "cannot import flow module no_such_module_here"),
        (["json"], "module json defines no Flow or Crew"),
    ],
)
def test_runner_dev_refuses_a_bad_allow_list_in_one_line(
    project: Path, args: list[str], needle: str
) -> None:
    done = runner(project, "dev", *args, "--no-flower", "--no-ui")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and needle in done.stderr, done.stderr
    assert not (project / ".runner").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_leaves_a_run_whose_printed_commands_work_as_printed(tmp_path: Path) -> None:
    env = bare_env(DEMO_FLOWER_PORT=str(_free_port()))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # venv on
    demo = subprocess.run(
        [sys.executable, "-m", "examples.demo"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=200, check=False,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    assert "rm -rf .runner" in out
    commands = [
        line.split("#")[0].strip()
        for line in out.split("Explore it:", 1)[1].splitlines()[1:]
        if line.startswith("  ")
    ]
    assert commands[0].startswith("RUNNER_PREFIX=demo runner dev examples.research")
    shell_env = dict(env)
    dev = DevProcess.start(
        tmp_path, ["bash", "-c", f"exec env {commands[0]} --no-flower --no-ui"], shell_env
    )
    try:
        exports = [c for c in commands[1:] if c.startswith("export ")]
        for name, value in (c[len("export ") :].split("=", 1) for c in exports):
            shell_env[name] = value
        for command in [c for c in commands[1:] if not c.startswith("export ")]:
            done = subprocess.run(
                ["bash", "-c", command], cwd=tmp_path, env=shell_env, capture_output=True,
                text=True, timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            if command.startswith("runner fork"):
                assert done.stdout.splitlines()[-1].startswith("succeeded: ")
    finally:
        dev.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


LOOP_FLOWS = """
import time
from pathlib import Path

from loophelp import SUFFIX
from runner import Flow, FlowState, listen, start


class S(FlowState):
    topic: str = ""


class LoopFlow(Flow[S]):
    @start()
    def plan(self):
        with open("plan.log", "a") as log:  # one line each time plan runs
            log.write(self.state.id + "\\n")
        return f"plan of {self.state.topic}"

    @listen(plan)
    def write(self, plan):
        if self.state.topic == "slow":
            Path("write-started").touch()
            time.sleep(3)
        return WRITE
"""


def loop_flows(write: str) -> str:
    """``loopflows.py`` whose ``write`` returns the expression ``write``."""
    return LOOP_FLOWS.replace("WRITE", write)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_runner_dev_restarts_its_workers_on_a_code_change_and_resume_runs_the_fix(
    project: Path,
) -> None:
    (project / "loophelp.py").write_text('SUFFIX = "v1"\n')
    (project / "loopflows.py").write_text(loop_flows("plan.body  # a bug: plan is a str"))
    dev = DevProcess.start(project, dev_argv("loopflows"), bare_env())
    try:
        failed = runner(project, "submit", "loopflows:LoopFlow", "--input", "topic=bees", "--wait")
        assert failed.returncode == 1, failed.stderr
        run_id = failed.stdout.split()[0]
        assert "AttributeError: 'str' object has no attribute 'body'" in failed.stderr

        # An editor saving two files a moment apart: one restart, naming both.
        (project / "loopflows.py").write_text(loop_flows('f"report from {plan} {SUFFIX}"'))
        time.sleep(0.1)
        (project / "loophelp.py").write_text('SUFFIX = "v2"\n')
        (line,) = dev.wait_for(RESTARTED)
        named = re.match(RESTARTED, line)
        assert named is not None and set(named.group(1).split(", ")) == {
            "loopflows.py",
            "loophelp.py",
        }
        resumed = runner(project, "resume", run_id, "--wait")
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.splitlines()[-1] == "succeeded: report from plan of bees v2"
        assert (project / "plan.log").read_text().splitlines() == [run_id]  # plan ran once
        assert len(dev.lines(RESTARTED)) == 1

        # A change while a step runs: the step finishes on the code it started with, once.
        slow = subprocess.Popen(
            [sys.executable, "-m", "runner.cli", "submit", "loopflows:LoopFlow", "--input",
             "topic=slow", "--wait"],
            cwd=project, env=bare_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (project / "write-started").exists():
            assert slow.poll() is None and time.monotonic() < deadline, slow.communicate()
            time.sleep(0.05)
        (project / "loophelp.py").write_text('SUFFIX = "v3"\n')
        dev.wait_for(RESTARTED, count=2)
        out, err = slow.communicate(timeout=90)
        assert slow.returncode == 0, err
        slow_id, outcome = out.splitlines()
        assert outcome == "succeeded: report from plan of slow v2"
        steps = runner(project, "steps", slow_id, "--json")
        assert steps.returncode == 0, steps.stderr
        rows = {row["step"].split("#")[0]: row for row in json.loads(steps.stdout)}
        assert rows["write"]["outcome"] == "done" and rows["write"]["attempts"] == 1
        again = runner(project, "submit", "loopflows:LoopFlow", "--input", "topic=owls", "--wait")
        assert again.stdout.splitlines()[-1] == "succeeded: report from plan of owls v3"

        # An edit that does not import: said in one line, the same workers keep running.
        running = sorted(descendants(dev.proc.pid))
        (project / "loopflows.py").write_text(loop_flows("(("))
        (broken,) = dev.wait_for(r"loopflows\.py changed but does not import")
        assert "SyntaxError" in broken and broken.endswith("the workers keep the code they run")
        assert sorted(descendants(dev.proc.pid)) == running
        assert len(dev.lines(RESTARTED)) == 2
    finally:
        pid = dev.proc.pid
        assert dev.stop() == 0
    assert descendants(pid) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_runner_dev_without_reload_keeps_its_workers_on_a_code_change(project: Path) -> None:
    (project / "loophelp.py").write_text('SUFFIX = "v1"\n')
    (project / "loopflows.py").write_text(loop_flows('f"{plan} {SUFFIX}"'))
    dev = DevProcess.start(project, dev_argv("loopflows", "--no-reload"), bare_env())
    try:
        (project / "loophelp.py").write_text('SUFFIX = "v2"\n')
        time.sleep(3)  # a reload would have begun by now (it does within a second)
        done = runner(project, "submit", "loopflows:LoopFlow", "--input", "topic=bees", "--wait")
        assert done.stdout.splitlines()[-1] == "succeeded: plan of bees v1", done.stderr
        assert dev.lines("changed") == []
    finally:
        assert dev.stop() == 0


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent")
def test_the_login_link_runner_dev_prints_logs_the_browser_in_and_the_console_can_act(
    project: Path,
) -> None:
    from playwright.sync_api import sync_playwright

    flower_port, ui_port = _free_port(), _free_port()
    ports = ["--flower-port", str(flower_port), "--ui-port", str(ui_port)]
    dev = DevProcess.start(project, dev_argv("devflows", *ports, flower=True, ui=True), bare_env())
    try:
        assert dev.lines(rf"^runner dev: Flower http://127\.0\.0\.1:{flower_port}$")
        link = console_link(dev)
        assert re.fullmatch(rf"http://127\.0\.0\.1:{ui_port}/\?token=[\w-]{{20,}}", link), link
        done = runner(project, "submit", "devflows:EchoFlow", "--input", "topic=bees", "--wait")
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.split()[0]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(link)  # as a click on the link in the terminal opens it
                assert page.url == f"http://127.0.0.1:{ui_port}/"  # the token left the URL
                assert run_id in page.content() and "password" not in page.content()
                # An action from the page, as its forms send it (session cookie + CSRF).
                answer = page.evaluate(
                    """async (runId) => {
                        const csrf = JSON.parse(document.body.getAttribute("hx-headers"));
                        const response = await fetch(`/api/checkpoints/${runId}/fork`, {
                            method: "POST", headers: {...csrf, "Content-Type": "application/json"},
                            body: JSON.stringify({set: {topic: "wasps"}}),
                        });
                        return [response.status, await response.json()];
                    }""",
                    run_id,
                )
            finally:
                browser.close()
        assert answer[0] == 201, answer
        forked = runner(project, "show", answer[1]["run_id"], "--json")
        assert json.loads(forked.stdout)["state"]["topic"] == "wasps", forked.stdout
    finally:
        assert dev.stop() == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cause", ["a busy port", "a failed import"])
def test_runner_dev_says_in_one_line_why_the_console_did_not_start(
    project: Path, cause: str
) -> None:
    import socket

    argv = dev_argv("devflows", "--workers", "0", "--no-reload", ui=True)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        if cause == "a failed import":
            busy.close()  # the port is free; the console's web framework does not import
            (project / "fastapi.py").write_text(
                "raise ModuleNotFoundError(\"No module named 'fastapi'\", name='fastapi')\n"
            )
        dev = DevProcess.start(project, [*argv, "--ui-port", str(port)], bare_env())
        try:
            said = dev.lines("console")
        finally:
            assert dev.stop() == 0
    reason = {
        "a busy port": f"port {port} is in use (--ui-port PORT picks another)",
        "a failed import": "error: the console needs fastapi, jinja2, python-multipart and "
        "uvicorn (fastapi is missing); they come with celery-flows: pip install celery-flows "
        "(exit code 1; log: ",
    }[cause]
    assert len(said) == 1 and said[0].startswith(f"runner dev: the console did not start: {reason}")
