"""The README's Quick start, pasted as a new user would: its files written, its commands run.

Each ``python`` block is written to the file the text right before it names (`name.py`) and
each ``bash`` line runs in a shell in that folder, with nothing configured (no ``RUNNER_*``
variable but the console's and Flower's ports, free ones); ``runner dev`` runs in the
background, as in its own terminal. ``tests/test_wheel.py`` does the same in a virtualenv
where the README's install line installed the built wheel.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.test_dev import DevProcess, bare_env, console_link, descendants

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_blocks(heading: str | None) -> list[tuple[str, str, str]]:
    """(language, file name or "", code) of each code block of one README section.

    ``heading`` is the section's whole heading line (``"## Quick start"``); the section ends
    at the next heading of any level. ``None``: the first screen, before the first ``## ``.
    A block's file name is the last `name.py` the text since the previous block names.
    """
    section: list[str] = []
    inside, fenced = heading is None, False
    for line in README.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            if inside and (heading is not None or line.startswith("## ")):
                break
            inside = inside or line.rstrip("\n") == heading
            continue
        if inside:
            section.append(line)
    text = "".join(section)
    assert text, f"README.md has no section {heading!r}"
    blocks = []
    for match in re.finditer(r"```(\w+)\n(.*?)```", text, flags=re.S):
        before = text[: match.start()].rsplit("```", 1)[-1]
        names = re.findall(r"`([\w/]+\.py)`", before)
        blocks.append((match.group(1), names[-1] if names else "", match.group(2)))
    return blocks


def quick_start() -> list[tuple[str, str, str]]:
    """(language, file name or "", code) of each code block of the Quick start section."""
    return readme_blocks("## Quick start")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_ports() -> dict[str, str]:
    """Free ports for the console and Flower of ``runner dev`` (others may use the defaults)."""
    return {
        "RUNNER_UI_PORT": str(free_port()),
        "RUNNER_UI_FLOWER_URL": f"http://127.0.0.1:{free_port()}",
    }


def run_quick_start(folder: Path, env: dict[str, str]) -> tuple[DevProcess, str]:
    """Write the Quick start's files in ``folder``, start its ``runner dev`` there, run its
    other commands and check what they print; the ``runner dev`` (still running) and the id
    of the run its submit made."""
    dev: DevProcess | None = None
    run_id = ""
    for lang, name, code in quick_start():
        if lang == "python":
            (folder / name).write_text(code)
        elif code.strip().startswith("runner dev "):
            dev = DevProcess.start(folder, ["bash", "-c", f"exec {code.strip()}"], env)
        else:
            try:
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", code],
                    cwd=folder,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert done.returncode == 0, (code, done.stdout, done.stderr)
                lines = done.stdout.splitlines()
                assert lines[-1] == "succeeded: report from outline of redis", done.stdout
                run_id = lines[0]
            except BaseException:
                if dev is not None:
                    dev.stop()
                raise
    assert dev is not None and run_id, "the quick start starts no `runner dev`, or no run"
    return dev, run_id


def check_console(dev: DevProcess, run_id: str) -> None:
    """The login link ``runner dev`` printed logs in, and the console can act: a fork of
    ``run_id`` from the page's session (its cookie and CSRF token) is accepted."""
    with httpx.Client(follow_redirects=True, timeout=30) as browser:
        page = browser.get(console_link(dev))
        assert page.status_code == 200 and run_id in page.text, page.text
        assert "token=" not in str(page.url)  # logged in by a cookie; the link is spent
        found = re.search(r"hx-headers='([^']*)'", page.text)
        assert found is not None, page.text
        csrf = json.loads(html.unescape(found.group(1)))
        fork = browser.post(
            f"{page.url}api/checkpoints/{run_id}/fork",
            json={"set": {"topic": "bees"}},
            headers=csrf,
        )
        assert fork.status_code == 201, fork.text


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
    env = bare_env(**service_ports())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    dev, run_id = run_quick_start(tmp_path, env)
    try:
        check_console(dev, run_id)
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
        pid = dev.proc.pid
        assert dev.stop(signal.SIGINT) == 0  # Ctrl-C in its terminal
        assert descendants(pid) == []
