"""A guide to writing a flow definition, in Markdown (CrewAI's ``FlowDefinition.skill()``).

Written for a person or a model that authors ``crewai.flow/v1`` files: the flow's fields and
a method's fields are read from the definition models (their names, types and defaults), so
the guide follows the models; the actions, templates and the sections a caller may leave
out (``skips``) are written here, with examples in YAML or JSON.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import yaml
from pydantic import BaseModel

from runner.flow.expressions import (
    FLOW_TEMPLATE_EXPRESSION_EXAMPLES,
    FLOW_TEMPLATE_EXPRESSION_RULES,
)

SKIPPABLE = frozenset(
    {
        "each",
        "hitl",
        "persistence",
        "conversational",
        "expression_action",
        "script_action",
        "tool_action",
    }
)
"""Sections ``skips`` may leave out (other names are ignored)."""

_FLOW_EXAMPLE: dict[str, Any] = {
    "schema": "crewai.flow/v1",
    "name": "ResearchFlow",
    "state": {"type": "dict", "default": {"topic": "durable flows"}},
    "methods": {
        "research": {"start": True, "do": {"call": "code", "ref": "my_project.flows:research"}},
        "summarize": {
            "listen": "research",
            "do": {
                "call": "code",
                "ref": "my_project.flows:summarize",
                "with": {"notes": "${outputs.research}", "topic": "${state.topic}"},
            },
        },
    },
}

_ACTIONS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "code_action",
        "Code (`call: code`)",
        "Calls the function `ref` names (`module:qualname`); `with` gives its keyword "
        "arguments (templates). A function whose first parameter `with` does not give is "
        "given the flow.",
        {"call": "code", "ref": "my_project.flows:normalize", "with": {"topic": "${state.topic}"}},
    ),
    (
        "crew_action",
        "Crew (`call: crew`)",
        "Runs an inline crew: `with` holds its agents by name and its tasks in order; "
        "`inputs` are the runtime inputs passed to the crew (templates).",
        {
            "call": "crew",
            "with": {
                "agents": {"writer": {"role": "Writer", "goal": "Write", "backstory": "Careful."}},
                "tasks": [{"description": "Write about {topic}", "expected_output": "Text"}],
            },
            "inputs": {"topic": "${state.topic}"},
        },
    ),
    (
        "agent_action",
        "Agent (`call: agent`)",
        "Asks one agent: `with` holds its role, goal, backstory, llm and its `input` (a template).",
        {
            "call": "agent",
            "with": {"role": "Analyst", "goal": "Answer", "input": "${state.question}"},
        },
    ),
    (
        "expression_action",
        "Expression (`call: expression`)",
        "Evaluates one CEL expression over `state` and `outputs`. Prefer `call: expression` "
        "for small decisions and values; a router's expression returns its label.",
        {"call": "expression", "expr": "state.score > 5 ? 'many' : 'none'"},
    ),
    (
        "each",
        "Each (`call: each`)",
        "Runs its ordered steps for every item of the list `in` evaluates to; a step runs "
        "only if its `if` holds and reads `item` and the outputs of the steps before it.",
        {
            "call": "each",
            "in": "state.rows",
            "do": [{"name": "clean", "action": {"call": "code", "ref": "my_project.rows:clean"}}],
        },
    ),
    (
        "script_action",
        "Script (`call: script`)",
        "Inline Python. Not run by runner (no definition text is executed): put the code in a "
        "function and use a code action.",
        {"call": "script", "code": "return state['topic'].strip()"},
    ),
    (
        "tool_action",
        "Tool (`call: tool`)",
        "A tool class by reference (a `BaseTool` subclass, made without arguments): its "
        "`run` gets `with` as keyword arguments, checked against its `_run` signature; its "
        "result is the method's output. On workers the class must be in the allow-list.",
        {"call": "tool", "ref": "my_project.tools:Search", "with": {"query": "${state.topic}"}},
    ),
]


def _block(data: Any, fmt: str) -> str:
    text = json.dumps(data, indent=2) if fmt == "json" else yaml.safe_dump(data, sort_keys=False)
    return f"```{fmt}\n{text.rstrip()}\n```"


def _fields(model: type[BaseModel]) -> list[str]:
    lines = []
    for name, info in model.model_fields.items():
        shown = info.alias or name
        kind = getattr(info.annotation, "__name__", None) or str(info.annotation)
        kind = kind.replace("typing.", "")
        default = info.get_default(call_default_factory=True)
        need = "required" if info.is_required() else f"optional; default `{default!r}`"
        doc = f": {info.description}" if info.description else ""
        lines.append(f"- `{shown}` ({need}): {kind}{doc}")
    return lines


def skill(
    flow_model: type[BaseModel],
    method_model: type[BaseModel],
    skips: list[str] | None = None,
    examples_format: str = "yaml",
) -> str:
    """The guide to definitions of ``flow_model`` with methods of ``method_model``, without
    the sections ``skips`` names (see :data:`SKIPPABLE`), its examples in
    ``examples_format`` (``"yaml"`` or ``"json"``)."""
    fmt = "json" if examples_format == "json" else "yaml"
    skipped = set(skips or ()) & SKIPPABLE
    actions = [a for a in _ACTIONS if a[0] not in skipped]
    parts = [
        "# Writing a flow definition (`crewai.flow/v1`)",
        "",
        "A flow is its state, its methods and what each method does. A method runs at the "
        "start, when its `listen` condition holds (a method's name, a router's label, or "
        "`{or: [...]}` / `{and: [...]}` of them), and a router's result is a label its "
        "listeners wait for.",
        "",
        "Contents: [Flow](#flow), [Method](#method-methods), [Actions](#actions), "
        "[Templates](#templates)"
        + ("" if "hitl" in skipped else ", [Human feedback](#human-feedback-human_feedback)")
        + ("" if "persistence" in skipped else ", [Persistence](#persistence-persist)"),
        "",
        "## Flow",
        "",
        *_fields(flow_model),
        "",
        _block(_FLOW_EXAMPLE, fmt),
        "",
        "### Method (`methods`)",
        "",
        "Method names are identifiers (`^[A-Za-z_][A-Za-z0-9_]*$`).",
        "",
        *_fields(method_model),
        "",
        *([] if "conversational" in skipped else _conversational(flow_model)),
        "## Actions",
        "",
    ]
    for _, title, text, example in actions:
        parts += [f"### {title}", "", text, "", _block({"do": example}, fmt), ""]
    parts += ["## Templates", "", *[f"- {rule}" for rule in FLOW_TEMPLATE_EXPRESSION_RULES], ""]
    for example in FLOW_TEMPLATE_EXPRESSION_EXAMPLES[fmt]:
        parts += [f"#### {example['title']}", "", f"```{fmt}\n{example['code']}\n```", ""]
    if "hitl" not in skipped:
        parts += [
            "## Human feedback (`human_feedback`)",
            "",
            "A method's output is reviewed by a person: `message`, and with `emit` the "
            "labels the answer is collapsed to (by `llm`), `default_outcome` for an empty "
            "answer, `provider` a reference to who asks.",
            "",
        ]
    if "persistence" not in skipped:
        parts += [
            "## Persistence (`persist`)",
            "",
            "`persist: {enabled: true}` on the flow or a method saves the state after each "
            "method (or that one); `persistence` names the backend "
            "(`{persistence_type: Name, ...its fields}` or a `module:name` reference); "
            "`enabled: false` on a method leaves it out.",
            "",
        ]
    return "\n".join(parts)


def _model_in(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model the field ``name`` of ``model`` holds (``X | None`` gives ``X``)."""
    info = model.model_fields.get(name)
    if info is None:
        return None
    for kind in (info.annotation, *typing.get_args(info.annotation)):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None


def _conversational(flow_model: type[BaseModel]) -> list[str]:
    """The sections of the flow's ``conversational`` block and of its router, each listing
    its model's fields (the router in a section of its own, linked from the block's)."""
    block = _model_in(flow_model, "conversational")
    if block is None:
        return []
    parts = [
        "### Conversational (`conversational`)",
        "",
        "Declaring it makes the flow a chat: each turn appends the user's message to "
        "`state.messages`, the built-in router picks a route (a label the flow's listeners "
        "wait for, `converse` or `end`) and the route's listener replies.",
        "",
        *_fields(block),
        "",
    ]
    router = _model_in(block, "router")
    if router is not None:
        parts += [
            "### Conversational Router (`conversational.router`)",
            "",
            "Which route a message takes, as asked of the router's model.",
            "",
            *_fields(router),
            "",
        ]
    return parts
