"""Changing runs: ``resume``, ``fork``, ``recover``, ``prune``, and ``upgrade`` of stored data."""

from __future__ import annotations

import getpass
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from runner.errors import FlowImportError
from runner.store.models import Checkpoint, RunStatus

from . import bulk, refs
from ._app import commands
from ._outcome import follow
from ._session import FLAG, BadUsage, console, parse_duration, print_json, session, text_pairs
from .location import LocationOpt, located, resume_here
from .runs import InputOpt, JsonOpt, TimeoutOpt, WaitOpt

if TYPE_CHECKING:
    from runner.distributed.engine import Runtime

# The runtime, the flow core and recovery are imported by the commands that use them, so
# `runner --help` (which loads every command module to list it) does not pay for them.

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""


def _typed(texts: dict[str, str], checkpoint: Checkpoint | None) -> dict[str, Any]:
    """``--input``/``--set`` text read as the state model of the checkpoint's flow types it."""
    from runner.distributed.client import load_flow
    from runner.flow.state import values_from_text

    model = load_flow(str(checkpoint.flow)).state_type() if checkpoint is not None else None
    return values_from_text(model, texts)


@app.command()
def resume(
    ctx: typer.Context,
    run: bulk.RunOptArg = None,
    from_checkpoint: Annotated[
        str | None,
        typer.Option(
            "--from", metavar="CKPT", help="Continue from this checkpoint of RUN, not the latest."
        ),
    ] = None,
    inputs: InputOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
    location: LocationOpt = None,
    feedback: Annotated[
        str | None,
        typer.Option(
            "--feedback",
            metavar="TEXT",
            help="Answer what the run awaits: a review of a step's output (@human_feedback) "
            "or a question (ask). The step goes on with it; the reviewed method is not re-run.",
        ),
    ] = None,
    outcome: Annotated[
        str | None,
        typer.Option(
            "--outcome",
            metavar="LABEL",
            help="With a review that routes (emit=...): pick its label directly.",
        ),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option("--by", metavar="WHO", help="Who answers (default: your user name)."),
    ] = None,
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            metavar="STEP",
            help="The step whose question you answer: refused if the run now awaits another.",
        ),
    ] = None,
    where: bulk.WhereOpt = None,
    ids: bulk.IdsOpt = None,
    yes: bulk.YesOpt = False,
) -> None:
    """Continue a failed, cancelled or paused run; completed steps are not re-run.

    The failed or paused step runs again, on the state with --input values applied (e.g.
    `--input approved=true` for a run paused for approval). The run keeps its id and its
    history grows. A child run (a crew a flow step started) whose parent failed with it is
    resumed through its parent chain: the topmost failed parent is resumed, which resumes
    the child at its failed task. With --wait, follow it and print how it ended; exit 1 if
    it failed again. With --location (a run kept in a JSON directory or SQLite file), it
    runs on in this process, as `kickoff(from_checkpoint=...)` does, to its end. A run
    paused for a person's answer (a review, a question) takes it with --feedback (and
    --outcome, --by); `runner status RUN` shows what it awaits.

    With --where TERMS or --ids IDS, every run selected: a dry run listing them unless --yes.
    """
    if bulk.wanted(run, where, ids):
        bulk.only_alone(
            from_=from_checkpoint,
            input=inputs,
            wait=wait,
            timeout=timeout,
            location=location,
            feedback=feedback,
            outcome=outcome,
            by=by,
            step=step,
        )
        bulk.run(ctx, "resume", where, ids, yes=yes, as_json=as_json)
        return
    assert run is not None
    if feedback is not None or outcome is not None:
        if from_checkpoint is not None or inputs or location is not None:
            raise BadUsage(
                "--feedback and --outcome answer the run where it waits: "
                "not with --from, --input or --location"
            )
        from runner.distributed import control

        rt = session(ctx).rt
        handle = control.answer(
            refs.resolve_run(rt, run),
            feedback if feedback is not None else "",
            by=by or _who(),
            outcome=outcome,
            step=step,
            rt=rt,
        )
        follow(rt, handle, wait=wait or timeout is not None, timeout=timeout, as_json=as_json)
        return
    if by is not None or step is not None:
        raise BadUsage("--by and --step go with --feedback or --outcome (who answers what)")
    if location is not None:
        if timeout is not None:
            raise BadUsage("--timeout does not apply with --location: the run resumes here")
        resume_here(
            located(ctx, location),
            run,
            from_checkpoint,
            text_pairs(inputs, "--input"),
            as_json=as_json,
        )
    rt = session(ctx).rt
    run_id = refs.resolve_run(rt, run)
    checkpoint = refs.resolve_checkpoint(rt, from_checkpoint).id if from_checkpoint else None
    texts = text_pairs(inputs, "--input")
    values = _typed(texts, rt.store.latest(run_id)) if texts else {}
    from runner.distributed import control

    handle = control.resume(run_id, checkpoint, values, rt=rt)
    if handle.run_id != run_id:
        typer.echo(
            f"run {run_id} is a child of {handle.run_id}, which stopped with it: "
            f"resuming {handle.run_id}",
            err=True,
        )
    follow(rt, handle, wait=wait or timeout is not None, timeout=timeout, as_json=as_json)


def _who() -> str | None:
    """The user answering from this shell, when the system knows a name for them."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a container's anonymous uid)
        return None


@app.command()
def fork(
    ctx: typer.Context,
    ref: Annotated[
        str | None,
        typer.Argument(
            metavar="CKPT|RUN",
            help="A checkpoint id, or a run id (its latest); or a prefix (or --where/--ids).",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="FIELD=VALUE",
            help=(
                "Edit a state field (repeatable); VALUE is parsed as JSON if it parses. A "
                "dotted FIELD (outputs.t02.raw) edits one entry of a nested object."
            ),
        ),
    ] = None,
    rerun: Annotated[
        list[str] | None,
        typer.Option(
            "--rerun", metavar="STEP", help="Run STEP and everything downstream again (repeatable)."
        ),
    ] = None,
    branch: Annotated[
        str | None, typer.Option("--branch", metavar="NAME", help="A label for the fork.")
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", metavar="ID", help="Id of the new run.")
    ] = None,
    map_: Annotated[
        list[str] | None,
        typer.Option(
            "--map",
            metavar="OLD=NEW",
            help="Continue on code that renamed method OLD to NEW (repeatable).",
        ),
    ] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
    location: LocationOpt = None,
    where: bulk.WhereOpt = None,
    ids: bulk.IdsOpt = None,
    yes: bulk.YesOpt = False,
) -> None:
    """Start a new run from a checkpoint, optionally with edited state; print its id.

    With --map OLD=NEW the run moves, on purpose, onto code that renamed its method OLD:
    the new run continues from the checkpoint with NEW where the run recorded OLD.

    The new run skips the steps completed at the checkpoint, except --rerun steps and
    everything downstream of them. The source run is untouched; the new run records
    its parent run and checkpoint (see `runner status NEW_RUN`). A fork that would
    change nothing (no step left to run at the checkpoint, no --rerun, no --set value
    that differs) is refused (exit 2). With --location (an archive, a JSON directory or a
    SQLite file), the source run is first restored into Redis (`runner restore`).

    With --where TERMS or --ids IDS, a fork of each run selected from its latest checkpoint,
    unedited: a dry run listing them unless --yes.
    """
    if bulk.wanted(ref, where, ids):
        bulk.only_alone(
            set=set_,
            rerun=rerun,
            branch=branch,
            run_id=run_id,
            map=map_,
            wait=wait,
            timeout=timeout,
            location=location,
        )
        bulk.run(ctx, "fork", where, ids, yes=yes, as_json=as_json)
        return
    assert ref is not None
    rt = session(ctx).rt
    if location is not None:
        ref = _restored(ctx, rt, location, ref)
    source = refs.resolve_checkpoint_or_run(rt, ref)
    values = _typed(text_pairs(set_, "--set"), source)
    renames = text_pairs(map_, "--map")
    from runner.distributed import control

    handle = control.fork(
        source.id,
        values,
        rerun or [],
        branch,
        run_id,
        renames={str(k): str(v) for k, v in renames.items()},
        rt=rt,
    )
    start = handle.latest()
    if start.event == "flow_started" and start.status is RunStatus.SUCCEEDED:
        # Allowed (the state was edited) but easy to mistake for a run that did work.
        typer.echo(
            f"note: no step runs in {handle.run_id}: checkpoint {source.id} has nothing left "
            "to run, so the new run is its edited state, finished; add --rerun STEP to run "
            "steps on it",
            err=True,
        )
    follow(rt, handle, wait=wait or timeout is not None, timeout=timeout, as_json=as_json)


def _restored(ctx: typer.Context, rt: Runtime, location: str, ref: str) -> str:
    """The id of ``ref``'s checkpoint at ``location``, its run restored into Redis first."""
    from runner.store.archive import restore_run

    view = located(ctx, location)
    source = refs.resolve_checkpoint_or_run(view, ref)
    if rt.store.run(source.run_id) is None:
        restore_run(view.store, rt.store, source.run_id)  # type: ignore[arg-type]
        typer.echo(f"note: run {source.run_id} restored from {location} to fork it", err=True)
    return source.id


@app.command()
def recover(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Re-dispatch steps of running runs whose worker died or that were never started.

    Workers do this by themselves every RUNNER_RECOVERY_INTERVAL seconds; this runs one
    pass now. A step still holding a live lease is left alone.
    """
    rt = session(ctx).rt
    for run, problem in _load_running_flows(rt).items():
        typer.echo(f"warning: run {run} not recovered: {problem}", err=True)
    from runner.distributed import recovery

    resent = recovery.recover(rt, force=True)
    if as_json:
        print_json(resent)
    elif not resent:
        typer.echo("nothing to recover")
    else:
        for run, steps in resent.items():
            typer.echo(f"{run}: re-dispatched {', '.join(steps)}")


@app.command()
def prune(
    ctx: typer.Context,
    keep: Annotated[
        int | None,
        typer.Option(
            "--keep",
            min=1,
            metavar="N",
            help="Checkpoints to keep per run (default: RUNNER_MAX_CHECKPOINTS).",
            show_default=False,
        ),
    ] = None,
    run: Annotated[
        str | None, typer.Argument(metavar="RUN", help="Only this run (default: every run).")
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="AGE",
            help="Only runs not updated within AGE (e.g. 90s, 30m, 12h, 7d, 2w).",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only list what would be deleted.", metavar=FLAG)
    ] = False,
    as_json: JsonOpt = False,
    location: LocationOpt = None,
) -> None:
    """Delete old checkpoints, keeping the newest N of each run (of RUN, or of every run).

    N is --keep, else the configured maximum (RUNNER_MAX_CHECKPOINTS). A run's newest
    checkpoint is always kept, and so is any checkpoint a fork started from. With
    --older-than AGE, only runs whose last update is older than AGE are pruned; runs
    active within AGE are left whole. Runs themselves are never deleted. --location prunes
    a JSON directory or SQLite file instead of Redis.
    """
    found = session(ctx).rt if location is None else located(ctx, location)
    store = found.store
    kept = keep if keep is not None else store.max_checkpoints
    if kept < 1:
        raise BadUsage(
            "no --keep given, and RUNNER_MAX_CHECKPOINTS is 0 (keep every checkpoint): "
            "give --keep N"
        )
    cutoff = time.time() - parse_duration(older_than) if older_than else None
    if run is not None:
        info = store.run(refs.resolve_run(found, run))
        assert info is not None, "resolve_run returns existing runs"
        targets = [info]
    else:
        targets = refs.all_runs(store)
    pruned: dict[str, list[str]] = {}
    for info in targets:
        if cutoff is not None and info.updated_at >= cutoff:
            continue
        gone = store.prune(info.run_id, kept, dry_run=dry_run)
        if gone:
            pruned[info.run_id] = gone
    if as_json:
        print_json({"dry_run": dry_run, "keep": kept, "pruned": pruned})
        return
    verb = "would delete" if dry_run else "deleted"
    out = console()
    for run_id, gone in pruned.items():
        out.print(f"{run_id}: {verb} {len(gone)} checkpoint(s)")
    total = sum(len(gone) for gone in pruned.values())
    out.print(f"{verb} {total} checkpoint(s) of {len(pruned)} run(s)")


@app.command()
def upgrade(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Convert what an earlier version stored in Redis to this version's layout.

    Snapshots kept one key each are moved into their run's snapshot hash, and run records
    get the parent, children and version `runs` lists them by. Safe to run again, and while
    workers run; until it is run, such runs show no history and list as top-level runs.
    """
    moved = session(ctx).rt.store.upgrade()
    if as_json:
        print_json({"moved": moved})
    else:
        console().print(f"moved {moved} checkpoint(s) to this version's layout")


def _load_running_flows(rt: Runtime) -> dict[str, str]:
    """Register the flows of the running runs, as `resume` loads a run's flow by its path.

    :func:`recovery.recover` re-sends only steps of flows its runtime knows (on a worker,
    its allow-list). Returns run id -> why its flow could not be loaded here.
    """
    from runner.distributed.client import load_flow

    problems: dict[str, str] = {}
    for run_id in rt.coord.active_runs():
        latest = rt.store.latest(run_id)
        if latest is None or latest.status is not RunStatus.RUNNING or not latest.flow:
            continue
        try:
            flow_cls = load_flow(latest.flow)
        except FlowImportError as exc:
            problems[run_id] = str(exc)
            continue
        rt.flows.setdefault(flow_cls.flow_name(), flow_cls)
    return problems
