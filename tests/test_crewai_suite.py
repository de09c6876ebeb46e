"""``bench/crewai_suite.py``: CrewAI's test files rewritten to import ours by its table,
crewai-only names failing only the tests that use them, and the exclusion rule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench import crewai_suite

SOURCE = textwrap.dedent(
    """
    from __future__ import annotations

    import crewai.flow.flow_definition as flow_definition
    from crewai.events.event_bus import crewai_event_bus
    from crewai.events.types.flow_events import FlowStartedEvent
    from crewai.flow import Flow, start
    from crewai.agents.agent_builder.base_agent import BaseAgent


    class Researcher(BaseAgent):
        role: str = "researcher"


    def _attach(cls):
        cls._flow_definition = None


    def test_uses_the_flow():
        assert flow_definition.FlowDefinition.__name__ == "FlowDefinition"
        assert Flow.__module__.startswith("runner")


    def test_uses_a_crewai_only_name():
        Researcher()


    def test_reads_the_bus():
        crewai_event_bus.on(FlowStartedEvent)


    def test_names_an_event_class():
        assert FlowStartedEvent


    def test_reads_a_private_attribute():
        assert Flow._methods


    def test_through_a_helper():
        _attach(Flow)


    def test_dunders_are_public():
        assert Flow.__name__ == "Flow"
    """
)


def test_imports_are_rewritten_by_the_table_and_bodies_are_unchanged():
    rewritten = crewai_suite.rewrite(SOURCE)

    assert "from crewai" not in rewritten.text and "import crewai" not in rewritten.text
    assert "_crewai_suite_shim.module('runner.flow.definition', 'crewai.flow.flow_definition')" in (
        rewritten.text
    )
    assert (
        "_crewai_suite_shim.bind('', [('BaseAgent', 'crewai.agents.agent_builder.base_agent')])"
        in rewritten.text
    )
    assert rewritten.text.splitlines()[1] == "from __future__ import annotations"
    for body_line in (
        "    Researcher()",
        "def _attach(cls):",
        "        cls._flow_definition = None",
    ):
        assert body_line in rewritten.text.splitlines() or body_line.strip() in rewritten.text


def test_the_rule_excludes_event_bus_and_private_reads_directly_or_through_helpers():
    rewritten = crewai_suite.rewrite(SOURCE)

    assert rewritten.excluded == [
        "test_names_an_event_class",
        "test_reads_a_private_attribute",
        "test_reads_the_bus",
        "test_through_a_helper",
    ]
    assert len(rewritten.tests) == 7


@pytest.mark.processes
def test_a_crewai_only_name_fails_only_the_tests_using_it(tmp_path: Path):
    rewritten = crewai_suite.rewrite(SOURCE)
    (tmp_path / "_crewai_suite_shim.py").write_text(crewai_suite.SHIM)
    (tmp_path / "test_sample.py").write_text(rewritten.text)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "test_sample.py",
            "-k",
            "uses or dunders",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert "1 failed, 2 passed" in done.stdout, done.stdout
    assert (
        "no counterpart in runner: crewai.agents.agent_builder.base_agent.BaseAgent" in done.stdout
    )


def test_a_bare_import_of_a_crewai_module_is_refused_rather_than_guessed():
    with pytest.raises(SystemExit, match=r"no rule for `import crewai\.flow`"):
        crewai_suite.rewrite("import crewai.flow\n")


def test_crewais_tools_module_maps_to_ours() -> None:
    # A tool written against crewai.tools.BaseTool moves over with its import changed.
    rewritten = crewai_suite.rewrite("from crewai.tools import BaseTool\n")
    assert "_crewai_suite_shim.bind('runner', [('BaseTool', 'crewai.tools')])" in rewritten.text
