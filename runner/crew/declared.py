"""Declarative flows: a :class:`~runner.flow.definition.FlowDefinition` made a flow class.

:func:`declared_flow` turns a definition (CrewAI's ``crewai.flow/v1``, from YAML, JSON, a
dict or a ``FlowDefinition``) into a :class:`~runner.flow.flow.Flow` subclass whose methods
are wired by the same ``@start`` / ``@listen`` / ``@router`` (and ``@human_feedback``) a
class flow uses, so it compiles to the same graph and runs as a class flow does: in process
(``kickoff``) and on workers, each method a step (checkpointed, resumable, forkable), its
``flow_definition()`` the definition it was made from.

**Its import path carries the definition.** The class is this module's attribute
``D_<the definition as compressed JSON>`` (made on first access, :func:`__getattr__`), so
the path a run records (``runner.crew.declared:D_...``) is all a worker, ``runner resume``
or the console need to run it again: no file, no registry. Code references in it resolve
on a worker only in the modules of its allow-list (``RUNNER_FLOW_MODULES``).

**Actions** (a method's ``do``): ``code`` (an importable function, keyword arguments from
``with``; a ``Class.method`` of a flow class is called with the flow as ``self``),
``expression`` (CEL), ``crew`` (an inline crew run by our :class:`~runner.crew.Crew`),
``agent`` (one :class:`~runner.crew.Agent` on ``with.input``), and ``each``: the pipeline
``do`` for every item of the list ``in`` evaluates to. In process the items run in turn; on
workers the ``each`` method starts a child run with one parallel step per item and a join
that collects their outputs in order, so a crash mid-fan-out re-runs only unfinished items.
Templates (``${state.x}``, ``${outputs.step.raw}``) and conditions are CEL
(:mod:`runner.flow.expressions`). ``tool`` calls a tool class (CrewAI's ``BaseTool`` shape,
:mod:`runner.crew.tools`) by reference with its rendered ``with`` as keyword arguments of
``run``; ``script`` actions are refused (no ``exec``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import inspect
import json
import logging
import threading
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, create_model
from pydantic_core import to_jsonable_python

from runner.checkpointing import CheckpointConfig, persist
from runner.crew.agent import Agent
from runner.crew.crew import Crew
from runner.crew.task import Task
from runner.crew.tools import awaited
from runner.distributed.engine import FlowNotAllowed
from runner.errors import DefinitionError
from runner.flow import conversation
from runner.flow import expressions as cel
from runner.flow.children import ChildRun
from runner.flow.conditions import Cond
from runner.flow.context import on_worker, step_context
from runner.flow.decorators import REVIEW_ATTR, listen, router, start
from runner.flow.definition import (
    ACTION_ATTR,
    DECLARED_MODULE,
    DEFINITION_ATTR,
    AgentAction,
    CodeAction,
    CrewAction,
    CrewDefinition,
    EachAction,
    EachStep,
    ExpressionAction,
    FlowDefinition,
    FlowMethodDefinition,
    InvalidDefinition,
    JsonSchemaState,
    PydanticState,
    ScriptAction,
    ToolAction,
    UnknownState,
    allowed_refs,
    check_ref,
    condition_of,
    invalid_definition,
)
from runner.flow.flow import Flow
from runner.flow.human_feedback import human_feedback
from runner.flow.state import FlowState, dump_state
from runner.store.persistence import REGISTERED

log = logging.getLogger(__name__)

PREFIX = "D_"
"""The start of a declared flow's attribute name in this module."""

EACH_ITEMS = "__each_items__"
"""The state field of an ``each`` child run holding the items."""
EACH_OUTPUTS = "__each_outputs__"
"""The state field of an ``each`` child run holding its parent's outputs."""

_classes: dict[str, type[Flow[Any]]] = {}
_lock = threading.RLock()

assert __name__ == DECLARED_MODULE


# --- the path that carries the definition ---------------------------------------------------


def attribute_of(definition: FlowDefinition) -> str:
    """The attribute of this module naming ``definition``'s flow class."""
    text = json.dumps(definition.to_dict(), sort_keys=True, separators=(",", ":"))
    packed = base64.urlsafe_b64encode(zlib.compress(text.encode(), 9)).decode().rstrip("=")
    return PREFIX + packed


def definition_of(attribute: str) -> FlowDefinition:
    """The definition an attribute of this module (or a declared flow path) carries."""
    packed = attribute.rpartition(":")[2].removeprefix(PREFIX)
    try:
        data = zlib.decompress(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)))
        loaded = json.loads(data)
    except (ValueError, zlib.error) as exc:
        raise DefinitionError(f"not a declared flow's path: {attribute[:40]}...: {exc}") from None
    try:
        return FlowDefinition.from_declaration(loaded)
    except ValidationError as exc:
        # A recorded run's definition that this version no longer accepts: a DefinitionError
        # (one line, its field's path), as every flow path that cannot be loaded is.
        raise invalid_definition(exc) from None


def __getattr__(name: str) -> Any:
    """``D_...``: the flow class of the definition the name carries (made once)."""
    if not name.startswith(PREFIX):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        found = _classes.get(name)
    return found if found is not None else declared_flow(definition_of(name))


# --- building the class ---------------------------------------------------------------------


def load_definition(
    contents: FlowDefinition | Mapping[str, Any] | str | Path | None = None,
    *,
    path: Path | str | None = None,
) -> FlowDefinition:
    """A definition from a definition, a mapping, YAML/JSON text, or a file (``path``, or a
    :class:`~pathlib.Path` as ``contents``); bad input is one line naming the field."""
    if isinstance(contents, Path):
        contents, path = None, contents
    return FlowDefinition.from_declaration(contents, path=path)


def declared_flow(
    contents: FlowDefinition | Mapping[str, Any] | str | Path | None = None,
    *,
    path: Path | str | None = None,
) -> type[Flow[Any]]:
    """The flow class of a definition (one class per definition in a process).

    Refuses, naming the field's path, what the runner does not run: ``script`` actions,
    a crew ``from_declaration``, a nested ``each``, a bad condition or reference."""
    definition = load_definition(contents, path=path)
    attribute = attribute_of(definition)
    with _lock:
        found = _classes.get(attribute)
        if found is None:
            found = _build(definition, attribute)
            _classes[attribute] = found
    return found


def from_declaration(
    contents: FlowDefinition | Mapping[str, Any] | str | Path | None = None,
    *,
    path: Path | str | None = None,
    **kwargs: Any,
) -> Flow[Any]:
    """A flow object of the definition (CrewAI's ``Flow.from_declaration``): ``kickoff``
    it in process, or ``submit`` its class (``type(flow).submit``) to the workers."""
    return declared_flow(contents, path=path)(**kwargs)


def submit_definition(
    contents: FlowDefinition | Mapping[str, Any] | str | Path,
    inputs: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Run a definition on the workers (:func:`runner.submit`'s options); the run records the
    definition, so the workers need no file of it. Returns a :class:`RunHandle`."""
    return declared_flow(contents).submit(inputs, **options)


def _build(definition: FlowDefinition, attribute: str) -> type[Flow[Any]]:
    for name, method in definition.methods.items():
        _check_supported(method.do, f"methods.{name}.do")
    digest = hashlib.sha256(attribute.encode()).hexdigest()[:8]
    path = f"{DECLARED_MODULE}:{attribute}"
    namespace: dict[str, Any] = {
        "__module__": DECLARED_MODULE,
        "__qualname__": definition.name,
        "__doc__": definition.description,
        # ``@`` marks a declared flow's task names (see runner.distributed.engine.task_name).
        "name": f"{definition.name}@{digest}",
        "initial_state": _initial_state(definition),
        DEFINITION_ATTR: definition,
        "flow_path": classmethod(lambda cls: path),
    }
    namespace.update(_configured(definition))
    for name, method in definition.methods.items():
        namespace[name] = _persisted(definition, name, _method(definition.name, name, method))
    if definition.conversational is not None:
        # Declaring the block is the opt-in (CrewAI's); enabled: false keeps it without chat.
        config = conversation.config_from_block(definition.conversational)
        namespace["conversational"] = config is not None
        namespace["conversational_config"] = config
    return type(definition.name, (Flow,), namespace)


def _configured(definition: FlowDefinition) -> dict[str, Any]:
    """The class attributes a definition's ``config`` sets, as a class flow sets them:
    ``stream``, ``max_method_calls``, ``checkpoint`` (``true`` or a ``CheckpointConfig``'s
    fields) and ``input_provider`` (a reference, made here: a class without arguments)."""
    config = definition.config
    attrs: dict[str, Any] = {"stream": config.stream, "max_method_calls": config.max_method_calls}
    if config.checkpoint is True:
        attrs["checkpoint"] = CheckpointConfig()
    elif isinstance(config.checkpoint, dict):
        try:
            attrs["checkpoint"] = CheckpointConfig(**config.checkpoint)
        except (TypeError, ValueError) as exc:
            line = " ".join(str(exc).split())[:200]
            raise InvalidDefinition(
                f"config.checkpoint: {line}", field="config.checkpoint"
            ) from None
    if config.input_provider is not None:
        target = resolve_ref(config.input_provider, "config.input_provider")
        attrs["input_provider"] = target() if isinstance(target, type) else target
    return attrs


def _persisted(definition: FlowDefinition, name: str, fn: Any) -> Any:
    """``fn`` with the ``persist`` its method or, unless the method opts out
    (``enabled: false``), the flow declares. A flow keeps its states in one persistence, so
    methods naming different ones are refused."""
    own, flow = definition.methods[name].persist, definition.persist
    spec = own if own is not None else flow if flow is not None and flow.enabled else None
    if spec is None or not spec.enabled:
        return fn
    where = f"methods.{name}.persist" if own is not None else "persist"
    backends = {
        json.dumps(p.persistence, sort_keys=True, default=str)
        for p in [flow, *(m.persist for m in definition.methods.values())]
        if p is not None and p.enabled and p.persistence is not None
    }
    if len(backends) > 1:
        raise InvalidDefinition(
            f"{where}.persistence: a flow keeps its states in one persistence; "
            f"its methods name {len(backends)}",
            field=f"{where}.persistence",
        )
    value = spec.persistence if spec.persistence is not None else flow and flow.persistence
    return persist(_persistence_of(value, f"{where}.persistence"), verbose=spec.verbose)(fn)


def _persistence_of(value: Any, where: str) -> Any:
    """The persistence a definition names: ``{persistence_type: Name, ...fields}`` (a
    :class:`FlowPersistence` subclass by class name), ``{ref: "module:name"}`` or
    ``"module:name"`` (a class, made without arguments, or an object); ``None``: the
    default."""
    if value is None:
        return None
    if isinstance(value, dict) and "persistence_type" in value:
        fields = {k: v for k, v in value.items() if k != "persistence_type"}
        cls = REGISTERED.get(str(value["persistence_type"]))
        if cls is None:
            raise InvalidDefinition(
                f"{where}.persistence_type: no FlowPersistence class named "
                f"{value['persistence_type']!r} is defined here",
                field=where,
            )
        try:
            return cls(**fields)
        except TypeError as exc:
            raise InvalidDefinition(f"{where}: {exc}", field=where) from None
    ref = value.get("ref") if isinstance(value, dict) else value
    if not isinstance(ref, str):
        raise InvalidDefinition(
            f"{where}: give {{persistence_type: ..., ...}} or a module:name reference", field=where
        )
    target = resolve_ref(ref, where)
    return target() if isinstance(target, type) else target


def _check_supported(action: Any, where: str, nested: bool = False) -> None:
    check_ref(action, where)
    if isinstance(action, ScriptAction):
        raise InvalidDefinition(
            f"{where}.call: script actions are not run here (no exec of definition text); "
            "use a code action naming a function",
            field=f"{where}.call",
        )
    if isinstance(action, CrewAction) and action.from_declaration is not None:
        raise InvalidDefinition(
            f"{where}.from_declaration: give the crew inline under with",
            field=f"{where}.from_declaration",
        )
    if isinstance(action, EachAction):
        if nested:
            raise InvalidDefinition(f"{where}: an each cannot hold an each", field=where)
        for i, step in enumerate(action.do):
            _check_supported(step.action, f"{where}.do[{i}].action", nested=True)


def _condition(value: Any, where: str) -> Cond:
    return condition_of(value, where)


def _method(flow: str, name: str, method: FlowMethodDefinition) -> Any:
    where = f"methods.{name}"
    action = method.do

    def step(self: Flow[Any], trigger_output: Any = None) -> Any:
        context = {**context_of(self), "trigger": trigger_output}
        return run_action(self, action, context, f"{where}.do")

    step.__name__ = name
    step.__qualname__ = f"{flow}.{name}"
    step.__doc__ = method.description
    setattr(step, ACTION_ATTR, action)
    fn: Any = step
    review = method.human_feedback
    reviewed_router = review is not None and bool(review.emit)
    if review is not None:
        fn = human_feedback(
            message=review.message,
            emit=review.emit,
            llm=review.llm,
            default_outcome=review.default_outcome,
            metadata=review.metadata,
            provider=None if review.provider is None else ProviderRef(review.provider, where),
        )(fn)
    trigger = None if method.listen is None else _condition(method.listen, f"{where}.listen")
    routes = method.router and not reviewed_router
    if method.is_start:
        if isinstance(method.start, str | dict):
            fn = start(_condition(method.start, f"{where}.start"))(fn)
        else:
            fn = start()(fn)
        if trigger is not None:
            fn = listen(trigger)(fn)
        if routes:
            fn = router(emit=method.emit)(fn)
    elif routes:
        if trigger is None:
            raise InvalidDefinition(f"{where}.listen: a router needs a trigger", field=where)
        fn = router(trigger, emit=method.emit)(fn)
    elif trigger is not None:
        fn = listen(trigger)(fn)
    else:
        raise InvalidDefinition(
            f"{where}: a method needs start or listen (it would never run)", field=where
        )
    return fn


class ProviderRef:
    """A review's ``provider`` given by reference (``module:Class`` or an object's
    ``module:name``): resolved, and a class instantiated, where the review runs (in that
    process or on that worker), so a definition never imports it just to be loaded."""

    def __init__(self, ref: str, where: str) -> None:
        self.ref = ref
        self.where = f"{where}.human_feedback.provider"
        self._provider: Any = None

    def provider(self) -> Any:
        """The provider the reference names (made once)."""
        if self._provider is None:
            try:
                target = resolve_ref(self.ref, self.where)
            except DefinitionError as exc:
                raise InvalidDefinition(
                    f"{self.where}: unresolvable human_feedback.provider ref {self.ref!r} ({exc})",
                    field=self.where,
                ) from None
            if isinstance(target, type):
                try:
                    target = target()
                except TypeError as exc:
                    raise InvalidDefinition(
                        f"{self.where}: cannot instantiate human_feedback.provider ref "
                        f"{self.ref!r} without arguments ({exc})",
                        field=self.where,
                    ) from None
            self._provider = target
        return self._provider

    def request_feedback(self, context: Any, flow: Any) -> Any:
        """Ask the provider the reference names."""
        return self.provider().request_feedback(context, flow)


def _initial_state(definition: FlowDefinition) -> Any:
    state = definition.state
    if state is None:
        return None
    default = dict(state.default or {})
    if isinstance(state, PydanticState) and state.ref:
        try:
            model = resolve_ref(state.ref, "state.ref")
        except DefinitionError:
            model = None
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model(**default) if default else model
        if state.json_schema is not None:
            return _with_defaults(model_of_schema(state.json_schema, definition.name), default)
        log.error(
            "%s: state.ref %r cannot be imported here and has no json_schema: falling back "
            "to dict state",
            definition.name,
            state.ref,
        )
        return default
    if isinstance(state, JsonSchemaState):
        return _with_defaults(model_of_schema(state.json_schema, definition.name), default)
    if isinstance(state, UnknownState):
        log.warning(
            "%s: state of unknown type %r: falling back to dict state", definition.name, state.ref
        )
    return default


def _with_defaults(model: type[BaseModel], default: dict[str, Any]) -> Any:
    return model.model_validate(default) if default else model


_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list[Any],
    "object": dict[str, Any],
}


def model_of_schema(schema: dict[str, Any], flow: str) -> type[BaseModel]:
    """A state model (a :class:`FlowState`, so it has an ``id``) with a field per property
    of a JSON schema: its JSON type and default; a required property without a default must
    come with the inputs, and one without a default is ``None`` until set. Values
    are validated as a pydantic model validates them (``"x"`` is no integer)."""
    fields: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        json_type = prop.get("type")
        kind = _JSON_TYPES.get(json_type, Any) if isinstance(json_type, str) else Any
        # Without a default a property is None until set (a required one by the inputs).
        fields[name] = (kind, prop["default"]) if "default" in prop else (kind | None, None)
    title = schema.get("title")
    name = title if isinstance(title, str) and title.isidentifier() else f"{flow}State"
    return create_model(name, __base__=FlowState, **fields)


def _schema_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties") or {}
    return {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}


# --- running an action ----------------------------------------------------------------------


def context_of(flow: Flow[Any]) -> dict[str, Any]:
    """What the expressions of a step read: the step's ``state`` and the run's ``outputs``
    (an ``each`` child's parent's outputs under its own)."""
    state = dump_state(flow.state, strict=False)
    outputs = dict(state.get(EACH_OUTPUTS) or {}) if isinstance(state, dict) else {}
    ctx = step_context()
    outputs.update((ctx.outputs if ctx is not None else None) or {})
    return {"state": state, "outputs": outputs}


def _json(value: Any) -> Any:
    return to_jsonable_python(value, fallback=str)


def run_action(flow: Flow[Any], action: Any, context: dict[str, Any], where: str) -> Any:
    """What ``action`` gives over ``context`` (``state``, ``outputs``, in an each ``item``)."""
    if isinstance(action, ExpressionAction):
        return cel.evaluate(action.expr, context, f"{where}.expr")
    if isinstance(action, CodeAction):
        fn = resolve_ref(action.ref, f"{where}.ref")
        if getattr(fn, REVIEW_ATTR, None) is not None:
            fn = getattr(fn, "__wrapped__", fn)  # the method's body: the definition reviews
        kwargs = cel.render(action.with_ or {}, context, f"{where}.with")
        if _takes_self(fn) or _takes_flow(fn, kwargs):
            # A flow class's method, or a function whose first parameter ``with`` does not
            # give (CrewAI binds every function to the flow): called on this flow, given its
            # trigger's output if it takes one (as the class flow would be).
            if _wants_trigger(fn, kwargs):
                return fn(flow, context.get("trigger"), **kwargs)
            return fn(flow, **kwargs)
        return fn(**kwargs)
    if isinstance(action, ToolAction):
        tool = tool_of(action.ref, f"{where}.ref")
        kwargs = cel.render(action.with_ or {}, context, f"{where}.with")
        # The step's output is the tool's result as JSON (a model as its fields).
        return _json(tool.run(**kwargs))
    if isinstance(action, CrewAction):
        assert action.with_ is not None  # _check_supported refused from_declaration
        inputs = {**action.with_.inputs, **cel.render(action.inputs or {}, context, where)}
        # The crew's and the agent's async entry points, as CrewAI's runtime awaits them (a
        # test that mocks ``kickoff_async`` runs no LLM); they run the sync kickoff.
        return awaited(crew_of(action.with_).kickoff_async(inputs=inputs))
    if isinstance(action, AgentAction):
        spec = action.with_
        text = cel.render(spec.input, context, f"{where}.with.input")
        if not isinstance(text, str):
            raise InvalidDefinition(
                f"{where}.with.input: agent input must render to a string, not "
                f"{type(text).__name__}",
                field=f"{where}.with.input",
            )
        agent = Agent(spec.role or "Agent", spec.goal or "", spec.backstory or "", spec.llm_name())
        return awaited(agent.kickoff_async(text))
    if isinstance(action, EachAction):
        return run_each(flow, action, context, where)
    raise DefinitionError(f"{where}: {type(action).__name__} is not run here", field=where)


def tool_of(ref: str, where: str) -> Any:
    """The tool a ``tool`` action names: a class (a :class:`~runner.crew.tools.BaseTool`
    subclass, or CrewAI's) made without arguments, or a tool object (``@tool``'s); resolved
    as code references are, so on a worker only in its allow-list."""
    target = resolve_ref(ref, where)
    if isinstance(target, type):
        try:
            target = target()
        except Exception as exc:
            line = " ".join(str(exc).split())[:200]
            raise InvalidDefinition(
                f"{where}: cannot instantiate tool ref {ref!r} without arguments: {line}",
                field=where,
            ) from None
    if not callable(getattr(target, "run", None)):
        raise InvalidDefinition(
            f"{where}: {ref} is not a tool (a BaseTool subclass, or an object with run())",
            field=where,
        )
    return target


def crew_of(spec: CrewDefinition) -> Crew:
    """Our :class:`Crew` of an inline crew definition: its agents with their LLMs by name."""
    agents = {
        name: Agent(a.role or name, a.goal or "", a.backstory or "", a.llm_name())
        for name, a in spec.agents.items()
    }
    tasks: list[Task] = []
    by_name: dict[str, Task] = {}
    for i, t in enumerate(spec.tasks):
        if t.agent is not None and t.agent not in agents:
            raise DefinitionError(f"tasks[{i}].agent: no agent named {t.agent!r}")
        context = [by_name[c] for c in t.context or () if c in by_name] or None
        task = Task(
            description=t.description,
            expected_output=t.expected_output,
            agent=agents.get(t.agent) if t.agent else next(iter(agents.values()), None),
            context=context,
            name=t.name,
        )
        tasks.append(task)
        by_name[task.name] = task
    return Crew(agents=list(agents.values()), tasks=tasks, name=spec.name or "crew")


def run_each(flow: Flow[Any], action: EachAction, context: dict[str, Any], where: str) -> Any:
    """The outputs of ``action``'s pipeline for each item, in order; on a worker a
    :class:`ChildRun` of one parallel step per item and a join."""
    items = cel.evaluate(action.in_, context, f"{where}.in")
    if not isinstance(items, list):
        raise InvalidDefinition(
            f"{where}.in: each.in must evaluate to an array (a list), not {type(items).__name__}",
            field=where,
        )
    # Inside an each child (its state holds the items) the one item runs here.
    if on_worker() and items and EACH_ITEMS not in context["state"]:
        child = _each_child(flow, action, len(items))
        state = {k: v for k, v in context["state"].items() if k not in ("id", EACH_ITEMS)}
        inputs = {**state, EACH_ITEMS: items, EACH_OUTPUTS: context["outputs"]}
        return ChildRun(flow=child.flow_path(), name=child.flow_name(), inputs=inputs)
    return [pipeline(flow, action.do, item, context, where) for item in items]


def pipeline(
    flow: Flow[Any], steps: list[EachStep], item: Any, context: dict[str, Any], where: str
) -> Any:
    """Run ``steps`` for one ``item``; the last output (a skipped step keeps the one before)."""
    local: dict[str, Any] = {}
    last: Any = None
    for i, step in enumerate(steps):
        here = {**context, "item": item, "outputs": {**context["outputs"], **local}}
        if step.if_ is not None:
            ok = cel.evaluate(step.if_, here, f"{where}.do[{i}].if")
            if not isinstance(ok, bool):
                raise InvalidDefinition(
                    f"{where}.do[{i}].if: if expression must evaluate to a boolean, not {ok!r}",
                    field=f"{where}.do[{i}].if",
                )
            if not ok:
                continue
        last = local[step.name] = _json(
            run_action(flow, step.action, here, f"{where}.do[{i}].action")
        )
    return last


def _each_child(flow: Flow[Any], action: EachAction, count: int) -> type[Flow[Any]]:
    """The child flow of an ``each`` over ``count`` items: a start per item (the pipeline
    over that one item) and ``collect``, the join, giving their outputs in order."""
    steps = [s.model_dump(by_alias=True, exclude_none=True) for s in action.do]
    methods: dict[str, Any] = {
        f"item_{i}": {
            "start": True,
            "do": {"call": "each", "in": f"[state.{EACH_ITEMS}[{i}]]", "do": steps},
        }
        for i in range(count)
    }
    methods["collect"] = {
        "listen": {"and": [f"item_{i}" for i in range(count)]},
        "do": {
            "call": "expression",
            "expr": "[" + ", ".join(f"outputs.item_{i}[0]" for i in range(count)) + "]",
        },
    }
    parent = type(flow).flow_definition().name
    return declared_flow({"name": f"{parent}_each", "state": {"type": "dict"}, "methods": methods})


# --- code references ------------------------------------------------------------------------


def resolve_ref(ref: str, where: str) -> Any:
    """The object ``module:qualname`` names. In a worker's declared step
    (:func:`~runner.flow.definition.allowed_refs` set) only in a module of its allow-list
    (:class:`FlowNotAllowed` otherwise, nothing imported)."""
    module_name, _, qualname = ref.partition(":")
    allowed = allowed_refs()
    if allowed is not None and not _allowed(module_name, allowed):
        raise FlowNotAllowed(
            f"{where}: {ref} is not in this worker's allow-list (RUNNER_FLOW_MODULES)",
            path=ref,
        )
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise DefinitionError(f"{where}: cannot resolve {ref}: {exc}", field=where) from None
    if "<locals>" in qualname:
        raise DefinitionError(f"{where}: {ref} is local to a function", field=where)
    return target


def _allowed(module: str, modules: tuple[str, ...]) -> bool:
    return module in modules


def _wants_trigger(fn: Any, kwargs: dict[str, Any]) -> bool:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(inspect.signature(fn).parameters.values())[1:]
    return any(
        p.kind in kinds and p.name not in kwargs and p.default is inspect.Parameter.empty
        for p in params
    ) or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)


def _takes_flow(fn: Any, kwargs: dict[str, Any]) -> bool:
    if not inspect.isfunction(fn):
        return False  # a callable object or a bound method is called as it is
    params = list(inspect.signature(fn).parameters.values())
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return bool(params) and params[0].kind in kinds and params[0].name not in kwargs


def _takes_self(fn: Any) -> bool:
    if not inspect.isfunction(fn) or "." not in fn.__qualname__:
        return False
    params = list(inspect.signature(fn).parameters)
    return bool(params) and params[0] == "self"
