"""Rich views of runs and checkpoints (the ``--json`` forms are the models' own dumps).

Commands import this module where they print a view, not at the top: rich takes ~30 ms to
import, which a cold ``runner runs --json`` (a script's call) should not pay.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.json import JSON
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from runner.flow.rates import priority_text
from runner.ids import activation_of_key
from runner.store.models import Answer, Checkpoint, RunInfo, RunStatus, StepError
from runner.views import (
    WAITING,
    StepState,
    awaited,
    duration,
    pause_reason,
    scheduled_until,
    step_states,
    when,
)

STATUS_STYLE = {
    RunStatus.PENDING: "dim",
    RunStatus.RUNNING: "cyan",
    RunStatus.PAUSED: "yellow",
    RunStatus.SUCCEEDED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "magenta",
    RunStatus.CORRUPT: "bold red",
}


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


def _in_flight_rows(
    grid: Table, status: RunStatus, latest: Checkpoint, states: dict[str, StepState]
) -> None:
    # In flight means running or waiting only while the run is (``states`` says which, see
    # runner.views.step_states); otherwise it is what a resume runs.
    if status is RunStatus.RUNNING:
        waiting = {step: s for step, s in states.items() if s.state == WAITING}
        running = [step for step in states if step not in waiting]
        if running or not waiting:
            grid.add_row("running", ", ".join(running) or "-")
        if waiting:
            lines = [s.line(step) for step, s in waiting.items()]
            grid.add_row(Text("waiting", style="yellow"), "\n".join(lines))
    elif latest.in_flight:
        grid.add_row("to resume", ", ".join(latest.in_flight))


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# --- runs -----------------------------------------------------------------------------------


def stamp(ts: float | None) -> str:
    """A Unix time in a table: ``HH:MM:SS`` if today, else ``YYYY-mm-dd HH:MM``."""
    if not ts:
        return "-"
    moment = datetime.fromtimestamp(ts)
    same_day = moment.date() == datetime.now().date()
    return moment.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M")


def short_event(event: str) -> str:
    """An event name for a table: ``method_execution_finished`` -> ``finished``."""
    return event.removeprefix("method_execution_")


def clock(ts: float | None) -> str:
    """A Unix time as local ``HH:MM:SS`` (``-`` if unset): for tables of one run's steps."""
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "-"


def runs_table(
    infos: list[tuple[RunInfo, int]],
    shown: dict[str, str],
    scheduled: Collection[str] = (),
    expires: dict[str, str] | None = None,
) -> Table:
    """``runner runs``: one row per run (child runs indented under their parent).

    ``infos`` are (run, depth) pairs; ``shown`` maps each run id to its unique prefix;
    ``scheduled``: the delayed runs still waiting to start (stored as running), shown so;
    ``expires``: run id -> when it leaves Redis (a column when given).
    """
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    table.add_column("run", no_wrap=True)
    table.add_column("flow", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("step", overflow="fold")
    table.add_column("seq", justify="right", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    if expires is not None:
        table.add_column("expires", no_wrap=True)
    for info, depth in infos:
        extra = [] if expires is None else [expires.get(info.run_id, "-")]
        table.add_row(
            "  " * depth + ("└ " if depth else "") + shown.get(info.run_id, info.run_id),
            info.name or info.flow or "-",
            Text("scheduled", style="cyan")
            if info.run_id in scheduled
            else status_text(info.status),
            info.step or "-",
            str(info.seq),
            stamp(info.updated_at),
            *extra,
        )
    return table


STEP_WIDTH = 24
"""The width a steps table keeps for step names however narrow the screen."""


def steps_table(rows: list[Any], shown: dict[str, str], *, one_row: bool = False) -> Table:
    """``runner steps``: each activation, a child run's steps indented under the step that
    started it (``runner runs`` shows the child runs' ids).

    ``one_row`` (the live view): each step keeps to one row, a worker name too long for its
    column cut with an ellipsis; otherwise nothing is cut (long names fold).
    """
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    # A step name keeps its width (up to STEP_WIDTH) however narrow the screen: the columns
    # that give way are the worker's and the checkpoint's, whose ids fold (two checkpoints
    # one process made in the same millisecond share all but their last digit).
    longest = max((len("  " * row.depth + row.step) for row in rows), default=4)
    table.add_column("step", overflow="fold", min_width=min(longest, STEP_WIDTH))
    table.add_column("outcome", no_wrap=True)
    table.add_column("try", justify="right", no_wrap=True)
    # The column may narrow as the step's does when the screen is narrow; in the live view
    # its cells stay on one line (a live view whose rows change height jumps).
    table.add_column("worker", overflow="fold")
    table.add_column("start", no_wrap=True)
    table.add_column("took", justify="right", no_wrap=True)
    # Only a run whose steps recorded LLM usage gets a tokens column, and in the live view it
    # takes the checkpoint's place (`runner steps` has both): at 80 columns one more column
    # made step names wrap.
    spent = any(row.usage for row in rows)
    keep_checkpoint = not (spent and one_row)
    if keep_checkpoint:  # in the live view cut like the worker's name, else folded
        if one_row:
            table.add_column("checkpoint", no_wrap=True, overflow="ellipsis", max_width=17)
        else:
            table.add_column("checkpoint", overflow="fold")
    if spent:
        table.add_column("tokens", justify="right", no_wrap=True)
    for row in rows:
        cells = [shown.get(row.checkpoint or "", row.checkpoint or "-")] if keep_checkpoint else []
        if spent:
            cells.append(f"{row.usage['total_tokens']:,}" if row.usage else "-")
        table.add_row(
            "  " * row.depth + row.step,
            Text(row.outcome, style=OUTCOME_STYLE.get(row.outcome, "")),
            str(row.attempts) if row.attempts is not None else "-",
            Text(row.worker or "-", no_wrap=True, overflow="ellipsis")
            if one_row
            else row.worker or "-",
            clock(row.started),
            duration(row.duration),
            *cells,
        )
    return table


OUTCOME_STYLE = {
    "done": "green",
    "failed": "red",
    "paused": "yellow",
    "running": "cyan",
    "waiting": "yellow",
}


def status_view(
    info: RunInfo,
    latest: Checkpoint,
    error: StepError | None,
    children: list[dict[str, Any]] | None = None,
    expires: str | None = None,
    states: dict[str, StepState] | None = None,
) -> RenderableType:
    """``runner status``: the run's metadata, progress, lineage and last error; ``expires``:
    when it leaves Redis (a row when given, see :mod:`runner.cli.expiry_view`); ``states``:
    how its in-flight steps are shown (:func:`runner.views.step_states`; default: with no
    deployment's waits known)."""
    grid = _grid()
    grid.add_row("run", info.run_id)
    grid.add_row("flow", f"{info.flow or '-'}" + (f"  ({info.name})" if info.name else ""))
    waiting = scheduled_until(latest)
    if waiting is not None:
        grid.add_row("status", Text(f"scheduled, starts at {when(waiting)}", style="cyan"))
    else:
        grid.add_row("status", status_text(info.status))
    grid.add_row("step", info.step or "-")
    grid.add_row("event", info.event or "-")
    grid.add_row("seq", f"{info.seq}  (checkpoint {info.latest or latest.id})")
    if latest.version:
        grid.add_row("version", latest.version)
    grid.add_row("created", when(info.created_at))
    grid.add_row("updated", when(info.updated_at))
    if expires is not None:
        grid.add_row("expires", expires)
    grid.add_row("completed", ", ".join(latest.completed) or "-")
    _in_flight_rows(grid, info.status, latest, states or step_states(latest, {}))
    if info.parent_run_id:
        lineage = f"forked from run {info.parent_run_id} at checkpoint {info.parent_checkpoint_id}"
        grid.add_row("lineage", lineage + (f" (branch {info.branch})" if info.branch else ""))
    if reason := pause_reason(info.status, latest):
        grid.add_row("paused", reason)
    _awaiting_rows(grid, info, latest)
    if latest.meta.scheduling.deadline is not None:
        grid.add_row("deadline", when(latest.meta.scheduling.deadline))
    if latest.meta.scheduling.priority is not None:
        grid.add_row("priority", priority_text(latest.meta.scheduling.priority))
    if info.status is RunStatus.CANCELLED and latest.meta.cancel_reason:
        grid.add_row("cancelled", latest.meta.cancel_reason)
    if error is not None:
        grid.add_row("error", Text(error_line(error), style="red"))
    parent = latest.meta.links.parent
    if parent is not None:
        grid.add_row("parent run", f"{parent.run_id} (step {parent.activation})")
    if children:
        lines = [
            f"{c['activation']}: {c['run_id']} ({c['name'] or '-'}, {c['status'] or 'not found'})"
            for c in children
        ]
        grid.add_row("child runs", "\n".join(lines))
    return grid


def _awaiting_rows(grid: Table, info: RunInfo, latest: Checkpoint) -> None:
    """What a paused run waits for a person to answer, and how to answer it."""
    waiting = awaited(info.status, latest)
    if waiting is None:
        return
    what = "a review" if waiting.kind == "feedback" else "an answer"
    grid.add_row("awaits", f"{what} at {waiting.method}: {waiting.message}")
    if waiting.kind == "feedback":
        shown = waiting.output if isinstance(waiting.output, str) else json.dumps(waiting.output)
        grid.add_row("under review", shown)
    if waiting.emit:
        grid.add_row("outcomes", ", ".join(waiting.emit))
    if waiting.deadline is not None:
        # The recovery pass answers None at the deadline (recovery.answer_overdue).
        left = duration(max(0.0, waiting.deadline - time.time()))
        grid.add_row("timeout", f"{when(waiting.deadline)} (in {left}): then it goes on with None")
    grid.add_row("answer", f"runner resume {info.run_id} --feedback TEXT")


def progress_view(
    info: RunInfo,
    latest: Checkpoint,
    rows: list[Any],
    total: int | None,
    error: StepError | None,
    shown: dict[str, str],
) -> RenderableType:
    """``--wait`` and ``watch``: steps done of total (crew tasks in child runs included), the
    steps with their attempts and durations, elapsed time, last error."""
    done = sum(1 for row in rows if row.outcome == "done")
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
    grid.add_row("elapsed", duration(max(elapsed, 0.0)))
    if reason := pause_reason(info.status, latest):
        grid.add_row("paused", reason)
    if error is not None:
        grid.add_row("last error", Text(error_line(error), style="red"))
    parts: list[RenderableType] = [grid]
    if rows:
        parts.append(steps_table(rows, shown, one_row=True))
    return Panel(Group(*parts), title=head, title_align="left")


# --- checkpoints ----------------------------------------------------------------------------


def history_table(
    ckpts: list[Checkpoint], shown: dict[str, str], answers: dict[str, Answer] | None = None
) -> Table:
    """``runner checkpoints``: seq, id (its unique prefix), event, step, status, time; a
    checkpoint that resumed the run with a person's answer (``answers``) says who gave it
    and what."""
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    table.add_column("seq", justify="right", no_wrap=True)
    table.add_column("checkpoint", no_wrap=True)
    table.add_column("event", overflow="fold")
    table.add_column("step", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("time", no_wrap=True)
    for ckpt in ckpts:
        table.add_row(
            str(ckpt.seq),
            shown.get(ckpt.id, ckpt.id),
            short_event(ckpt.event) + _answered((answers or {}).get(ckpt.id)),
            activation_of_key(ckpt.activation) if ckpt.activation else ckpt.step or "-",
            status_text(ckpt.status),
            stamp(ckpt.created_at),
        )
    return table


def _answered(answer: Answer | None) -> str:
    """`` (review answered by ana: 'ship it' -> approved)``, or nothing."""
    if answer is None:
        return ""
    said = [repr(answer.text)] if answer.text else []
    if answer.outcome:
        said.append(f"-> {answer.outcome}")
    if answer.text is None and not answer.outcome:
        said = ["no answer in time"]
    who = f" by {answer.by}" if answer.by else ""
    return f" ({answer.awaited.method} answered{who}: {' '.join(said) or repr('')})"


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
    if ckpt.activation:
        grid.add_row("activation", ckpt.activation)
    if ckpt.worker:
        grid.add_row("worker", ckpt.worker)
    if ckpt.duration is not None:
        grid.add_row("took", duration(ckpt.duration))
    if ckpt.attempts is not None:
        grid.add_row("attempts", str(ckpt.attempts))
    grid.add_row("flow", ckpt.flow or "-")
    grid.add_row("completed", ", ".join(ckpt.completed) or "-")
    grid.add_row("in flight", ", ".join(ckpt.in_flight) or "-")
    if ckpt.lineage is not None:
        lin = ckpt.lineage
        text = f"forked from run {lin.parent_run_id} at checkpoint {lin.parent_checkpoint_id}"
        grid.add_row("lineage", text + (f" (branch {lin.branch})" if lin.branch else ""))
    if ckpt.meta.human.pause_reason:
        grid.add_row("paused", ckpt.meta.human.pause_reason)
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
