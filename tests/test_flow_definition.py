"""``Flow.flow_definition()``: every flow class as data in CrewAI's ``crewai.flow/v1`` shape,
and the graph, its picture and its fingerprint drawn from that one description."""

from __future__ import annotations

import json
import subprocess
import sys
from enum import StrEnum
from typing import Any, Literal

import pytest
import yaml
from pydantic import ValidationError

from runner import Flow, FlowState, and_, human_feedback, listen, or_, persist, router, start
from runner.errors import DefinitionError
from runner.flow.definition import FlowDefinition, fingerprint, invalid_definition, mermaid
from tests.flows.cli import GatedFlow


class Report(FlowState):
    topic: str = "AI agents"
    limit: int = 3
    notes: list[str] = []


class Verdict(StrEnum):
    OK = "ok"
    RETRY = "retry"


class ReportFlow(Flow[Report]):
    """Plans, researches and writes a report."""

    @start()
    def plan(self) -> str:
        """Make an outline."""
        return "outline"

    @listen(plan)
    def research(self, outline: str) -> str:
        return outline

    @router(research)
    def check(self) -> str:
        return "ok" if self.state.limit else "retry"

    @listen("retry")
    def redo(self) -> None: ...

    @listen(and_(research, "ok"))
    def write(self) -> None: ...

    @listen(or_(write, redo))
    @human_feedback(message="Publish?", emit=["approved", "revise"], llm="gpt-4o-mini")
    def review(self) -> str:
        return "draft"

    @listen("approved")
    def publish(self) -> None: ...


def test_a_class_flow_as_crewais_definition() -> None:
    found = ReportFlow.flow_definition()
    assert isinstance(found, FlowDefinition)
    data = found.to_dict()
    assert data["schema"] == "crewai.flow/v1"
    assert data["name"] == "ReportFlow"
    assert data["description"] == "Plans, researches and writes a report."
    methods = data["methods"]
    assert list(methods) == ["plan", "research", "check", "redo", "write", "review", "publish"]
    assert methods["plan"]["start"] is True and "listen" not in methods["plan"]
    assert methods["plan"]["description"] == "Make an outline."
    assert methods["plan"]["do"] == {"call": "code", "ref": f"{__name__}:ReportFlow.plan"}
    assert methods["research"]["listen"] == "plan"
    assert methods["check"] == {
        "do": {"call": "code", "ref": f"{__name__}:ReportFlow.check"},
        "listen": "research",
        "router": True,
        "emit": ["ok", "retry"],
    }
    assert methods["write"]["listen"] == {"and": ["research", "ok"]}
    assert methods["review"]["listen"] == {"or": ["write", "redo"]}
    # A review with emit routes like a router; its labels are the review's (CrewAI's shape).
    assert methods["review"]["router"] is True and "emit" not in methods["review"]
    feedback = methods["review"]["human_feedback"]
    assert feedback["message"] == "Publish?"
    assert feedback["emit"] == ["approved", "revise"]
    assert feedback["llm"] == "gpt-4o-mini"  # the name, never a client


def test_the_state_schema_with_its_defaults_and_the_config() -> None:
    data = ReportFlow.flow_definition().to_dict()
    state = data["state"]
    assert state["type"] == "pydantic"
    assert state["ref"].endswith(":Report") or state["ref"].endswith("Report")
    assert state["default"] == {"topic": "AI agents", "limit": 3, "notes": []}
    assert set(state["json_schema"]["properties"]) == {"topic", "limit", "notes"}
    assert data["config"]["max_method_calls"] == 100

    class DictFlow(Flow[dict[str, Any]]):
        initial_state = {"count": 0, "items": ["a"]}

        @start()
        def go(self) -> None: ...

    assert DictFlow.flow_definition().to_dict()["state"] == {
        "type": "dict",
        "default": {"count": 0, "items": ["a"]},
    }


def test_starts_conditional_starts_and_stacked_listeners() -> None:
    class Starts(Flow):
        @start()
        def first(self) -> None: ...

        @start("fine")
        def conditional(self) -> None: ...

        @start()
        @listen(first)
        def both(self) -> None: ...

        @start()
        @router()
        def gate(self) -> Verdict:
            return Verdict.OK

        @listen(Verdict.OK)
        def fine(self) -> None: ...

    methods = Starts.flow_definition().to_dict()["methods"]
    assert methods["conditional"]["start"] == "fine" and "listen" not in methods["conditional"]
    assert methods["both"]["start"] is True and methods["both"]["listen"] == "first"
    assert methods["gate"]["start"] is True and methods["gate"]["router"] is True
    assert methods["gate"]["emit"] == ["ok", "retry"]  # its annotation, Verdict
    assert methods["fine"]["listen"] == "ok"


def test_crewais_flow_level_settings_are_the_config() -> None:
    class Settled(Flow):
        stream = True
        max_method_calls = 7

        @start()
        def go(self) -> None: ...

    config = Settled.flow_definition().config
    assert config.stream is True and config.max_method_calls == 7


def test_persist_and_a_dynamic_router() -> None:
    @persist()
    class Kept(Flow):
        @start()
        def go(self) -> str:
            return "x"

        @router(go)
        def pick(self) -> str:
            return self.state["label"]

    data = Kept.flow_definition().to_dict()
    assert data["persist"]["enabled"] is True
    assert data["methods"]["pick"]["router"] is True
    assert "emit" not in data["methods"]["pick"]  # not determinable: left open


def test_yaml_and_json_round_trip() -> None:
    found = ReportFlow.flow_definition()
    for text in (found.to_yaml(), found.to_json()):
        again = FlowDefinition.from_declaration(text)
        assert again.to_dict() == found.to_dict()
    assert yaml.safe_load(found.to_yaml())["schema"] == "crewai.flow/v1"
    assert json.loads(found.to_json())["name"] == "ReportFlow"


def test_graph_fingerprint_and_picture_come_from_the_definition() -> None:
    graph = ReportFlow.graph()
    found = ReportFlow.flow_definition()
    assert graph.fingerprint == fingerprint(found)
    assert graph.to_mermaid() == mermaid(found)
    assert 'n_check -.->|"retry"| n_redo' in graph.to_mermaid()
    assert 'n_review -.->|"approved"| n_publish' in graph.to_mermaid()
    assert "n_research ==> n_write" in graph.to_mermaid()
    # A declaration with the same shape and other actions has the same fingerprint.
    data = found.to_dict()
    for method in data["methods"].values():
        method["do"] = {"call": "expression", "expr": "state.topic"}
    assert fingerprint(FlowDefinition.from_declaration(data)) == graph.fingerprint


def test_a_definition_is_refused_with_the_path_of_the_bad_field() -> None:
    bad = {
        "schema": "crewai.flow/v1",
        "name": "Bad",
        "methods": {"go": {"start": True, "do": {"call": "each", "in": "state.items"}}},
    }
    # pydantic's ValidationError (CrewAI's contract); the CLI's one line names the path.
    with pytest.raises(ValidationError) as caught:
        FlowDefinition.from_declaration(bad)
    line = str(invalid_definition(caught.value))
    assert line.startswith("methods.go.do.do: Field required")
    assert "\n" not in line
    with pytest.raises(ValidationError) as caught:
        FlowDefinition.from_declaration({**bad, "schema": "crewai.flow/v9"})
    assert str(invalid_definition(caught.value)).startswith("schema: ")
    with pytest.raises(ValidationError, match="names the method itself"):
        FlowDefinition.from_declaration(
            {"name": "Loop", "methods": {"a": {"listen": "a", "do": {"ref": "m:f"}}}}
        )
    with pytest.raises(DefinitionError, match="mapping"):
        FlowDefinition.from_declaration("- a list\n")
    with pytest.raises(ValueError, match="Provide contents or path"):
        FlowDefinition.from_declaration()
    with pytest.raises(ValueError, match=r"methods\.go\.do\.each\.do"):  # a ValueError, as CrewAI's
        FlowDefinition.from_declaration(bad)


@pytest.mark.processes
def test_runner_graph_prints_the_definition() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "graph",
            "tests.flows.cli:GatedFlow",
            "--definition",
            "yaml",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == GatedFlow.flow_definition().to_dict()


class Route(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


class AnnotatedRouters(Flow):
    @start()
    def begin(self) -> str:
        return "x"

    @router(begin)
    def literal(self) -> Literal["left", "right"]:
        return self.state["way"]

    @router(begin)
    def enum(self) -> Route:
        return self.state["route"]

    @router(begin)
    def container(self) -> list[Literal["up"]]:
        return self.state["list"]

    @listen(or_("left", "right", "approve", "reject"))
    def after(self) -> None: ...


def test_a_routers_return_annotation_declares_its_emit() -> None:
    methods = AnnotatedRouters.flow_definition().methods
    assert methods["literal"].emit == ["left", "right"]
    assert methods["enum"].emit == ["approve", "reject"]
    assert methods["container"].emit is None  # not a label: read from the body, unknown
