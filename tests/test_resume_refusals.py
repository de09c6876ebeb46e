"""Every way of resuming a run refuses the same situations alike: one wording and one exit
code (2 bad input, 1 the run's state forbids it; the API's 404/422 and 409) from
``resume()`` in Python, ``runner resume``, the console's API, ``kickoff(from_checkpoint=)``
in process and ``runner resume --location``, because :func:`runner.flow.plans.plan_resume`
decides for all of them.

Also in process: a run another live process is running is refused as on the workers, and
resumes once that process ended (a crash, Ctrl-C); a run resumed, answered or cancelled
elsewhere while it runs here stops this process's run (its sink commits with
compare-and-set, as workers do) instead of being written over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from runner import CheckpointConfig
from runner.cli import app
from runner.cli._session import exit_code_for, one_line
from runner.distributed import control
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime
from runner.errors import RunnerError, RunStateError
from runner.store.jsondir import JsonProvider
from runner.store.models import RunStatus
from tests._dist_support import eventually, paused, runtime_for
from tests.conftest import WorkerPool
from tests.console_support import serving
from tests.flows.results import Held
from tests.flows.reviews import ArticleFlow

TOKEN = "t0ken-for-refusals"
REPO = Path(__file__).resolve().parent.parent
API_CODES = {404: 2, 422: 2, 409: 1}
"""The CLI's exit code for each HTTP status the API refuses with."""


@dataclass(frozen=True)
class Refusal:
    """What a way of resuming said: the message and the CLI's exit code for it."""

    message: str
    code: int

    @classmethod
    def of(cls, exc: RunnerError) -> Refusal:
        return cls(one_line(str(exc)), exit_code_for(exc))


@dataclass(frozen=True)
class Ask:
    """One resume: the run, the checkpoint named (``None``: its latest) and the inputs."""

    run: str
    ckpt: str | None = None
    inputs: dict[str, Any] | None = None


def by_python(rt: Runtime, ask: Ask) -> Refusal:
    try:
        handle = control.resume(ask.run, ask.ckpt, ask.inputs, rt=rt)
    except RunnerError as exc:
        return Refusal.of(exc)
    raise AssertionError(f"resumed {handle.run_id}")


def by_cli(env: dict[str, str], ask: Ask, *location: str) -> Refusal:
    args = ["resume", *location, ask.run]
    if ask.ckpt is not None:
        args += ["--from", ask.ckpt]
    for key, value in (ask.inputs or {}).items():
        args += ["--input", f"{key}={value}"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.stderr.startswith("error: "), (result.exit_code, result.stdout, result.stderr)
    return Refusal(result.stderr.strip().removeprefix("error: "), result.exit_code)


def by_api(http: httpx.Client, ask: Ask) -> Refusal:
    body = {"from_checkpoint": ask.ckpt, "inputs": ask.inputs or {}}
    response = http.post(f"/api/runs/{ask.run}/resume", json=body)
    assert response.status_code in API_CODES, response.text
    return Refusal(response.json()["error"]["message"], API_CODES[response.status_code])


def by_kickoff(store: Any, flow_cls: Any, ask: Ask) -> Refusal:
    restore = CheckpointConfig(provider=store, restore_from=ask.ckpt or ask.run)
    try:
        out = flow_cls().kickoff(inputs=ask.inputs, from_checkpoint=restore)
    except RunnerError as exc:
        return Refusal.of(exc)
    raise AssertionError(f"kickoff returned {out!r}")


@dataclass
class Situations:
    """Runs on the workers, and in a JSON directory made in process, in each situation."""

    rt: Runtime
    env: dict[str, str]
    succeeded: str
    succeeded_step: str
    """A checkpoint of ``succeeded`` with nothing left to run that is not its latest."""
    failed: str
    running: str
    awaiting: str
    files: Path
    succeeded_here: str
    succeeded_here_step: str
    failed_here: str


def last_step_checkpoint(store: Any, run_id: str) -> str:
    """The checkpoint of the run's last step (nothing left to run), not its latest."""
    newest, *older = store.history(run_id)
    found = next(c.id for c in older if c.event == "method_execution_finished")
    assert newest.event == "flow_finished"
    return found


@pytest.fixture(scope="module")
def runs(
    worker_env: dict[str, str], worker_pool: WorkerPool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Situations]:
    rt = runtime_for(worker_env)
    succeeded = submit(Held, {"topic": "fixed"}, rt=rt)
    failed = submit(Held, {}, rt=rt)
    running = submit(Held, {"gate": "sleep"}, rt=rt)
    awaiting = submit(ArticleFlow, {"topic": "refusals"}, rt=rt)
    assert succeeded.wait(30) is RunStatus.SUCCEEDED
    assert failed.wait(30) is RunStatus.FAILED
    paused(awaiting)
    eventually(lambda: running.latest().event == "step_sleeping", 30)

    files = tmp_path_factory.mktemp("refusals") / "checkpoints"
    # Every event: the run's closing checkpoint too, so its last step's is not its latest.
    here = CheckpointConfig(location=str(files), on_events=["*"])
    done_here = Held(checkpoint=here)
    done_here.kickoff(inputs={"topic": "fixed"})
    failing_here = Held(checkpoint=here)
    with pytest.raises(RuntimeError, match="cannot write"):
        failing_here.kickoff()
    store = JsonProvider(files)
    try:
        yield Situations(
            rt=rt,
            env=dict(worker_env),
            succeeded=succeeded.run_id,
            succeeded_step=last_step_checkpoint(rt.store, succeeded.run_id),
            failed=failed.run_id,
            running=running.run_id,
            awaiting=awaiting.run_id,
            files=files,
            succeeded_here=done_here.flow_id,
            succeeded_here_step=last_step_checkpoint(store, done_here.flow_id),
            failed_here=failing_here.flow_id,
        )
    finally:
        store.close()
        running.cancel()
        rt.close()


Situation = Callable[[Situations, bool], tuple[Ask, Refusal]]
"""A situation: given the runs and whether to take the ones kept in files, what to ask and
the refusal every way of asking must give."""


def a_succeeded_run(s: Situations, in_files: bool) -> tuple[Ask, Refusal]:
    run = s.succeeded_here if in_files else s.succeeded
    return Ask(run), Refusal(f"run {run} already succeeded; fork it to run again", 1)


def nothing_left(s: Situations, in_files: bool) -> tuple[Ask, Refusal]:
    run, ckpt = (
        (s.succeeded_here, s.succeeded_here_step) if in_files else (s.succeeded, s.succeeded_step)
    )
    return Ask(run, ckpt), Refusal(f"checkpoint {ckpt} has no step left to run", 1)


def a_changed_id(s: Situations, in_files: bool) -> tuple[Ask, Refusal]:
    run = s.failed_here if in_files else s.failed
    return Ask(run, inputs={"id": "someone-else"}), Refusal(
        f"inputs cannot change a resumed run's id ({run}); fork it instead", 2
    )


def another_runs_checkpoint(s: Situations, in_files: bool) -> tuple[Ask, Refusal]:
    run, other, ckpt = (
        (s.failed_here, s.succeeded_here, s.succeeded_here_step)
        if in_files
        else (s.failed, s.succeeded, s.succeeded_step)
    )
    return Ask(run, ckpt), Refusal(f"checkpoint {ckpt} belongs to run {other}, not {run}", 2)


def an_unknown_checkpoint(s: Situations, in_files: bool) -> tuple[Ask, Refusal]:
    run = s.failed_here if in_files else s.failed
    return Ask(run, "no-such-checkpoint"), Refusal("no checkpoint no-such-checkpoint", 2)


def a_running_run(s: Situations, in_files: bool) -> tuple[Ask, Refusal]:
    return Ask(s.running), Refusal(f"run {s.running} is running; cancel it first", 1)


def a_run_awaiting_an_answer(s: Situations, in_files: bool) -> tuple[Ask, Refusal]:
    run = s.awaiting
    return Ask(run), Refusal(
        f"run {run} awaits an answer at review: 'Publish this draft?'; "
        f"give it (runner resume {run} --feedback TEXT)",
        1,
    )


ON_WORKERS = [
    a_succeeded_run,
    nothing_left,
    a_changed_id,
    another_runs_checkpoint,
    an_unknown_checkpoint,
    a_running_run,
    a_run_awaiting_an_answer,
]
KICKOFF_REFUSES = {a_changed_id, an_unknown_checkpoint, a_running_run, a_run_awaiting_an_answer}
"""What ``kickoff(from_checkpoint=)`` refuses too: it returns a finished checkpoint's result
(as CrewAI's), and resumes a checkpoint's own run (no run is named besides it)."""


@pytest.fixture(scope="module")
def api(runs: Situations) -> Iterator[httpx.Client]:
    with (
        serving(runs.rt, token=TOKEN) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as http,
    ):
        yield http


@pytest.mark.parametrize("situation", ON_WORKERS, ids=lambda s: s.__name__)
def test_every_way_of_resuming_a_run_refuses_it_with_one_message_and_exit_code(
    situation: Situation, runs: Situations, api: httpx.Client
) -> None:
    ask, expected = situation(runs, False)
    before = {r.run_id: r.seq for r in runs.rt.store.runs(limit=1000)}

    said = {
        "resume()": by_python(runs.rt, ask),
        "runner resume": by_cli(runs.env, ask),
        "the API": by_api(api, ask),
    }
    if situation in KICKOFF_REFUSES:
        flow_cls = ArticleFlow if ask.run == runs.awaiting else Held
        said["kickoff(from_checkpoint=)"] = by_kickoff(runs.rt.store, flow_cls, ask)

    assert said == dict.fromkeys(said, expected)
    assert {r.run_id: r.seq for r in runs.rt.store.runs(limit=1000)} == before


IN_FILES = [a_succeeded_run, nothing_left, a_changed_id, another_runs_checkpoint]


@pytest.mark.parametrize("situation", IN_FILES, ids=lambda s: s.__name__)
def test_resuming_a_run_kept_in_files_refuses_it_as_resuming_on_the_workers_does(
    situation: Situation, runs: Situations
) -> None:
    ask, expected = situation(runs, True)
    said = {"runner resume --location": by_cli(runs.env, ask, "--location", str(runs.files))}
    if situation in KICKOFF_REFUSES:
        store = JsonProvider(runs.files)
        try:
            said["kickoff(from_checkpoint=)"] = by_kickoff(store, Held, ask)
        finally:
            store.close()

    assert said == dict.fromkeys(said, expected)


def test_kickoff_from_a_finished_checkpoint_returns_the_runs_result_where_resume_refuses(
    runs: Situations,
) -> None:
    for run, ckpt, store in (
        (runs.succeeded, None, runs.rt.store),
        (runs.succeeded, runs.succeeded_step, runs.rt.store),
    ):
        restore = CheckpointConfig(provider=store, restore_from=ckpt or run)
        assert Held().kickoff(from_checkpoint=restore) == "written from notes on fixed"
        assert by_python(runs.rt, Ask(run, ckpt)).code == 1


# --- a run another process is running here ---------------------------------------------------


def kickoff_elsewhere(config: str, run_id: str, gate: Path) -> subprocess.Popen[bytes]:
    """Another process kicking off a :class:`Held` run ``run_id`` that waits for ``gate``,
    keeping its checkpoints where ``config`` (a ``CheckpointConfig(...)`` expression) says."""
    script = (
        "from runner import CheckpointConfig\n"
        "from runner.store.redis import RedisProvider\n"
        "from tests.flows.results import Held\n"
        f"Held(checkpoint={config}).kickoff("
        f"inputs={{'id': {run_id!r}, 'topic': 'fixed', 'gate': {str(gate)!r}}})\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def holding(store: Any, run_id: str) -> bool:
    """Whether ``run_id``'s ``gather`` committed (its ``hold`` now waits)."""
    latest = store.latest(run_id)
    return latest is not None and (latest.event, latest.step) == (
        "method_execution_finished",
        "gather",
    )


@pytest.mark.processes
def test_a_run_another_live_process_runs_is_refused_here_until_that_process_ends(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    files = tmp_path / "checkpoints"
    run_id = f"elsewhere-{os.getpid()}-{time.monotonic_ns()}"
    other = kickoff_elsewhere(f"CheckpointConfig(location={str(files)!r})", run_id, tmp_path / "g")
    try:
        store = JsonProvider(files)
        eventually(lambda: holding(store, run_id), 30)
        expected = Refusal(f"run {run_id} is running; cancel it first", 1)
        ask = Ask(run_id)

        assert by_kickoff(store, Held, ask) == expected
        assert by_cli(worker_env, ask, "--location", str(files)) == expected

        other.send_signal(signal.SIGKILL)  # a crash: nobody drives the run any longer
        other.wait(10)
        (tmp_path / "g").touch()
        restore = CheckpointConfig(location=str(files), restore_from=run_id)
        assert Held().kickoff(from_checkpoint=restore) == "written from notes on fixed"
        assert store.run(run_id).status is RunStatus.SUCCEEDED
        store.close()
    finally:
        if other.poll() is None:
            other.kill()
        other.communicate(timeout=10)


def test_an_in_process_run_cancelled_elsewhere_stops_instead_of_writing_over_it(
    rt: Runtime, tmp_path: Path
) -> None:
    run_id = f"cancelled-{os.getpid()}-{time.monotonic_ns()}"
    redis = f"RedisProvider({rt.store.url!r}, prefix={rt.store.keys.prefix!r})"
    config = f"CheckpointConfig(provider={redis})"
    gate = tmp_path / "gate"
    other = kickoff_elsewhere(config, run_id, gate)
    try:
        eventually(lambda: holding(rt.store, run_id), 30)
        cancelled = RunHandle(run_id, rt).cancel()
        gate.touch()  # hold returns: the other process commits on the run it had

        _, err = other.communicate(timeout=60)
        assert other.returncode != 0
        assert RunStateError.__name__ in err.decode()
        assert f"run {run_id} changed elsewhere while it ran here" in err.decode()
        assert rt.store.latest(run_id).id == cancelled.id
        assert rt.store.run(run_id).status is RunStatus.CANCELLED
    finally:
        if other.poll() is None:
            other.kill()
        other.communicate(timeout=10)


# --- answering: RunHandle.resume(feedback=), runner resume --feedback, the API ------------------


@dataclass(frozen=True)
class Answering:
    """One answer: the run, the text, a label chosen directly, the step the answerer read."""

    run: str
    text: str = "ship it"
    outcome: str | None = None
    step: str | None = None


def answer_by_python(rt: Runtime, ask: Answering) -> Refusal:
    try:
        RunHandle(ask.run, rt).resume(ask.text, outcome=ask.outcome, step=ask.step)
    except RunnerError as exc:
        return Refusal.of(exc)
    raise AssertionError(f"answered {ask.run}")


def answer_by_cli(env: dict[str, str], ask: Answering) -> Refusal:
    args = ["resume", ask.run, "--feedback", ask.text]
    args += ["--outcome", ask.outcome] if ask.outcome is not None else []
    args += ["--step", ask.step] if ask.step is not None else []
    result = CliRunner().invoke(app, args, env=env)
    assert result.stderr.startswith("error: "), (result.exit_code, result.stdout, result.stderr)
    return Refusal(result.stderr.strip().removeprefix("error: "), result.exit_code)


def answer_by_api(http: httpx.Client, ask: Answering) -> Refusal:
    body = {"feedback": ask.text, "outcome": ask.outcome, "step": ask.step}
    response = http.post(f"/api/runs/{ask.run}/feedback", json=body)
    assert response.status_code in API_CODES, response.text
    return Refusal(response.json()["error"]["message"], API_CODES[response.status_code])


def no_answer_awaited(s: Situations) -> tuple[Answering, Refusal]:
    return Answering(s.failed), Refusal(f"run {s.failed} awaits no answer (it is failed)", 1)


def another_question(s: Situations) -> tuple[Answering, Refusal]:
    return Answering(s.awaiting, step="write"), Refusal(
        f"run {s.awaiting} now awaits review ('Publish this draft?'), not write: "
        "read the question again before answering",
        1,
    )


def an_unknown_outcome(s: Situations) -> tuple[Answering, Refusal]:
    return Answering(s.awaiting, outcome="maybe"), Refusal(
        "'maybe' is not an outcome of review; its outcomes: approved, rejected", 2
    )


@pytest.mark.parametrize(
    "situation", [no_answer_awaited, another_question, an_unknown_outcome], ids=lambda s: s.__name__
)
def test_every_way_of_answering_a_run_refuses_it_with_one_message_and_exit_code(
    situation: Callable[[Situations], tuple[Answering, Refusal]],
    runs: Situations,
    api: httpx.Client,
) -> None:
    ask, expected = situation(runs)
    before = {r.run_id: r.seq for r in runs.rt.store.runs(limit=1000)}

    said = {
        "RunHandle.resume(feedback=)": answer_by_python(runs.rt, ask),
        "runner resume --feedback": answer_by_cli(runs.env, ask),
        "the API": answer_by_api(api, ask),
    }

    assert said == dict.fromkeys(said, expected)
    assert {r.run_id: r.seq for r in runs.rt.store.runs(limit=1000)} == before
