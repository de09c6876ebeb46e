"""CrewAI behaviours of flows as data that its own test suite measures (``make crewai-suite``):
the flow picture (``build_flow_structure``, ``visualize_flow_structure``, ``plot``),
conditions in CrewAI's dict form, describing a class that cannot run yet, ``Expression``,
backends declaring their settings as fields, and a review over a router."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from runner import (
    Flow,
    FlowPersistence,
    FlowState,
    and_,
    human_feedback,
    listen,
    or_,
    persist,
    router,
    start,
)
from runner.errors import DefinitionError, InvalidCondition
from runner.flow import definition as flow_definition
from runner.flow.expressions import Expression, ExpressionError
from runner.flow.visualization import build_flow_structure, visualize_flow_structure


class Pipeline(Flow):
    """Two starts joined by and_/or_, a router with declared labels, listeners of them."""

    @start()
    def fetch(self) -> str:
        return "fetched"

    @start()
    def load(self) -> str:
        return "loaded"

    @listen(and_(fetch, load))
    def merge(self) -> str:
        return "merged"

    @listen(or_(fetch, load))
    def either(self) -> str:
        return "either"

    @router(merge, emit=["good", "bad"])
    def judge(self) -> str:
        return "good"

    @listen(or_("good", "bad"))
    def report(self) -> str:
        return "reported"

    @listen(and_("good", merge))
    def archive(self) -> str:
        return "archived"


def edges(structure: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    return [e for e in structure["edges"] if all(e[k] == v for k, v in match.items())]


def test_a_flows_picture_has_a_node_per_method_and_edges_from_its_triggers_and_labels():
    structure = build_flow_structure(Pipeline())

    assert set(structure["nodes"]) == {
        "fetch",
        "load",
        "merge",
        "either",
        "judge",
        "report",
        "archive",
    }
    assert structure["start_methods"] == ["fetch", "load"]
    assert structure["router_methods"] == ["judge"]
    assert len(edges(structure, target="merge", condition_type="AND")) == 2
    assert len(edges(structure, target="either", condition_type="OR")) == 2
    # each label the router declares reaches a listener naming it outside an and_
    assert {e["router_event"] for e in edges(structure, source="judge", target="report")} == {
        "good",
        "bad",
    }
    assert edges(structure, source="judge", target="archive") == []
    assert edges(structure, source="merge", target="archive", condition_type="AND")
    merge = structure["nodes"]["merge"]
    assert merge["condition_type"] == "AND"
    assert merge["trigger_condition"] == {"type": "AND", "conditions": ["fetch", "load"]}
    assert structure["nodes"]["judge"]["router_events"] == ["bad", "good"]
    assert structure["nodes"]["fetch"]["class_name"] == "Pipeline"
    json.dumps(structure)  # JSON data, for the page's script


def test_the_picture_of_a_class_and_of_its_declaration_are_the_same():
    declared = flow_definition.FlowDefinition.from_declaration(Pipeline.flow_definition().to_json())

    assert build_flow_structure(declared) == build_flow_structure(Pipeline)


def test_a_router_with_unknown_labels_and_a_trigger_nothing_emits_are_warned(caplog):
    class Open(Flow):
        @start()
        def begin(self) -> str:
            return "x"

        @router(begin)
        def pick(self) -> str:
            return self.state["where"]  # labels unknown until it runs

        @listen("somewhere")
        def go(self) -> str:
            return "went"

    with caplog.at_level(logging.WARNING, logger="runner.flow.visualization"):
        structure = build_flow_structure(Open)

    messages = [r.getMessage() for r in caplog.records]
    assert any("Router events for 'pick' are dynamic" in m for m in messages)
    assert any("could not match listener triggers" in m and "somewhere" in m for m in messages)
    assert edges(structure, is_router_event=True) == []


def test_plot_writes_a_page_with_its_stylesheet_and_a_script_holding_the_structure(tmp_path):
    class Tricky(Flow):
        """A description with </script> in it."""

        @start()
        def begin(self) -> str:
            """Says </script> too."""
            return "x"

    page = Path(Tricky().plot(str(tmp_path / "pic.html"), show=False))

    assert page == (tmp_path / "pic.html").resolve() and page.is_file()
    html = page.read_text()
    assert "<!DOCTYPE html>" in html and 'id="network-container"' in html
    assert "pic_style.css" in html and "pic_script.js" in html
    script = (tmp_path / "pic_script.js").read_text()
    assert "class NetworkManager" in script and "</script>" not in script
    data = script.split("const FLOW_STRUCTURE = ", 1)[1].split(";\n", 1)[0]
    assert json.loads(data) == build_flow_structure(Tricky)
    assert (tmp_path / "pic_style.css").read_text().startswith(":root")
    # visualize_flow_structure adds the suffix a bare name lacks
    assert visualize_flow_structure({"nodes": {}, "edges": []}, tmp_path / "bare", show=False)
    assert (tmp_path / "bare.html").is_file()


def test_a_class_without_a_start_is_described_but_refused_when_run():
    class NoStart(Flow):
        @router(emit=["go"])
        def decide(self) -> str:
            return "go"

        @listen("go")
        def act(self) -> str:
            return "acted"

    definition = NoStart.flow_definition()
    assert definition.methods["decide"].router is True
    assert definition.methods["decide"].emit == ["go"]
    assert build_flow_structure(NoStart)["start_methods"] == []
    with pytest.raises(DefinitionError, match="NoStart has no @start"):
        NoStart().kickoff()


def test_an_invalid_trigger_is_a_value_error_saying_so():
    with pytest.raises(InvalidCondition, match="Invalid condition") as caught:
        start(123)
    assert isinstance(caught.value, ValueError)


def test_or_and_equal_crewais_dict_form_which_is_also_taken_as_a_trigger():
    assert and_("a", or_("b")) == {
        "type": "AND",
        "conditions": ["a", {"type": "OR", "conditions": ["b"]}],
    }
    assert and_("a", "b") != {"type": "OR", "conditions": ["a", "b"]}
    assert and_("a", "b") != or_("a", "b")
    assert len({and_("a", "b"), and_("a", "b")}) == 1

    class Joined(Flow):
        @start()
        def one(self) -> str:
            return "1"

        @start()
        def two(self) -> str:
            return "2"

        @listen({"type": "AND", "conditions": ["one", "two"]})
        def both(self) -> str:
            return "both"

    assert Joined.flow_definition().methods["both"].listen == {"and": ["one", "two"]}
    assert Joined().kickoff() == "both"


class Shelf(FlowPersistence):
    """A CrewAI-style backend: settings as annotated fields, states kept by the class."""

    shelf: str = "default"
    verbose_saves: bool = False
    kept: ClassVar[dict[str, list[str]]] = {}

    def init_db(self) -> None:
        """Nothing to create."""

    def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None:
        Shelf.kept.setdefault(self.shelf, []).append(method_name)

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        return None


def test_a_backend_declaring_fields_takes_them_as_keywords_and_keeps_states_its_own_way():
    backend = Shelf(shelf="reports")
    assert backend.shelf == "reports" and backend.verbose_saves is False
    assert Shelf().shelf == "default" and backend.persistence_type == "base"
    with pytest.raises(TypeError, match="unexpected keyword arguments: kept"):
        Shelf(kept={})

    class Saved(Flow[FlowState]):
        @persist(backend)
        @start()
        def begin(self) -> str:
            return "saved"

    assert Saved().kickoff() == "saved"
    assert Shelf.kept["reports"] == ["begin"]


def test_a_backend_with_a_setting_named_store_is_not_taken_for_a_checkpoint_store():
    class Named(Shelf):
        store: str = "shelf-b"

    class Saved(Flow[FlowState]):
        @persist(Named(shelf="named"))
        @start()
        def begin(self) -> str:
            return "saved"

    assert Saved().kickoff() == "saved"
    assert Shelf.kept["named"] == ["begin"]


class Payload(BaseModel):
    name: str


@dataclass
class Row:
    payload: Payload


def test_an_expression_evaluates_over_its_own_context_or_the_one_given():
    expression = Expression("state.score * 2", context={"state": {"score": 21}})
    assert expression.evaluate() == 42
    assert expression.evaluate({"state": {"score": 1}}) == 2
    with pytest.raises(ExpressionError, match="failed to evaluate CEL expression"):
        expression.evaluate({})  # an empty context is a context, not "use mine"

    template = Expression(
        {"n": "${state.score}", "s": "got ${state.score}"}, {"state": {"score": 3}}
    )
    assert template.render_template() == {"n": 3, "s": "got 3"}

    # models and dataclasses in the context are read as their fields
    assert Expression("item.payload.name", {"item": Row(Payload(name="q"))}).evaluate() == "q"


@pytest.mark.parametrize("text", ["{'a': 1/0}", "{'a': [1, state.missing]}", "{'a': {'b': 1/0}}"])
def test_an_error_inside_a_map_or_list_fails_the_evaluation(text):
    with pytest.raises(ExpressionError, match="failed to evaluate CEL expression"):
        Expression(text, {"state": {}}).evaluate()


def test_an_error_cel_logic_short_circuits_is_not_one():
    assert Expression("{'ok': false && 1/0 == 1}", {"state": {}}).evaluate() == {"ok": False}


def test_an_expression_from_a_flow_reads_its_state_outputs_and_local_names():
    class Scored(Flow):
        @start()
        def begin(self) -> None:
            self.state["score"] = 5

    flow = Scored()
    flow.kickoff()
    expression = Expression.from_flow(
        "state.score + item + outputs.begin", flow, {"item": 1}, outputs={"begin": 10}
    )
    assert expression.evaluate() == 16


def test_a_review_with_emit_over_a_router_takes_its_labels_from_the_review():
    class Reviewed(Flow):
        @start()
        def begin(self) -> str:
            return "data"

        @human_feedback(message="Review:", emit=["approved", "rejected"], llm="gpt-4o-mini")
        @router(begin, emit=["x", "y"])
        def route(self) -> str:
            return "x"

        @listen("approved")
        def go_on(self) -> str:
            return "ok"

    method = Reviewed.flow_definition().methods["route"]
    assert method.router is True and method.emit is None
    assert method.human_feedback is not None
    assert method.human_feedback.emit == ["approved", "rejected"]
    assert Reviewed.graph().methods["route"].labels == {"approved", "rejected"}


def test_crewais_names_for_the_definition_models_are_the_same_models():
    loaded = flow_definition.FlowDefinition.model_validate(
        {"name": "Typed", "state": {"type": "json_schema", "json_schema": {"type": "object"}}}
    )
    assert isinstance(loaded.state, flow_definition.FlowJsonSchemaStateDefinition)
    assert flow_definition.FlowCodeActionDefinition is flow_definition.CodeAction
    assert flow_definition.FlowEachStepDefinition is flow_definition.EachStep


# --- declared flows: persist, a review's provider, functions given the flow --------------------


class Ledger(FlowPersistence):
    """A backend named in definitions by ``persistence_type: Ledger`` and its fields."""

    book: str = "main"
    saves: ClassVar[dict[str, list[tuple[str, dict[str, Any]]]]] = {}
    pending: ClassVar[dict[str, Any]] = {}

    def init_db(self) -> None:
        """Nothing to create."""

    def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None:
        Ledger.saves.setdefault(self.book, []).append((method_name, dict(state_data)))

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        found = [s for _, s in Ledger.saves.get(self.book, []) if s.get("id") == flow_uuid]
        return found[-1] if found else None

    def save_pending_feedback(self, flow_uuid: str, context: Any, state_data: Any) -> None:
        Ledger.pending[flow_uuid] = (dict(state_data), context)

    def load_pending_feedback(self, flow_uuid: str) -> Any:
        return Ledger.pending.get(flow_uuid)

    def clear_pending_feedback(self, flow_uuid: str) -> None:
        Ledger.pending.pop(flow_uuid, None)


def count(flow: Flow) -> int:
    """A module function whose first parameter no ``with`` fills: it is given the flow."""
    flow.state["count"] = flow.state.get("count", 0) + 1
    return flow.state["count"]


def count_from(flow: Flow, previous: int) -> int:
    """Given the flow and its trigger's output."""
    return previous + 10


def add(a: int, b: int) -> int:
    """Every parameter from ``with``: called with them only."""
    return a + b


def declared(persist_flow: dict[str, Any] | None, **methods: dict[str, Any]) -> dict[str, Any]:
    here = __name__
    shape = {
        "first": {"do": {"ref": f"{here}:count"}, "start": True},
        "second": {"do": {"ref": f"{here}:count_from"}, "listen": "first"},
        "third": {
            "do": {
                "call": "code",
                "ref": f"{here}:add",
                "with": {"a": "${outputs.second}", "b": 1},
            },
            "listen": "second",
        },
    }
    for name, extra in methods.items():
        shape[name] = {**shape[name], **extra}
    return {
        "schema": "crewai.flow/v1",
        "name": "Counting",
        "persist": persist_flow,
        "methods": shape,
    }


def test_a_code_function_is_given_the_flow_when_with_does_not_fill_its_first_parameter():
    flow = Flow.from_declaration(declared(None))
    assert flow.kickoff() == 12
    assert flow.state["count"] == 1


def test_a_declared_flow_persists_every_method_to_the_backend_its_definition_names():
    backend = {"persistence_type": "Ledger", "book": "flow-level"}
    flow = Flow.from_declaration(declared({"enabled": True, "persistence": backend}))
    flow.kickoff()
    assert [m for m, _ in Ledger.saves["flow-level"]] == ["first", "second", "third"]
    assert Ledger.saves["flow-level"][0][1]["count"] == 1


def test_a_method_may_opt_out_of_the_flows_persist_or_persist_alone():
    backend = {"persistence_type": "Ledger", "book": "opt-out"}
    flow = Flow.from_declaration(
        declared({"enabled": True, "persistence": backend}, second={"persist": {"enabled": False}})
    )
    flow.kickoff()
    assert [m for m, _ in Ledger.saves["opt-out"]] == ["first", "third"]

    alone = {"enabled": True, "persistence": {"persistence_type": "Ledger", "book": "alone"}}
    Flow.from_declaration(declared(None, first={"persist": alone})).kickoff()
    assert [m for m, _ in Ledger.saves["alone"]] == ["first"]


def test_a_flow_naming_two_persistences_or_an_unknown_one_is_refused_in_one_line():
    one = {"persistence_type": "Ledger", "book": "one"}
    other = {"enabled": True, "persistence": {"persistence_type": "Ledger", "book": "two"}}
    with pytest.raises(DefinitionError, match="keeps its states in one persistence"):
        Flow.from_declaration(
            declared({"enabled": True, "persistence": one}, second={"persist": other})
        )
    unknown = {"enabled": True, "persistence": {"persistence_type": "Nowhere"}}
    with pytest.raises(DefinitionError, match="persistence_type: no FlowPersistence class named"):
        Flow.from_declaration(declared(unknown))


@persist(Ledger(book="class-decorated"))
class Decorated(Flow):
    @start()
    def first(self) -> str:
        return "one"

    @listen(first)
    def second(self) -> str:
        return "two"


def test_a_class_with_a_fielded_backend_round_trips_through_its_definition():
    definition = Decorated.flow_definition()
    assert definition.persist is not None
    assert definition.persist.persistence == {
        "persistence_type": "Ledger",
        "book": "class-decorated",
    }

    again = flow_definition.FlowDefinition.from_declaration(definition.to_yaml())
    # the class's methods are referenced by import path, so the declared flow runs them
    before = len(Ledger.saves.get("class-decorated", []))
    Flow.from_declaration(again).kickoff()
    assert [m for m, _ in Ledger.saves["class-decorated"][before:]] == ["first", "second"]


class Pauses:
    """A review provider given by reference: pauses every review."""

    def request_feedback(self, context: Any, flow: Any) -> str:
        from runner import HumanFeedbackPending

        raise HumanFeedbackPending(context=context)


class NeedsArguments:
    def __init__(self, token: str) -> None:
        self.token = token


def draft(flow: Flow) -> str:
    return "draft"


def publish(flow: Flow, review: Any) -> str:
    return f"published after {review.feedback!r}"


def reviewed(provider: str) -> dict[str, Any]:
    here = __name__
    return {
        "schema": "crewai.flow/v1",
        "name": "Reviewed",
        "persist": {"enabled": True, "persistence": {"persistence_type": "Ledger", "book": "hitl"}},
        "methods": {
            "write": {
                "do": {"ref": f"{here}:draft"},
                "start": True,
                "human_feedback": {"message": "Check it:", "provider": provider},
            },
            "ship": {"do": {"ref": f"{here}:publish"}, "listen": "write"},
        },
    }


def test_a_review_provider_by_reference_pauses_into_the_persistence_and_resumes_by_definition():
    from runner import HumanFeedbackPending

    definition = flow_definition.FlowDefinition.from_declaration(reviewed(f"{__name__}:Pauses"))
    pending = Flow.from_declaration(definition).kickoff()

    assert isinstance(pending, HumanFeedbackPending)
    flow_id = pending.context.flow_id
    assert flow_id in Ledger.pending  # kept by the @persist backend, not a default store
    resumed = Flow.from_pending(flow_id, Ledger(book="hitl"), definition=definition)
    assert resumed.resume("fine") == "published after 'fine'"
    assert flow_id not in Ledger.pending


@pytest.mark.parametrize(
    ("provider", "says"),
    [
        ("no_such_module_here:Provider", "unresolvable human_feedback.provider ref"),
        (f"{__name__}:NeedsArguments", "cannot instantiate human_feedback.provider ref"),
    ],
)
def test_a_provider_reference_that_cannot_be_made_fails_the_review_in_one_line(provider, says):
    flow = Flow.from_declaration(reviewed(provider))
    with pytest.raises(ValueError, match=says) as caught:
        flow.kickoff()
    assert "methods.write.human_feedback.provider" in str(caught.value)
    assert "\n" not in str(caught.value)


# --- declared flows: state from a JSON schema, CrewAI's wording for bad definitions ------------


def bump(flow: Flow) -> str:
    flow.state.count += 1
    flow.state.label = f"count={flow.state.count}"
    return flow.state.label


SCHEMA = {
    "title": "CounterState",
    "type": "object",
    "required": ["owner"],
    "properties": {
        "count": {"type": "integer", "default": 0},
        "label": {"type": "string", "default": "none"},
        "owner": {"type": "string"},
    },
}


def schema_flow(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": "crewai.flow/v1",
        "name": "Counter",
        "state": state,
        "methods": {"begin": {"do": {"ref": f"{__name__}:bump"}, "start": True}},
    }


def test_a_json_schema_state_is_a_model_of_its_properties_with_an_id():
    flow = Flow.from_declaration(schema_flow({"type": "json_schema", "json_schema": SCHEMA}))

    assert flow.kickoff(inputs={"owner": "ada"}) == "count=1"
    assert flow.state.count == 1 and flow.state.owner == "ada" and flow.state.id
    with pytest.raises(ValueError, match="Invalid inputs") as caught:
        Flow.from_declaration(schema_flow({"type": "json_schema", "json_schema": SCHEMA})).kickoff(
            inputs={"count": "many"}
        )
    assert "count" in str(caught.value)


def test_a_pydantic_state_that_cannot_be_imported_uses_its_schema_else_a_dict(caplog):
    missing = {"type": "pydantic", "ref": "no_such_module_here:State"}
    flow = Flow.from_declaration(schema_flow({**missing, "json_schema": SCHEMA}))
    assert flow.kickoff() == "count=1"

    with caplog.at_level(logging.WARNING, logger="runner.crew.declared"):
        plain = Flow.from_declaration(schema_flow(missing))
        Flow.from_declaration(schema_flow({"type": "unknown", "ref": "x:Y"}))
    assert plain.state["id"]
    falling = [r for r in caplog.records if "falling back to dict state" in r.getMessage()]
    assert [r.levelname for r in falling] == ["ERROR", "WARNING"]


STEP = {"name": "s", "action": {"call": "expression", "expr": "item"}}


@pytest.mark.parametrize(
    ("each", "says"),
    [
        ({"in": "state.rows", "do": [STEP]}, "each.in must evaluate to an array"),
        (
            {"in": "[1]", "do": [{**STEP, "if": "'yes'"}]},
            "if expression must evaluate to a boolean",
        ),
    ],
)
def test_an_each_over_a_non_list_or_with_a_non_boolean_if_is_a_value_error(each, says):
    definition = {
        "schema": "crewai.flow/v1",
        "name": "Rows",
        "state": {"type": "dict", "default": {"rows": "not a list"}},
        "methods": {"begin": {"do": {"call": "each", **each}, "start": True}},
    }
    with pytest.raises(ValueError, match=says):
        Flow.from_declaration(definition).kickoff()


def test_a_ref_not_of_the_form_module_qualname_says_what_was_expected():
    bad = schema_flow({"type": "dict"})
    bad["methods"]["begin"]["do"]["ref"] = "no-colon"
    # The definition is data (it loads); making a flow of it refuses the reference.
    definition = flow_definition.FlowDefinition.from_declaration(bad)
    with pytest.raises(ValueError, match="expected 'module:qualname', got 'no-colon'"):
        Flow.from_declaration(definition)


# --- a definition's config sets what a class flow's attributes set ----------------------------


class Answers:
    """An input provider given by reference."""

    def request_input(self, message: str, flow: Any, metadata: Any = None) -> str:
        return "answered"


def again(flow: Flow) -> str:
    return "again"


def looping(config: dict[str, Any]) -> dict[str, Any]:
    here = __name__
    return {
        "schema": "crewai.flow/v1",
        "name": "Looping",
        "config": config,
        "methods": {
            "begin": {"do": {"ref": f"{here}:again"}, "start": True},
            "spin": {
                "do": {"call": "expression", "expr": "'again'"},
                "listen": {"or": ["begin", "again"]},
                "router": True,
                "emit": ["again"],
            },
        },
    }


def test_a_definitions_config_sets_checkpoint_input_provider_and_stream(tmp_path):
    from runner import CheckpointConfig
    from runner.flow.streaming import FlowStreamSession

    config = {
        "checkpoint": {"location": str(tmp_path)},
        "input_provider": f"{__name__}:Answers",
        "stream": True,
    }
    flow = Flow.from_declaration(looping({**config, "max_method_calls": 3}))

    assert isinstance(flow.checkpoint, CheckpointConfig)
    assert flow.checkpoint.location == str(tmp_path)
    assert isinstance(flow.input_provider, Answers)
    assert flow.stream is True
    assert isinstance(flow.kickoff(), FlowStreamSession)
    with pytest.raises(DefinitionError, match=r"^config\.checkpoint: "):
        Flow.from_declaration(looping({"checkpoint": {"max_checkpoints": "many"}}))


def test_max_method_calls_caps_every_method_of_a_class_or_a_definition():
    with pytest.raises(RecursionError, match="spin has been called 2 times"):
        Flow.from_declaration(looping({"max_method_calls": 2})).kickoff()

    class Capped(Flow):
        max_method_calls = 3

        @start()
        def begin(self) -> None:
            pass

        @router(or_(begin, "again"), emit=["again"])
        def spin(self) -> str:
            return "again"

    assert Capped.graph().methods["spin"].max_calls == 3
    with pytest.raises(RecursionError, match="has been called 3 times"):
        Capped().kickoff()


# --- the authoring guide ------------------------------------------------------------------------


def test_the_guide_lists_the_models_fields_and_leaves_out_what_it_is_told_to():
    from runner.flow.expressions import (
        FLOW_TEMPLATE_EXPRESSION_EXAMPLES,
        FLOW_TEMPLATE_EXPRESSION_RULES,
    )

    full = flow_definition.FlowDefinition.skill()
    for field in ("schema", "methods", "listen", "router", "emit", "human_feedback"):
        assert f"`{field}`" in full
    assert "[Method](#method-methods)" in full and "### Method (`methods`)" in full
    assert all(rule in full for rule in FLOW_TEMPLATE_EXPRESSION_RULES)
    assert "call: expression" in full and "call: script" in full and "```yaml" in full

    trimmed = flow_definition.FlowDefinition.skill(
        skips=["expression_action", "script_action", "nonsense"]
    )
    assert "call: expression" not in trimmed and "call: script" not in trimmed
    assert "call: code" in trimmed and len(trimmed) < len(full)

    as_json = flow_definition.FlowDefinition.skill(examples_format="json")
    assert "```yaml" not in as_json and '"schema": "crewai.flow/v1"' in as_json
    assert all(e["code"] in as_json for e in FLOW_TEMPLATE_EXPRESSION_EXAMPLES["json"])
    # every example in the guide is a definition fragment that loads
    flow_definition.FlowDefinition.from_declaration(
        as_json.split("```json\n", 1)[1].split("\n```", 1)[0]
    )


# --- an agent on its own, the conversational block, CrewAI's wording for bad inputs ----------


def test_an_agent_kicks_off_on_its_own_sync_and_async() -> None:
    import asyncio

    from runner import Agent

    seen: list[str] = []

    def llm(prompt: str) -> str:
        seen.append(prompt)
        return "answer " + str(len(seen))

    agent = Agent("Analyst", "Answer", "Precise.", llm=llm)
    assert agent.kickoff("What is a queue?").raw == "answer 1"
    assert "Current Task: What is a queue?" in seen[0]
    # Chat messages: their contents make the task.
    messages = [{"role": "user", "content": "first"}, {"role": "user", "content": "second"}]
    assert asyncio.run(agent.kickoff_async(messages)).raw == "answer 2"
    assert "Current Task: first\nsecond" in seen[1]


def test_an_agent_actions_input_must_be_text_when_declared_and_when_rendered() -> None:
    from pydantic import ValidationError

    def agent_flow(value: Any) -> dict[str, Any]:
        return {
            "name": "Ask",
            "state": {"type": "dict", "default": {"n": 3}},
            "methods": {
                "answer": {
                    "start": True,
                    "do": {"call": "agent", "with": {"role": "A", "input": value}},
                }
            },
        }

    with pytest.raises(ValidationError, match=r"agent\.input must be a string, not int"):
        flow_definition.FlowDefinition.from_declaration(agent_flow(123))
    with pytest.raises(DefinitionError, match=r"^methods\.answer\.do\.with\.input: agent input"):
        Flow.from_declaration(agent_flow("${state.n}")).kickoff()


def test_a_crew_actions_inputs_must_be_a_mapping() -> None:
    from pydantic import ValidationError

    crew = {"agents": {"a": {"role": "A"}}, "tasks": [{"description": "d", "expected_output": "e"}]}
    for do in (
        {"call": "crew", "with": crew, "inputs": ["topic"]},
        {"call": "crew", "with": {**crew, "inputs": "topic"}},
    ):
        bad = {"name": "C", "methods": {"research": {"start": True, "do": do}}}
        with pytest.raises(ValidationError, match=r"crew\.inputs must be a mapping"):
            flow_definition.FlowDefinition.from_declaration(bad)


def test_the_conversational_block_is_crewais_model_with_its_defaults() -> None:
    def chat(block: dict[str, Any]) -> dict[str, Any]:
        return {"name": "Chat", "conversational": block, "methods": {}}

    loaded = flow_definition.FlowDefinition.from_declaration(chat({"llm": "echo-model"}))
    block = loaded.conversational
    assert isinstance(block, flow_definition.FlowConversationalDefinition)
    assert (block.enabled, block.llm, block.defer_trace_finalization) == (True, "echo-model", True)
    assert block.builtin_routes == ["converse", "end"]
    # Its data form loads again, and a flow made of it is conversational.
    again = flow_definition.FlowDefinition.from_declaration(loaded.to_dict())
    assert again.conversational == block
    assert type(Flow.from_declaration(again)).conversational is True
    off = flow_definition.FlowDefinition.from_declaration(chat({"enabled": False, "llm": "x"}))
    assert off.conversational is not None and off.conversational.enabled is False
    assert type(Flow.from_declaration(off)).conversational is False
