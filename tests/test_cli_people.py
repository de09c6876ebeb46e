"""The CLI for people, on an 80-column terminal, against the real test workers.

Ids are never cut (tables show unique prefixes that every command takes back); an
ambiguous prefix is one clear error; ``--wait`` redraws progress live on a terminal (a real
pseudo-terminal here) and prints JSON with ``--json``; ``watch --json`` streams JSON lines;
``runs`` nests child runs; ``steps`` lists each activation; resuming a failed crew's child
run resumes its parent chain.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import redis

from tests.flows import crews
from tests.flows.cli import gate_key
from tests.test_cli import GATED, Cli, cli, tag  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = "tests.flows.crews:CrewPipeline"
NARROW = {"COLUMNS": "80"}


def narrow(cli: Cli, *args: str, code: int = 0) -> Any:  # noqa: F811
    """``runner ARGS`` at 80 columns; no line of its output is wider."""
    result = cli(*args, env=NARROW)
    assert result.exit_code == code, (result.stdout, result.stderr)
    for line in result.stdout.splitlines():
        assert len(line) <= 80, line
    assert "…" not in result.stdout  # nothing cut
    return result


def first_column(table: str) -> list[str]:
    """The first cell of each body row of a rich table (indent and tree marks stripped)."""
    rows = table.split("━\n", 1)[1].splitlines()
    cells = [row.split("│")[0].strip().lstrip("└ ") for row in rows]
    return [cell for cell in cells if cell]  # a wrapped row's later lines start empty


def test_tables_at_80_columns_show_unique_prefixes_that_every_command_takes(
    cli: Cli,  # noqa: F811
    redis_client: redis.Redis,
    tag: str,  # noqa: F811
) -> None:
    redis_client.set(gate_key(tag), 1)
    run_id = cli.ok("submit", GATED, "--input", f"tag={tag}", "--wait").stdout.split()[0]

    shown = first_column(narrow(cli, "runs", "--limit", "100").stdout)
    mine = [s for s in shown if run_id.startswith(s)]
    assert len(mine) == 1 and len(mine[0]) >= 8
    assert "succeeded" in narrow(cli, "runs", "--limit", "100").stdout  # status never cut
    assert cli.json("status", mine[0])["run_id"] == run_id

    history = cli.json("checkpoints", run_id)
    table = narrow(cli, "checkpoints", mine[0]).stdout
    rows = [row.split("│") for row in table.split("━\n", 1)[1].splitlines()]
    prefixes = [cells[1].strip() for cells in rows if cells[0].strip()]  # not wrapped lines
    assert len(prefixes) == len(history)
    for prefix, ckpt in zip(prefixes, history, strict=True):
        assert ckpt["id"].startswith(prefix) and len(prefix) >= 16
        assert cli.json("show", prefix)["id"] == ckpt["id"]
    forked = cli.json("fork", prefixes[-1], "--wait")  # the first checkpoint, by its prefix
    assert forked["status"] == "succeeded"


def test_an_ambiguous_prefix_is_one_clear_error(
    cli: Cli,  # noqa: F811
    redis_client: redis.Redis,
    tag: str,  # noqa: F811
) -> None:
    redis_client.set(gate_key(tag), 1)
    stem = uuid.uuid4().hex[:8]
    ids = [f"{stem}-{uuid.uuid4()}", f"{stem}-{uuid.uuid4()}"]
    for run_id in ids:
        cli.ok("submit", GATED, "--input", f"tag={tag}", "--input", f"id={run_id}", "--wait")
    result = cli("status", stem)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: run prefix {stem} is ambiguous: 2 runs match ({', '.join(sorted(ids))}); "
        "type more of the id"
    ]
    assert cli.json("status", ids[0][:14])["run_id"] == ids[0]
    shared = cli.json("checkpoints", ids[0])[0]["id"][:2]  # millisecond time: all share it
    shown = cli("show", shared)
    assert shown.exit_code == 2 and "checkpoint prefix" in shown.stderr
    assert "is ambiguous" in shown.stderr and len(shown.stderr.splitlines()) == 1
    missing = cli("status", "zzzz")
    assert missing.exit_code == 2 and missing.stderr.strip() == "error: no run zzzz"


def test_wait_on_a_terminal_redraws_steps_and_crew_tasks_then_sums_up(
    cli: Cli,  # noqa: F811
    tag: str,  # noqa: F811
) -> None:
    args = ["submit", PIPELINE, "--input", f"tag={tag}", "--input", "topic=bees", "--wait"]
    env = {**os.environ, **cli.env, **NARROW, "TERM": "xterm", "PYTHONPATH": str(ROOT)}
    parent, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", *args],
        cwd=ROOT, env=env, stdin=child, stdout=child, stderr=child,
    )  # fmt: skip
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(parent, 65536)
        except OSError:  # the terminal closed: the command exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(parent)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert proc.wait(timeout=60) == 0, screen[-3000:]
    assert "steps" in screen and "/" in screen  # done of total
    for task in ("a1", "b2", "c3", "d3"):
        assert task in screen, task
    # Stages shown as steps; which ones a frame caught depends on the machine's speed.
    assert re.search(r"stage\d#1", screen), screen[-3000:]
    # Redrawn while it ran: a step seen running, or at least two frames of progress (a busy
    # machine may run a step between two frames and never show it running).
    assert "done" in screen, screen[-3000:]
    assert "running" in screen or screen.count("steps") >= 2, screen[-3000:]
    assert screen.rstrip().splitlines()[-1].startswith('succeeded: {"raw": "d3(')


def test_wait_json_is_one_object_and_watch_json_streams_lines(
    cli: Cli,  # noqa: F811
    tag: str,  # noqa: F811
) -> None:
    done = cli.json("submit", PIPELINE, "--input", f"tag={tag}", "--input", "topic=x", "--wait")
    assert done["status"] == "succeeded" and done["result"]["raw"].startswith("d3(")

    run_id = done["run_id"]
    watched = cli.ok("watch", run_id, "--json")
    lines = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [line["type"] for line in lines] == ["checkpoint"] * (len(lines) - 1) + ["outcome"]
    assert lines[-1]["status"] == "succeeded"
    runs = {line["run_id"] for line in lines[:-1]}
    assert run_id in runs and f"{run_id}-stage2-1" in runs  # the crews' checkpoints too
    tasks = {line["step"] for line in lines[:-1] if line["event"] == "method_execution_finished"}
    assert {"stage1", "a1", "d3"} <= tasks


def test_runs_nest_children_steps_list_them_and_resuming_a_child_resumes_its_parent(
    cli: Cli,  # noqa: F811
    tag: str,  # noqa: F811
) -> None:
    failed = cli("submit", PIPELINE, "--input", f"tag={tag}", "--input", "fail_once=c2", "--wait")
    assert failed.exit_code == 1
    run_id = failed.stdout.split()[0]
    child = f"{run_id}-stage3-1"

    tree = next(r for r in cli.json("runs", "--limit", "100") if r["run_id"] == run_id)
    assert [c["run_id"] for c in tree["children"]] == [f"{run_id}-stage{i}-1" for i in (1, 2, 3)]
    assert tree["children"][2]["status"] == "failed"
    assert child not in [r["run_id"] for r in cli.json("runs", "--limit", "100")]
    assert child in [r["run_id"] for r in cli.json("runs", "--all", "--limit", "100")]

    shown = first_column(narrow(cli, "runs", "--limit", "100").stdout)
    child_shown = next(s for s in shown if s.endswith("-stage3-1") and run_id.startswith(s[:8]))
    assert len(child_shown) < len(child)  # parent's prefix + the rest

    rows = cli.json("steps", run_id)
    by_step = {(row["depth"], row["step"]): row for row in rows}
    assert by_step[(0, "stage1#1")]["outcome"] == "done"
    assert by_step[(0, "stage1#1")]["child_run"] == f"{run_id}-stage1-1"
    assert by_step[(1, "a1#1")]["outcome"] == "done"
    assert by_step[(1, "a1#1")]["worker"] and by_step[(1, "a1#1")]["duration"] is not None
    assert by_step[(0, "stage3#1")]["outcome"] == "failed"
    assert by_step[(0, "stage3#1")]["child_run"] == child
    assert by_step[(1, "c2#1")]["outcome"] == "failed"
    assert "planned failure of c2" in by_step[(1, "c2#1")]["error"]
    table = narrow(cli, "steps", run_id[:8]).stdout
    assert "c2" in table and "failed" in table and "a1#1" in table

    resumed = cli("resume", child_shown, "--wait")
    assert resumed.exit_code == 0, resumed.stderr
    assert f"run {child} is a child of {run_id}" in resumed.stderr
    assert resumed.stdout.splitlines()[-1].startswith('succeeded: {"raw": "d3(')
    assert cli.json("status", child)["status"] == "succeeded"
    assert crews.counts(tag)["c2"] == 2 and crews.counts(tag)["c1"] == 1


def test_flags_show_as_flags_in_help(cli: Cli) -> None:  # noqa: F811
    for args in (["submit", "--help"], ["resume", "--help"], ["--help"]):
        text = narrow(cli, *args).stdout
        for flag in ("--wait", "--json", "--debug"):
            for line in text.splitlines():
                if f" {flag} " in line:
                    assert "<bool>" not in line, line
