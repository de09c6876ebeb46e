"""The console's actions: submit, resume, cancel and fork, through the API the CLI uses.

A fork's edited state is validated field by field against the flow's state model before
anything is stored, so a form can show each error next to its field; then
:func:`runner.distributed.control.fork` (or a crew's :meth:`~runner.crew.Crew.fork`,
for edited task outputs) validates it again and creates the run.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from runner import ids
from runner.crew import CrewFlow
from runner.distributed import control
from runner.distributed.client import RunHandle, check_fields, load_flow
from runner.distributed.client import submit as submit_run
from runner.distributed.engine import Runtime
from runner.errors import InvalidInputs, RunnerError
from runner.flow import orchestrator as orch
from runner.flow import transition as tr
from runner.store.models import Checkpoint


class FieldErrors(InvalidInputs):
    """Edited state the flow's state model rejects; ``errors`` maps each field to why."""

    errors: dict[str, str]


# --- the fork form ---------------------------------------------------------------------------


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return {
            **defs.get(ref.rpartition("/")[2], {}),
            **{k: v for k, v in prop.items() if k != "$ref"},
        }
    return prop


_KINDS = {"string": "text", "integer": "integer", "number": "number", "boolean": "boolean"}
"""Form field kind of a JSON schema type; anything else is edited as JSON text."""


def _kind(prop: dict[str, Any], defs: dict[str, Any]) -> tuple[str, bool, list[Any]]:
    """How a schema property is edited: (kind, nullable, enum options)."""
    prop = _resolve(prop, defs)
    options = prop.get("anyOf")
    if isinstance(options, list):
        real = [_resolve(o, defs) for o in options if o.get("type") != "null"]
        nullable = len(real) < len(options)
        if len(real) == 1:
            kind, _, values = _kind(real[0], defs)
            return kind, nullable, values
        return "json", nullable, []
    if "enum" in prop:
        return "enum", False, list(prop["enum"])
    return _KINDS.get(prop.get("type", ""), "json"), False, []


def _shown(kind: str, value: Any) -> Any:
    if kind == "boolean":
        return bool(value)
    if kind == "json":
        return json.dumps(value, indent=2)
    return "" if value is None else str(value)


def form_fields(flow_cls: Any, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The editable fields of ``flow_cls``'s state, from its pydantic JSON schema, filled
    with ``state``'s values (a dict state: one JSON field per key). ``id`` is not editable:
    a fork gets a new one."""
    model = flow_cls.state_type()
    crew = isinstance(flow_cls, type) and issubclass(flow_cls, CrewFlow)
    if model is None:
        props: dict[str, Any] = {key: {} for key in state}
        defs: dict[str, Any] = {}
        required: set[str] = set()
    else:
        schema = model.model_json_schema()
        props, defs = schema.get("properties", {}), schema.get("$defs", {})
        required = set(schema.get("required", []))
    fields = []
    for name, prop in props.items():
        if name == "id" or (crew and name == "outputs"):  # crew outputs: edited per task
            continue
        kind, nullable, options = _kind(prop, defs)
        resolved = _resolve(prop, defs)
        fields.append(
            {
                "name": name,
                "kind": kind,
                "nullable": nullable,
                "options": options,
                "title": resolved.get("title") or name,
                "description": resolved.get("description"),
                "required": name in required,
                "value": _shown(kind, state.get(name, resolved.get("default"))),
            }
        )
    return fields


def task_outputs(flow_cls: Any, state: dict[str, Any]) -> list[dict[str, Any]]:
    """A crew's finished task outputs (result text), editable as in CrewAI's browser."""
    if not (isinstance(flow_cls, type) and issubclass(flow_cls, CrewFlow)):
        return []
    done = state.get("outputs") or {}
    return [
        {"task": task.name, "raw": str((done.get(task.name) or {}).get("raw", ""))}
        for task in flow_cls.crew.tasks
        if task.name in done
    ]


def fork_form(rt: Runtime, ref: str) -> dict[str, Any]:
    """What the fork form of checkpoint ``ref`` needs: fields, task outputs, steps."""
    source = control.find_checkpoint(rt, ref)
    flow_cls = load_flow(str(source.flow))
    graph = flow_cls.graph()
    return {
        "checkpoint": {
            "id": source.id,
            "run_id": source.run_id,
            "seq": source.seq,
            "event": source.event,
            "step": source.step,
        },
        "flow": source.flow,
        "schema": (model.model_json_schema() if (model := flow_cls.state_type()) else None),
        "fields": form_fields(flow_cls, source.state),
        "outputs": task_outputs(flow_cls, source.state),
        "steps": list(graph.methods),
        "completed": sorted({ids.method_of(a) for a in source.completed}),
    }


def parse_form(
    fields: list[dict[str, Any]], form: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Submitted form values (``field.<name>``) as state values, and per-field errors of
    values that cannot even be read (JSON that does not parse). Numbers stay text: the
    state model converts and checks them, as it does ``--set`` values."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in fields:
        key, kind = f"field.{field['name']}", field["kind"]
        if kind == "boolean":
            values[field["name"]] = form.get(key) == "true"
            continue
        if key not in form:
            continue
        raw = str(form[key])
        if kind == "json":
            try:
                values[field["name"]] = json.loads(raw)
            except ValueError as exc:
                errors[field["name"]] = f"not valid JSON: {exc}"
        elif raw == "" and field["nullable"]:
            values[field["name"]] = None
        else:
            values[field["name"]] = raw
    return values, errors


def validated_changes(
    flow_cls: Any, state: dict[str, Any], values: dict[str, Any]
) -> dict[str, Any]:
    """The fields of ``values`` that differ from ``state``, as the state model stores them.

    Raises :class:`FieldErrors` (every rejected field, each with its reason) if the state
    model rejects them, before anything is stored.
    """
    model = flow_cls.state_type()
    if model is None:
        return {k: v for k, v in values.items() if state.get(k) != v}
    errors: dict[str, str] = {}
    try:
        check_fields(flow_cls, values)  # keys the model would silently drop
    except InvalidInputs:
        for key in values:
            if key not in model.model_fields:
                errors[key] = f"{model.__name__} has no field {key!r}"
    if "id" in values:
        errors["id"] = "a fork gets a new id: use run_id to choose it"
    if not errors:
        try:
            dumped = model.model_validate({**state, **values}).model_dump(mode="json")
        except ValidationError as exc:
            for err in exc.errors():
                where = str(err["loc"][0]) if err["loc"] else "state"
                errors.setdefault(where, err["msg"])
    if errors:
        listed = "; ".join(f"{k}: {v}" for k, v in errors.items())
        raise FieldErrors(f"invalid state: {listed}", errors=errors)
    return {k: dumped[k] for k in values if dumped.get(k) != state.get(k)}


def rerun_preview(rt: Runtime, ref: str, steps: list[str]) -> dict[str, Any]:
    """What a fork of checkpoint ``ref`` re-running ``steps`` runs: every step downstream
    of them (``rerun``) and the steps dispatched first (``starts``)."""
    source = control.find_checkpoint(rt, ref)
    graph = control.check_steps(load_flow(str(source.flow)), steps)
    record = tr.record_of(source)
    if steps:
        record = orch.invalidate(graph, record, steps)
    again = graph.downstream(steps) if steps else frozenset()
    return {
        "checkpoint": source.id,
        "steps": steps,
        "rerun": [name for name in graph.methods if name in again],
        "starts": [act.method for act in orch.pending(record)],
    }


# --- actions ---------------------------------------------------------------------------------


def fork(
    rt: Runtime,
    ref: str,
    values: dict[str, Any],
    *,
    rerun: list[str] | None = None,
    branch: str | None = None,
    run_id: str | None = None,
    outputs: dict[str, Any] | None = None,
    renames: dict[str, str] | None = None,
) -> RunHandle:
    """A new run from checkpoint ``ref`` with the edited ``values`` (only fields that
    changed are set), ``rerun`` steps and, for a crew, edited task ``outputs``; ``renames``
    (old -> new method) moves it onto code that renamed methods."""
    source: Checkpoint = control.find_checkpoint(rt, ref)
    flow_cls = load_flow(str(source.flow))
    changes = validated_changes(flow_cls, source.state, values)
    done = (source.state.get("outputs") or {}) if outputs else {}
    edited = {
        task: text
        for task, text in (outputs or {}).items()
        if not (isinstance(text, str) and text == (done.get(task) or {}).get("raw"))
    }
    if edited:
        if not issubclass(flow_cls, CrewFlow):
            raise InvalidInputs(
                f"{flow_cls.flow_name()} is not a crew: it has no task outputs to edit",
                flow=flow_cls.flow_name(),
            )
        inputs = changes.pop("inputs", None)
        if changes:
            raise InvalidInputs(
                f"a crew fork edits inputs and task outputs only, not {', '.join(changes)}",
                flow=flow_cls.flow_name(),
            )
        crew_handle = flow_cls.crew.fork(
            source.id,
            outputs=edited,
            rerun=rerun,
            inputs=inputs,
            branch=branch,
            run_id=run_id,
            rt=rt,
        )
        return RunHandle(crew_handle.run_id, rt)
    return control.fork(source.id, changes, rerun or [], branch, run_id, renames=renames, rt=rt)


def submit(
    rt: Runtime,
    flow: str,
    inputs: dict[str, Any],
    *,
    run_id: str | None,
    if_exists: str,
    countdown: float | None,
    deadline: float | None,
    priority: int | None = None,
) -> RunHandle:
    """Start a run of ``flow`` (a path in the workers' allow-list), as ``runner submit``:
    a repeated submit of one ``run_id`` with the same flow and inputs returns that run."""
    return submit_run(
        flow,
        inputs,
        id=run_id,
        if_exists=if_exists,
        countdown=countdown,
        deadline=deadline,
        priority=priority,
        rt=rt,
    )


def resume(
    rt: Runtime, run_id: str, from_checkpoint: str | None, inputs: dict[str, Any]
) -> RunHandle:
    """Continue ``run_id`` (from its latest, or ``from_checkpoint``) with ``inputs`` set."""
    return control.resume(run_id, from_checkpoint or None, inputs or None, rt=rt)


def answer(
    rt: Runtime,
    run_id: str,
    feedback: str,
    *,
    outcome: str | None,
    by: str | None,
    step: str | None = None,
) -> RunHandle:
    """Give the run the answer it awaits (a review's feedback, or a label chosen directly;
    a question's answer), as ``runner resume RUN --feedback`` does."""
    return control.answer(run_id, feedback, by=by, outcome=outcome or None, step=step, rt=rt)


def turn(rt: Runtime, run_id: str, message: str, timeout: float | None) -> tuple[RunHandle, Any]:
    """Give the conversational run the user's ``message`` as its next turn and wait for the
    turn's result, as ``runner chat RUN`` does; the run and the result."""
    handle = RunHandle(run_id, rt)
    handle.info()  # an unknown run is a 404, not a refused turn
    return handle, handle.turn(message, timeout)


def cancel(rt: Runtime, run_id: str, *, by: str | None = None) -> Checkpoint:
    """Cancel the run: no more steps are sent, running ones are stopped. Resumable. ``by``
    (who cancelled, from the console; ``console`` when the login named nobody) is kept as
    its cancel reason."""
    handle = RunHandle(run_id, rt)
    handle.info()  # an unknown run is a 404, not a refused cancel
    named = by is not None and by != "console"
    return handle.cancel(
        reason=f"cancelled by {by} in the console" if named else "cancelled in the console"
    )


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object (empty text: ``{}``); :class:`InvalidInputs` otherwise."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidInputs(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInputs(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def describe(exc: RunnerError) -> dict[str, Any]:
    """An error as the API's JSON body: type, message and structured fields."""
    body: dict[str, Any] = {"type": type(exc).__name__, "message": exc.message}
    # ``check_fields`` passes a field named ``fields``, which replaces the error's dict.
    fields = exc.fields if isinstance(exc.fields, dict) else {"fields": exc.fields}
    for key, value in fields.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = str(value)
        body[key] = value
    return body
