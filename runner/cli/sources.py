"""What a command's FLOW argument names: a flow class by import path (``pkg.mod:Class``), or
a declarative flow's YAML or JSON file (CrewAI's ``crewai.flow/v1``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEFINITION_SUFFIXES = (".yaml", ".yml", ".json")
"""The file names a FLOW argument is read as a definition by."""


def is_definition_file(flow: str) -> bool:
    """Whether FLOW names a definition file rather than an import path."""
    return flow.lower().endswith(DEFINITION_SUFFIXES) or (":" not in flow and Path(flow).is_file())


def flow_class(flow: str) -> Any:
    """The flow class FLOW names: a definition file's declared flow (refused, naming the bad
    field's path, before anything is stored), else the class at the import path."""
    if is_definition_file(flow):
        from pydantic import ValidationError

        from runner.crew.declared import declared_flow
        from runner.flow.definition import invalid_definition

        try:
            return declared_flow(path=flow)
        except ValidationError as exc:
            # pydantic's error is several lines; a command says one (the field's path).
            raise invalid_definition(exc) from None
    from runner.flow.loading import load_flow

    return load_flow(flow)
