"""Decorators, conditions and the compiled flow graph (pure: no Redis, no Celery)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from enum import StrEnum

import pytest

from runner.errors import DefinitionError, DefinitionWarning, UnknownStep, UnknownTrigger
from runner.flow.conditions import And, Or, and_, evaluate, has_and, leaves, normalize, or_
from runner.flow.decorators import DEFAULT_MAX_CALLS, STEP_ATTR, listen, router, start
from runner.flow.graph import compile_graph, infer_labels, route_label


class Verdict(StrEnum):
    OK = "ok"
    RETRY = "retry"


class ReportFlow:
    @start()
    def plan(self) -> str:
        return "plan"

    @listen(plan)
    def research(self, plan_output: str) -> str:
        return plan_output + "!"

    @router(research)
    def check(self) -> str:
        return "ok" if self else "retry"

    @listen("retry")
    def redo(self) -> None: ...

    @listen(and_(research, "ok"))
    async def write(self) -> None: ...

    def helper(self) -> None: ...


# --- conditions -----------------------------------------------------------------------------


def test_conditions_normalize_callables_to_their_names() -> None:
    def a() -> None: ...

    cond = or_(a, and_("b", or_("c", "d")))
    assert cond == Or(("a", And(("b", Or(("c", "d"))))))
    assert leaves(cond) == {"a", "b", "c", "d"}
    assert has_and(cond) and not has_and(or_("a", "b"))
    assert normalize(Verdict.OK) == "ok"


def test_evaluate_requires_all_of_and_and_any_of_or() -> None:
    cond = and_("a", or_("b", "c"))
    assert not evaluate(cond, {"a"})
    assert evaluate(cond, {"a", "c"})
    assert not evaluate(cond, {"b", "c"})


def test_bad_trigger_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        or_()
    with pytest.raises(DefinitionError):
        normalize(42)


# --- decorators -----------------------------------------------------------------------------


def test_decorators_return_the_function_with_a_mark() -> None:
    def step(self: object) -> int:
        return 7

    marked = listen("x", "y", retries=2, max_calls=5)(step)
    assert marked is step and step(None) == 7
    decl = getattr(step, STEP_ATTR)
    assert decl.condition == Or(("x", "y")) and decl.role == "listen"
    assert decl.options.retries == 2 and decl.options.max_calls == 5


def test_a_decorator_given_twice_is_rejected() -> None:
    with pytest.raises(DefinitionError, match="@listen is given twice"):

        @listen("a")
        @listen("b")
        def both(self: object) -> None: ...


def test_start_and_router_combine_into_a_start_router() -> None:
    @start()
    @router(labels=["go"], retries=1)
    def begin(self: object) -> str:
        return "go"

    decl = getattr(begin, STEP_ATTR)
    assert decl.role == "start_router" and decl.labels == {"go"} and decl.options.retries == 1


def test_start_router_takes_its_trigger_from_start() -> None:
    with pytest.raises(DefinitionError, match="trigger"):

        @start()
        @router("a")
        def begin(self: object) -> None: ...


@pytest.mark.parametrize("opts", [{"retries": -1}, {"time_limit": 0}, {"max_calls": 0}])
def test_invalid_options_are_rejected(opts: dict[str, int]) -> None:
    with pytest.raises(DefinitionError):
        listen("a", **opts)


# --- compile --------------------------------------------------------------------------------


def test_compile_reads_roles_arguments_and_options() -> None:
    graph = compile_graph(ReportFlow)
    assert list(graph.methods) == ["plan", "research", "check", "redo", "write"]
    assert graph.starts == ("plan",) and graph.kickoff == ("plan",)
    research, check, write = (graph.methods[n] for n in ("research", "check", "write"))
    assert research.takes_arg and not graph.methods["plan"].takes_arg
    assert write.is_async and not research.is_async
    assert check.is_router and check.labels == {"ok", "retry"}
    assert graph.labels == {"ok", "retry"}
    assert research.max_calls == DEFAULT_MAX_CALLS and research.retries is None
    assert graph.listeners("research") == ("check", "write")
    assert graph.listeners("ok") == ("write",)
    assert "helper" not in graph.methods


def test_compiled_graph_is_cached_per_class() -> None:
    assert compile_graph(ReportFlow) is compile_graph(ReportFlow)


def test_subclass_inherits_steps_and_its_overrides_win() -> None:
    class Child(ReportFlow):
        @listen(ReportFlow.plan)
        def extra(self) -> None: ...

        @listen(ReportFlow.plan)  # rewired: now listens to plan, not "retry"
        def redo(self) -> None: ...

    graph = compile_graph(Child)
    assert graph is not compile_graph(ReportFlow)
    assert "extra" not in compile_graph(ReportFlow).methods
    assert graph.methods["redo"].condition == "plan"
    assert list(graph.methods)[-1] == "extra"


def test_router_labels_are_inferred_from_enum_returns() -> None:
    class EnumFlow:
        @start()
        def a(self) -> None: ...

        @router(a)
        def decide(self) -> Verdict:
            if self:
                return Verdict.OK
            return Verdict.RETRY

        @router(a)
        async def local(self) -> str:
            done = Verdict
            return "x" if self else done.OK.value

        @listen(Verdict.RETRY)
        def again(self) -> None: ...

    graph = compile_graph(EnumFlow)
    assert graph.methods["decide"].labels == {"ok", "retry"}
    assert graph.methods["local"].labels is None  # a local variable: undeterminable
    assert graph.open_labels


def test_labels_argument_wins_over_inference() -> None:
    class Declared:
        @start()
        def a(self) -> None: ...

        @router(a, labels=Verdict)
        def decide(self) -> str:
            return str(self)

        @listen("retry")
        def again(self) -> None: ...

    assert compile_graph(Declared).methods["decide"].labels == {"ok", "retry"}


def test_infer_labels_reads_closure_constants_and_ignores_nested_functions() -> None:
    label = "near"

    def route(self: object) -> str:
        def inner() -> str:
            return str(self)

        return label if inner() else "far"

    assert infer_labels(route) == {"near", "far"}
    assert route_label(Verdict.OK) == "ok" and route_label(None) is None


def test_unknown_trigger_warning_names_it_and_a_strict_class_refuses_it() -> None:
    class Typo:
        @start()
        def a(self) -> None: ...

        @listen("aa")
        def b(self) -> None: ...

    with pytest.warns(DefinitionWarning, match=r"Typo\.b listens to 'aa'"):
        assert compile_graph(Typo).unknown_triggers == (("b", "aa"),)

    class StrictTypo(Typo):
        strict = True

    with pytest.raises(UnknownTrigger, match="'aa'") as info:
        compile_graph(StrictTypo)
    assert info.value.fields["trigger"] == "aa" and info.value.fields["step"] == "b"


def test_unknown_trigger_is_allowed_when_a_router_label_is_undeterminable() -> None:
    class Open:
        @start()
        def a(self) -> None: ...

        @router(a)
        def decide(self) -> str:
            return str(self)

        @listen("anything")
        def b(self) -> None: ...

    graph = compile_graph(Open)
    assert graph.emitters("anything") == ("decide",)
    assert graph.downstream(["a"]) == {"a", "decide", "b"}


def test_a_step_listening_to_itself_is_rejected() -> None:
    class Loop:
        @start()
        def a(self) -> None: ...

        @listen(or_("a", "b"))
        def b(self) -> None: ...

    with pytest.raises(DefinitionError, match=r"Loop\.b listens to itself"):
        compile_graph(Loop)


def test_a_flow_without_start_is_rejected() -> None:
    class NoStart:
        @listen("a")
        def b(self) -> None: ...

    with pytest.raises(DefinitionError, match="NoStart has no @start"):
        compile_graph(NoStart)


def test_a_router_without_trigger_is_rejected() -> None:
    class Lost:
        @start()
        def a(self) -> None: ...

        @router()
        def r(self) -> str:
            return "x"

    with pytest.raises(DefinitionError, match=r"Lost\.r"):
        compile_graph(Lost)


def test_only_conditional_starts_all_run_at_kickoff() -> None:
    class Cond:
        @start("b")
        def a(self) -> None: ...

        @start("a")
        def b(self) -> None: ...

    graph = compile_graph(Cond)
    assert graph.starts == () and graph.kickoff == ("a", "b")
    assert graph.listeners("a") == ("b",)


def test_downstream_follows_router_labels_and_unknown_steps_raise() -> None:
    graph = compile_graph(ReportFlow)
    assert graph.downstream(["check"]) == {"check", "redo", "write"}
    assert graph.downstream(["redo"]) == {"redo"}
    assert graph.downstream(["plan"]) == set(graph.methods)
    with pytest.raises(UnknownStep):
        graph.downstream(["nope"])


# --- fingerprint and mermaid ----------------------------------------------------------------


def _fingerprint_of(source: str) -> str:
    script = textwrap.dedent(source) + textwrap.dedent(
        """
        from runner.flow.graph import compile_graph
        print(compile_graph(F).fingerprint)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout.strip()


FLOW_SOURCE = """
from runner.flow.decorators import listen, start
class F:
    @start()
    def a(self): return 1
    @listen(a)
    def b(self): return {body}
    @listen({trigger})
    def c(self): ...
"""


@pytest.mark.processes
def test_fingerprint_is_stable_across_processes_and_ignores_bodies() -> None:
    first = _fingerprint_of(FLOW_SOURCE.format(body="1", trigger="a"))
    assert len(first) == 16 and int(first, 16) >= 0
    assert _fingerprint_of(FLOW_SOURCE.format(body="'other'", trigger="a")) == first
    assert _fingerprint_of(FLOW_SOURCE.format(body="1", trigger="b")) != first


def test_fingerprint_changes_when_wiring_changes() -> None:
    class A:
        @start()
        def a(self) -> None: ...

        @listen(or_("a", "b"))
        def c(self) -> None: ...

        @listen(a)
        def b(self) -> None: ...

    class B:
        @start()
        def a(self) -> None: ...

        @listen(and_("a", "b"))
        def c(self) -> None: ...

        @listen(a)
        def b(self) -> None: ...

    assert compile_graph(A).fingerprint != compile_graph(B).fingerprint


def test_mermaid_shows_nodes_and_edges() -> None:
    text = compile_graph(ReportFlow).to_mermaid()
    assert text.startswith("flowchart TD\n")
    assert 'n_plan(["plan"])' in text
    assert 'n_check{"check"}' in text
    assert 'n_research["research"]' in text
    assert "n_plan --> n_research" in text
    assert 'n_check -.->|"retry"| n_redo' in text
    assert 'n_check -.->|"ok"| n_write' in text
    assert "n_research ==> n_write" in text
