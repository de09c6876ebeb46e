"""Flow definitions: the serializable shape of a flow (CrewAI's ``schema: crewai.flow/v1``).

A :class:`FlowDefinition` says what a flow is without its code: its state (a dict with
defaults, a pydantic model by reference with its JSON schema, or an inline JSON schema), its
configuration, and its methods -- each with its role (``start``, ``listen`` condition,
``router`` with the labels it may ``emit``) and what it does (``do``: a code reference, a
crew, an agent, a CEL expression, or an ``each`` over a list).

It is the one description of a flow's shape: :func:`runner.flow.graph.compile_graph` makes
the methods part of it for every class (``FlowGraph.definition``), the graph's fingerprint is
a hash of that shape (:func:`fingerprint`), its Mermaid picture is drawn from it
(:func:`mermaid`), and ``Flow.flow_definition()`` completes it with the state and config.
A declarative flow (:mod:`runner.flow.declared`) goes the other way: from a definition to a
flow class whose graph gives back the same shape.

Conditions are CrewAI's: a trigger name, or ``{"or": [...]}`` / ``{"and": [...]}`` trees.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from runner.errors import DefinitionError
from runner.flow.conditions import And, Cond, Or, normalize

SCHEMA = "crewai.flow/v1"
"""The schema identifier a definition carries (CrewAI's)."""

ACTION_ATTR = "__runner_action__"
"""Where a method made from a declaration keeps its declared action (its ``do``)."""

Condition: TypeAlias = str | dict[str, Any]
"""A trigger as a definition writes it: a name, or ``{"or"|"and": [conditions]}``."""

Data: TypeAlias = Any
"""JSON data whose strings may hold ``${...}`` templates."""


class InvalidDefinition(DefinitionError, ValueError):
    """A definition that cannot be loaded or run here: one line naming the bad field's path
    (a ``ValueError`` too, as CrewAI raises)."""


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- state and config ------------------------------------------------------------------------


class DictState(BaseModel):
    """A plain dict state, with its default values."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["dict"] = "dict"
    default: dict[str, Any] | None = None


class PydanticState(BaseModel):
    """A pydantic model state: its import reference (``module:qualname``) and, for a
    process that cannot import it, its JSON schema."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["pydantic"] = "pydantic"
    ref: str | None = None
    json_schema: dict[str, Any] | None = None
    default: dict[str, Any] | None = None


class JsonSchemaState(BaseModel):
    """A state described by an inline JSON schema (defaults from its properties)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"] = "json_schema"
    json_schema: dict[str, Any]
    default: dict[str, Any] | None = None


class UnknownState(BaseModel):
    """A state type with no serializable description; runs as a dict."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["unknown"] = "unknown"
    ref: str | None = None
    default: dict[str, Any] | None = None


StateDefinition: TypeAlias = Annotated[
    DictState | PydanticState | JsonSchemaState | UnknownState, Field(discriminator="type")
]


class FlowConfigDefinition(BaseModel):
    """Flow-level configuration (CrewAI's fields; those the runner has no use for are kept
    and ignored)."""

    tracing: bool | None = None
    stream: bool = False
    memory: dict[str, Any] | None = None
    input_provider: str | None = None
    suppress_flow_events: bool = False
    max_method_calls: int = 100
    defer_trace_finalization: bool = False
    checkpoint: bool | dict[str, Any] | None = None


class PersistenceDefinition(BaseModel):
    """``@persist`` on the flow or a method."""

    enabled: bool = False
    verbose: bool = False
    persistence: Any = None


class HumanFeedbackDefinition(BaseModel):
    """``@human_feedback`` on a method: ``llm`` is the name (or a client's reference)."""

    message: str
    emit: list[str] | None = None
    llm: Any = None
    default_outcome: str | None = None
    metadata: dict[str, Any] | None = None
    provider: str | None = None
    learn: bool = False
    learn_source: str = "hitl"
    learn_strict: bool = False


# --- actions --------------------------------------------------------------------------------


class _Action(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class CodeAction(_Action):
    """Call an importable function (``module:qualname``), keyword arguments from ``with``.
    A declared flow resolves it only in a module the workers may import."""

    call: Literal["code"] = "code"
    ref: str
    with_: dict[str, Data] | None = Field(default=None, alias="with")


class ToolAction(_Action):
    """Call a tool (``module:qualname`` of a ``BaseTool`` class, made without arguments):
    its ``run`` with ``with`` (templates) as keyword arguments; the result is the output.
    A declared flow resolves it only in a module the workers may import."""

    call: Literal["tool"]
    ref: str
    with_: dict[str, Data] | None = Field(default=None, alias="with")


class AgentDefinition(BaseModel):
    """An agent: role, goal, backstory and its LLM by name (``llm`` or ``settings.llm``)."""

    model_config = ConfigDict(extra="allow")
    role: str | None = None
    goal: str | None = None
    backstory: str | None = None
    llm: str | dict[str, Any] | None = None
    settings: dict[str, Any] = Field(default_factory=dict)

    def llm_name(self) -> str | None:
        """The model it names: ``llm`` (a name or ``{"model": name}``), else ``settings.llm``."""
        value = self.llm if self.llm is not None else self.settings.get("llm")
        if isinstance(value, dict):
            value = value.get("model")
        return value if isinstance(value, str) and value else None


class AgentActionDefinition(AgentDefinition):
    """The agent of an ``agent`` action, with the ``input`` it is given (a template)."""

    input: str

    @field_validator("input", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        # CrewAI's wording: an agent is given text (a template may make it from data).
        if not isinstance(value, str):
            raise ValueError(f"agent.input must be a string, not {type(value).__name__}")
        return value


class TaskDefinition(BaseModel):
    """One task of a crew."""

    model_config = ConfigDict(extra="allow")
    description: str
    expected_output: str
    name: str | None = None
    agent: str | None = None
    context: list[str] | None = None


class CrewDefinition(BaseModel):
    """A crew: agents by name and tasks in order (CrewAI's crew declaration)."""

    model_config = ConfigDict(extra="allow")
    name: str | None = None
    agents: dict[str, AgentDefinition] = Field(default_factory=dict)
    tasks: list[TaskDefinition]
    inputs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("inputs", mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(f"crew.inputs must be a mapping, not {type(value).__name__}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _named_agent_list(cls, data: Any) -> Any:
        # A list of agents with a ``name`` each is the same as a mapping by name.
        if isinstance(data, dict) and isinstance(data.get("agents"), list):
            agents = {}
            for agent in data["agents"]:
                if not isinstance(agent, dict) or not isinstance(agent.get("name"), str):
                    raise ValueError("a list of agents needs a name on each")
                agents[agent["name"]] = {k: v for k, v in agent.items() if k != "name"}
            data = {**data, "agents": agents}
        return data


class CrewAction(_Action):
    """Run a crew (inline in ``with``) with ``inputs`` (templates)."""

    call: Literal["crew"]
    from_declaration: str | None = None
    with_: CrewDefinition | None = Field(default=None, alias="with")
    inputs: dict[str, Data] | None = None

    @field_validator("inputs", mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f"crew.inputs must be a mapping, not {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> CrewAction:
        if (self.from_declaration is None) == (self.with_ is None):
            raise ValueError("crew action requires exactly one of from_declaration or with")
        return self


class AgentAction(_Action):
    """Run one agent outside a crew on its ``with.input``."""

    call: Literal["agent"]
    with_: AgentActionDefinition = Field(alias="with")


class ExpressionAction(_Action):
    """Evaluate a CEL expression over ``state`` and ``outputs``."""

    call: Literal["expression"]
    expr: str


class ScriptAction(_Action):
    """CrewAI's inline Python (kept in the shape; a declared flow here refuses it: no exec)."""

    call: Literal["script"]
    code: str
    language: Literal["python"] = "python"


AtomicAction: TypeAlias = Annotated[
    CodeAction | ToolAction | CrewAction | AgentAction | ExpressionAction | ScriptAction,
    Field(discriminator="call"),
]


class EachStep(BaseModel):
    """One named step of an ``each`` pipeline, run if ``if`` (CEL) holds."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    name: str
    if_: str | None = Field(default=None, alias="if")
    action: AtomicAction

    @model_validator(mode="after")
    def _valid_name(self) -> EachStep:
        check_name(self.name, "each.do step names")
        return self


class EachAction(_Action):
    """For every item of the list ``in`` (CEL) evaluates to, run ``do`` in order; the
    method's output is the list of each item's last output. On workers each item is a step
    of its own (see :mod:`runner.flow.declared`)."""

    call: Literal["each"]
    in_: str = Field(alias="in")
    do: list[EachStep]

    @model_validator(mode="after")
    def _steps(self) -> EachAction:
        if not self.do:
            raise ValueError("each.do must contain at least one step")
        names = [s.name for s in self.do]
        if len(set(names)) != len(names):
            raise ValueError(f"each.do step names must be unique: {names}")
        return self


Action: TypeAlias = Annotated[
    CodeAction
    | ToolAction
    | CrewAction
    | AgentAction
    | ExpressionAction
    | ScriptAction
    | EachAction,
    Field(discriminator="call"),
]


def _default_call(data: Any) -> Any:
    # ``do: {ref: ...}`` is a code action (CrewAI's default discriminator value).
    if isinstance(data, dict) and "call" not in data and "ref" in data:
        return {**data, "call": "code"}
    return data


# --- methods and the flow -------------------------------------------------------------------


class FlowMethodDefinition(BaseModel):
    """One method: what it does and when it runs."""

    model_config = ConfigDict(populate_by_name=True)
    description: str | None = None
    do: Action
    start: bool | Condition | None = None
    listen: Condition | None = None
    router: bool = False
    emit: list[str] | None = None
    human_feedback: HumanFeedbackDefinition | None = None
    persist: PersistenceDefinition | None = None

    @model_validator(mode="before")
    @classmethod
    def _code_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "do" in data:
            return {**data, "do": _default_call(data["do"])}
        return data

    @model_validator(mode="after")
    def _feedback_routes(self) -> FlowMethodDefinition:
        if self.human_feedback is not None and self.human_feedback.emit:
            self.router = True
            self.emit = None
        return self

    @property
    def is_start(self) -> bool:
        """A start method (``start: false`` or an empty value is not one)."""
        return bool(self.start)

    def labels(self) -> list[str] | None:
        """The labels a router may return (its ``emit``, or its review's); ``None``: unknown."""
        if self.human_feedback is not None and self.human_feedback.emit:
            return list(self.human_feedback.emit)
        return self.emit


_LLM_FORMS = "A model name or a settings mapping with a `model` key, resolved where it runs."


class FlowConversationalRouterDefinition(BaseModel):
    """The LLM router of a conversational block (CrewAI's; the runtime shape is
    ``runner.flow.conversation.RouterConfig``)."""

    # A key it does not know is kept so that config_from_block refuses it in one line naming
    # its path (conversational.router.<key>), as it does every other bad value of the block.
    model_config = ConfigDict(extra="allow")

    prompt: str | None = Field(
        default=None, description="The router's own instructions, before the route list."
    )
    response_format: Any = Field(
        default=None,
        description="Ignored in a definition (no model class is data); Python flows set it.",
    )
    llm: Any = Field(
        default=None,
        description=f"The router's model (else `intent_llm`, else `llm`). {_LLM_FORMS}",
    )
    routes: list[str] | None = Field(
        default=None,
        description="The routes it may pick besides the built-in ones (default: the labels "
        "the flow's listeners wait for).",
    )
    route_descriptions: dict[str, str] | None = Field(
        default=None,
        description="What each route is for, as the router reads it (default: the handler's "
        "description).",
    )
    default_intent: str | None = Field(
        default="converse", description="The route taken when no router model is set."
    )
    fallback_intent: str | None = Field(
        default="converse",
        description="The route taken when the router fails or names no known route.",
    )
    intent_field: str = Field(
        default="intent", description="The field of the router's answer that names the route."
    )


class FlowConversationalDefinition(BaseModel):
    """A flow's conversational block (CrewAI's): declaring it is the opt-in (``enabled``
    defaults to true)."""

    model_config = ConfigDict(extra="allow")  # see FlowConversationalRouterDefinition

    enabled: bool = Field(
        default=True,
        description="Chat on; declaring the block opts in, `false` keeps it with chat off.",
    )
    system_prompt: str | None = Field(
        default=None,
        description="The `converse` route's system prompt (unset: a default one; `''`: none).",
    )
    llm: Any = Field(
        default=None, description=f"The model of the built-in `converse` route. {_LLM_FORMS}"
    )
    router: FlowConversationalRouterDefinition | None = Field(
        default=None,
        description="The LLM router, see [Conversational Router (`conversational.router`)]"
        "(#conversational-router-conversationalrouter); without one, a flow with routes of "
        "its own gets a default router.",
    )
    answer_from_history_prompt: str | None = Field(
        default=None, description="How to decide and answer from the history alone."
    )
    default_intents: list[str] | None = Field(
        default=None, description="Intents each message is classified into (with `intent_llm`)."
    )
    intent_llm: Any = Field(default=None, description=f"The intent classifier. {_LLM_FORMS}")
    answer_from_history_llm: Any = Field(
        default=None,
        description=f"Enables the `answer_from_history` route. {_LLM_FORMS}",
    )
    visible_agent_outputs: list[str] | Literal["all"] | None = Field(
        default=None, description="Agents whose recorded results the user sees (or `all`)."
    )
    defer_trace_finalization: bool = Field(
        default=True, description="CrewAI's session-long trace; kept, each turn's events are final."
    )
    builtin_routes: list[str] = Field(
        default_factory=lambda: ["converse", "end"],
        description="The built-in routes (only these here).",
    )
    internal_routes: list[str] = Field(
        default_factory=lambda: ["answer_from_history"],
        description="The internal routes (only these here).",
    )


class FlowDefinition(BaseModel):
    """A flow as data (CrewAI's ``FlowDefinition``)."""

    model_config = ConfigDict(populate_by_name=True)
    _source_path: Path | None = PrivateAttr(default=None)

    schema_: Literal["crewai.flow/v1"] = Field(default="crewai.flow/v1", alias="schema")
    name: str
    description: str | None = None
    state: StateDefinition | None = None
    config: FlowConfigDefinition = Field(default_factory=FlowConfigDefinition)
    persist: PersistenceDefinition | None = None
    conversational: FlowConversationalDefinition | None = None
    """CrewAI's conversational block: declaring it makes the flow conversational
    (``runner.flow.conversation.config_from_block`` reads it; ``enabled: false`` keeps it
    without chat); a conversational class's definition gives its config here
    (``Flow.flow_definition``)."""
    methods: dict[str, FlowMethodDefinition] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _methods(self) -> FlowDefinition:
        for name, method in self.methods.items():
            check_name(name, "Flow method names")
            if method.listen is not None and name in condition_leaves(method.listen):
                raise ValueError(
                    f"methods.{name}.listen: the listen condition {method.listen!r} names the "
                    "method itself: a listener triggered by its own completion loops for ever"
                )
        # Inside validation, so a bad template is pydantic's ValidationError (as CrewAI's
        # is), its message starting with the field's path.
        check_expressions(self)
        return self

    @property
    def source_path(self) -> Path | None:
        """The file it was loaded from, if any."""
        return self._source_path

    def to_dict(self, *, exclude_none: bool = True) -> dict[str, Any]:
        """The declaration as JSON data (``schema`` first, aliases as written)."""
        return self.model_dump(by_alias=True, exclude_none=exclude_none, mode="json")

    def to_json(self, *, indent: int | None = 2) -> str:
        """The declaration as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_yaml(self) -> str:
        """The declaration as YAML text."""
        import yaml

        return str(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_declaration(
        cls,
        contents: FlowDefinition | str | Mapping[str, Any] | None = None,
        *,
        path: Path | str | None = None,
    ) -> FlowDefinition:
        """A definition from ``contents`` (a definition, a mapping, YAML or JSON text) or the
        YAML/JSON file at ``path``. Bad input is a :class:`DefinitionError` whose message is
        one line naming the bad field's path (``methods.fan.do.in: ...``) when it is no
        definition at all (an empty file, no mapping), and pydantic's ``ValidationError``
        when it does not validate (its first error names the field's path;
        :func:`invalid_definition` makes it one line)."""
        if isinstance(contents, cls):
            return contents
        source: Path | None = None
        if contents is None:
            if path is None:
                raise ValueError("Provide contents or path")
            source = Path(path).expanduser()
            try:
                contents = source.read_text(encoding="utf-8")
            except OSError as exc:
                raise InvalidDefinition(f"cannot read {source}: {exc.strerror}") from None
        data: Any = contents
        if isinstance(contents, str):
            if not contents.strip():
                where = f" file is empty: {source}" if source else " contents are empty"
                raise InvalidDefinition(f"Flow declaration{where}")
            import yaml

            try:
                data = yaml.safe_load(contents)
            except yaml.YAMLError as exc:
                raise InvalidDefinition(f"not YAML or JSON: {' '.join(str(exc).split())}") from None
        if not isinstance(data, Mapping):
            raise InvalidDefinition("Flow declaration must contain a mapping")
        # A definition that does not validate is pydantic's ValidationError (CrewAI's
        # contract: ``except ValidationError``); the CLI prints it as one line
        # (:func:`invalid_definition`).
        definition = cls.model_validate(dict(data))
        if source is not None:
            definition._source_path = source.resolve()
        return definition

    @classmethod
    def skill(cls, skips: list[str] | None = None, examples_format: str = "yaml") -> str:
        """A Markdown guide to writing a definition (CrewAI's): the flow's and a method's
        fields, the actions, templates; ``skips`` leaves sections out, examples in
        ``examples_format`` (``yaml`` or ``json``). See :mod:`runner.flow.skill`."""
        from runner.flow.skill import skill

        return skill(cls, FlowMethodDefinition, skips, examples_format)

    def shape(self) -> list[dict[str, Any]]:
        """What the fingerprint hashes: each method's name, roles, canonical trigger and
        labels, sorted by name (not its action, description or options)."""
        found = []
        for name in sorted(self.methods):
            m = self.methods[name]
            start = m.start if isinstance(m.start, str | dict) else bool(m.start)
            labels = m.labels()
            found.append(
                {
                    "name": name,
                    "start": canonical(start) if not isinstance(start, bool) else start,
                    "listen": None if m.listen is None else canonical(m.listen),
                    "router": m.router,
                    "emit": None if labels is None else sorted(labels),
                }
            )
        return found


# --- checks a definition passes when it is loaded -------------------------------------------

BASE_ROOTS = frozenset({"state", "outputs"})
"""What a method's expressions and templates may read."""
EACH_ROOTS = BASE_ROOTS | {"item"}
"""What the steps of an ``each`` may read besides: the item."""

_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_expressions(definition: FlowDefinition) -> None:
    """Refuse (a :class:`DefinitionError` naming the field's path) a CEL expression or
    ``${...}`` template that does not parse or reads a root it may not."""
    for name, method in definition.methods.items():
        check_action(method.do, f"methods.{name}.do", BASE_ROOTS)


def check_ref(action: Any, where: str) -> None:
    """Refuse (naming ``where``) a code or tool reference not of the form
    ``module:qualname``. Checked when a flow is made of the definition, not when it is
    loaded (CrewAI's order: a definition is data until it is run)."""
    if isinstance(action, CodeAction | ToolAction) and not _REF.fullmatch(action.ref):
        raise InvalidDefinition(
            f"{where}.ref: expected 'module:qualname', got {action.ref!r}", field=f"{where}.ref"
        )


def invalid_definition(exc: ValidationError) -> InvalidDefinition:
    """A definition's ``ValidationError`` as one line naming the first bad field's path (what
    the CLI and API show)."""
    return InvalidDefinition(validation_line(exc), field=first_path(exc) or None)


def check_action(action: Any, where: str, allowed: frozenset[str]) -> None:
    """:func:`check_expressions` of one action at ``where``."""
    from runner.flow import expressions as cel

    if isinstance(action, CodeAction | ToolAction):
        if action.with_ is not None:
            cel.validate_template(action.with_, allowed, f"{where}.with")
    elif isinstance(action, ExpressionAction):
        cel.validate_expression(action.expr, allowed, f"{where}.expr")
    elif isinstance(action, CrewAction):
        if action.inputs is not None:
            cel.validate_template(action.inputs, allowed, f"{where}.inputs")
    elif isinstance(action, AgentAction):
        cel.validate_template(action.with_.input, allowed, f"{where}.with.input")
    elif isinstance(action, EachAction):
        cel.validate_expression(action.in_, BASE_ROOTS, f"{where}.in")
        for i, step in enumerate(action.do):
            if step.if_ is not None:
                cel.validate_expression(step.if_, EACH_ROOTS, f"{where}.do[{i}].if")
            check_action(step.action, f"{where}.do[{i}].action", EACH_ROOTS)


def refs(definition: FlowDefinition) -> list[tuple[str, str]]:
    """Every ``(path of the field, code reference)`` of the definition: what a worker must
    be allowed to import to run it."""
    found: list[tuple[str, str]] = []

    def visit(action: Any, where: str) -> None:
        if isinstance(action, CodeAction | ToolAction):
            found.append((f"{where}.ref", action.ref))
        elif isinstance(action, EachAction):
            for i, step in enumerate(action.do):
                visit(step.action, f"{where}.do[{i}].action")

    for name, method in definition.methods.items():
        visit(method.do, f"methods.{name}.do")
    if isinstance(definition.state, PydanticState) and definition.state.ref:
        found.append(("state.ref", definition.state.ref))
    return found


DECLARED_MODULE = "runner.crew.declared"
"""The module whose attributes are the flow classes made from declarations (a declared
flow's import path is ``runner.crew.declared:D_<its definition, compressed>``): any process
that has the path has the flow."""

_allowed_refs: ContextVar[tuple[str, ...] | None] = ContextVar("runner_allowed_refs", default=None)
"""The modules a declared flow's code references may resolve in while a worker runs its
step (the worker's allow-list, ``RUNNER_FLOW_MODULES``); ``None``: anywhere (in process).
A context variable, not a process-wide list, so a worker installed in a process (a test's,
an embedding program's) does not restrict the flows that process runs itself."""


@contextmanager
def refs_allowed_in(modules: list[str]) -> Iterator[None]:
    """Within: code references resolve only in ``modules`` (a worker's declared step)."""
    token = _allowed_refs.set(tuple(modules))
    try:
        yield
    finally:
        _allowed_refs.reset(token)


def allowed_refs() -> tuple[str, ...] | None:
    """The modules code references may resolve in here (``None``: anywhere)."""
    return _allowed_refs.get()


def is_declared(path: str | None) -> bool:
    """Whether a flow path names a flow made from a declaration."""
    return bool(path) and str(path).partition(":")[0] == DECLARED_MODULE


# --- helpers --------------------------------------------------------------------------------


def check_name(name: str, what: str) -> None:
    """``ValueError`` unless ``name`` is an identifier (a step's name)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{what} must match {_NAME.pattern}: {name!r}")


def first_path(exc: ValidationError) -> str:
    """The dotted path of the first error's field (``methods.fan.do.in``)."""
    errors = exc.errors()
    if not errors:
        return ""
    parts: list[str] = []
    for part in errors[0]["loc"]:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part in _TAGS or part.startswith("function-"):
            continue  # pydantic's union branch names are not fields
        else:
            parts.append(("." if parts else "") + part)
    return "".join(parts)


_TAGS = frozenset(
    {"code", "tool", "crew", "agent", "expression", "script", "each"}
    | {"dict", "pydantic", "json_schema", "unknown", "str", "bool"}
)


def validation_line(exc: ValidationError) -> str:
    """A pydantic error as one line: the first bad field's path and what is wrong there."""
    errors = exc.errors()
    if not errors:
        return " ".join(str(exc).split())
    msg = str(errors[0]["msg"]).removeprefix("Value error, ")
    where = first_path(exc)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    text = f"{where}: {msg}{more}" if where else f"{msg}{more}"
    return " ".join(text.split())


def condition_json(cond: Cond) -> Condition:
    """A trigger condition as a definition writes it (children in the order given)."""
    if isinstance(cond, str):
        return cond
    key = "or" if isinstance(cond, Or) else "and"
    return {key: [condition_json(c) for c in cond.children]}


def condition_of(value: Condition, where: str) -> Cond:
    """A definition's condition as a trigger condition; :class:`DefinitionError` naming
    ``where`` if it is neither a name nor an ``or``/``and`` tree."""
    if isinstance(value, str) and value:
        return normalize(value)
    if isinstance(value, dict) and len(value) == 1:
        key, children = next(iter(value.items()))
        if key in ("or", "and") and isinstance(children, list) and children:
            parsed = tuple(condition_of(c, f"{where}.{key}[{i}]") for i, c in enumerate(children))
            return Or(parsed) if key == "or" else And(parsed)
    raise InvalidDefinition(
        f"{where}: a condition is a name or {{or: [...]}} / {{and: [...]}}, not {value!r}",
        field=where,
    )


def condition_leaves(value: Condition) -> set[str]:
    """Every name a definition's condition mentions (nothing for a malformed one)."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return {
            leaf
            for key in ("or", "and")
            for child in value.get(key) or []
            for leaf in condition_leaves(child)
        }
    return set()


def canonical(value: Condition) -> Condition:
    """A condition with every ``or``/``and`` children sorted (``or_(a, b)`` is ``or_(b, a)``)."""
    if isinstance(value, dict):
        return {
            key: sorted((canonical(c) for c in children), key=json.dumps)
            for key, children in value.items()
        }
    return value


def fingerprint(definition: FlowDefinition) -> str:
    """16 hex digits of a hash of the definition's :meth:`~FlowDefinition.shape`."""
    text = json.dumps(definition.shape(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def object_ref(value: Any) -> str:
    """``module:qualname`` of a class, function or an object's class."""
    target = value if isinstance(value, type) or callable(value) else type(value)
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return f"{module}:{qualname}" if module and qualname else repr(value)


# --- from a class's decorated methods -------------------------------------------------------


def method_definition(
    fn: Callable[..., Any],
    *,
    is_start: bool,
    is_router: bool,
    condition: Cond | None,
    at_kickoff: bool,
    labels: frozenset[str] | None,
) -> FlowMethodDefinition:
    """The definition of one decorated method (as :func:`runner.flow.graph.compile_graph`
    compiled it): a conditional start is ``start: <condition>``; a start that a stacked
    ``@listen`` also triggers is ``start: true`` with ``listen``."""
    from runner.checkpointing import PERSIST_ATTR
    from runner.flow.decorators import REVIEW_ATTR

    declared = getattr(fn, ACTION_ATTR, None)
    do: Any = declared if declared is not None else CodeAction(ref=object_ref(fn))
    start: bool | Condition | None = None
    listen: Condition | None = None
    if is_start:
        if condition is None or at_kickoff:
            start = True
            listen = None if condition is None else condition_json(condition)
        else:
            start = condition_json(condition)
    elif condition is not None:
        listen = condition_json(condition)
    doc = (getattr(fn, "__doc__", None) or "").strip()
    review = getattr(fn, REVIEW_ATTR, None)
    feedback = None
    if review is not None:
        llm = review.llm
        feedback = HumanFeedbackDefinition(
            message=str(review.message),
            emit=None if review.emit is None else [str(e) for e in review.emit],
            llm=llm if llm is None or isinstance(llm, str | dict) else _llm_ref(llm),
            default_outcome=review.default_outcome,
            metadata=_jsonable(review.metadata),
            provider=None if review.provider is None else object_ref(review.provider),
        )
    persisted = getattr(fn, PERSIST_ATTR, None)
    return FlowMethodDefinition(
        description=doc.split("\n", 1)[0].strip() or None,
        do=do,
        start=start,
        listen=listen,
        router=is_router,
        emit=None if not is_router or labels is None else sorted(labels),
        human_feedback=feedback,
        persist=None if persisted is None else persistence_definition(persisted),
    )


def persistence_definition(spec: Any) -> PersistenceDefinition:
    """``@persist``'s spec as a definition (its backend as its reference)."""
    backend = getattr(spec, "persistence", None)
    return PersistenceDefinition(
        enabled=True,
        verbose=bool(getattr(spec, "verbose", False)),
        persistence=None if backend is None else backend_definition(backend),
    )


def backend_definition(backend: Any) -> dict[str, Any]:
    """A persistence as a definition names it: a backend declaring its settings as fields
    (CrewAI's way) by class name with their values, which a declared flow builds again;
    any other by its reference."""
    from runner.store.persistence import FlowPersistence, declared_fields

    fields = declared_fields(type(backend)) - {"persistence_type"}
    if isinstance(backend, FlowPersistence) and fields:
        values = {name: getattr(backend, name) for name in sorted(fields)}
        if all(isinstance(v, str | int | float | bool | type(None)) for v in values.values()):
            return {"persistence_type": type(backend).__name__, **values}
    return {"ref": object_ref(backend)}


def _llm_ref(llm: Any) -> Any:
    model = getattr(llm, "model", None)
    return model if isinstance(model, str) else {"ref": object_ref(llm)}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"ref": object_ref(value)}
    return value


def state_definition(initial_state: Any, model: type[BaseModel] | None) -> StateDefinition | None:
    """The state part of a class's definition: its ``initial_state`` or state model."""
    if isinstance(initial_state, dict):
        return DictState(default=_jsonable(initial_state))
    if initial_state is dict:
        return DictState()
    if model is None:
        return None
    schema = model.model_json_schema()
    schema.get("properties", {}).pop("id", None)
    if "id" in schema.get("required", []):
        schema["required"].remove("id")
    default: dict[str, Any] | None = None
    if isinstance(initial_state, BaseModel):
        default = initial_state.model_dump(mode="json", exclude={"id"})
    else:
        default = {
            name: field.get_default(call_default_factory=True)
            for name, field in model.model_fields.items()
            if name != "id" and not field.is_required()
        }
        default = _jsonable(_json_defaults(default))
    ref = object_ref(initial_state if initial_state is not None else model)
    return PydanticState(ref=ref, json_schema=schema, default=default or None)


def _json_defaults(values: dict[str, Any]) -> dict[str, Any]:
    from pydantic_core import to_jsonable_python

    try:
        return dict(to_jsonable_python(values))
    except Exception:  # a default with no JSON form: left out
        return {}


def config_definition(flow_cls: type) -> FlowConfigDefinition:
    """The config part of a class's definition."""
    checkpoint = getattr(flow_cls, "checkpoint", None)
    if isinstance(checkpoint, BaseModel):
        checkpoint = _jsonable(checkpoint.model_dump(mode="json", exclude_none=True))
    provider = getattr(flow_cls, "input_provider", None)
    # CrewAI's flow-level settings, where a class sets them (``stream = True``).
    given = {
        name: value
        for name in ("tracing", "stream", "suppress_flow_events", "max_method_calls")
        if isinstance(value := getattr(flow_cls, name, None), bool | int)
    }
    return FlowConfigDefinition(
        **given,
        input_provider=None
        if provider is None or isinstance(provider, str)
        else object_ref(provider),
        checkpoint=checkpoint if isinstance(checkpoint, bool | dict) else None,
    )


# --- the picture ----------------------------------------------------------------------------


def mermaid(definition: FlowDefinition) -> str:
    """A Mermaid ``flowchart TD``: starts as stadiums, routers as diamonds, label edges
    dashed with the label as text, edges into an ``and`` join thick."""
    methods = definition.methods
    lines = ["flowchart TD"]
    lines += [f"    {_node(name, m)}" for name, m in methods.items()]
    for name, m in methods.items():
        trigger = m.listen if m.listen is not None else m.start
        if not isinstance(trigger, str | dict):
            continue
        arrow = "==>" if _has_and(trigger) else "-->"
        for leaf in sorted(condition_leaves(trigger)):
            if leaf in methods:
                lines.append(f"    {_node_id(leaf)} {arrow} {_node_id(name)}")
                continue
            for r, rm in methods.items():
                labels = rm.labels()
                if rm.router and (labels is None or leaf in labels):
                    lines.append(f'    {_node_id(r)} -.->|"{_text(leaf)}"| {_node_id(name)}')
    return "\n".join(lines) + "\n"


def _has_and(value: Condition) -> bool:
    if isinstance(value, dict):
        return "and" in value or any(_has_and(c) for cs in value.values() for c in cs)
    return False


def _node_id(name: str) -> str:
    # A prefix keeps Mermaid keywords (``end``, ``graph``) usable as method names.
    return f"n_{name}"


def _text(text: str) -> str:
    return text.replace('"', "#quot;")


def _node(name: str, m: FlowMethodDefinition) -> str:
    text = f'"{_text(name)}"'
    if m.router:
        return f"{_node_id(name)}{{{text}}}"
    if m.is_start:
        return f"{_node_id(name)}([{text}])"
    return f"{_node_id(name)}[{text}]"


DEFINITION_ATTR = "__runner_definition__"
"""Where a flow class made from a declaration keeps that declaration."""


def class_definition(flow_cls: Any, methods: FlowDefinition) -> FlowDefinition:
    """The whole definition of a flow class: ``methods`` (its graph's) with its name,
    docstring, state, config and ``@persist``; a class made from a declaration gives that."""
    declared = flow_cls.__dict__.get(DEFINITION_ATTR)
    if isinstance(declared, FlowDefinition):
        return declared
    from runner.checkpointing import PERSIST_ATTR

    persisted = getattr(flow_cls, PERSIST_ATTR, None)
    doc = flow_cls.__dict__.get("__doc__")
    return methods.model_copy(
        update={
            "name": flow_cls.flow_name(),
            "description": doc.strip() if isinstance(doc, str) and doc.strip() else None,
            "state": state_definition(flow_cls.initial_state, flow_cls.state_type()),
            "config": config_definition(flow_cls),
            "persist": None if persisted is None else persistence_definition(persisted),
        },
        deep=True,
    )


# CrewAI's names for the models above (``crewai.flow.flow_definition``), so code written
# against its module finds them here under the same names.
FlowDictStateDefinition = DictState
FlowPydanticStateDefinition = PydanticState
FlowJsonSchemaStateDefinition = JsonSchemaState
FlowUnknownStateDefinition = UnknownState
FlowStateDefinition = StateDefinition
FlowPersistenceDefinition = PersistenceDefinition
FlowHumanFeedbackDefinition = HumanFeedbackDefinition
FlowCodeActionDefinition = CodeAction
FlowToolActionDefinition = ToolAction
FlowAgentActionDefinition = AgentAction
FlowCrewActionDefinition = CrewAction
FlowExpressionActionDefinition = ExpressionAction
FlowScriptActionDefinition = ScriptAction
FlowEachActionDefinition = EachAction
FlowEachStepDefinition = EachStep
FlowDefinitionCondition = Condition
