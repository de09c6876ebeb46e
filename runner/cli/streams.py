"""``runner watch RUN --stream`` and ``runner submit ... --wait --stream``: a run's live
stream (tokens, progress lines) printed as it comes, then how the run ended.

On a terminal the run's live table stays on top and the running steps' text grows under it;
piped, the text is written as it comes (a step's tokens run on; JSON chunks and a step's
newer attempt get a line of their own), then the one-line outcome ``watch`` prints.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, NoReturn

import typer

from runner.errors import RunTimeout

from ._outcome import LIVE_POLL, exit_code_of, progress_view, say
from ._session import Reader, console

TAIL_LINES = 12
"""Lines of each running step's text shown under the live table."""


def follow_stream(reader: Reader, run_id: str, *, timeout: float | None) -> NoReturn:
    """Print ``run_id``'s stream until the run stops, then its outcome; exit with its code."""
    from runner.flow import following, streaming

    frames = following.follow(reader.store, run_id)  # RunNotFound: one line, before output
    out = console()
    deadline = None if timeout is None else time.monotonic() + timeout
    end = _live(reader, run_id, frames, out, deadline) if out.is_terminal else None
    if end is None:
        for frame in frames:
            if frame.channel == streaming.FLOW and frame.type in streaming.ENDINGS.values():
                end = frame
                break
            _write(frame, run_id)
            _check(deadline, run_id)
        sys.stdout.write("\n")
        sys.stdout.flush()
    say(reader, run_id)
    from runner.store.models import RunStatus

    raise typer.Exit(exit_code_of(RunStatus(end.data["status"]) if end else RunStatus.FAILED))


_step = ""


def _label(frame: Any, run_id: str) -> str:
    """A frame's step, with the child run's id when a child wrote it."""
    return frame.step if frame.run_id == run_id else f"{frame.run_id[:8]}/{frame.step}"


def _write(frame: Any, run_id: str) -> None:
    """One frame, piped: text runs on; anything else gets its own line."""
    global _step
    label = _label(frame, run_id)
    if frame.type == "attempt":
        sys.stdout.write(f"\n[{label}: attempt {frame.attempt} supersedes the earlier ones]\n")
    elif frame.content:
        if label != _step:
            sys.stdout.write(f"\n[{label}]\n" if _step else f"[{label}]\n")
        sys.stdout.write(frame.content)
    else:
        sys.stdout.write(f"\n[{label} {frame.channel}] {json.dumps(frame.data)}\n")
    _step = label if frame.content else _step
    sys.stdout.flush()


def _check(deadline: float | None, run_id: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise RunTimeout(f"run {run_id} still running after the timeout", run_id=run_id)


def _live(reader: Reader, run_id: str, frames: Any, out: Any, deadline: float | None) -> Any:
    """The live table with each step's streamed text under it; the end frame."""
    from rich.console import Group
    from rich.live import Live
    from rich.panel import Panel
    from rich.text import Text

    from runner.flow import streaming

    texts: dict[str, str] = {}
    ended: list[Any] = []
    lock = threading.Lock()

    def pump() -> None:
        for frame in frames:
            with lock:
                if frame.channel == streaming.FLOW and frame.type in streaming.ENDINGS.values():
                    ended.append(frame)
                    return
                key = _label(frame, run_id)
                if frame.type == "attempt":
                    texts[key] = f"(attempt {frame.attempt})\n"
                elif frame.content:
                    texts[key] = texts.get(key, "") + frame.content
                else:
                    texts[key] = (
                        texts.get(key, "") + f"\n{frame.channel}: {json.dumps(frame.data)}\n"
                    )

    thread = threading.Thread(target=pump, name="runner-watch-stream", daemon=True)
    thread.start()
    with Live(console=out, auto_refresh=False) as live:
        while True:
            _info, view = progress_view(reader, run_id)
            with lock:
                panels = [
                    Panel(Text("\n".join(text.splitlines()[-TAIL_LINES:])), title=step)
                    for step, text in texts.items()
                ]
                done = ended[0] if ended else None
            live.update(Group(view, *panels), refresh=True)
            if done is not None:
                return done
            _check(deadline, run_id)
            time.sleep(LIVE_POLL / 2)
