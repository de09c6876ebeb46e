"""Finding a flow class by its import path (``pkg.mod:Class``), for workers and producers."""

from __future__ import annotations

import importlib
from typing import Any

from runner.errors import FlowImportError


def load_flow(path: str) -> Any:
    """The class named by ``pkg.mod:Class``, or :class:`FlowImportError`.

    A crew (an object with ``as_flow()``) names the flow class of its tasks.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise FlowImportError(f"flow path {path!r} is not of the form pkg.mod:Class", path=path)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise FlowImportError(f"cannot import {module_name}: {exc}", path=path) from None
    obj: Any = getattr(module, attr, None)
    if hasattr(obj, "as_flow") and not isinstance(obj, type):
        obj = obj.as_flow()  # a Crew: runs as a flow of its tasks
    # Told by its face, not by ``issubclass(obj, Flow)``: the executors below Flow load it.
    if not (isinstance(obj, type) and callable(getattr(obj, "graph", None))):
        raise FlowImportError(f"{path} is not a Flow class", path=path)
    return obj
