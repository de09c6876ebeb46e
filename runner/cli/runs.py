"""Starting and following runs: ``submit``, ``status``, ``watch``, ``runs``, ``cancel``."""

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from runner.errors import InvalidInputs, RunTimeout
from runner.flow.rates import PRIORITIES
from runner.store import selection
from runner.store.models import Checkpoint, RunInfo, RunStatus
from runner.views import (
    asleep,
    awaiting_of,
    pause_reason,
    scheduled_until,
    step_states,
    woken_at,
)

from . import bulk, progress, refs, sources, streams
from ._app import commands
from ._outcome import (
    cancel_reason,
    exit_code_of,
    follow,
    outcome,
    result_now,
    run_now,
    say,
    stopped,
    watch_live,
)
from ._session import FLAG, BadUsage, Reader, console, load_inputs, print_json, session

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.", metavar=FLAG)]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="Run id, or a unique prefix of it.")]
WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait",
        "-w",
        help="Follow the run until it stops (live on a terminal); print how it ended.",
        metavar=FLAG,
    ),
]
StreamOpt = Annotated[
    bool,
    typer.Option(
        "--stream",
        help="Print what the run's steps stream (tokens, progress) as it comes.",
        metavar=FLAG,
    ),
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
    flow: Annotated[
        str,
        typer.Argument(
            metavar="FLOW", help="pkg.mod:FlowClass, or a flow definition's YAML/JSON file"
        ),
    ],
    inputs: InputOpt = None,
    inputs_file: Annotated[
        Path | None,
        typer.Option(
            "--inputs-file",
            metavar="FILE",
            help="A JSON object of inputs; --input values override it.",
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            metavar="RUN",
            help="Name the run: submitting an id again hands back its run (see --if-exists).",
        ),
    ] = None,
    if_exists: Annotated[
        str,
        typer.Option(
            "--if-exists",
            metavar="return|reject",
            help="A run of --id exists: print it if its flow and inputs match (return), or "
            "refuse (reject).",
        ),
    ] = "return",
    countdown: Annotated[
        float | None,
        typer.Option(
            "--countdown", min=0, metavar="SECONDS", help="Start the run this much later."
        ),
    ] = None,
    eta: Annotated[
        str | None,
        typer.Option(
            "--eta",
            metavar="TIME",
            help="Start the run at this ISO time with its zone (2026-01-02T03:00:00+00:00).",
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            "--deadline",
            min=0,
            metavar="SECONDS",
            help="Cancel the run if it has not finished this long after now.",
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            min=min(PRIORITIES),
            max=max(PRIORITIES),
            metavar="0-9",
            help="Its steps' priority, 0 (lowest) to 9 (highest); default: each method's "
            "priority=, else 5. Workers take higher ones first; a resume keeps it.",
        ),
    ] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
    stream: StreamOpt = False,
) -> None:
    """Start a run of FLOW on the workers and print its run id.

    With --wait (or --timeout), wait for it to stop and print the result; exit 1 if it
    failed or was cancelled; with --wait --stream, print what its steps stream meanwhile.
    Inputs are validated before anything is stored, and so is the flow against the
    workers' allow-list when it is known here (RUNNER_FLOW_MODULES, or the one `runner dev`
    published).
    """
    # The client (and the flow core under it) is imported by the commands that use it, so
    # `runner runs` does not pay for it.
    from runner.distributed import client

    # Checked before connecting, so a typo is exit 2 even without Redis (submit checks
    # again, with the allow-list).
    flow_cls = sources.flow_class(flow)
    client.check_importable(flow_cls)
    values = load_inputs(inputs, inputs_file, flow_cls.state_type())
    client.check_fields(flow_cls, client.split_trigger_payload(values)[0])
    start = None if eta is None else client.start_time(time.time(), countdown, _instant(eta))
    rt = session(ctx).rt
    handle = client.submit(
        flow_cls,
        values,
        id=run_id,
        if_exists=if_exists,
        countdown=countdown,
        eta=start,
        deadline=deadline,
        priority=priority,
        rt=rt,
    )
    if stream and (wait or timeout is not None) and not as_json:
        typer.echo(handle.run_id)
        streams.follow_stream(rt, handle.run_id, timeout=timeout)
    follow(rt, handle, wait=wait or timeout is not None, timeout=timeout, as_json=as_json)


def _instant(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInputs(
            f"--eta {text!r} is not an ISO time (2026-01-02T03:00:00+00:00)"
        ) from None


@app.command()
def status(ctx: typer.Context, run: RunArg, as_json: JsonOpt = False) -> None:
    """Show a run: status, flow, step, seq, times, completed and running steps, lineage, error."""
    from runner.distributed import client

    reader = session(ctx).reader
    info, latest = run_now(reader, refs.resolve_run(reader, run))
    error = client.failure(reader.store, latest).error
    children = _children(reader, latest)
    # A running run's steps may wait in the broker for a worker of a version: read it there.
    waits = progress.waits(session(ctx).rt if info.status is RunStatus.RUNNING else reader, latest)
    from .expiry_view import expiry_fields, expiry_line

    if as_json:
        print_json(
            {
                **info.model_dump(mode="json"),
                **expiry_fields(reader.store, [info]).get(info.run_id, {}),
                "checkpoint": latest.id,
                "completed": latest.completed,
                "in_flight": latest.in_flight,
                "lineage": latest.lineage.model_dump(mode="json") if latest.lineage else None,
                "last_error": error.model_dump(mode="json") if error else None,
                "pause_reason": pause_reason(info.status, latest),
                "awaiting": awaiting_of(info.status, latest),
                "scheduled_until": scheduled_until(latest),
                "sleeping": {
                    act: woken_at(latest, act) for act in latest.in_flight if asleep(latest, act)
                },
                "deadline": latest.meta.scheduling.deadline,
                "priority": latest.meta.scheduling.priority,
                # The code version that wrote the latest checkpoint (runner.flow.versions).
                "version": latest.version,
                "fingerprint": latest.fingerprint,
                "cancel_reason": cancel_reason(info, latest),
                "parent": latest.meta.links.parent.model_dump()
                if latest.meta.links.parent
                else None,
                "children": children,
                "waiting": waits,
                # What RunHandle.result() and submit --wait give (runner.flow.results).
                "result": result_now(info, latest),
            }
        )
    else:
        from . import render  # rich: a view only (see render)

        expires = expiry_line(reader.store, info)
        states = step_states(latest, waits)
        console().print(render.status_view(info, latest, error, children, expires, states))


@app.command()
def watch(
    ctx: typer.Context,
    run: RunArg,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, metavar="SECONDS", help="Poll period.")
    ] = 0.5,
    timeout: TimeoutOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Stream each new checkpoint as a JSON line.", metavar=FLAG),
    ] = False,
    stream: StreamOpt = False,
) -> None:
    """Follow a run live until it stops; exit with its outcome (0 succeeded or paused, 1 not).

    Shows the steps done of the total (crew tasks of child runs included), each step with
    its attempts, worker and duration, the time elapsed and the last error. With --json,
    prints one JSON line per new checkpoint of the run or its child runs, then one line
    with the outcome. With --stream, prints what the steps stream (tokens, progress) as it
    comes, under the live table on a terminal.
    """
    reader = session(ctx).reader
    run_id = refs.resolve_run(reader, run)
    if stream and not as_json:
        streams.follow_stream(reader, run_id, timeout=timeout)
    if as_json:
        status = _stream(reader, run_id, interval, timeout)
    else:
        out = console()
        info, view = watch_live(reader, run_id, out, timeout=timeout, interval=interval)
        if not out.is_terminal:
            out.print(view)
        say(reader, run_id)
        status = info.status
    raise typer.Exit(exit_code_of(status))


def _stream(reader: Reader, run_id: str, interval: float, timeout: float | None) -> Any:
    """JSON lines: each checkpoint not printed yet (oldest first), then the outcome."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: set[str] = set()
    while True:
        # Read first: every checkpoint up to this status is printed.
        status = run_now(reader, run_id)[0].status
        for ckpt in _new_checkpoints(reader, run_id, seen):
            typer.echo(json.dumps(_event(ckpt)))
        if stopped(status):
            typer.echo(json.dumps({"type": "outcome", **outcome(reader, run_id)}))
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise RunTimeout(f"run {run_id} still {status.value} after {timeout}s", run_id=run_id)
        time.sleep(interval)


def _new_checkpoints(reader: Reader, run_id: str, seen: set[str]) -> list[Checkpoint]:
    """Checkpoints of the run and its child runs not in ``seen`` (added to it), by time."""
    ckpts = progress.history(reader, run_id)
    found = [ckpt for ckpt in ckpts if ckpt.id not in seen]
    seen.update(ckpt.id for ckpt in found)
    for link in ckpts[-1].meta.links.children.values() if ckpts else ():
        found += _new_checkpoints(reader, link.run_id, seen)
    return sorted(found, key=lambda c: c.id)


def _event(ckpt: Checkpoint) -> dict[str, Any]:
    return {
        "type": "checkpoint",
        "run_id": ckpt.run_id,
        "seq": ckpt.seq,
        "checkpoint": ckpt.id,
        "event": ckpt.event,
        "step": ckpt.step,
        "activation": ckpt.activation,
        "status": ckpt.status.value,
        "time": ckpt.created_at,
        "worker": ckpt.worker,
        "duration": ckpt.duration,
        "attempts": ckpt.attempts,
        "error": ckpt.error.model_dump(mode="json") if ckpt.error else None,
    }


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
    version: Annotated[
        str | None,
        typer.Option(
            "--version", metavar="V", help="Only runs whose latest checkpoint version V wrote."
        ),
    ] = None,
    where: bulk.ListWhereOpt = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most N runs.")] = 20,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Every run that matches, no limit; child runs too, flat, each on its own.",
            metavar=FLAG,
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """List runs, most recently updated first, child runs (crews) nested under their parent.

    Run ids show as their shortest unique prefix, which every command accepts; a child run
    shows as its parent's prefix followed by the rest of its id. --json gives whole ids.
    --where takes the selection the bulk actions take ("flow=X status=failed since=1h");
    a last line says how many more runs match than are shown.
    """
    reader = session(ctx).reader
    chosen = _where(where, status, flow, version)
    # The runs' records say all a listing shows (parent, children, version, delayed start):
    # no checkpoint is read, however many runs the selection counts.
    page = selection.page_of(
        reader.store, chosen, limit=None if every else limit, top_level=not every
    )
    found = page.runs
    if as_json:
        print_json(_json_listing(reader, found, nested=not every))
        if page.more:
            typer.echo(f"… {page.more} more (use --limit or --all)", err=True)
        return
    if not found:
        typer.echo("no runs" if chosen.empty else "no runs match")
        return
    from . import render  # rich: a view only (see render)

    nested = [(info, 0) for info in found] if every else _nest(reader, found)
    shown = refs.short_runs(reader, [info.run_id for info, _depth in nested])
    waiting = {info.run_id for info, _depth in nested if scheduled_until(info) is not None}
    from .expiry_view import expiry_texts

    expires = expiry_texts(reader.store, [info for info, _depth in nested])
    console().print(render.runs_table(nested, shown, scheduled=waiting, expires=expires))
    if page.more:
        typer.echo(f"… {page.more} more (use --limit or --all)")


def _where(
    text: str | None, status: RunStatus | None, flow: str | None, version: str | None
) -> selection.Where:
    """``--where`` with ``--status``, ``--flow`` and ``--version`` added (each once)."""
    chosen = selection.parse(text, time.time())
    twice = [
        option
        for option, value, there in (
            ("--status", status, chosen.statuses),
            ("--flow", flow, chosen.flows),
            ("--version", version, chosen.versions),
        )
        if value is not None and there
    ]
    if twice:
        raise BadUsage(f"{', '.join(twice)} also in --where: give each once")
    return chosen._replace(
        statuses=(status,) if status is not None else chosen.statuses,
        flows=(flow,) if flow is not None else chosen.flows,
        versions=(version,) if version is not None else chosen.versions,
    )


@app.command()
def cancel(
    ctx: typer.Context,
    run: bulk.RunOptArg = None,
    as_json: JsonOpt = False,
    where: bulk.WhereOpt = None,
    ids: bulk.IdsOpt = None,
    yes: bulk.YesOpt = False,
) -> None:
    """Cancel a run: no more steps are sent, running ones are stopped and commit nothing.
    The child runs it waits on (crews its steps run) are cancelled with it.

    Resume it later with `resume`: the stopped steps run again, its children's too. With
    --where TERMS or --ids IDS, every run selected: a dry run listing them unless --yes."""
    if bulk.wanted(run, where, ids):
        bulk.run(ctx, "cancel", where, ids, yes=yes, as_json=as_json)
        return
    assert run is not None
    from runner.distributed import client
    from runner.distributed.cancel import waited_on

    rt = session(ctx).rt
    handle = client.RunHandle(refs.resolve_run(rt, run), rt)
    ckpt = handle.cancel()
    children = [
        c
        for c in waited_on(ckpt)
        if (info := rt.store.run(c)) and info.status is RunStatus.CANCELLED
    ]
    if as_json:
        print_json(
            {
                "run_id": handle.run_id,
                "status": ckpt.status.value,
                "checkpoint": ckpt.id,
                "children": children,
            }
        )
    else:
        with_it = f"; with it child run(s) {', '.join(children)}" if children else ""
        typer.echo(f"cancelled {handle.run_id} (checkpoint {ckpt.id}){with_it}")


def _children(reader: Reader, latest: Checkpoint) -> list[dict[str, Any]]:
    """The child runs (crews run by flow methods) of the run, with their current status."""
    found = []
    for activation, link in latest.meta.links.children.items():
        child = reader.store.run(link.run_id)
        found.append(
            {
                "activation": activation,
                "run_id": link.run_id,
                "name": link.name,
                "status": child.status.value if child is not None else None,
            }
        )
    return found


def _child_infos(reader: Reader, info: RunInfo) -> list[RunInfo]:
    """The child runs the run's steps started, in the order they were started."""
    return [child for run_id in info.child_runs if (child := reader.store.run(run_id)) is not None]


def _nest(reader: Reader, infos: list[RunInfo], depth: int = 0) -> list[tuple[RunInfo, int]]:
    out: list[tuple[RunInfo, int]] = []
    for info in infos:
        out.append((info, depth))
        out += _nest(reader, _child_infos(reader, info), depth + 1)
    return out


def _json_listing(reader: Reader, found: list[RunInfo], nested: bool) -> list[dict[str, Any]]:
    """``runs --json``: each run (``nested``: with its child runs under ``children``) and
    when it expires, read for all of them in one round trip
    (:func:`~runner.cli.expiry_view.expiry_fields`)."""
    from .expiry_view import expiry_fields

    entries: list[tuple[RunInfo, dict[str, Any]]] = []

    def entry(info: RunInfo) -> dict[str, Any]:
        listed = _listed(info)
        entries.append((info, listed))
        if nested:
            listed["children"] = [entry(child) for child in _child_infos(reader, info)]
        return listed

    top = [entry(info) for info in found]
    expiry = expiry_fields(reader.store, [info for info, _ in entries])
    for info, listed in entries:
        listed.update(expiry.get(info.run_id, {}))
    return top


def _listed(info: RunInfo) -> dict[str, Any]:
    """A run as ``runs --json`` lists it: its record, and when it starts if it is a delayed
    run still waiting (``scheduled_until``, as ``status --json`` has it)."""
    return {**info.model_dump(mode="json"), "scheduled_until": scheduled_until(info)}
