"""Tools: CrewAI's ``BaseTool`` shape, for tools a flow definition calls (``call: tool``).

A tool is a pydantic model with a ``name``, a ``description`` and a ``_run`` method; its
arguments are ``_run``'s parameters (``args_schema``, made from the signature unless the
class gives one). :meth:`BaseTool.run` validates keyword arguments against that schema and
calls ``_run``; a ``_run`` that returns a coroutine is awaited (CrewAI's behaviour), so a
tool with an async body works from a sync step. A class written against
``crewai.tools.BaseTool`` moves over by changing the import.

What the runner adds nothing to: usage limits, caching and result-as-answer (agent-side
features of CrewAI's tools) are not here.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from runner.errors import DefinitionError


class ToolArgumentsError(DefinitionError, ValueError):
    """Arguments a tool's ``args_schema`` refuses: one line naming the tool and the field."""


class BaseTool(BaseModel, ABC):
    """A tool: ``name``, ``description``, and the work in ``_run`` (CrewAI's ``BaseTool``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = ""
    description: str = ""
    args_schema: type[BaseModel] | None = Field(default=None, exclude=True)

    _schemas: ClassVar[dict[type, type[BaseModel]]] = {}

    def model_post_init(self, context: Any) -> None:
        if not self.name:
            self.name = type(self).__name__
        if self.args_schema is None:
            self.args_schema = arguments_schema(type(self))

    @abstractmethod
    def _run(self, *args: Any, **kwargs: Any) -> Any:
        """The tool's work (a coroutine it returns is awaited by :meth:`run`)."""

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """``_run`` on the arguments (keyword arguments validated and converted by the
        tool's ``args_schema`` first); a coroutine result is awaited."""
        if not args:
            kwargs = self.validated(kwargs)
        return awaited(self._run(*args, **kwargs))

    async def arun(self, *args: Any, **kwargs: Any) -> Any:
        """The async form of :meth:`run` (``_arun`` if the class has one, else ``_run``)."""
        if not args:
            kwargs = self.validated(kwargs)
        body = getattr(self, "_arun", None) or self._run
        result = body(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    def validated(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` as the tool's ``args_schema`` reads them; :class:`ToolArgumentsError`
        (one line: the tool, the field, what is wrong) if it refuses them."""
        schema = self.args_schema
        if schema is None or not schema.model_fields:
            return kwargs
        try:
            model = schema.model_validate(kwargs)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "arguments"
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            raise ToolArgumentsError(
                f"tool {self.name!r}: {where}: {first['msg']}{more}", field=where
            ) from None
        # What was given, converted (``"2"`` for an ``int`` is 2); a parameter left out
        # keeps ``_run``'s own default, as a direct call would.
        dumped = model.model_dump()
        return {k: dumped[k] for k in model.model_fields_set}


def arguments_schema(cls: type[BaseTool]) -> type[BaseModel]:
    """A model of ``cls._run``'s keyword parameters (annotation and default each)."""
    found = BaseTool._schemas.get(cls)
    if found is not None:
        return found
    fields: dict[str, Any] = {}
    try:
        # Annotations written under ``from __future__ import annotations`` are strings.
        params = inspect.signature(cls._run, eval_str=True).parameters
    except (NameError, TypeError, SyntaxError):
        params = inspect.signature(cls._run).parameters
    for name, param in params.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = param.annotation
        if annotation is param.empty or isinstance(annotation, str):
            annotation = Any
        default = ... if param.default is param.empty else param.default
        fields[name] = (annotation, default)
    schema = create_model(f"{cls.__name__}Schema", **fields)
    BaseTool._schemas[cls] = schema
    return schema


def awaited(result: Any) -> Any:
    """``result``, awaited if it is a coroutine: on this thread when no event loop runs
    here, else on a thread of its own (a loop cannot be re-entered)."""
    if not inspect.iscoroutine(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(result)
    box: dict[str, Any] = {}
    # The step's context (its run, its stream) goes with the coroutine to that thread.
    context = contextvars.copy_context()

    def run() -> None:
        try:
            box["value"] = context.run(asyncio.run, result)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=run, name="tool-await")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
