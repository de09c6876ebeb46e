"""The graph of a Flow class: its steps, their triggers, router labels and a fingerprint.

:func:`compile_graph` reads the ``@start`` / ``@listen`` / ``@router`` marks of a Flow class
(base classes included; a subclass attribute of the same name wins, so overriding a step
without re-decorating it removes the step), validates the wiring and caches the result in the
class's own ``__dict__`` so every subclass compiles its own graph.

Events are strings: a method's name (it finished) or a router label (a router returned it).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import textwrap
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

from runner.errors import (
    DefinitionError,
    DefinitionWarning,
    SelfTrigger,
    UnknownStep,
    UnknownTrigger,
)
from runner.flow.conditions import Cond, and_, describe, leaves
from runner.flow.decorators import CONVERSATIONAL_ONLY, DEFAULT_MAX_CALLS, STEP_ATTR, StepDecl
from runner.flow.definition import FlowDefinition, fingerprint, mermaid, method_definition
from runner.flow.rates import Rate

_CACHE_ATTR = "__runner_graph__"

TRIGGER_PAYLOAD = "crewai_trigger_payload"
"""The kickoff input handed to methods that declare a parameter of this name (CrewAI's)."""


@dataclass(frozen=True)
class MethodSpec:
    """One step of a flow, as compiled."""

    name: str
    """The method's name; also the event it emits when it finishes."""
    is_start: bool
    """Runs at kickoff (see :attr:`FlowGraph.kickoff`)."""
    is_router: bool
    """Its return value is emitted as a label."""
    condition: Cond | None
    """What triggers it; ``None`` for an unconditional start."""
    labels: frozenset[str] | None
    """The labels a router can return; ``None`` if not a router or not determinable."""
    takes_arg: bool
    """Accepts the trigger's output as a positional argument besides ``self``."""
    is_async: bool
    """Defined with ``async def``."""
    retries: int | None
    """Retries on failure; ``None`` = settings default."""
    retry_backoff: float | None
    """First retry delay in seconds; ``None`` = settings default."""
    time_limit: float | None
    """Soft time limit of an attempt in seconds; ``None`` = settings default."""
    max_calls: int
    """Activations allowed per run."""
    at_kickoff: bool = False
    """A start with a trigger (stacked ``@start()`` and ``@listen``) that also runs at kickoff."""
    trigger_payload: bool = False
    """Declares a ``crewai_trigger_payload`` parameter (given from the kickoff inputs)."""
    queue: str | None = None
    """The deployment's queue its steps go to, by name (``None``: the default queue)."""
    concurrency: int | None = None
    """Attempts running at once across the deployment (``None``: no limit)."""
    rate: Rate | None = None
    """Starts allowed across the deployment (``None``: no limit)."""
    limits: tuple[str, ...] = ()
    """Named limits it counts against."""
    limit_key: Callable[[Any], object] | None = None
    """Computes the key its limits hold per, from the run's state."""
    priority: int | None = None
    """Its steps' priority in runs submitted without one (``None``: the default)."""

    @property
    def limited(self) -> bool:
        """Whether a step of it must be admitted before it starts."""
        return bool(self.concurrency or self.rate or self.limits)


@dataclass(frozen=True)
class FlowGraph:
    """The compiled, immutable wiring of a Flow class."""

    name: str
    """The flow class's qualified name."""
    methods: Mapping[str, MethodSpec]
    """Every step by name, in definition order (base classes first)."""
    starts: tuple[str, ...]
    """Starts that run at kickoff whatever else the flow has (unconditional ones, and those
    with a stacked ``@listen``), in definition order."""
    labels: frozenset[str]
    """Every known router label."""
    fingerprint: str
    """16 hex digits of a hash of the wiring (names, roles, conditions); not of the bodies."""
    open_labels: bool
    """Some router's labels could not be determined; unknown string triggers are allowed."""
    _index: Mapping[str, tuple[str, ...]] = field(repr=False, compare=False)
    definition: FlowDefinition = field(repr=False, compare=False)
    """The methods part of the flow's definition (CrewAI's shape): what :attr:`fingerprint`
    hashes and :meth:`to_mermaid` draws; ``Flow.flow_definition()`` completes it."""
    unknown_triggers: tuple[tuple[str, str], ...] = ()
    """``(step, trigger)`` pairs naming a trigger no step has and no router returns: such a
    listener never runs (a :class:`DefinitionWarning`, an error for a strict flow)."""
    schema: str = ""
    """16 hex digits of a hash of the state model's JSON schema (``dict`` state: of
    nothing); with :attr:`fingerprint`, what a run's default code version is made of
    (:mod:`runner.flow.versions`)."""

    @property
    def kickoff(self) -> tuple[str, ...]:
        """The steps run at kickoff: :attr:`starts`, or all starts if there are none."""
        if self.starts:
            return self.starts
        return tuple(m.name for m in self.methods.values() if m.is_start)

    def spec(self, name: str) -> MethodSpec:
        """The step called ``name``; :class:`UnknownStep` if there is none."""
        try:
            return self.methods[name]
        except KeyError:
            raise UnknownStep(
                f"{self.name} has no step {name!r}", flow=self.name, step=name
            ) from None

    def listeners(self, event: str) -> tuple[str, ...]:
        """Steps whose condition mentions ``event``, in definition order."""
        return self._index.get(event, ())

    def emits(self, name: str) -> frozenset[str]:
        """The events step ``name`` may emit: its name and, for a router, its labels.

        A router with undeterminable labels may emit any trigger that is not a method name.
        """
        spec = self.spec(name)
        if not spec.is_router:
            return frozenset((name,))
        if spec.labels is None:
            return frozenset((name, *(e for e in self._index if e not in self.methods)))
        return frozenset((name, *spec.labels))

    def emitters(self, label: str) -> tuple[str, ...]:
        """Routers that may return ``label``."""
        return tuple(
            m.name
            for m in self.methods.values()
            if m.is_router and (m.labels is None or label in m.labels)
        )

    def downstream(self, steps: Iterable[str]) -> frozenset[str]:
        """``steps`` and every step reachable from them through triggers and router labels."""
        todo = [self.spec(s).name for s in steps]
        reached = set(todo)
        while todo:
            for event in self.emits(todo.pop()):
                for listener in self.listeners(event):
                    if listener not in reached:
                        reached.add(listener)
                        todo.append(listener)
        return frozenset(reached)

    def to_mermaid(self) -> str:
        """A Mermaid ``flowchart TD`` of :attr:`definition`
        (:func:`runner.flow.definition.mermaid`)."""
        return mermaid(self.definition)


# --- compiling ------------------------------------------------------------------------------


def compile_graph(flow_cls: type, *, warn: bool = True) -> FlowGraph:
    """The validated graph of ``flow_cls``, compiled once per class and cached on it.

    Raises :class:`DefinitionError` naming the offending step. A listener of a trigger that
    nothing emits is accepted (it never runs, as in CrewAI) with a :class:`DefinitionWarning`
    when the class is first compiled (unless ``warn`` is false), or, if the class sets
    ``strict = True``, refused with :class:`UnknownTrigger`.
    """
    cached = flow_cls.__dict__.get(_CACHE_ATTR)
    if isinstance(cached, FlowGraph):
        return cached
    graph = _build(flow_cls)
    if graph.unknown_triggers and getattr(flow_cls, "strict", False) is True:
        raise unknown_trigger(graph)
    setattr(flow_cls, _CACHE_ATTR, graph)
    if graph.unknown_triggers and warn:
        step, trigger = graph.unknown_triggers[0]
        warnings.warn(
            f"{graph.name}.{step} listens to {trigger!r}, which is neither a step nor a "
            "label a router returns: it never runs",
            DefinitionWarning,
            stacklevel=3,
        )
    return graph


def unknown_trigger(graph: FlowGraph) -> UnknownTrigger:
    """The error a strict flow raises for the first listener of a trigger nothing emits."""
    step, trigger = graph.unknown_triggers[0]
    return UnknownTrigger(
        f"{graph.name}.{step} listens to {trigger!r}, which is neither a step nor a router "
        "label (strict flow)",
        flow=graph.name,
        step=step,
        trigger=trigger,
    )


def _step_functions(flow_cls: type) -> dict[str, tuple[Callable[..., Any], StepDecl]]:
    """Decorated public methods, base classes first, the most derived definition winning."""
    found: dict[str, Any] = {}
    for klass in reversed(flow_cls.__mro__):
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                found[name] = value
    steps = {}
    conversational = bool(getattr(flow_cls, "conversational", False))
    for name, value in found.items():
        decl = getattr(value, STEP_ATTR, None)
        # The built-in conversational steps (runner.flow.conversation) are steps only of a
        # flow that opts in, as in CrewAI; elsewhere they are plain methods.
        if getattr(value, CONVERSATIONAL_ONLY, False) and not conversational:
            continue
        if isinstance(decl, StepDecl) and callable(value):
            steps[name] = (value, decl)
    return steps


def _params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def _takes_arg(fn: Callable[..., Any]) -> bool:
    params = [p for p in _params(fn) if p.name != TRIGGER_PAYLOAD]
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in kinds]
    var = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    return len(positional) > 1 or var


def _spec(name: str, fn: Callable[..., Any], decl: StepDecl, owner: type) -> MethodSpec:
    labels = None
    if decl.is_router:
        labels = decl.labels
        if labels is None:
            labels = annotated_labels(fn)
        if labels is None:
            labels = infer_labels(fn, owner)
    opts = decl.options
    return MethodSpec(
        name=name,
        is_start=decl.is_start,
        is_router=decl.is_router,
        condition=decl.condition,
        labels=labels,
        takes_arg=_takes_arg(fn),
        is_async=inspect.iscoroutinefunction(fn),
        retries=opts.retries,
        retry_backoff=opts.retry_backoff,
        time_limit=opts.time_limit,
        max_calls=opts.max_calls if opts.max_calls is not None else _default_calls(owner),
        at_kickoff=decl.at_kickoff,
        trigger_payload=any(p.name == TRIGGER_PAYLOAD for p in _params(fn)),
        queue=opts.queue,
        concurrency=opts.concurrency,
        rate=opts.rate,
        limits=opts.limits or (),
        limit_key=opts.limit_key,
        priority=opts.priority,
    )


def methods_definition(flow_cls: type) -> FlowDefinition:
    """The methods part of ``flow_cls``'s definition, also for a class that cannot run yet
    (no start method, a router without a trigger: CrewAI describes those too); running it
    still compiles and validates its graph (:func:`compile_graph`)."""
    cached = flow_cls.__dict__.get(_CACHE_ATTR)
    if isinstance(cached, FlowGraph):
        return cached.definition
    steps = _step_functions(flow_cls)
    specs = _router_last(
        flow_cls, {n: _spec(n, fn, decl, flow_cls) for n, (fn, decl) in steps.items()}
    )
    return _definition(flow_cls, steps, specs)


CONVERSATION_ROUTER = "route_conversation"
"""The built-in start router of a conversational flow (:mod:`runner.flow.conversation`)."""


def _router_last(flow_cls: type, specs: dict[str, MethodSpec]) -> dict[str, MethodSpec]:
    """A conversational flow's start router runs after the flow's own kickoff starts (as
    CrewAI orders them): it listens to all of them (on workers too, each a step), so a
    start that prepares the turn (loads a profile, sets state) has finished when the turn
    is routed. Without starts of its own the router is the kickoff step."""
    router_spec = specs.get(CONVERSATION_ROUTER)
    if router_spec is None or not getattr(flow_cls, "conversational", False):
        return specs
    own = [
        n
        for n, m in specs.items()
        if n != CONVERSATION_ROUTER and m.is_start and (m.condition is None or m.at_kickoff)
    ]
    if not own:
        return specs
    condition: Cond = own[0] if len(own) == 1 else and_(*own)
    return {**specs, CONVERSATION_ROUTER: replace(router_spec, condition=condition)}


def _definition(
    flow_cls: type,
    steps: Mapping[str, tuple[Callable[..., Any], StepDecl]],
    specs: Mapping[str, MethodSpec],
) -> FlowDefinition:
    return FlowDefinition(
        name=flow_cls.__name__,
        methods={
            n: method_definition(
                fn,
                is_start=specs[n].is_start,
                is_router=specs[n].is_router,
                condition=specs[n].condition,
                at_kickoff=specs[n].at_kickoff,
                labels=specs[n].labels,
            )
            for n, (fn, _) in steps.items()
        },
    )


def _default_calls(owner: type) -> int:
    """How often a method of ``owner`` may run in one run unless it says: the class's
    ``max_method_calls`` (CrewAI's), else :data:`DEFAULT_MAX_CALLS`."""
    given = getattr(owner, "max_method_calls", None)
    if isinstance(given, int) and not isinstance(given, bool) and given >= 1:
        return given
    return DEFAULT_MAX_CALLS


def _build(flow_cls: type) -> FlowGraph:
    name = flow_cls.__qualname__
    steps = _step_functions(flow_cls)
    specs = _router_last(
        flow_cls, {n: _spec(n, fn, decl, flow_cls) for n, (fn, decl) in steps.items()}
    )
    unknown = _validate(name, specs)
    definition = _definition(flow_cls, steps, specs)
    index: dict[str, list[str]] = {}
    for m in specs.values():
        for leaf in sorted(leaves(m.condition)) if m.condition is not None else ():
            index.setdefault(leaf, []).append(m.name)
    return FlowGraph(
        name=name,
        methods=MappingProxyType(specs),
        starts=tuple(
            m.name for m in specs.values() if m.is_start and (m.condition is None or m.at_kickoff)
        ),
        labels=frozenset().union(*(m.labels or () for m in specs.values())),
        fingerprint=fingerprint(definition),
        open_labels=any(m.is_router and m.labels is None for m in specs.values()),
        _index=MappingProxyType({k: tuple(v) for k, v in index.items()}),
        definition=definition,
        unknown_triggers=unknown,
        schema=_schema_hash(flow_cls),
    )


def _schema_hash(flow_cls: type) -> str:
    """A hash of ``flow_cls``'s state model's JSON schema (its fields, types, defaults)."""
    find = getattr(flow_cls, "state_type", None)
    model = find() if callable(find) else None
    if model is None:
        text = "dict"
    else:
        try:
            text = json.dumps(model.model_json_schema(), sort_keys=True, default=str)
        except Exception:  # a field type with no JSON schema: its annotation's text stands in
            text = repr(sorted((n, repr(f.annotation)) for n, f in model.model_fields.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _validate(flow: str, specs: Mapping[str, MethodSpec]) -> tuple[tuple[str, str], ...]:
    """Raise for wiring that cannot work; return the ``(step, trigger)`` pairs whose trigger
    nothing emits."""
    if not any(m.is_start for m in specs.values()):
        raise DefinitionError(f"{flow} has no @start() method", flow=flow)
    labels = frozenset().union(*(m.labels or () for m in specs.values()))
    open_labels = any(m.is_router and m.labels is None for m in specs.values())
    unknown: list[tuple[str, str]] = []
    for m in specs.values():
        if m.condition is None:
            if not m.is_start:
                raise DefinitionError(
                    f"{flow}.{m.name}: a @router needs a trigger", flow=flow, step=m.name
                )
            continue
        if m.name in leaves(m.condition):
            raise SelfTrigger(
                f"{flow}.{m.name} listens to itself ({describe(m.condition)})",
                flow=flow,
                step=m.name,
            )
        for leaf in sorted(leaves(m.condition)):
            if leaf not in specs and leaf not in labels and not open_labels:
                unknown.append((m.name, leaf))
    return tuple(unknown)


# --- router label inference -----------------------------------------------------------------

_MISSING = object()
_SKIP = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def annotated_labels(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The labels a router's return annotation declares (as CrewAI reads them): a
    ``Literal`` of strings, an Enum class, or a union of those (``Annotated`` unwrapped);
    ``None`` for any other annotation, or none."""
    try:
        hint = typing.get_type_hints(fn, include_extras=True).get("return")
    except Exception:  # an annotation that does not resolve here: read the body instead
        return None
    found = _annotation_labels(hint)
    return None if not found else frozenset(found)


def _annotation_labels(hint: Any) -> list[str] | None:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _annotation_labels(typing.get_args(hint)[0])
    if origin is typing.Literal:
        values = typing.get_args(hint)
        if all(isinstance(v, str | Enum) for v in values):
            return [str(v.value) if isinstance(v, Enum) else v for v in values]
        return None
    if isinstance(hint, type) and issubclass(hint, Enum):
        return [str(member.value) for member in hint]
    if origin in (typing.Union, types.UnionType):
        parts = [_annotation_labels(arg) for arg in typing.get_args(hint)]
        if all(p is not None for p in parts):
            return [label for p in parts if p is not None for label in p]
    return None


def infer_labels(fn: Callable[..., Any], owner: type | None = None) -> frozenset[str] | None:
    """The labels a router can return, read from its ``return`` statements.

    Understands string constants, ``a if c else b``, and names or attribute chains that
    resolve (through the function's globals and closure, ``self`` meaning ``owner``) to a
    string or an Enum member (its ``value``). ``None`` if any return is something else
    or the source is unavailable.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    defs = (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    func = next((n for n in defs if n.name == fn.__name__), None)
    if func is None:
        return None
    scope = _scope(fn, owner)
    found: set[str] = set()
    for ret in _returns(func):
        values = _return_values(ret.value, scope)
        if values is None:
            return None
        found.update(values)
    return frozenset(found)


def _returns(node: ast.AST) -> Iterator[ast.Return]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _SKIP):
            continue
        if isinstance(child, ast.Return):
            yield child
        yield from _returns(child)


def _scope(fn: Callable[..., Any], owner: type | None) -> dict[str, Any]:
    scope: dict[str, Any] = dict(getattr(fn, "__globals__", {}))
    code = getattr(fn, "__code__", None)
    for name, cell in zip(
        getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None) or (), strict=False
    ):
        try:
            scope[name] = cell.cell_contents
        except ValueError:  # an empty cell: the name is not bound yet
            continue
    if owner is not None:
        scope["self"] = owner
    return scope


def _return_values(expr: ast.expr | None, scope: Mapping[str, Any]) -> list[str] | None:
    if expr is None or (isinstance(expr, ast.Constant) and expr.value is None):
        return []  # returning None emits no label
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    if isinstance(expr, ast.IfExp):
        body, orelse = _return_values(expr.body, scope), _return_values(expr.orelse, scope)
        return None if body is None or orelse is None else body + orelse
    if isinstance(expr, ast.Name | ast.Attribute):
        obj = _resolve(expr, scope)
        if isinstance(obj, Enum):
            return [str(obj.value)]
        if isinstance(obj, str):
            return [obj]
    return None


def _resolve(expr: ast.expr, scope: Mapping[str, Any]) -> Any:
    if isinstance(expr, ast.Name):
        return scope.get(expr.id, _MISSING)
    if isinstance(expr, ast.Attribute):
        base = _resolve(expr.value, scope)
        return _MISSING if base is _MISSING else getattr(base, expr.attr, _MISSING)
    return _MISSING


def route_label(result: object) -> str | None:
    """The label a router's return value emits: an Enum's ``value``, else ``str``; None: none."""
    if result is None:
        return None
    if isinstance(result, Enum):
        return str(result.value)
    return str(result)
