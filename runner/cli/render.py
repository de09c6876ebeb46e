"""Rich views of runs and checkpoints (the ``--json`` forms are the models' own dumps)."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.json import JSON
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from runner.store.models import Checkpoint, RunInfo, RunStatus, StepError

STATUS_STYLE = {
    RunStatus.PENDING: "dim",
    RunStatus.RUNNING: "cyan",
    RunStatus.PAUSED: "yellow",
    RunStatus.SUCCEEDED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "magenta",
}


def when(ts: float | None) -> str:
    """A Unix time as local ``YYYY-mm-dd HH:MM:SS`` (``-`` if unset)."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float) -> str:
    """``4.2s``, ``3m 05s``, ``2h 10m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def status_text(status: RunStatus) -> Text:
    """The status word in its colour."""
    return Text(status.value, style=STATUS_STYLE.get(status, ""))


def error_line(error: StepError | None) -> str:
    """``Type: message`` of a step error."""
    return f"{error.type}: {error.message}" if error else ""


def _grid() -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    return grid


def _in_flight_row(grid: Table, status: RunStatus, latest: Checkpoint) -> None:
    # In flight means running only while the run is; otherwise it is what a resume runs.
    if status is RunStatus.RUNNING:
        grid.add_row("running", ", ".join(latest.in_flight) or "-")
    elif latest.in_flight:
        grid.add_row("to resume", ", ".join(latest.in_flight))


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# --- runs -----------------------------------------------------------------------------------


def runs_table(infos: list[RunInfo]) -> Table:
    """``runner runs``: one row per run, newest update first."""
    table = Table(show_edge=False, header_style="bold")
    table.add_column("run", no_wrap=True)
    table.add_column("flow", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("step")
    table.add_column("seq", justify="right")
    table.add_column("updated", no_wrap=True)
    table.add_column("parent", no_wrap=True)
    for info in infos:
        table.add_row(
            info.run_id,
            info.name or info.flow or "-",
            status_text(info.status),
            info.step or "-",
            str(info.seq),
            when(info.updated_at),
            info.parent_run_id or "",
        )
    return table


def status_view(
    info: RunInfo,
    latest: Checkpoint,
    error: StepError | None,
    children: list[dict[str, Any]] | None = None,
) -> RenderableType:
    """``runner status``: the run's metadata, progress, lineage and last error."""
    grid = _grid()
    grid.add_row("run", info.run_id)
    grid.add_row("flow", f"{info.flow or '-'}" + (f"  ({info.name})" if info.name else ""))
    grid.add_row("status", status_text(info.status))
    grid.add_row("step", info.step or "-")
    grid.add_row("event", info.event or "-")
    grid.add_row("seq", f"{info.seq}  (checkpoint {info.latest or latest.id})")
    grid.add_row("created", when(info.created_at))
    grid.add_row("updated", when(info.updated_at))
    grid.add_row("completed", ", ".join(latest.completed) or "-")
    _in_flight_row(grid, info.status, latest)
    if info.parent_run_id:
        lineage = f"forked from run {info.parent_run_id} at checkpoint {info.parent_checkpoint_id}"
        grid.add_row("lineage", lineage + (f" (branch {info.branch})" if info.branch else ""))
    if info.status is RunStatus.PAUSED and latest.meta.get("pause_reason"):
        grid.add_row("paused", str(latest.meta["pause_reason"]))
    if error is not None:
        grid.add_row("error", Text(error_line(error), style="red"))
    parent = latest.meta.get("parent")
    if isinstance(parent, dict):
        grid.add_row("parent run", f"{parent.get('run_id')} (step {parent.get('activation')})")
    if children:
        lines = [
            f"{c['activation']}: {c['run_id']} ({c['name'] or '-'}, {c['status'] or 'not found'})"
            for c in children
        ]
        grid.add_row("child runs", "\n".join(lines))
    return grid


def progress_view(
    info: RunInfo, latest: Checkpoint, total: int | None, error: StepError | None
) -> RenderableType:
    """``runner watch``: steps done of total, running steps, elapsed time, last error."""
    done = len({act.rpartition("#")[0] for act in latest.completed})
    end = time.time() if not (info.status.finished or info.status is RunStatus.PAUSED) else None
    elapsed = (end or info.updated_at) - (info.created_at or latest.created_at)
    head = Text.assemble(
        (info.name or info.flow or "run", "bold"), f"  {info.run_id}  ", status_text(info.status)
    )
    grid = _grid()
    if total:
        bar = Table.grid(padding=(0, 1))
        progress = ProgressBar(total=total, completed=min(done, total), width=30)
        bar.add_row(progress, f"{done}/{total}")
        grid.add_row("steps", bar)
    else:
        grid.add_row("steps", f"{done} done")
    _in_flight_row(grid, info.status, latest)
    grid.add_row("elapsed", duration(max(elapsed, 0.0)))
    if info.status is RunStatus.PAUSED and latest.meta.get("pause_reason"):
        grid.add_row("paused", str(latest.meta["pause_reason"]))
    if error is not None:
        grid.add_row("last error", Text(error_line(error), style="red"))
    return Panel(grid, title=head, title_align="left", expand=False)


# --- checkpoints ----------------------------------------------------------------------------


def history_table(ckpts: list[Checkpoint]) -> Table:
    """``runner checkpoints``: seq, id, event, step, status, time (newest first)."""
    table = Table(show_edge=False, header_style="bold")
    table.add_column("seq", justify="right")
    table.add_column("id", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("step")
    table.add_column("status", no_wrap=True)
    table.add_column("time", no_wrap=True)
    for ckpt in ckpts:
        table.add_row(
            str(ckpt.seq),
            ckpt.id,
            ckpt.event,
            ckpt.step or "-",
            status_text(ckpt.status),
            when(ckpt.created_at),
        )
    return table


def checkpoint_view(ckpt: Checkpoint) -> RenderableType:
    """``runner show``: one checkpoint in full."""
    grid = _grid()
    grid.add_row("checkpoint", ckpt.id)
    grid.add_row("run", ckpt.run_id)
    grid.add_row("seq", str(ckpt.seq))
    grid.add_row("event", ckpt.event)
    grid.add_row("step", ckpt.step or "-")
    grid.add_row("status", status_text(ckpt.status))
    grid.add_row("time", when(ckpt.created_at))
    grid.add_row("flow", ckpt.flow or "-")
    grid.add_row("completed", ", ".join(ckpt.completed) or "-")
    grid.add_row("in flight", ", ".join(ckpt.in_flight) or "-")
    if ckpt.lineage is not None:
        lin = ckpt.lineage
        text = f"forked from run {lin.parent_run_id} at checkpoint {lin.parent_checkpoint_id}"
        grid.add_row("lineage", text + (f" (branch {lin.branch})" if lin.branch else ""))
    if ckpt.meta.get("pause_reason"):
        grid.add_row("paused", str(ckpt.meta["pause_reason"]))
    parts: list[RenderableType] = [
        grid,
        Panel(JSON.from_data(ckpt.state), title="state", title_align="left", expand=False),
    ]
    if ckpt.outputs:
        outputs = JSON.from_data(ckpt.outputs)
        parts.append(Panel(outputs, title="outputs", title_align="left", expand=False))
    if ckpt.error is not None:
        err = ckpt.error
        body = Text(f"{error_line(err)}  (attempts: {err.attempts})\n", style="red")
        body.append(err.traceback.rstrip() or "(no traceback)", style="")
        parts.append(Panel(body, title="error", title_align="left", expand=False))
    return Group(*parts)


def diff_view(a: Checkpoint, b: Checkpoint, diff: dict[str, Any]) -> RenderableType:
    """``runner diff``: state fields added, removed, changed; completed steps on each side."""
    head = Text(
        f"a = {a.id} (run {a.run_id}, seq {a.seq})\nb = {b.id} (run {b.run_id}, seq {b.seq})"
    )
    state = diff["state"]
    table = Table(show_edge=False, header_style="bold", title="state", title_justify="left")
    table.add_column("", no_wrap=True)
    table.add_column("field", no_wrap=True)
    table.add_column("a", overflow="fold")
    table.add_column("b", overflow="fold")
    for path, value in state["added"].items():
        table.add_row(Text("+", style="green"), path, "", _value(value))
    for path, value in state["removed"].items():
        table.add_row(Text("-", style="red"), path, _value(value), "")
    for path, (old, new) in state["changed"].items():
        table.add_row(Text("~", style="yellow"), path, _value(old), _value(new))
    parts: list[RenderableType] = [head]
    if table.row_count:
        parts.append(table)
    else:
        parts.append(Text("state: no differences"))
    done = diff["completed"]
    grid = _grid()
    grid.add_row("completed only in a", ", ".join(done["only_a"]) or "-")
    grid.add_row("completed only in b", ", ".join(done["only_b"]) or "-")
    parts.append(grid)
    return Group(*parts)
