"""The research example: four crew stages, a planned failure in stage 3, a resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples import research
from runner import CheckpointConfig


@pytest.fixture
def fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CheckpointConfig:
    """No sleeping, markers and checkpoints in ``tmp_path``; the flow's checkpoint config."""
    monkeypatch.setenv("RESEARCH_SLEEP", "0")
    monkeypatch.setenv("RESEARCH_MARKER_DIR", str(tmp_path / "markers"))
    return CheckpointConfig(location=str(tmp_path / "checkpoints"))


def test_the_research_flow_runs_four_crew_stages(fast: CheckpointConfig) -> None:
    out = research.ResearchFlow(checkpoint=fast).kickoff({"topic": "bees"})
    assert [t["name"] for t in out["tasks_output"]] == [
        "outline_report",
        "write_report",
        "edit_report",
    ]
    assert out["raw"].startswith("[stage4, fake LLM] Edit the report for clarity")


def test_a_planned_failure_in_stage3_resumes_at_the_failed_task(
    fast: CheckpointConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESEARCH_FAIL_ONCE", "stage3")
    calls: list[str] = []
    real = research.FakeLLM.__call__

    def counted(self: research.FakeLLM, prompt: str) -> str:
        calls.append(research.current_task.get().name)
        return real(self, prompt)

    monkeypatch.setattr(research.FakeLLM, "__call__", counted)
    flow = research.ResearchFlow(checkpoint=fast)
    with pytest.raises(research.PlannedFailure, match="stage3/identify_gaps"):
        flow.kickoff({"topic": "bees"})
    assert calls[-2:] == ["compare_findings", "identify_gaps"]
    assert len(calls) == 8

    config = CheckpointConfig(location=fast.location, restore_from=flow.flow_id)
    out = research.ResearchFlow.from_checkpoint(config, checkpoint=fast).kickoff()
    assert calls[8:] == [
        "identify_gaps",
        "draw_conclusions",
        "outline_report",
        "write_report",
        "edit_report",
    ]
    assert out["raw"].startswith("[stage4, fake LLM]")


def test_the_example_runs_from_the_command_line(
    fast: CheckpointConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(research.ResearchFlow, "checkpoint", fast)
    monkeypatch.setenv("RESEARCH_FAIL_ONCE", "stage2")
    assert research.main(["bees"]) == 1
    run_id = capsys.readouterr().err.split("--resume ")[1].strip()
    assert research.main(["--resume", run_id]) == 0
    assert "[stage4, fake LLM] Edit the report" in capsys.readouterr().out
