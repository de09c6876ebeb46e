"""Starting and following runs: ``submit``, ``status``, ``watch``, ``runs``, ``cancel``."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live

from runner.distributed import client
from runner.distributed.control import check_fields
from runner.errors import DefinitionError, FlowImportError, RunTimeout
from runner.store.models import Checkpoint, RunInfo, RunStatus

from . import render
from ._app import app
from ._outcome import exit_code_of, follow, last_error
from ._session import console, load_inputs, print_json, session

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="Run id.")]
WaitOpt = Annotated[
    bool, typer.Option("--wait", "-w", help="Wait for the run to stop; print how it ended.")
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=0, metavar="SECONDS", help="Give up waiting after this long."),
]
InputOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        "-i",
        metavar="KEY=VALUE",
        help="A state field (repeatable); VALUE is parsed as JSON if it parses, else a string.",
    ),
]


@app.command()
def submit(
    ctx: typer.Context,
    flow: Annotated[str, typer.Argument(metavar="FLOW", help="pkg.mod:FlowClass")],
    inputs: InputOpt = None,
    inputs_file: Annotated[
        Path | None,
        typer.Option(
            "--inputs-file",
            metavar="FILE",
            help="A JSON object of inputs; --input values override it.",
        ),
    ] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a run of FLOW on the workers and print its run id.

    With --wait (or --timeout), wait for it to stop and print the result; exit 1 if it
    failed or was cancelled. Inputs are validated before anything is stored.
    """
    values = load_inputs(inputs, inputs_file)
    flow_cls = client.load_flow(flow)
    check_fields(flow_cls, values)
    _check_allowed(flow_cls, session(ctx).settings().flow_modules)
    rt = session(ctx).rt
    handle = client.submit(flow_cls, values, rt=rt)
    follow(rt, handle, wait=wait or timeout is not None, timeout=timeout, as_json=as_json)


@app.command()
def status(ctx: typer.Context, run: RunArg, as_json: JsonOpt = False) -> None:
    """Show a run: status, flow, step, seq, times, completed and running steps, lineage, error."""
    rt = session(ctx).rt
    handle = client.RunHandle(run, rt)
    info, latest = handle.info(), handle.latest()
    error = last_error(rt, info, latest)
    children = _children(rt, latest)
    if as_json:
        print_json(
            {
                **info.model_dump(mode="json"),
                "checkpoint": latest.id,
                "completed": latest.completed,
                "in_flight": latest.in_flight,
                "lineage": latest.lineage.model_dump(mode="json") if latest.lineage else None,
                "last_error": error.model_dump(mode="json") if error else None,
                "pause_reason": latest.meta.get("pause_reason")
                if info.status is RunStatus.PAUSED
                else None,
                "parent": latest.meta.get("parent"),
                "children": children,
            }
        )
    else:
        console().print(render.status_view(info, latest, error, children))


@app.command()
def watch(
    ctx: typer.Context,
    run: RunArg,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, metavar="SECONDS", help="Poll period.")
    ] = 0.5,
    timeout: TimeoutOpt = None,
) -> None:
    """Follow a run live until it stops; exit with its outcome (0 succeeded or paused, 1 not).

    Shows the steps done of the flow's total, the steps running, the time elapsed and
    the last error, polling the checkpoint store every --interval seconds.
    """
    rt = session(ctx).rt
    handle = client.RunHandle(run, rt)
    info = handle.info()
    total = _method_count(info.flow)
    deadline = None if timeout is None else time.monotonic() + timeout
    out = console()
    # A terminal gets a live view; a pipe or log only the final one.
    live = Live(console=out, auto_refresh=False) if out.is_terminal else None
    with live or contextlib.nullcontext():
        while True:
            info, latest = handle.info(), handle.latest()
            view = render.progress_view(info, latest, total, last_error(rt, info, latest))
            if live is not None:
                live.update(view, refresh=True)
            if info.status.finished or info.status is RunStatus.PAUSED:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise RunTimeout(
                    f"run {run} still {info.status.value} after {timeout}s", run_id=run
                )
            time.sleep(interval)
    if live is None:
        out.print(view)
    raise typer.Exit(exit_code_of(info.status))


@app.command("runs")
def list_runs(
    ctx: typer.Context,
    status: Annotated[
        RunStatus | None, typer.Option("--status", "-s", help="Only runs with this status.")
    ] = None,
    flow: Annotated[
        str | None,
        typer.Option("--flow", "-f", metavar="NAME", help="Only runs of this flow (name or path)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most N runs.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List runs, most recently updated first."""
    found = _select_runs(session(ctx).rt.store, status, flow, limit)
    if as_json:
        print_json([info.model_dump(mode="json") for info in found])
    else:
        console().print(render.runs_table(found))


@app.command()
def cancel(ctx: typer.Context, run: RunArg, as_json: JsonOpt = False) -> None:
    """Stop dispatching a run's steps; running steps finish. Resume it later with `resume`."""
    handle = client.RunHandle(run, session(ctx).rt)
    handle.info()  # an unknown run is bad input (exit 2), not a refused cancel
    ckpt = handle.cancel()
    if as_json:
        print_json({"run_id": run, "status": ckpt.status.value, "checkpoint": ckpt.id})
    else:
        typer.echo(f"cancelled {run} (checkpoint {ckpt.id})")


def _check_allowed(flow_cls: Any, modules: list[str]) -> None:
    """Refuse a flow outside ``RUNNER_FLOW_MODULES`` (when set here) before storing a run.

    Workers fail such a run; with the workers' allow-list in the CLI's environment the
    mistake is caught before anything is stored.
    """
    module = flow_cls.flow_path().partition(":")[0]
    if modules and module not in modules:
        raise FlowImportError(
            f"{flow_cls.flow_path()} is not in the workers' allow-list "
            f"(RUNNER_FLOW_MODULES={','.join(modules)})",
            path=flow_cls.flow_path(),
        )


def _children(rt: Any, latest: Checkpoint) -> list[dict[str, Any]]:
    """The child runs (crews run by flow methods) of the run, with their current status."""
    found = []
    links = latest.meta.get("children")
    for activation, link in links.items() if isinstance(links, dict) else []:
        child_id = link.get("run_id") if isinstance(link, dict) else link
        child = rt.store.run(str(child_id)) if child_id else None
        found.append(
            {
                "activation": activation,
                "run_id": child_id,
                "name": link.get("name") if isinstance(link, dict) else None,
                "status": child.status.value if child is not None else None,
            }
        )
    return found


def _method_count(flow: str | None) -> int | None:
    """Number of methods of the run's flow, if it imports here (else progress has no total)."""
    if not flow:
        return None
    try:
        return len(client.load_flow(flow).graph().methods)
    except DefinitionError:  # not importable here, or no longer a valid flow
        return None


def _select_runs(
    store: Any, status: RunStatus | None, flow: str | None, limit: int
) -> list[RunInfo]:
    """Up to ``limit`` runs matching ``status`` and ``flow``, paging the run index."""
    if flow is None:
        return list(store.runs(limit=limit, status=status))
    found: list[RunInfo] = []
    offset, page = 0, 200
    while len(found) < limit:
        batch = store.runs(limit=page, offset=offset, status=status)
        found += [info for info in batch if _flow_matches(info, flow)]
        if len(batch) < page:
            break
        offset += page
    return found[:limit]


def _flow_matches(info: RunInfo, flow: str) -> bool:
    return flow in (info.name, info.flow) or (info.flow or "").endswith(f":{flow}")
