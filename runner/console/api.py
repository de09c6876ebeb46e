"""The JSON API under ``/api`` (OpenAPI document: ``/api/openapi.json``).

Reads return the same dicts the pages render; actions call the CLI's Python API. Every
error is a 4xx/5xx with ``{"error": {"type": ..., "message": ..., ...}}``; an invalid
fork names each rejected field in ``error.errors``. With a token, send it as
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from runner.distributed import bulk
from runner.distributed.fleet import survey
from runner.flow import conversation, following
from runner.flow.rates import PRIORITIES
from runner.store import selection
from runner.store.models import RunStatus

from . import actions, data, streams
from .context import console_of

router = APIRouter(prefix="/api", tags=["api"])


class SubmitBody(BaseModel):
    """Start a run (``runner submit``)."""

    model_config = ConfigDict(extra="forbid")

    flow: str = Field(description="The flow, pkg.mod:FlowClass, in the workers' allow-list.")
    inputs: dict[str, Any] = Field(default_factory=dict, description="State fields to set.")
    id: str | None = Field(
        default=None,
        description="Name the run: a submit repeated with this id, the same flow and the same "
        "inputs returns the run it made (a producer's retry starts one run).",
    )
    if_exists: Literal["return", "reject"] = Field(
        default="return",
        description="For an id that exists: return it if flow and inputs match (else 409), "
        "or always refuse (409).",
    )
    countdown: float | None = Field(
        default=None, ge=0, description="Start no sooner than this many seconds from now."
    )
    deadline: float | None = Field(
        default=None, gt=0, description="Cancel the run if it has not finished by then (s)."
    )
    priority: int | None = Field(
        default=None,
        ge=min(PRIORITIES),
        le=max(PRIORITIES),
        description="Its steps' priority, 0 (lowest) to 9 (highest); default: each method's "
        "priority=, else 5. Kept when the run is resumed.",
    )


class ResumeBody(BaseModel):
    """Resume a run (``runner resume``)."""

    model_config = ConfigDict(extra="forbid")

    from_checkpoint: str | None = Field(
        default=None, description="Continue from this checkpoint of the run, not the latest."
    )
    inputs: dict[str, Any] = Field(
        default_factory=dict, description="State fields to set first (e.g. an approval)."
    )


class FeedbackBody(BaseModel):
    """Answer what a paused run awaits (``runner resume RUN --feedback``)."""

    model_config = ConfigDict(extra="forbid")

    feedback: str = Field(
        default="",
        description="The review of the step's output under review (@human_feedback), or the "
        "answer to the question (ask); empty: no feedback (a review's default outcome).",
    )
    outcome: str | None = Field(
        default=None, description="One of the review's emit labels, chosen directly."
    )
    by: str | None = Field(
        default=None,
        description="Who answers (kept in the run's history); default: the logged-in user "
        "(basic auth's user name, else RUNNER_UI_USER, else `console`).",
    )
    step: str | None = Field(
        default=None,
        description="The step (method or activation id) whose question is answered: 409 if "
        "the run now awaits another one.",
    )


class ForkBody(BaseModel):
    """Fork a checkpoint into a new run (``runner fork``)."""

    model_config = ConfigDict(extra="forbid")

    set: dict[str, Any] = Field(default_factory=dict, description="State fields to change.")
    rerun: list[str] = Field(
        default_factory=list, description="Steps to run again, with everything downstream."
    )
    branch: str | None = Field(default=None, description="A label for the fork.")
    run_id: str | None = Field(default=None, description="Id of the new run.")
    outputs: dict[str, Any] = Field(
        default_factory=dict,
        description="Crews only: task name -> its new output text; later tasks re-run.",
    )
    map: dict[str, str] = Field(
        default_factory=dict,
        description="Old method name -> new: continue on code that renamed methods "
        "(`runner fork --map`).",
    )


class TurnBody(BaseModel):
    """A conversational run's next turn (``runner chat RUN``)."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1, description="What the user says.")
    timeout: float | None = Field(
        default=60, gt=0, description="Seconds to wait for the reply (409 past them)."
    )


class Started(BaseModel):
    """The run an action started or continued."""

    run_id: str
    status: RunStatus


class TurnTaken(Started):
    """A turn's reply and the conversation so far."""

    reply: str
    messages: list[dict[str, Any]]


class Cancelled(Started):
    """A cancelled run and the checkpoint that records it."""

    checkpoint: str


@router.get("/runs", summary="List runs, newest update first")
def list_runs(
    request: Request,
    status: Annotated[RunStatus | None, Query(description="Only runs with this status.")] = None,
    flow: Annotated[str | None, Query(description="Only this flow (name or path).")] = None,
    q: Annotated[str | None, Query(description="Text in id, flow, step, error, branch.")] = None,
    where: Annotated[
        str | None,
        Query(
            description="A selection, as the CLI's --where: \"flow=X status=failed,paused "
            'since=1h until=ISO id~text text~text version=V" (every term must hold).'
        ),
    ] = None,
    offset: Annotated[int, Query(ge=0, description="Skip this many matching runs.")] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """Runs with status, flow, times, current step and fork/child links (``short``: the
    unambiguous short form of each id); ``total`` counts every run that matches, ``more``
    those after this page."""
    store = console_of(request).rt.store
    chosen = selection.parse(where, time.time())
    chosen = chosen._replace(
        statuses=(status,) if status is not None else chosen.statuses,
        flows=(flow,) if flow else chosen.flows,
        text=q or chosen.text,
    )
    return data.runs_page(store, chosen, offset=offset, limit=limit)


class BulkBody(BaseModel):
    """One action on many runs (``runner resume|cancel|fork|pin --where/--ids``)."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["resume", "cancel", "fork", "pin"] = Field(
        description="What to do to each run, through the one-run action's code path."
    )
    where: str | None = Field(
        default=None, description='The runs a selection keeps ("flow=X status=failed since=1h").'
    )
    ids: list[str] | None = Field(default=None, description="Or these run ids.")
    dry_run: bool = Field(
        default=True, description="Only say which runs it would act on (the default)."
    )


@router.post("/runs/bulk", summary="Resume, cancel, fork or pin many runs")
def post_bulk(request: Request, body: BulkBody) -> dict[str, Any]:
    """The runs ``where`` keeps (or ``ids`` names); with ``dry_run`` (the default) their
    count and the first of them, else each acted on in turn: ``acted``, ``skipped`` (its
    state refused the action, with the reason) and ``failed`` (with the error's line) counts
    and each run's ``outcomes``. A bad ``where`` or an unknown id is 422, before anything."""
    rt = console_of(request).rt
    chosen = bulk.select(rt, where=body.where, ids=body.ids)
    summary = bulk.dry(body.action, chosen) if body.dry_run else bulk.act(rt, body.action, chosen)
    return summary.as_json()


@router.get("/runs/{run_id}", summary="One run: inputs, result, graph, timeline, lineage")
def get_run(request: Request, run_id: str) -> dict[str, Any]:
    """Everything the run page shows, as JSON: its inputs and (once it succeeded) its
    result, as `runner submit --wait` prints it, among them."""
    console = console_of(request)
    return data.run_detail(console.rt, run_id, console.flower_url)


@router.get(
    "/runs/{run_id}/stream",
    summary="The run's live stream (Server-Sent Events)",
    response_class=StreamingResponse,
)
async def get_stream(
    request: Request,
    run_id: str,
    channels: Annotated[
        list[str] | None, Query(description="Only these channels (e.g. tokens).")
    ] = None,
    from_id: Annotated[
        str | None, Query(description="Start after this entry id (Last-Event-ID wins).")
    ] = None,
    last_event_id: Annotated[str | None, Header(description="Resume after this id.")] = None,
) -> StreamingResponse:
    """What the run's steps stream (tokens, progress), live, one event per entry (``id:`` the
    entry id; ``data:`` the frame as JSON: channel, type, content, data, step, attempt,
    superseded, run_id), ending with an ``end`` event carrying how the run ended and its
    result. Resume with ``Last-Event-ID`` (browsers send it when they reconnect) or
    ``from_id``: every entry comes once. 404 for an unknown run."""
    store = console_of(request).rt.store
    after, stop = last_event_id or from_id, threading.Event()
    frames = await run_in_threadpool(
        functools.partial(following.follow, store, run_id, channels, after, stop=stop)
    )
    return StreamingResponse(
        streams.events(frames, stop, request.is_disconnected),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/limits", summary="Rate and concurrency limits in use")
def get_limits(request: Request) -> dict[str, Any]:
    """Each limit in use (`runner limits`): kind, setting, use now, and the steps waiting on
    it with the seconds until they try again."""
    return {"limits": data.limits(console_of(request).rt.store)}


@router.get("/workers", summary="Live workers and the queues' backlog")
def get_workers(
    request: Request,
    timeout: Annotated[
        float, Query(gt=0, le=10, description="Seconds to wait for the workers' answers.")
    ] = 1.0,
) -> dict[str, Any]:
    """`runner workers --json`: each live worker (queues, pool, concurrency, busy slots,
    last heartbeat, versions), the workers gone in the last hour, and each queue's depth
    and oldest message's age (`oldest_age` says how that is measured on this broker)."""
    return survey(console_of(request).rt, timeout=timeout).as_json()


@router.get("/schedules", summary="Schedules")
def get_schedules(request: Request) -> dict[str, Any]:
    """Each schedule (`runner schedule list`): flow, inputs, cron or period (`when`), catch-up,
    paused, and its next tick (unix seconds)."""
    return {"schedules": data.schedules(console_of(request).rt.store)}


@router.get("/checkpoints/{ref}", summary="One checkpoint in full")
def get_checkpoint(request: Request, ref: str) -> dict[str, Any]:
    """A checkpoint by id (or a run id: its latest): state, outputs, record, error."""
    return data.checkpoint_view(console_of(request).rt, ref)


@router.get("/diff", summary="Compare two checkpoints")
def get_diff(
    request: Request,
    a: Annotated[str, Query(description="Checkpoint (or run) id.")],
    b: Annotated[str, Query(description="Checkpoint (or run) id.")],
) -> dict[str, Any]:
    """State fields added, removed and changed from ``a`` to ``b``; steps done on one side."""
    return data.diff(console_of(request).rt, a, b)


@router.get("/checkpoints/{ref}/fork-form", summary="What a fork of a checkpoint can edit")
def get_fork_form(request: Request, ref: str) -> dict[str, Any]:
    """The state model's JSON schema, its fields filled from the checkpoint, crew task
    outputs, and the flow's steps (for ``rerun``)."""
    return actions.fork_form(console_of(request).rt, ref)


@router.get("/checkpoints/{ref}/rerun", summary="What re-running steps would run")
def get_rerun(
    request: Request,
    ref: str,
    step: Annotated[list[str] | None, Query(description="A step to re-run (repeatable).")] = None,
) -> dict[str, Any]:
    """Every step downstream of ``step`` (run again) and the steps a fork dispatches first."""
    return actions.rerun_preview(console_of(request).rt, ref, step or [])


@router.post("/runs", status_code=202, summary="Submit a run")
def post_submit(request: Request, body: SubmitBody) -> Started:
    """Start a run on the workers, as `runner submit` does; the inputs are validated against
    the flow's state before anything is stored. With `id`, submitting again is safe: the
    same flow and inputs return the run already made (its status may be past running)."""
    handle = actions.submit(
        console_of(request).rt,
        body.flow,
        body.inputs,
        run_id=body.id,
        if_exists=body.if_exists,
        countdown=body.countdown,
        deadline=body.deadline,
        priority=body.priority,
    )
    return Started(run_id=handle.run_id, status=handle.status())


@router.post("/runs/{run_id}/resume", status_code=202, summary="Resume a run")
def post_resume(request: Request, run_id: str, body: ResumeBody | None = None) -> Started:
    """Continue a failed, cancelled or paused run; completed steps are not re-run."""
    body = body or ResumeBody()
    handle = actions.resume(console_of(request).rt, run_id, body.from_checkpoint, body.inputs)
    return Started(run_id=handle.run_id, status=handle.status())


@router.post("/runs/{run_id}/feedback", status_code=202, summary="Answer a paused run")
def post_feedback(request: Request, run_id: str, body: FeedbackBody) -> Started:
    """Give a run paused for a person its answer: the step that waits goes on with it (a
    reviewed method is not run again; with ``outcome``, or the label the feedback comes to,
    that label's listeners run). A run that awaits no answer is 409, an ``outcome`` that is
    not one of the labels 422."""
    console = console_of(request)
    handle = actions.answer(
        console.rt,
        run_id,
        body.feedback,
        outcome=body.outcome,
        by=body.by or console.author(request),
        step=body.step,
    )
    return Started(run_id=handle.run_id, status=handle.status())


@router.post("/runs/{run_id}/turns", summary="Take a turn of a conversational run")
def post_turn(request: Request, run_id: str, body: TurnBody) -> TurnTaken:
    """Give a conversational run (a flow with ``conversational = True``) the user's message
    as its next turn, a new epoch of the run on the workers, and wait for the reply. A run
    still running its turn, a turn that failed or outlasted ``timeout`` are 409; a run of a
    flow that is not conversational, or an empty message, 422."""
    handle, result = actions.turn(console_of(request).rt, run_id, body.message, body.timeout)
    return TurnTaken(
        run_id=handle.run_id,
        status=handle.status(),
        reply=conversation.reply_text(result),
        messages=handle.messages(),
    )


@router.post("/runs/{run_id}/cancel", summary="Cancel a run")
def post_cancel(request: Request, run_id: str) -> Cancelled:
    """Cancel the run: no more steps are sent, running ones are stopped. Resumable later."""
    console = console_of(request)
    ckpt = actions.cancel(console.rt, run_id, by=console.author(request))
    return Cancelled(run_id=run_id, status=ckpt.status, checkpoint=ckpt.id)


@router.post("/checkpoints/{ref}/fork", status_code=201, summary="Fork a checkpoint")
def post_fork(request: Request, ref: str, body: ForkBody) -> Started:
    """A new run from the checkpoint with edited state; ``rerun`` steps and everything
    downstream of them run again. The source run is untouched. A fork that would change
    nothing (no step left to run at the checkpoint, no ``rerun``, no ``set`` value that
    differs) is refused: 422, ``ForkChangesNothing``."""
    handle = actions.fork(
        console_of(request).rt,
        ref,
        body.set,
        rerun=body.rerun,
        branch=body.branch,
        run_id=body.run_id,
        outputs=body.outputs,
        renames=body.map,
    )
    return Started(run_id=handle.run_id, status=handle.status())
