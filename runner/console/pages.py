"""The console's pages and the htmx fragments they poll and swap.

Pages render the same dicts the JSON API returns (:mod:`.data`, :mod:`.actions`).
Action responses tell htmx where to go next (``HX-Redirect``); a fork form that does not
validate comes back (422) with each error next to its field.
"""

from __future__ import annotations

import time
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from runner.distributed import bulk
from runner.distributed.fleet import survey
from runner.errors import InvalidInputs, RunnerError
from runner.store.models import RunStatus
from runner.store.selection import Where, instant

from . import actions, data
from .context import console_of, error_response, logged_in
from .security import safe_next

router = APIRouter(include_in_schema=False)

ACTIVE = (RunStatus.PENDING.value, RunStatus.RUNNING.value)
TURN_TIMEOUT = 120.0
"""Seconds the chat panel's post waits for a turn's reply (then a 409 says so; the turn goes
on and its reply shows on the run's page)."""


def _status(value: str | None) -> RunStatus | None:
    return RunStatus(value) if value in {s.value for s in RunStatus} else None


def _redirect(url: str) -> Response:
    return Response(status_code=204, headers={"HX-Redirect": url})


# --- runs ------------------------------------------------------------------------------------


SINCE = ("15m", "1h", "6h", "1d", "1w")
"""The runs page's time filter's choices: updated within this long (``since=`` takes any
age or ISO time, as ``--where`` does)."""
PAGE_SIZE = 50
"""Runs a page of the list shows unless ``limit=`` says otherwise (at most ``MAX_PAGE``)."""
MAX_PAGE = 500


def _selection(
    status: str | None, flow: str | None, q: str | None, since: str | None
) -> tuple[Where, dict[str, str]]:
    """The runs page's filters as a selection (the CLI's ``--where``), and as they show."""
    now = time.time()
    where = Where(
        statuses=(state,) if (state := _status(status)) else (),
        flows=(flow,) if flow else (),
        since=instant(since, now, f"since={since}") if since else None,
        text=q or "",
    )
    shown = {"status": status or "", "flow": flow or "", "q": q or "", "since": since or ""}
    return where, shown


def _list(
    request: Request,
    status: str | None,
    flow: str | None,
    q: str | None,
    since: str | None,
    offset: int,
    limit: int,
) -> dict[str, Any]:
    console = console_of(request)
    where, filters = _selection(status, flow, q, since)
    offset, limit = max(offset, 0), min(max(limit, 1), MAX_PAGE)
    page = data.runs_page(console.rt.store, where, offset=offset, limit=limit)
    query: dict[str, str | int] = {k: v for k, v in filters.items() if v}
    if limit != PAGE_SIZE:
        query["limit"] = limit
    links = {
        "prev": urlencode({**query, "offset": max(offset - limit, 0)}) if offset > 0 else None,
        "next": urlencode({**query, "offset": offset + limit}) if page["more"] else None,
    }
    return {**page, "filters": filters, "links": links}


@router.get("/")
def runs_page(
    request: Request,
    status: str | None = None,
    flow: str | None = None,
    q: str | None = None,
    since: str | None = None,
    offset: int = 0,
    limit: int = PAGE_SIZE,
) -> Response:
    """Runs, a page at a time, filtered by status, flow, time and text; with a count, paging,
    and bulk resume, cancel and pin of the runs selected. The table refreshes itself."""
    console = console_of(request)
    return console.page(
        request,
        "runs.html",
        **_list(request, status, flow, q, since, offset, limit),
        flows=data.flow_names(console.rt.store),
        statuses=[s.value for s in RunStatus],
        periods=SINCE,
    )


@router.get("/fragments/runs")
def runs_rows(
    request: Request,
    status: str | None = None,
    flow: str | None = None,
    q: str | None = None,
    since: str | None = None,
    offset: int = 0,
    limit: int = PAGE_SIZE,
) -> Response:
    """The rows of the runs table and its count (polled, and swapped in)."""
    console = console_of(request)
    return console.page(
        request, "_runs_rows.html", **_list(request, status, flow, q, since, offset, limit)
    )


@router.post("/runs/bulk/{action}")
def bulk_submit(
    request: Request, action: str, run_id: Annotated[list[str] | None, Form()] = None
) -> Response:
    """Resume, cancel or pin the runs selected on the runs page; the summary goes to the
    page's message area."""
    console = console_of(request)
    if not run_id:
        raise InvalidInputs("no run selected")
    chosen = bulk.select(console.rt, ids=run_id)
    # `act` refuses an action it does not know, for this route as for the API and the CLI.
    summary = bulk.act(console.rt, action, chosen)  # type: ignore[arg-type]
    return console.page(request, "_bulk_summary.html", summary=summary.as_json())


@router.get("/limits")
def limits_page(request: Request) -> Response:
    """Each rate and concurrency limit in use, its use now and the steps waiting on it."""
    console = console_of(request)
    return console.page(request, "limits.html", limits=data.limits(console.rt.store))


@router.get("/workers")
def workers_page(request: Request) -> Response:
    """Each live worker (queues, pool, busy slots, heartbeat) and each queue's backlog."""
    console = console_of(request)
    return console.page(request, "workers.html", **_fleet(console))


@router.get("/fragments/workers")
def workers_fragment(request: Request) -> Response:
    """The Workers page's tables (polled)."""
    console = console_of(request)
    return console.page(request, "_workers.html", **_fleet(console))


def _fleet(console: Any) -> dict[str, Any]:
    found = survey(console.rt).as_json()
    return {"fleet": found, "labels": {q["queue"]: q["name"] for q in found["queues"]}}


@router.get("/schedules")
def schedules_page(request: Request) -> Response:
    """Each schedule: its flow, inputs, cron or period, next tick, paused or not."""
    console = console_of(request)
    return console.page(request, "schedules.html", schedules=data.schedules(console.rt.store))


# --- one run ---------------------------------------------------------------------------------


@router.get("/runs/{run_id}")
def run_page(request: Request, run_id: str) -> Response:
    """A run: graph, timeline, error, children, lineage, state, diff and actions."""
    console = console_of(request)
    run = data.run_detail(console.rt, run_id, console.flower_url)
    return console.page(request, "run.html", d=run, active=run["run"]["status"] in ACTIVE)


@router.get("/fragments/runs/{run_id}/live")
def run_live(
    request: Request, run_id: str, seq: int | None = None, status: str | None = None
) -> Response:
    """The moving part of a run's page; 204 (nothing to swap) while the run has not moved
    since the ``seq`` and ``status`` the page shows."""
    console = console_of(request)
    info = console.rt.store.run(run_id)
    if info is not None and info.seq == seq and info.status.value == status:
        return Response(status_code=204)
    run = data.run_detail(console.rt, run_id, console.flower_url)
    return console.page(request, "_run_live.html", d=run, active=run["run"]["status"] in ACTIVE)


@router.get("/fragments/checkpoints/{ref}")
def checkpoint_fragment(request: Request, ref: str) -> Response:
    """One checkpoint's state, outputs, lineage and error."""
    console = console_of(request)
    return console.page(request, "_checkpoint.html", c=data.checkpoint_view(console.rt, ref))


@router.get("/fragments/diff")
def diff_fragment(
    request: Request,
    a: Annotated[str, Query()],
    b: Annotated[str, Query()],
) -> Response:
    """The diff between two checkpoints (or runs: their latest)."""
    console = console_of(request)
    return console.page(request, "_diff.html", diff=data.diff(console.rt, a.strip(), b.strip()))


# --- fork ------------------------------------------------------------------------------------


@router.get("/fragments/fork/{ref}")
def fork_form(request: Request, ref: str) -> Response:
    """The fork form of a checkpoint, generated from the flow's state model."""
    console = console_of(request)
    form = actions.fork_form(console.rt, ref)
    preview = actions.rerun_preview(console.rt, ref, [])
    return console.page(
        request, "_fork_form.html", form=form, errors={}, chosen=[], preview=preview
    )


@router.get("/fragments/rerun/{ref}")
def rerun_fragment(
    request: Request, ref: str, rerun: Annotated[list[str] | None, Query()] = None
) -> Response:
    """What the chosen re-run steps would run, shown before the fork is confirmed."""
    console = console_of(request)
    preview = actions.rerun_preview(console.rt, ref, rerun or [])
    return console.page(request, "_rerun.html", preview=preview)


@router.post("/checkpoints/{ref}/fork")
async def fork_submit(request: Request, ref: str) -> Response:
    """Fork from the form: invalid fields come back with their errors, nothing stored."""
    console = console_of(request)
    form = await request.form()
    submitted: dict[str, Any] = {k: v for k, v in form.items() if isinstance(v, str)}
    rerun = [v for v in form.getlist("rerun") if isinstance(v, str)]
    spec = actions.fork_form(console.rt, ref)
    values, errors = actions.parse_form(spec["fields"], submitted)
    outputs = {
        task["task"]: submitted[f"output.{task['task']}"]
        for task in spec["outputs"]
        if f"output.{task['task']}" in submitted
    }
    if not errors:
        try:
            handle = actions.fork(
                console.rt,
                ref,
                values,
                rerun=rerun,
                branch=submitted.get("branch") or None,
                run_id=submitted.get("run_id") or None,
                outputs=outputs,
            )
        except actions.FieldErrors as exc:
            errors = dict(exc.errors)
        except RunnerError as exc:  # refused as a whole (e.g. the run id is taken)
            errors = {"_form": f"{type(exc).__name__}: {exc}"}
        else:
            return _redirect(f"/runs/{handle.run_id}")
    # Show what was typed, not the checkpoint's values, next to the errors.
    for field in spec["fields"]:
        key = f"field.{field['name']}"
        if field["kind"] == "boolean":
            field["value"] = submitted.get(key) == "true"
        elif key in submitted:
            field["value"] = submitted[key]
    for task in spec["outputs"]:
        task["raw"] = outputs.get(task["task"], task["raw"])
    spec["branch"], spec["run_id"] = submitted.get("branch", ""), submitted.get("run_id", "")
    # A step the flow does not have is named in the form's error; the preview skips it.
    chosen = [step for step in rerun if step in spec["steps"]]
    preview = actions.rerun_preview(console.rt, ref, chosen)
    return console.page(
        request,
        "_fork_form.html",
        status=422,
        form=spec,
        errors=errors,
        chosen=chosen,
        preview=preview,
    )


# --- resume, cancel --------------------------------------------------------------------------


@router.post("/runs/{run_id}/resume")
def resume_submit(
    request: Request,
    run_id: str,
    inputs: Annotated[str, Form()] = "",
    from_checkpoint: Annotated[str, Form()] = "",
) -> Response:
    """Resume the run (with optional JSON inputs) and reload its page."""
    console = console_of(request)
    values = actions.parse_json_object(inputs, "inputs")
    handle = actions.resume(console.rt, run_id, from_checkpoint.strip() or None, values)
    return _redirect(f"/runs/{handle.run_id}")  # a child's stopped parent, when resumed instead


@router.post("/runs/{run_id}/feedback")
def feedback_submit(
    request: Request,
    run_id: str,
    feedback: Annotated[str, Form()] = "",
    outcome: Annotated[str, Form()] = "",
    step: Annotated[str, Form()] = "",
) -> Response:
    """Answer what the run awaits (the feedback box, or a label's button) and reload its page;
    ``step`` is the activation whose question the page showed."""
    console = console_of(request)
    actions.answer(
        console.rt,
        run_id,
        feedback,
        outcome=outcome or None,
        by=console.author(request),
        step=step or None,
    )
    return _redirect(f"/runs/{run_id}")


@router.post("/runs/{run_id}/turns")
def turn_submit(request: Request, run_id: str, message: Annotated[str, Form()] = "") -> Response:
    """Take the chat panel's message as the run's next turn, wait for the reply and reload
    the run's page (which shows the conversation)."""
    actions.turn(console_of(request).rt, run_id, message, TURN_TIMEOUT)
    return _redirect(f"/runs/{run_id}")


@router.post("/runs/{run_id}/cancel")
def cancel_submit(request: Request, run_id: str) -> Response:
    """Cancel the run and reload its page."""
    console = console_of(request)
    actions.cancel(console.rt, run_id, by=console.author(request))
    return _redirect(f"/runs/{run_id}")


# --- login -----------------------------------------------------------------------------------


@router.get("/login")
def login_page(request: Request, next: str | None = None) -> Response:
    """The token form (only useful when the console was started with a token)."""
    console = console_of(request)
    if console.guard.read_only:
        return RedirectResponse(safe_next(next), status_code=303)
    return console.page(
        request,
        "login.html",
        next=safe_next(next),
        failed=False,
        default_user=console.user or "console",
    )


@router.post("/login")
def login_submit(
    request: Request,
    token: Annotated[str, Form()],
    csrf: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
    user: Annotated[str, Form()] = "",
) -> Response:
    """Check the token; on success set the session cookie (and the name given, recorded
    with this browser's answers and cancels) and go on."""
    console = console_of(request)
    guard = console.guard
    if guard.read_only:
        return RedirectResponse("/", status_code=303)
    if not guard.csrf_ok(request, csrf):
        body = {"type": "CsrfFailed", "message": "login form expired or from another site"}
        return error_response(request, 403, body)
    if not guard.check_token(token):
        return console.page(
            request,
            "login.html",
            status=401,
            next=safe_next(next),
            failed=True,
            default_user=console.user or "console",
        )
    return logged_in(guard, next, user.strip() or None)
