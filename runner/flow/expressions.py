"""CEL expressions and ``${...}`` templates of flow definitions, evaluated by cel-python.

A definition's text is never ``eval``-ed: CEL (Common Expression Language) is parsed and
evaluated by ``celpy``, over JSON data only (``state``, ``outputs`` and, inside an
``each``, ``item``). A template is any JSON value whose strings hold ``${expr}``: a string
that is exactly one ``${expr}`` becomes the expression's value with its type; a string
mixing text and expressions becomes text (non-text values as JSON, ``null`` as nothing).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

from runner.errors import DefinitionError

MACROS = frozenset({"all", "exists", "exists_one", "filter", "map"})
"""CEL macros whose first argument binds a local name."""


FLOW_TEMPLATE_EXPRESSION_RULES: tuple[str, ...] = (
    "Insert Flow values with `${...}`: a CEL expression over `state`, `outputs.<method>` "
    "and, inside an `each`, `item`.",
    "A value that is exactly one `${...}` keeps the expression's type (a number, a list, "
    "an object); text around or between expressions makes a string.",
    "Templates are evaluated by CEL, never as Python: call a function from a code action "
    "for anything CEL cannot say.",
)
"""How templates read, for guides (:func:`runner.flow.skill.skill`)."""

FLOW_TEMPLATE_EXPRESSION_EXAMPLES: dict[str, list[dict[str, str]]] = {
    "yaml": [
        {"title": "A typed value", "code": 'limit: "${state.limit}"'},
        {
            "title": "Text with values",
            "code": 'query: "News about ${state.topic} (${size(state.items)})"',
        },
    ],
    "json": [
        {"title": "A typed value", "code": '{"limit": "${state.limit}"}'},
        {
            "title": "Text with values",
            "code": '{"query": "News about ${state.topic} (${size(state.items)})"}',
        },
    ],
}
"""The rules above as examples, in each format a guide is written in."""


class ExpressionError(DefinitionError, ValueError):
    """An expression that does not parse, names an unknown root, or fails to evaluate."""


@functools.lru_cache(maxsize=512)
def _compiled(expression: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env, env.compile(expression)


def compile_cel(expression: str, where: str) -> Any:
    """The parsed ``expression``; :class:`ExpressionError` naming ``where`` if it does not
    parse."""
    text = strip_marker(expression)
    if not text:
        raise ExpressionError(f"{where}: empty CEL expression", field=where)
    try:
        return _compiled(text)[1]
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ExpressionError(
            f"{where}: invalid CEL expression {text!r}: {detail}", field=where
        ) from None


def strip_marker(expression: str) -> str:
    """``${x}`` written where a whole expression is expected is ``x``."""
    text = expression.strip()
    if text.startswith("${") and text.endswith("}"):
        text = text[2:-1].strip()
    return text


def roots(tree: Any) -> set[str]:
    """The identifiers an expression reads at its root (``state`` of ``state.x``); names a
    macro binds (``x`` of ``items.map(x, ...)``) are not roots."""
    found: set[str] = set()
    bound: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data == "ident" and node.children:
            found.add(str(node.children[0]))
        if node.data in ("member_dot_arg", "ident_arg"):
            names = [str(c) for c in node.children if not hasattr(c, "data")]
            if any(n in MACROS for n in names):
                for sub in node.iter_subtrees():
                    if sub.data == "ident" and sub.children:
                        bound.add(str(sub.children[0]))
                        break
    return found - bound if bound else found


def validate_expression(expression: str, allowed: Iterable[str], where: str) -> None:
    """Refuse (naming ``where``) an expression that does not parse or reads a root other
    than ``allowed``."""
    tree = compile_cel(expression, where)
    unknown = sorted(roots(tree) - set(allowed))
    if unknown:
        raise ExpressionError(
            f"{where}: unknown CEL root {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(allowed))}",
            field=where,
        )


def segments(text: str, where: str) -> list[str | tuple[str]]:
    """``text`` split into literal strings and ``(expression,)`` parts."""
    parts: list[str | tuple[str]] = []
    index = 0
    while (start := text.find("${", index)) != -1:
        if start > index:
            parts.append(text[index:start])
        depth, end, quote = 1, start + 2, ""
        while end < len(text) and depth:
            ch = text[end]
            if quote:
                if ch == "\\":
                    end += 1
                elif ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            end += 1
        if depth:
            raise ExpressionError(f"{where}: unterminated ${{...}} in {text!r}", field=where)
        inner = text[start + 2 : end - 1].strip()
        if not inner:
            raise ExpressionError(f"{where}: empty CEL expression ${{}} in {text!r}", field=where)
        parts.append((inner,))
        index = end
    if index < len(text) or not parts:
        parts.append(text[index:])
    return parts


def validate_template(value: Any, allowed: Iterable[str], where: str) -> None:
    """Refuse (naming the path inside ``where``) a template with a bad ``${...}``."""
    allowed = list(allowed)
    if isinstance(value, str):
        for part in segments(value, where):
            if isinstance(part, tuple):
                validate_expression(part[0], allowed, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            validate_template(item, allowed, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            validate_template(item, allowed, f"{where}[{i}]")


def evaluate(expression: str, context: dict[str, Any], where: str = "expression") -> Any:
    """The JSON value of ``expression`` over ``context`` (JSON data; pydantic models and
    dataclasses in it are read as their fields); :class:`ExpressionError` naming ``where``
    if it fails (a missing field, a wrong type, an error inside a map or list it builds)."""
    from celpy.adapter import CELJSONEncoder, json_to_cel
    from celpy.evaluation import CELEvalError
    from pydantic_core import to_jsonable_python

    text = strip_marker(expression)
    compile_cel(text, where)
    env, tree = _compiled(text)
    try:
        activation = json_to_cel(to_jsonable_python(context, fallback=str))
        result = env.program(tree).evaluate(activation)
        # celpy returns an error inside a map or list literal as data instead of raising it.
        failed = _first_error(result, CELEvalError)
        if failed is not None:
            raise failed
        return json.loads(json.dumps(result, cls=CELJSONEncoder))
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ExpressionError(
            f"{where}: failed to evaluate CEL expression {text!r}: {detail}", field=where
        ) from None


def _first_error(value: Any, kind: type[BaseException]) -> BaseException | None:
    if isinstance(value, kind):
        return value
    children = (
        value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    )
    for child in children:
        found = _first_error(child, kind)
        if found is not None:
            return found
    return None


class Expression:
    """A CEL expression, or a template whose strings hold ``${...}``, with the context it
    reads by default (CrewAI's ``Expression``): :meth:`evaluate` and
    :meth:`render_template` take another context, and an empty one is a context too (an
    expression reading ``state`` then fails)."""

    def __init__(self, source: Any, context: dict[str, Any] | None = None) -> None:
        self.source = source
        self.context: dict[str, Any] = dict(context or {})

    @classmethod
    def from_flow(
        cls,
        source: Any,
        flow: Any,
        local_context: dict[str, Any] | None = None,
        *,
        outputs: dict[str, Any] | None = None,
    ) -> Expression:
        """``source`` over ``flow``'s ``state``, the ``outputs`` given (by method name) and
        ``local_context`` (``item`` in an ``each``). Inside a declared method's step,
        ``runner.crew.declared.context_of(flow)`` gives the run's outputs so far."""
        from runner.flow.state import dump_state

        context = {
            "state": dump_state(flow.state, strict=False),
            "outputs": dict(outputs or {}),
            **(local_context or {}),
        }
        return cls(source, context)

    def evaluate(self, context: dict[str, Any] | None = None) -> Any:
        """The expression's value over ``context`` (else the one it was made with)."""
        if not isinstance(self.source, str):
            raise ExpressionError("expression: an expression is a string; use render_template")
        return evaluate(self.source, self.context if context is None else context)

    def render_template(self, context: dict[str, Any] | None = None) -> Any:
        """The template with each ``${...}`` evaluated over ``context`` (else its own)."""
        return render(self.source, self.context if context is None else context, "template")


def render(value: Any, context: dict[str, Any], where: str = "with") -> Any:
    """``value`` with every ``${...}`` in its strings evaluated over ``context``."""
    if isinstance(value, str):
        parts = segments(value, where)
        exprs = [p for p in parts if isinstance(p, tuple)]
        if not exprs:
            return value
        literal = [p for p in parts if isinstance(p, str)]
        if len(exprs) == 1 and not "".join(literal).strip():
            return evaluate(exprs[0][0], context, where)
        out = []
        for part in parts:
            if isinstance(part, str):
                out.append(part)
                continue
            got = evaluate(part[0], context, where)
            out.append("" if got is None else got if isinstance(got, str) else json.dumps(got))
        return "".join(out)
    if isinstance(value, dict):
        return {k: render(v, context, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, context, f"{where}[{i}]") for i, v in enumerate(value)]
    return value
