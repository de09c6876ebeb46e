"""Inspecting history: ``checkpoints``, ``steps``, ``show``, ``diff`` and ``graph``."""

from __future__ import annotations

from typing import Annotated

import typer

from runner.flow.usage import run_sums, run_sums_text
from runner.views import answers_given, checkpoint_diff, short_ids

from . import progress, refs, sources
from ._app import commands
from ._session import FLAG, console, print_json
from .location import LocationOpt, located

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.", metavar=FLAG)]


@app.command()
def checkpoints(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="Run id, or a unique prefix of it.")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Newest N.")] = 50,
    as_json: JsonOpt = False,
    location: LocationOpt = None,
) -> None:
    """List a run's checkpoints, newest first: seq, id, event, step, status, time.

    Ids show as their shortest unique prefix (at least 16 characters), which `show`, `diff`,
    `fork` and `resume --from` accept; --json gives whole ids.
    """
    reader = located(ctx, location)
    run_id = refs.resolve_run(reader, run)
    found = reader.store.history(run_id, limit=limit)
    if as_json:
        print_json([c.model_dump(mode="json") for c in found])
        return
    every = progress.history(reader, run_id)
    from . import render  # rich: a view only (see render)

    shown = short_ids([c.id for c in every], refs.MIN_CHECKPOINT)
    console().print(render.history_table(found, shown, answers_given(list(reversed(every)))))


@app.command()
def steps(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="Run id, or a unique prefix of it.")],
    as_json: JsonOpt = False,
    location: LocationOpt = None,
) -> None:
    """List each step activation of a run, child runs' steps under the step that started them.

    For each: outcome (done, failed, paused, running, pending), attempts, worker, start time,
    duration, the checkpoint it committed and the tokens it spent; then, per run, the tokens
    spent in all, since its latest start or resume, and what that resume saved.
    """
    reader = located(ctx, location)
    rows = progress.step_rows(reader, refs.resolve_run(reader, run))
    if as_json:
        print_json([row.as_json() for row in rows])
        return
    ckpts = [row.checkpoint for row in rows if row.checkpoint]
    from . import render  # rich: a view only (see render)

    console().print(render.steps_table(rows, short_ids(ckpts, refs.MIN_CHECKPOINT)))
    for run_id in dict.fromkeys(row.run_id for row in rows):
        sums = run_sums(reader.store.latest(run_id))
        if sums is not None:
            console().print(run_sums_text(run_id, sums), highlight=False, soft_wrap=True)


@app.command()
def show(
    ctx: typer.Context,
    ref: Annotated[
        str,
        typer.Argument(
            metavar="CKPT", help="Checkpoint id or unique prefix (or a run's: its latest)."
        ),
    ],
    as_json: JsonOpt = False,
    location: LocationOpt = None,
) -> None:
    """Show one checkpoint: state, outputs, completed and in-flight steps, lineage, error."""
    ckpt = refs.resolve_checkpoint_or_run(located(ctx, location), ref)
    if as_json:
        print_json(ckpt.model_dump(mode="json"))
    else:
        from . import render  # rich: a view only (see render)

        console().print(render.checkpoint_view(ckpt))


@app.command()
def diff(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(metavar="CKPT_A", help="Checkpoint (or run) id.")],
    b: Annotated[str, typer.Argument(metavar="CKPT_B", help="Checkpoint (or run) id.")],
    as_json: JsonOpt = False,
    location: LocationOpt = None,
) -> None:
    """Compare two checkpoints (of one run or of a fork and its parent).

    Lists the state fields added, removed and changed from CKPT_A to CKPT_B (nested
    objects by dotted path) and the step activations completed on one side only.
    """
    reader = located(ctx, location)
    first = refs.resolve_checkpoint_or_run(reader, a)
    second = refs.resolve_checkpoint_or_run(reader, b)
    found = checkpoint_diff(first, second)
    if as_json:
        print_json({"a": first.id, "b": second.id, **found})
    else:
        from . import render  # rich: a view only (see render)

        console().print(render.diff_view(first, second, found))


@app.command()
def graph(
    flow: Annotated[
        str,
        typer.Argument(
            metavar="FLOW", help="pkg.mod:FlowClass, or a flow definition's YAML/JSON file"
        ),
    ],
    definition: Annotated[
        str | None,
        typer.Option(
            "--definition",
            metavar="yaml|json",
            help="Print the flow's definition (crewai.flow/v1) instead of the Mermaid graph.",
        ),
    ] = None,
) -> None:
    """Print a flow's graph as Mermaid text (paste into a Markdown mermaid block), or its
    definition as YAML or JSON; both are drawn from the one definition."""
    if definition not in (None, "yaml", "json"):
        raise typer.BadParameter("--definition takes yaml or json")
    flow_cls = sources.flow_class(flow)
    if definition is None:
        typer.echo(flow_cls.graph().to_mermaid(), nl=False)
        return
    found = flow_cls.flow_definition()
    typer.echo(found.to_yaml() if definition == "yaml" else found.to_json(), nl=False)
