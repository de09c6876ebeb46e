"""Declarative flows (CrewAI's ``crewai.flow/v1``): ``Flow.from_declaration`` runs a
definition in process like a class flow, and ``runner submit flow.yaml`` runs it on real
workers from the definition its run records, each method a step; an ``each`` fans out as
parallel steps with a join, so a worker killed mid-fan-out re-runs only unfinished items.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from pydantic import ValidationError

from runner import (
    BaseTool,
    Flow,
    FlowDefinition,
    and_,
    flow_config,
    human_feedback,
    listen,
    or_,
    router,
    start,
    submit_definition,
)
from runner.crew.declared import declared_flow
from runner.distributed.client import RunHandle
from runner.distributed.engine import DECLARED_TASK, task_name
from runner.errors import DefinitionError
from runner.flow import transition as tr
from runner.flow.definition import invalid_definition
from runner.flow.llm import register_llm
from runner.store.models import RunStatus
from tests import cli_support
from tests._dist_support import eventually, private_pool
from tests.flows.declared import ECHO, count_key
from tests.test_flow_definition import Report

HERE = __name__


class ChainFlow(Flow):
    @start()
    def begin(self) -> str:
        return "hello"

    @listen(begin)
    def shout(self, text: str) -> str:
        return text.upper()

    @listen(and_(begin, shout))
    def join(self) -> str:
        self.state["joined"] = True
        return "joined"

    @listen(or_(shout, join))
    def either(self) -> str:
        return "either"


def test_a_class_flows_definition_runs_as_the_class_does() -> None:
    expected = ChainFlow()
    assert expected.kickoff() == "either"
    declared = Flow.from_declaration(ChainFlow.flow_definition().to_yaml())
    assert declared.kickoff() == "either"
    assert declared.method_outputs == expected.method_outputs
    assert declared.state["joined"] is True
    assert type(declared).graph().fingerprint == ChainFlow.graph().fingerprint
    assert (
        type(declared).flow_definition().methods.keys()
        == ChainFlow.flow_definition().methods.keys()
    )


ROUTE = """
schema: crewai.flow/v1
name: Routed
state:
  type: json_schema
  json_schema:
    type: object
    properties:
      score: {type: integer, default: 3}
      topic: {type: string, default: "flows"}
methods:
  seed:
    start: true
    do: {call: expression, expr: "'Topic: ' + state.topic"}
  decide:
    listen: seed
    router: true
    emit: [high, low]
    do: {call: expression, expr: "state.score > 5 ? 'high' : 'low'"}
  high_path:
    listen: high
    do: {call: code, ref: "tests.flows.declared:strip", with: {text: "  ${outputs.seed} is high "}}
  low_path:
    listen: low
    do:
      call: code
      ref: "tests.flows.declared:strip"
      with: {text: " ${outputs.seed}, ${state.score}"}
"""


def test_a_router_on_a_cel_condition_and_templates() -> None:
    low = Flow.from_declaration(ROUTE)
    assert low.kickoff() == "Topic: flows, 3"
    assert low.method_outputs == ["Topic: flows", "low", "Topic: flows, 3"]
    high = Flow.from_declaration(ROUTE)
    assert high.kickoff(inputs={"score": 9, "topic": "AI"}) == "Topic: AI is high"
    graph = type(high).graph()
    assert graph.methods["decide"].labels == frozenset({"high", "low"})
    assert task_name(type(high).flow_name(), "seed") == DECLARED_TASK


def _crew_definition(items: list[Any], pause: float = 0.0) -> dict[str, Any]:
    return {
        "schema": "crewai.flow/v1",
        "name": "Research",
        "state": {
            "type": "dict",
            "default": {"topic": "durable flows", "score": 7, "tag": "", "items": items},
        },
        "methods": {
            "research": {
                "start": True,
                "do": {
                    "call": "crew",
                    "with": {
                        "agents": {
                            "researcher": {
                                "role": "Researcher",
                                "goal": "Research {topic}",
                                "backstory": "Careful.",
                                "llm": ECHO,
                            }
                        },
                        "tasks": [
                            {
                                "name": "notes",
                                "description": "Research {topic}",
                                "expected_output": "Notes",
                                "agent": "researcher",
                            }
                        ],
                    },
                    "inputs": {"topic": "${state.topic}"},
                },
            },
            "decide": {
                "listen": "research",
                "router": True,
                "emit": ["many", "none"],
                "do": {
                    "call": "expression",
                    "expr": "state.score > 5 && size(state.items) > 0 ? 'many' : 'none'",
                },
            },
            "fan": {
                "listen": "many",
                "do": {
                    "call": "each",
                    "in": "state.items",
                    "do": [
                        {
                            "name": "work",
                            "action": {
                                "call": "code",
                                "ref": "tests.flows.declared:count_item",
                                "with": {"item": "${item}", "tag": "${state.tag}", "pause": pause},
                            },
                        },
                        {
                            "name": "label",
                            "if": "item % 2 == 0",
                            "action": {
                                "call": "expression",
                                "expr": "outputs.work + ' / ' + outputs.research.raw",
                            },
                        },
                    ],
                },
            },
            "nothing": {"listen": "none", "do": {"call": "expression", "expr": "'nothing'"}},
        },
    }


def _expected(items: list[int]) -> list[str]:
    notes = "notes on durable flows"
    return [f"done-{i} / {notes}" if i % 2 == 0 else f"done-{i}" for i in items]


def test_a_crew_action_and_an_each_in_process(redis_client: redis.Redis, worker_env: Any) -> None:
    tag = f"d{uuid.uuid4().hex[:8]}"
    flow = Flow.from_declaration(_crew_definition([1, 2, 3]))
    result = flow.kickoff(inputs={"tag": tag})
    assert result == _expected([1, 2, 3])
    assert flow.method_outputs[0]["raw"] == "notes on durable flows"
    assert flow.method_outputs[1] == "many"
    assert Flow.from_declaration(_crew_definition([])).kickoff() == "nothing"


def test_an_agent_action_runs_our_agent() -> None:
    definition = {
        "name": "Ask",
        "state": {"type": "dict", "default": {"question": "Research queues"}},
        "methods": {
            "answer": {
                "start": True,
                "do": {
                    "call": "agent",
                    "with": {
                        "role": "Analyst",
                        "goal": "Answer",
                        "backstory": "Precise.",
                        "settings": {"llm": ECHO},
                        "input": "${state.question}",
                    },
                },
            }
        },
    }
    assert Flow.from_declaration(definition).kickoff()["raw"] == "notes on queues"


# --- tool actions (CrewAI's `call: tool`) -----------------------------------------------------


def _tool_definition(with_: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "Searching",
        "state": {"type": "dict", "default": {"topic": "queues", "tag": "", "n": 3}},
        "methods": {
            "search": {
                "start": True,
                "do": {"call": "tool", "ref": "tests.flows.declared:CountingSearch", "with": with_},
            },
            "report": {
                "listen": "search",
                "do": {
                    "call": "expression",
                    "expr": "outputs.search.hits[size(outputs.search.hits) - 1]",
                },
            },
        },
    }


def test_a_tool_action_calls_run_with_its_rendered_arguments(redis_client: redis.Redis) -> None:
    tag = f"t{uuid.uuid4().hex[:8]}"
    # A whole `${...}` keeps its type (an int for `limit`); text around it makes a string.
    flow = Flow.from_declaration(
        _tool_definition(
            {"query": "durable ${state.topic}", "tag": "${state.tag}", "limit": "${state.n}"}
        )
    )
    assert flow.kickoff(inputs={"tag": tag}) == "durable queues #3"
    # The tool's result is the step's output, as JSON, for the steps after it.
    assert flow.method_outputs[0] == {
        "query": "durable queues",
        "hits": ["durable queues #1", "durable queues #2", "durable queues #3"],
    }
    assert int(redis_client.get(count_key(tag, "durable queues"))) == 1


def test_a_tool_converts_and_refuses_arguments_by_its_run_signature() -> None:
    from runner.crew.tools import ToolArgumentsError
    from tests.flows.declared import CountingSearch

    tool = CountingSearch()
    assert tool.name == "counting_search"
    assert set(tool.args_schema.model_fields) == {"query", "tag", "limit"}
    # A string template that renders "2" is the int the signature asks for.
    flow = Flow.from_declaration(
        _tool_definition(
            {"query": "q", "tag": "conv-${state.n}", "limit": "${string(state.n - 1)}"}
        )
    )
    assert flow.kickoff() == "q #2"
    with pytest.raises(ToolArgumentsError) as caught:
        Flow.from_declaration(
            _tool_definition({"query": "q", "tag": "t", "limit": "many"})
        ).kickoff()
    assert str(caught.value).startswith(
        "tool 'counting_search': limit: Input should be a valid integer"
    )
    assert "\n" not in str(caught.value)


class AsyncBodyTool(BaseTool):
    name: str = "async_body"

    def _run(self, word: str) -> Any:
        async def later() -> str:
            await asyncio.sleep(0)
            return word.upper()

        return later()


class NeedsKey(BaseTool):
    key: str

    def _run(self) -> str:
        return self.key


def test_a_tool_whose_run_returns_a_coroutine_gives_its_value_even_inside_an_event_loop() -> None:
    assert AsyncBodyTool().run(word="loud") == "LOUD"

    async def inside_a_loop() -> Any:
        return AsyncBodyTool().run(word="still")

    assert asyncio.run(inside_a_loop()) == "STILL"
    definition = {
        "name": "AsyncTool",
        "methods": {
            "shout": {
                "start": True,
                "do": {"call": "tool", "ref": f"{HERE}:AsyncBodyTool", "with": {"word": "hey"}},
            }
        },
    }
    assert Flow.from_declaration(definition).kickoff() == "HEY"


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        (f"{HERE}:NeedsKey", "cannot instantiate tool ref"),
        (f"{HERE}:HERE", "is not a tool"),
        (f"{HERE}.AsyncBodyTool", "expected 'module:qualname'"),
    ],
)
def test_a_tool_ref_that_names_no_tool_is_refused_naming_the_field(ref: str, says: str) -> None:
    definition = {
        "name": "BadTool",
        "methods": {"use": {"start": True, "do": {"call": "tool", "ref": ref}}},
    }
    with pytest.raises(DefinitionError, match=rf"^methods\.use\.do\.ref: .*{says}"):
        Flow.from_declaration(definition).kickoff()


def test_a_bad_template_is_pydantics_validation_error_and_one_line_for_the_cli() -> None:
    bad = _tool_definition({"query": "a ${state.topic", "tag": "t"})
    with pytest.raises(ValidationError) as caught:
        FlowDefinition.from_declaration(bad)
    line = str(invalid_definition(caught.value))
    assert line.startswith("methods.search.do.with.query: unterminated ${...}"), line
    assert "\n" not in line
    bad = _tool_definition({"query": "x ${} y", "tag": "t"})
    with pytest.raises(ValidationError, match="empty CEL expression"):
        FlowDefinition.from_declaration(bad)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda d: d["methods"]["fan"]["do"].pop("in"), "methods.fan.do.in: Field required"),
        (
            lambda d: d["methods"]["decide"]["do"].update(expr="state.score >"),
            "methods.decide.do.expr: invalid CEL",
        ),
        (
            lambda d: d["methods"]["decide"]["do"].update(expr="secrets.key"),
            "methods.decide.do.expr: unknown CEL root 'secrets'",
        ),
        (
            lambda d: d["methods"]["fan"]["do"]["do"][0]["action"].update(ref="no-colon"),
            "methods.fan.do.do[0].action.ref: expected 'module:qualname', got 'no-colon'",
        ),
        (
            lambda d: d["methods"]["fan"]["do"]["do"][1].update({"if": "state.x +"}),
            "methods.fan.do.do[1].if: invalid CEL",
        ),
        (
            lambda d: d["methods"]["research"]["do"].update(call="script", code="1"),
            "methods.research.do",
        ),
        (lambda d: d["methods"]["nothing"].pop("listen"), "methods.nothing: a method needs"),
    ],
)
def test_a_malformed_definition_is_refused_with_the_fields_path(change: Any, path: str) -> None:
    definition = _crew_definition([1])
    change(definition)
    # A definition that does not validate is pydantic's ValidationError (as CrewAI's); one
    # the runner cannot make a flow of is a DefinitionError. Either is one line with its path.
    with pytest.raises((DefinitionError, ValidationError)) as caught:
        declared_flow(definition)
    error = caught.value
    line = str(invalid_definition(error) if isinstance(error, ValidationError) else error)
    assert line.startswith(path), line
    assert "\n" not in line


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_support.run(*args, env=env)


def test_runner_submit_refuses_a_malformed_file_before_storing_anything(
    worker_env: dict[str, str], tmp_path: Path, rt: Any
) -> None:
    definition = _crew_definition([1])
    definition["methods"]["fan"]["do"]["in"] = "state.items +"
    bad = tmp_path / "flow.yaml"
    bad.write_text(yaml.safe_dump(definition))
    before = rt.store.run_ids()
    done = _cli(worker_env, "submit", str(bad), "--input", "tag=x")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "methods.fan.do.in: invalid CEL" in done.stderr
    assert "Traceback" not in done.stderr
    assert rt.store.run_ids() == before


def test_submit_definition_runs_on_workers(rt: Any, redis_client: redis.Redis) -> None:
    tag = f"d{uuid.uuid4().hex[:8]}"
    handle = submit_definition(_crew_definition([5, 6]), {"tag": tag}, rt=rt)
    assert handle.result(timeout=30) == _expected([5, 6])
    latest = rt.store.latest(handle.run_id)
    assert latest.flow.startswith("runner.crew.declared:D_")
    recorded = FlowDefinition.from_declaration(_crew_definition([5, 6]))
    assert declared_flow(recorded).flow_path() == latest.flow  # the run carries its definition


def test_a_tool_action_runs_once_as_a_step_on_workers(rt: Any, redis_client: redis.Redis) -> None:
    tag = f"t{uuid.uuid4().hex[:8]}"
    definition = _tool_definition({"query": "${state.topic}", "tag": "${state.tag}"})
    handle = submit_definition(definition, {"tag": tag}, rt=rt)
    assert handle.result(timeout=30) == "queues #2"
    latest = rt.store.latest(handle.run_id)
    # The tool's output is recorded as the step's output, and the tool ran once.
    assert tr.record_of(latest).outputs["search"] == {
        "query": "queues",
        "hits": ["queues #1", "queues #2"],
    }
    assert int(redis_client.get(count_key(tag, "queues"))) == 1


def test_a_tool_outside_the_workers_allow_list_is_refused_at_submit(rt: Any) -> None:
    from runner.distributed.engine import FlowNotAllowed

    definition = _tool_definition({"query": "q", "tag": "t"})
    definition["methods"]["search"]["do"]["ref"] = f"{HERE}:AsyncBodyTool"
    before = rt.store.run_ids()
    with pytest.raises(FlowNotAllowed, match=r"^methods\.search\.do\.ref: "):
        submit_definition(definition, {}, rt=rt)
    assert rt.store.run_ids() == before


def _child_of(rt: Any, run_id: str) -> str | None:
    found = [r for r in rt.store.run_ids(f"{run_id}-") if r != run_id]
    return found[0] if found else None


@pytest.mark.processes
def test_a_yaml_flow_from_the_cli_survives_a_worker_killed_mid_fan_out(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    items = list(range(20))
    tag = f"d{uuid.uuid4().hex[:8]}"
    source = tmp_path / "research.yaml"
    source.write_text(yaml.safe_dump(_crew_definition(items, pause=0.5), sort_keys=False))
    with private_pool(worker_env, str(tmp_path)) as (pool, rt, env):
        worker = pool.start(concurrency=2)
        done = _cli(env, "submit", str(source), "--input", f"tag={tag}")
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.strip()
        child = eventually(lambda: _child_of(rt, run_id), timeout=60)

        def finished_items() -> set[str]:
            latest = rt.store.latest(child)
            outputs = tr.record_of(latest).outputs if latest is not None else {}
            return {m for m in outputs if m.startswith("item_")}

        eventually(lambda: len(finished_items()) >= 4, timeout=60)
        pool.kill(worker)  # mid-fan-out: some items done, some running, most not started
        done_before = finished_items()
        assert 4 <= len(done_before) < 20
        started = {i for i in items if redis_client.get(count_key(tag, i))}
        assert started >= {int(m.removeprefix("item_")) for m in done_before}

        pool.start(concurrency=2)  # recovery takes over the dead worker's steps
        assert RunHandle(run_id, rt).result(timeout=90) == _expected(items)
        status = _cli(env, "status", run_id, "--json")
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["result"] == _expected(items)
        runs = {i: int(redis_client.get(count_key(tag, i)) or 0) for i in items}
        for name in done_before:  # finished before the kill: never run again
            assert runs[int(name.removeprefix("item_"))] == 1
        assert all(n >= 1 for n in runs.values())
        assert sum(runs.values()) <= 20 + 2  # at most the two in flight ran twice
        latest = rt.store.latest(run_id)
        assert latest.status is RunStatus.SUCCEEDED
        steps = tr.record_of(latest).outputs
        assert set(steps) == {"research", "decide", "fan"}
    keys = list(redis_client.scan_iter(f"decl-test:{tag}:*"))
    if keys:
        redis_client.delete(*keys)


def test_a_declared_run_is_cancelled_resumed_and_forked_from_the_cli(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis, rt: Any
) -> None:
    items = list(range(8))
    tag = f"d{uuid.uuid4().hex[:8]}"
    source = tmp_path / "research.json"
    source.write_text(json.dumps(_crew_definition(items, pause=1.5)))
    done = _cli(worker_env, "submit", str(source), "--input", f"tag={tag}")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    child = eventually(lambda: _child_of(rt, run_id), timeout=60)

    def finished_items() -> set[str]:
        latest = rt.store.latest(child)
        outputs = tr.record_of(latest).outputs if latest is not None else {}
        return {m for m in outputs if m.startswith("item_")}

    eventually(lambda: len(finished_items()) >= 2, timeout=60)
    assert _cli(worker_env, "cancel", run_id).returncode == 0
    eventually(lambda: rt.store.latest(child).status is RunStatus.CANCELLED, timeout=30)
    done_before = finished_items()
    assert len(done_before) < len(items)

    resumed = _cli(worker_env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert RunHandle(run_id, rt).result(timeout=60) == _expected(items)
    for name in done_before:
        assert int(redis_client.get(count_key(tag, int(name.removeprefix("item_"))))) == 1

    # A fork from the checkpoint after the crew, with another score: the router goes the
    # other way and the crew is not run again.
    research = next(
        c
        for c in rt.store.history(run_id, limit=200)
        if c.step == "research"
        and c.error is None
        and "research" in tr.record_of(c).outputs
        and "decide" not in tr.record_of(c).outputs
    )
    forked = _cli(worker_env, "fork", research.id, "--set", "score=1", "--json")
    assert forked.returncode == 0, forked.stderr
    new_run = json.loads(forked.stdout)["run_id"]
    assert RunHandle(new_run, rt).result(timeout=60) == "nothing"
    assert "research" not in {
        c.step for c in rt.store.history(new_run, limit=200) if c.event.endswith("finished")
    } - {None}
    keys = list(redis_client.scan_iter(f"decl-test:{tag}:*"))
    if keys:
        redis_client.delete(*keys)


def test_runner_graph_draws_a_definition_file(tmp_path: Path) -> None:
    source = tmp_path / "routed.yaml"
    source.write_text(ROUTE)
    done = _cli({}, "--redis-url", "redis://127.0.0.1:1/0", "graph", str(source))
    assert done.returncode == 0, done.stderr
    assert done.stdout == declared_flow(path=source).graph().to_mermaid()
    again = _cli({}, "graph", str(source), "--definition", "json")
    assert json.loads(again.stdout) == FlowDefinition.from_declaration(ROUTE).to_dict()


class Approving:
    """A reviewer who approves at once."""

    def request_feedback(self, context: Any, flow: Any) -> str:
        return "ship it"


class Reviewed(Flow[Report]):
    @start()
    @human_feedback(message="Ship?", emit=["approved", "hold"], llm="decl-test-judge")
    def draft(self) -> str:
        self.state.notes.append("drafted")
        return f"draft on {self.state.topic}"

    @listen("approved")
    def ship(self) -> str:
        return "shipped " + ",".join(self.state.notes)

    @router(ship)
    def after(self) -> str:
        return "done"


def test_a_class_flows_definition_keeps_its_state_model_and_its_review() -> None:
    register_llm("decl-test-judge", lambda prompt: "approved")
    flow_config.hitl_provider = Approving()
    try:
        declared = Flow.from_declaration(Reviewed.flow_definition().to_json())
        assert isinstance(declared.state, Report)
        assert declared.kickoff() == "done"
        assert declared.method_outputs[1] == "shipped drafted"  # the body ran once
        assert declared.last_human_feedback is not None
        assert declared.last_human_feedback.outcome == "approved"
    finally:
        flow_config.hitl_provider = None
        register_llm("decl-test-judge", None)


def test_a_code_reference_outside_the_workers_allow_list_is_refused_at_submit(rt: Any) -> None:
    from runner.distributed.engine import FlowNotAllowed

    definition = _crew_definition([1])
    definition["methods"]["fan"]["do"]["do"][0]["action"]["ref"] = "os:system"
    before = rt.store.run_ids()
    with pytest.raises(FlowNotAllowed, match=r"^methods\.fan\.do\.do\[0\]\.action\.ref: os:system"):
        submit_definition(definition, {"tag": "x"}, rt=rt)
    assert rt.store.run_ids() == before


FAILING = {
    "name": "Failing",
    "state": {"type": "dict", "default": {"text": " ok ", "ready": False}},
    "methods": {
        "clean": {
            "start": True,
            "do": {
                "call": "code",
                "ref": "tests.flows.declared:strip",
                "with": {"text": "${state.text}"},
            },
        },
        "check": {
            "listen": "clean",
            "do": {"call": "expression", "expr": "state.ready ? outputs.clean : state.missing"},
        },
    },
}


def test_a_declared_run_resumes_from_its_checkpoint_file_with_its_definition(
    tmp_path: Path,
) -> None:
    from runner import CheckpointConfig

    flow = Flow.from_declaration(FAILING, checkpoint=CheckpointConfig(location=str(tmp_path)))
    with pytest.raises(
        DefinitionError, match=r"methods\.check\.do\.expr: failed to evaluate CEL expression"
    ):
        flow.kickoff()
    newest = sorted(tmp_path.rglob("*.json"))[-1]
    again = Flow.from_checkpoint(str(newest), definition=FAILING)  # CrewAI's signature
    assert type(again).flow_definition().name == "Failing"
    assert again.kickoff(inputs={"ready": True}) == "ok"
    assert again.method_outputs == ["ok"]  # clean is not run again; check is


def test_a_recorded_definition_that_no_longer_validates_is_a_one_line_definition_error() -> None:
    import base64
    import zlib

    from runner.crew import declared
    from runner.flow.loading import load_flow

    # As a run recorded it (runner.crew.declared:D_<compressed JSON>), with an agent input
    # that is not text: this version refuses it when the path is loaded, naming the field.
    text = json.dumps(
        {
            "name": "Old",
            "methods": {"a": {"start": True, "do": {"call": "agent", "with": {"input": 5}}}},
        }
    )
    packed = base64.urlsafe_b64encode(zlib.compress(text.encode())).decode().rstrip("=")
    with pytest.raises(DefinitionError) as caught:
        load_flow(f"{declared.DECLARED_MODULE}:{declared.PREFIX}{packed}")
    assert str(caught.value).startswith("methods.a.do.with.input: agent.input must be a string")
    assert "\n" not in str(caught.value)
