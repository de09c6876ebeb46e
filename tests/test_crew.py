"""Crews in process: definitions, task context, outputs, checkpoints, resume, crews in flows."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from runner import CheckpointConfig, Flow, FlowState, router, start
from runner.crew import (
    Agent,
    ChildRun,
    Crew,
    CrewOutput,
    CrewState,
    Task,
    TaskInput,
    TaskOutput,
    TaskOutputError,
    current_task,
)
from runner.distributed.client import load_flow
from runner.errors import DefinitionError, InvalidInputs
from runner.flow.context import WORKER, StepContext, running
from runner.flow.orchestrator import Activation
from runner.store.jsondir import JsonProvider
from tests.flows import crews
from tests.flows.crews import CrewPipeline, counts, make_crew, twelve


def echo(task: TaskInput) -> str:
    seen = ",".join(out.raw for out in task.context)
    return f"{task.name}[{seen}]"


def tag() -> str:
    return uuid.uuid4().hex


class Outline(BaseModel):
    points: list[str]


# --- definitions ----------------------------------------------------------------------------


def test_task_name_defaults_to_a_slug_of_the_description() -> None:
    task = Task("Research the {topic} market, in depth!", "notes", fn=echo)
    assert task.name == "research_the_topic_market_in_depth"
    assert Task("3 ideas", fn=echo).name == "task_3_ideas"


def test_task_names_must_be_unique_in_a_crew() -> None:
    with pytest.raises(DefinitionError, match="two tasks are named 'write'"):
        Crew(tasks=[Task("Write", fn=echo), Task("Write", fn=echo)])


def test_task_names_must_not_shadow_flow_attributes() -> None:
    with pytest.raises(DefinitionError, match="reserved"):
        Crew(tasks=[Task("x", name="kickoff", fn=echo)])


def test_task_needs_a_fn_or_an_agent_with_an_llm() -> None:
    with pytest.raises(DefinitionError, match="no fn and no agent"):
        Crew(tasks=[Task("Write", agent=Agent("Writer"))])


def test_context_must_name_earlier_tasks_of_the_crew() -> None:
    first, second = Task("One", fn=echo), Task("Two", fn=echo)
    second.context = [first]
    first.context = [second]
    with pytest.raises(DefinitionError, match="does not run before it"):
        Crew(tasks=[first, second])


def test_only_the_sequential_process_is_supported() -> None:
    with pytest.raises(DefinitionError, match="hierarchical"):
        Crew(tasks=[Task("One", fn=echo)], process="hierarchical")


def test_generated_flow_chains_one_method_per_task() -> None:
    flow_cls = twelve.as_flow()
    graph = flow_cls.graph()
    assert list(graph.methods) == [f"t{i:02d}" for i in range(1, 13)]
    assert graph.kickoff == ("t01",)
    assert graph.listeners("t07") == ("t08",)
    assert flow_cls.flow_name() == "crew_twelve"
    assert flow_cls.__module__ == "tests.flows.crews"
    assert flow_cls.flow_path() == "tests.flows.crews:twelve"
    assert twelve.as_flow() is flow_cls


def test_load_flow_turns_a_crew_path_into_its_generated_flow() -> None:
    assert load_flow("tests.flows.crews:twelve") is twelve.as_flow()


def test_crew_name_defaults_to_its_module_variable() -> None:
    globals()["unnamed_crew"] = crew = Crew(tasks=[Task("One", fn=echo)])
    try:
        assert crew.name == "unnamed_crew"
        assert crew.flow_path() == f"{__name__}:unnamed_crew"
        assert load_flow(crew.flow_path()) is crew.as_flow()
    finally:
        del globals()["unnamed_crew"]


def test_a_crew_outside_module_level_cannot_be_submitted() -> None:
    local = Crew(tasks=[Task("One", fn=echo)], name="local")
    with pytest.raises(DefinitionError, match="not a module-level variable"):
        local.submit({})


# --- running: context, placeholders, outputs ------------------------------------------------


def test_each_task_sees_the_outputs_of_the_tasks_before_it() -> None:
    crew = Crew(tasks=[Task(n, name=n, fn=echo) for n in ("one", "two", "three")])
    out = crew.kickoff()
    assert [t.raw for t in out.tasks_output] == ["one[]", "two[one[]]", "three[one[],two[one[]]]"]
    assert out.raw == "three[one[],two[one[]]]"


def test_context_limits_a_task_to_the_tasks_it_names() -> None:
    one, two = Task("One", name="one", fn=echo), Task("Two", name="two", fn=echo)
    three = Task("Three", name="three", fn=echo, context=[one])
    assert Crew(tasks=[one, two, three]).kickoff().raw == "three[one[]]"


def test_placeholders_are_filled_from_the_kickoff_inputs() -> None:
    seen: list[tuple[str, str]] = []

    def record(task: TaskInput) -> str:
        seen.append((task.description, task.expected_output))
        return "ok"

    crew = Crew(tasks=[Task("Research {topic} for {year}", "a {topic} {json}", fn=record)])
    crew.kickoff({"topic": "bees", "year": 2024, "json": {"a": 1}})
    assert seen == [("Research bees for 2024", 'a bees {"a": 1}')]


def test_a_missing_placeholder_input_fails_before_any_task_runs() -> None:
    ran: list[str] = []
    crew = Crew(
        tasks=[
            Task("First", fn=lambda t: ran.append(t.name) or "x"),
            Task("About {topic}", fn=echo),
        ]
    )
    with pytest.raises(InvalidInputs, match="needs input"):
        crew.kickoff({})
    assert ran == []


def test_the_state_holds_inputs_and_task_outputs_as_json() -> None:
    crew = Crew(tasks=[Task("Plan {topic}", "json", name="plan", fn=lambda t: {"n": 1})])
    flow = crew.as_flow()()
    flow.kickoff({"topic": "bees"})
    state = flow._dump()
    assert state["inputs"] == {"topic": "bees"}
    assert state["outputs"]["plan"]["json_dict"] == {"n": 1}
    assert state["outputs"]["plan"]["raw"] == '{"n": 1}'


def test_top_level_inputs_of_the_crew_state_are_kickoff_inputs() -> None:
    state = CrewState.model_validate({"topic": "bees", "inputs": {"year": 1}, "id": "r1"})
    assert state.inputs == {"year": 1, "topic": "bees"}
    assert state.id == "r1"


def test_output_pydantic_accepts_a_model_a_dict_or_json_text() -> None:
    results: list[Any] = [
        Outline(points=["a"]),
        {"points": ["b"]},
        'Sure! {"points": ["c"]} Hope this helps.',
    ]
    tasks = [
        Task(f"Outline {i}", output_pydantic=Outline, fn=lambda t, r=r: r)
        for i, r in enumerate(results)
    ]
    out = Crew(tasks=tasks).kickoff()
    assert [t.pydantic for t in out.tasks_output] == [Outline(points=[x]) for x in "abc"]
    assert out.pydantic == Outline(points=["c"])
    assert out.to_dict() == {"points": ["c"]}


def test_output_that_does_not_fit_output_pydantic_fails_the_task() -> None:
    crew = Crew(tasks=[Task("Outline", output_pydantic=Outline, fn=lambda t: "no json here")])
    with pytest.raises(TaskOutputError, match="no JSON"):
        crew.kickoff()


def test_a_task_returning_something_else_fails_clearly() -> None:
    with pytest.raises(TaskOutputError, match="returned int"):
        Crew(tasks=[Task("Count", fn=lambda t: 3)]).kickoff()


def test_crew_output_round_trips_through_json() -> None:
    crew = Crew(tasks=[Task("Outline", name="o", output_pydantic=Outline, fn=lambda t: "{}")])
    with pytest.raises(TaskOutputError):
        crew.kickoff()
    out = Crew(
        tasks=[Task("Outline", name="o", output_pydantic=Outline, fn=lambda t: Outline(points=[]))]
    ).kickoff()
    again = CrewOutput.model_validate(out.model_dump(mode="json"))
    assert again.tasks_output[0].name == "o"
    assert out.model_dump(mode="json")["pydantic"] == {"points": []}
    assert TaskOutput.load(out.tasks_output[0].dump(), crew.tasks[0]).pydantic == Outline(points=[])


def test_the_running_task_is_visible_to_llm_clients() -> None:
    seen: list[str] = []

    def llm(prompt: str) -> str:
        seen.append(current_task.get().name)
        return "fine"

    Crew(tasks=[Task("Write", name="write", agent=Agent("Writer", llm=llm))]).kickoff()
    assert seen == ["write"]


# --- agents ----------------------------------------------------------------------------------


class CallLLM:
    def call(self, prompt: str) -> str:
        return "via call"


class Message:
    content = "via invoke"


class InvokeLLM:
    def invoke(self, prompt: str) -> Message:
        return Message()


@pytest.mark.parametrize(
    ("llm", "answer"),
    [
        (lambda prompt: "via callable", "via callable"),
        (CallLLM(), "via call"),
        (InvokeLLM(), "via invoke"),
    ],
)
def test_an_agent_uses_any_llm_client_shape(llm: Any, answer: str) -> None:
    agent = Agent("Writer", "write well", "a pro", llm=llm)
    assert Crew(tasks=[Task("Write", agent=agent)]).kickoff().raw == answer


def test_the_agent_prompt_has_role_task_and_context() -> None:
    prompts: list[str] = []
    agent = Agent("Writer", "write well", "A pro.", llm=lambda p: prompts.append(p) or "done")
    first = Task("Research {topic}", "notes", name="research", fn=lambda t: "NOTES")
    second = Task("Write about {topic}", "an article", agent=agent)
    Crew(agents=[agent], tasks=[first, second]).kickoff({"topic": "bees"})
    (prompt,) = prompts
    assert "You are Writer. A pro." in prompt
    assert "Current Task: Write about bees" in prompt
    assert "expected criteria for your final answer: an article" in prompt
    assert prompt.endswith("This is the context you're working with:\nNOTES")


def test_an_llm_that_is_neither_a_client_nor_a_name_is_refused() -> None:
    with pytest.raises(DefinitionError, match="llm must be a client"):
        Agent("Writer", llm=42)


# --- checkpoints -----------------------------------------------------------------------------


def _history(location: Path, run_id: str) -> list[tuple[str, str | None]]:
    store = JsonProvider(location)
    return [(c.event, c.step) for c in reversed(store.history(run_id, limit=100))]


def _three(**options: Any) -> tuple[Crew, list[Task]]:
    tasks = [Task(n, name=n, fn=echo) for n in ("one", "two", "three")]
    return Crew(tasks=tasks, **options), tasks


def test_effective_checkpoint_inherits_task_then_agent_then_crew() -> None:
    crew_cfg, agent_cfg = CheckpointConfig(location="crew"), CheckpointConfig(location="agent")
    quiet = Agent("Quiet", llm=lambda p: "x", checkpoint=False)
    chatty = Agent("Chatty", llm=lambda p: "x", checkpoint=agent_cfg)
    plain = Agent("Plain", llm=lambda p: "x")
    tasks = [
        Task("a", agent=plain),
        Task("b", agent=quiet),
        Task("c", agent=chatty),
        Task("d", agent=quiet, checkpoint=True),
        Task("e", agent=chatty, checkpoint=False),
        Task("f", fn=echo),
    ]
    crew = Crew(agents=[quiet, chatty, plain], tasks=tasks, checkpoint=crew_cfg)
    got = [crew.effective_checkpoint(t) for t in tasks]
    assert got[0] is crew_cfg
    assert got[1] is None
    assert got[2] is agent_cfg
    assert got[3] == CheckpointConfig()
    assert got[4] is None
    assert got[5] is crew_cfg
    off = Crew(tasks=[Task("g", fn=echo)])
    assert off.effective_checkpoint(off.tasks[0]) is None


def test_crew_checkpoints_after_every_task_by_default(tmp_path: Path) -> None:
    crew, _ = _three(checkpoint=CheckpointConfig(location=str(tmp_path)))
    flow = crew.as_flow()()
    flow.kickoff()
    assert _history(tmp_path, flow.flow_id) == [
        ("flow_started", None),
        ("method_execution_finished", "one"),
        ("method_execution_finished", "two"),
        ("method_execution_finished", "three"),
    ]


def test_a_task_opted_out_writes_no_checkpoint(tmp_path: Path) -> None:
    crew, tasks = _three(checkpoint=CheckpointConfig(location=str(tmp_path)))
    tasks[1].checkpoint = False
    flow = crew.as_flow()()
    flow.kickoff()
    steps = [step for _, step in _history(tmp_path, flow.flow_id)]
    assert steps == [None, "one", "three"]


def test_an_agent_can_turn_checkpoints_on_for_its_tasks(tmp_path: Path) -> None:
    cfg = CheckpointConfig(location=str(tmp_path), on_events=["task_completed"])
    agent = Agent("Writer", llm=lambda p: "text", checkpoint=cfg)
    crew = Crew(tasks=[Task("One", name="one", fn=echo), Task("Two", name="two", agent=agent)])
    flow = crew.as_flow()()
    flow.kickoff()
    assert _history(tmp_path, flow.flow_id) == [("method_execution_finished", "two")]


def test_without_checkpointing_nothing_is_written(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    crew, _ = _three()
    crew.kickoff()
    assert list(tmp_path.iterdir()) == []


def test_a_crew_resumes_in_process_at_its_first_unfinished_task(tmp_path: Path) -> None:
    crew = make_crew("local_six", ["s1", "s2", "s3", "s4", "s5", "s6"])
    crew.checkpoint = CheckpointConfig(location=str(tmp_path))
    run = tag()
    flow = crew.as_flow()()
    with pytest.raises(RuntimeError, match="planned failure of s4"):
        flow.kickoff({"topic": "bees", "tag": run, "fail_once": "s4"})
    assert counts(run) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1}
    out = crew.kickoff(
        from_checkpoint=CheckpointConfig(location=str(tmp_path), restore_from=flow.flow_id)
    )
    assert counts(run) == {"s1": 1, "s2": 1, "s3": 1, "s4": 2, "s5": 1, "s6": 1}
    assert out.raw == "s6(s5(s4(s3(s2(s1(bees))))))"
    assert len(out.tasks_output) == 6


# --- crews inside flows, in process ------------------------------------------------------


def test_flow_of_four_crews_resumes_at_the_failed_task_of_the_third(tmp_path: Path) -> None:
    run = tag()
    cfg = CheckpointConfig(location=str(tmp_path))
    flow = CrewPipeline(checkpoint=cfg)
    with pytest.raises(RuntimeError, match="planned failure of c2"):
        flow.kickoff({"topic": "bees", "tag": run, "fail_once": "c2"})
    once = {t: 1 for t in ("a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2")}
    assert counts(run) == once

    resumed = CrewPipeline.from_checkpoint(
        CheckpointConfig(location=str(tmp_path), restore_from=flow.flow_id)
    )
    out = resumed.kickoff()
    assert counts(run) == {**once, "c2": 2, "c3": 1, "d1": 1, "d2": 1, "d3": 1}
    assert out["raw"] == "d3(d2(d1(c3(c2(c1(b3(b2(b1(a3(a2(a1(bees))))))))))))"
    assert [t["name"] for t in out["tasks_output"]] == ["d1", "d2", "d3"]


class OneCrewFlow(Flow[FlowState]):
    @start()
    def research(self) -> Any:
        return self.run_crew(crews.crew_a, {"topic": "bees", "tag": self.state.id})


def test_a_crew_output_is_the_flow_methods_output() -> None:
    flow = OneCrewFlow()
    out = flow.kickoff()
    assert out == CrewOutput.model_validate(out).model_dump(mode="json")
    assert out["raw"] == "a3(a2(a1(bees)))"


def test_on_workers_run_crew_returns_a_child_run_marker() -> None:
    from runner.flow.state import dump_state

    flow = OneCrewFlow()
    on_a_worker = StepContext(flow, Activation("research#1", "research", 1, "plan"), WORKER)
    with running(on_a_worker):
        marker = flow.research()
    assert marker == ChildRun(
        flow="tests.flows.crews:crew_a",
        name="crew_a",
        inputs={"topic": "bees", "tag": flow.state.id},
    )
    as_json = dump_state({"out": marker})["out"]
    assert ChildRun.from_output(as_json) == marker
    assert ChildRun.from_output({"flow": "x", "name": "y"}) is None


def test_using_the_marker_as_a_crew_output_explains_what_to_do() -> None:
    marker = ChildRun(flow="m:c", name="c")
    with pytest.raises(DefinitionError, match="read the CrewOutput in a @listen method"):
        _ = marker.raw


class RoutingFlow(Flow[FlowState]):
    @start()
    @router()
    def decide(self) -> str:
        out = self.run_crew(crews.crew_a, {"topic": "bees", "tag": self.state.id})
        return "ok" if out.raw else "retry"


def test_a_router_cannot_run_a_crew() -> None:
    with pytest.raises(DefinitionError, match="decide is a router"):
        RoutingFlow().kickoff()


def test_an_async_task_fn_is_awaited() -> None:
    async def fetch(task: TaskInput) -> str:
        return f"fetched {task.inputs['topic']}"

    assert Crew(tasks=[Task("Fetch {topic}", fn=fetch)]).kickoff({"topic": "bees"}).raw == (
        "fetched bees"
    )
