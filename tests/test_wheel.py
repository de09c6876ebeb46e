"""What users install, installed as they would: the wheel built from this checkout, put in a
fresh virtualenv outside it by the README's install line as pasted (pip finds the wheel through
``PIP_FIND_LINKS``, the dependencies on the package index), then the README's quick start and
its dev loop (a bug fails a run, the fix is saved, ``runner dev`` reloads, ``runner resume``
finishes it) run from there, with nothing of the checkout importable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_dev import RESTARTED, descendants
from tests.test_quickstart import (
    check_console,
    quick_start,
    readme_blocks,
    run_quick_start,
    service_ports,
)

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NICE = ["nice", "-n", "10"] if shutil.which("nice") else []
"""The build and the install (a minute of CPU, nothing timed) yield the CPU to the files
`make test` runs beside this one, some of which time recoveries against a promise."""


def _run(
    argv: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``argv``, which must succeed; what it printed."""
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (argv, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built by ``python -m build --wheel`` from a copy of its
    files (the checkout's own ``build/`` may hold modules since removed)."""
    where = tmp_path_factory.mktemp("wheel")
    listed = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT
    ).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the work tree is not there
            (where / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / "src" / name)
    _run(
        [*NICE, sys.executable, "-m", "build", "--wheel", "--outdir", str(where / "dist"), "src"],
        cwd=where,
    )
    (found,) = (where / "dist").glob("*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A shell environment whose virtualenv (outside the checkout) got ``celery-flows`` by the
    README's install line, run as pasted; ``RUNNER_*`` unset but for free console/Flower ports."""
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RUNNER_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(ROOT))]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])  # as `source venv/bin/activate`
    env["VIRTUAL_ENV"] = str(venv)
    # The wheel first; any links pip is configured with stay (the index gives the rest).
    env["PIP_FIND_LINKS"] = " ".join(filter(None, [str(wheel.parent), env.get("PIP_FIND_LINKS")]))
    (line,) = [
        line
        for lang, _name, code in readme_blocks(None)
        if lang == "bash"
        for line in code.splitlines()
        if line.startswith("pip install ")
    ]
    assert line.split("#")[0].split() == ["pip", "install", "celery-flows"], line
    _run([*NICE, "bash", "-euo", "pipefail", "-c", line], cwd=home, env=env, timeout=600)
    yield {**env, **service_ports()}


def test_the_wheel_holds_the_runner_package_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"runner"}, sorted(tops)
    assert "runner/worker.py" in names and "runner/cli/dev.py" in names
    # The console's pages and its vendored scripts come along (package data).
    assert any(n.startswith("runner/console/templates/") for n in names)
    assert any(n.startswith("runner/console/static/") for n in names)


def test_the_readme_install_quick_start_and_dev_loop_work_from_the_wheel(
    wheel: Path, installed: dict[str, str], tmp_path: Path
) -> None:
    env = installed
    venv_python = Path(env["VIRTUAL_ENV"]) / "bin" / "python"
    where = _run(
        [str(venv_python), "-c", "import runner.cli.dev as m; print(m.__file__)"],
        cwd=tmp_path,
        env=env,
    ).stdout.strip()
    assert Path(where).is_relative_to(env["VIRTUAL_ENV"]), where  # not the checkout's
    with zipfile.ZipFile(wheel) as archive:
        assert Path(where).read_bytes() == archive.read("runner/cli/dev.py")  # the wheel's

    dev, first_run = run_quick_start(tmp_path, env)
    try:
        # The console and Flower of the installed package, on the ports given to them.
        check_console(dev, first_run)
        flower = env["RUNNER_UI_FLOWER_URL"]
        assert dev.lines(rf"^runner dev: Flower {re.escape(flower)}$"), dev.log.read_text()
        assert httpx.get(flower, timeout=30).status_code == 200

        # The dev loop: a bug in `write` fails the run, the fix is saved, resume finishes it.
        commands = [
            line
            for lang, _name, code in readme_blocks("### The dev loop")
            if lang == "bash"
            for line in code.splitlines()
            if line.strip()
        ]
        submit = next(c for c in commands if c.startswith("runner submit "))
        resume = next(c for c in commands if c.startswith("runner resume "))
        module = tmp_path / "report_flows.py"
        (fixed,) = [code for lang, name, code in quick_start() if name == module.name]
        buggy = fixed.replace('f"report from {outline}"', 'f"report from {outline.body}"')
        assert buggy != fixed
        module.write_text(buggy)
        dev.wait_for(RESTARTED)
        failed = subprocess.run(
            ["bash", "-c", submit], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert failed.returncode == 1, (failed.stdout, failed.stderr)
        assert "AttributeError: 'str' object has no attribute 'body'" in failed.stderr
        run_id = failed.stdout.split()[0]
        module.write_text(fixed)
        (_, restarted) = dev.wait_for(RESTARTED, count=2)
        assert restarted == "runner dev: report_flows.py changed; restarting the workers"
        resumed = _run(
            ["bash", "-c", re.sub(r"\bRUN\b", run_id, resume)],
            cwd=tmp_path,
            env=env,
            timeout=120,
        )
        assert resumed.stdout.splitlines()[-1] == "succeeded: report from outline of redis"
        steps = _run(["runner", "steps", run_id, "--json"], cwd=tmp_path, env=env)
        plan = [row for row in json.loads(steps.stdout) if row["step"].startswith("plan")]
        assert [(row["outcome"], row["attempts"]) for row in plan] == [("done", 1)], plan
    finally:
        pid = dev.proc.pid
        assert dev.stop(signal.SIGINT) == 0
        assert descendants(pid) == []
