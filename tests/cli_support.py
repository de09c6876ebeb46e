"""``runner ARGS`` run in the test's own process, as the console script would run them.

A test that checks what a command prints and its exit code needs no Python of its own:
typer's ``CliRunner`` invokes the same command group, with the environment patched for the
call, and saves a process start-up (~0.4 s of CPU) per command. Tests of the process itself
(the console script's exit on a bad flag, ``--debug`` tracebacks, the cold start, the wheel,
a terminal, a signal) still start ``python -m runner``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from typer.testing import CliRunner

from runner.cli import app


def run(
    *args: str, env: Mapping[str, str | None] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``runner ARGS`` with ``env`` on top of this process's environment (a ``None`` value
    unsets a variable), as a finished process: its exit code, stdout and stderr."""
    result = CliRunner().invoke(app, list(args), env=env, input=stdin)
    return subprocess.CompletedProcess(
        ["runner", *args], result.exit_code, result.stdout, result.stderr
    )


def only(env: Mapping[str, str]) -> dict[str, str | None]:
    """The overlay that makes ``env`` the whole environment of a call: every other variable
    of this process unset for it (``None``)."""
    return {**dict.fromkeys(os.environ), **env}
