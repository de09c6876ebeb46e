"""The README's Quick start, pasted as a new user would: its files written, its commands run.

Each ``python`` block is written to the file the text right before it names (`name.py`) and
each ``bash`` line runs in a shell in that folder, with nothing configured (no ``RUNNER_*``
variable); ``runner dev`` runs in the background, as in its own terminal.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_dev import DevProcess, bare_env, descendants

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def quick_start() -> list[tuple[str, str, str]]:
    """(language, file name or "", code) of each code block of the Quick start section."""
    text = README.read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = []
    for match in re.finditer(r"```(\w+)\n(.*?)```", section, flags=re.S):
        before = section[: match.start()].rsplit("```", 1)[-1]
        names = re.findall(r"`([\w/]+\.py)`", before)
        blocks.append((match.group(1), names[-1] if names else "", match.group(2)))
    return blocks


def test_the_quick_start_names_a_module_runner_dev_and_a_submit() -> None:
    blocks = quick_start()
    files = [name for lang, name, _code in blocks if lang == "python"]
    commands = [code.strip() for lang, _name, code in blocks if lang == "bash"]
    assert files == ["report_flows.py", "submit_report.py"]
    assert commands[0].startswith("runner dev ")
    assert any(c.startswith("runner submit ") for c in commands[1:])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_quick_start_works_as_pasted(tmp_path: Path) -> None:
    env = bare_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    dev: DevProcess | None = None
    try:
        for lang, name, code in quick_start():
            if lang == "python":
                (tmp_path / name).write_text(code)
            elif code.strip().startswith("runner dev "):
                dev = DevProcess.start(tmp_path, ["bash", "-c", f"exec {code.strip()}"], env)
            else:
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", code],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert done.returncode == 0, (code, done.stdout, done.stderr)
                lines = done.stdout.splitlines()
                assert lines[-1] == "succeeded: report from outline of redis", done.stdout
        script = subprocess.run(
            [sys.executable, "submit_report.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert script.returncode == 0, script.stderr
        assert script.stdout.splitlines() == ["report from outline of redis"] * 2
    finally:
        if dev is not None:
            pid = dev.proc.pid
            assert dev.stop(signal.SIGINT) == 0  # Ctrl-C in its terminal
            assert descendants(pid) == []
