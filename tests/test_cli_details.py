"""Small things a user of the CLI meets: a busy console port, a malformed Redis URL, an empty
store, how ``watch`` ends, and worker names in the live view at 80 columns."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from rich.console import Console

from runner import views
from runner.cli import progress, refs, render
from tests.flows.cli import gate_key
from tests.test_cli import GATED, Cli, cli, tag  # noqa: F401  (fixtures)
from tests.test_cli_errors import assert_one_line_error

LONG_WORKER = "celery@a-very-long-host-name-of-some-kubernetes-node-pool-7f9c8d6b5-xk2lm"


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another process (here: a plain socket) listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_the_console_on_a_busy_port_is_one_error_line_and_exit_1(
    cli: Cli,  # noqa: F811
    busy_port: int,
) -> None:
    result = cli("ui", "--port", str(busy_port))
    assert_one_line_error(result, 1, f"cannot listen on 127.0.0.1:{busy_port}")
    assert result.stdout == ""  # no console address announced for a console that never ran


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["runs"], {"RUNNER_REDIS_URL": "notaurl"}),
        (["--redis-url", "notaurl", "status", "some-run"], {}),
        (["--redis-url", "redis://:s3cret@127.0.0.1:port/0", "runs"], {}),
        (["submit", GATED, "--input", "tag=t1"], {"RUNNER_REDIS_URL": "http://127.0.0.1:6379"}),
    ],
)
def test_a_malformed_redis_url_is_bad_input_in_one_line(
    cli: Cli,  # noqa: F811
    args: list[str],
    env: dict[str, str],
) -> None:
    result = cli(*args, env=env)
    assert_one_line_error(result, 2, "is not a Redis URL")
    assert "s3cret" not in result.stderr and "does not answer" not in result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://127.0.0.1:1",  # no service
        "rediss+sentinel://127.0.0.1:notaport/primary/0",
    ],
)
def test_a_malformed_sentinel_url_is_bad_input_in_one_line(
    cli: Cli,  # noqa: F811
    url: str,
) -> None:
    result = cli("--redis-url", url, "runs")
    assert_one_line_error(result, 2, "Sentinel URL" if "notaport" not in url else "HOST:PORT")


def test_an_empty_store_says_no_runs_and_its_json_is_an_empty_list(
    cli: Cli,  # noqa: F811
) -> None:
    empty = {"RUNNER_PREFIX": f"empty-{uuid.uuid4().hex[:8]}"}
    listed = cli("runs", env=empty)
    assert listed.exit_code == 0, listed.stderr
    assert listed.stdout == "no runs\n"
    assert cli("runs", "--json", env=empty).stdout.strip() == "[]"
    assert cli("runs", "--status", "failed", env=empty).stdout == "no runs match\n"


def last_line(result: Any) -> str:
    """The last line a command printed on stdout or, if it printed an error, on stderr."""
    return (result.stderr or result.stdout).splitlines()[-1]


def test_watch_ends_with_the_line_submit_wait_ends_with(
    cli: Cli,  # noqa: F811
    redis_client: redis.Redis,
    tag: str,  # noqa: F811
) -> None:
    failed = cli("submit", GATED, "--input", f"tag={tag}", "--wait")  # the gate is closed
    assert failed.exit_code == 1
    run_id = failed.stdout.split()[0]
    watched = cli("watch", run_id)
    assert watched.exit_code == 1
    assert last_line(watched) == last_line(failed)
    assert last_line(watched) == f"error: run {run_id} failed at check: RuntimeError: gate closed"

    redis_client.set(gate_key(tag), 1)
    done = cli("submit", GATED, "--input", f"tag={tag}", "--wait")
    assert done.exit_code == 0
    run_id = done.stdout.split()[0]
    watched = cli("watch", run_id)
    assert watched.exit_code == 0
    assert last_line(watched) == last_line(done) == "succeeded: total=1"


def test_the_live_view_keeps_a_long_worker_name_on_one_row_at_80_columns(
    cli: Cli,  # noqa: F811
    rt: Any,
    redis_client: redis.Redis,
    tag: str,  # noqa: F811
) -> None:
    redis_client.set(gate_key(tag), 1)
    run_id = cli.ok("submit", GATED, "--input", f"tag={tag}", "--wait").stdout.split()[0]
    info, latest = rt.store.run(run_id), rt.store.latest(run_id)
    rows = progress.step_rows(rt, run_id)
    for row in rows:
        row.worker = LONG_WORKER  # as a worker on a node with a long host name records it
    shown = views.short_ids([r.checkpoint for r in rows if r.checkpoint], refs.MIN_CHECKPOINT)
    for spent in (None, {"total_tokens": 123456}):  # a run with LLM usage has a tokens column
        for row in rows:
            row.usage = spent
        out = Console(width=80, record=True, force_terminal=True, color_system=None)
        out.print(render.progress_view(info, latest, rows, 3, None, shown))
        lines = out.export_text().splitlines()
        assert all(len(line) <= 80 for line in lines)
        for step in ("fetch#1", "check#1", "report#1"):
            (line,) = [line for line in lines if step in line]
            assert LONG_WORKER[:8] in line and "…" in line
            assert ("123,456" in line) is (spent is not None)
        assert not [line for line in lines if LONG_WORKER[-6:] in line]  # nothing folded over


@pytest.mark.parametrize("one_row", [False, True], ids=["runner steps", "live view"])
def test_step_names_keep_their_width_at_80_columns_beside_same_millisecond_checkpoint_ids(
    one_row: bool,
) -> None:
    # Checkpoints one process commits in the same millisecond share all but their last digit,
    # so their shortest unique prefixes are whole 28-digit ids (seen in CI: crew tasks of
    # 0.00 s on one worker); with a tokens column the step names were folded letter by letter.
    ids = [f"{0x01A2166FE0AD:012x}{0x4D29000000000000 + n:016x}" for n in range(4)]
    steps = [(0, "stage1#1"), (1, "a1#1"), (0, "stage3#1"), (1, "c2#1")]
    rows = [
        progress.StepRow(
            run_id="r",
            depth=depth,
            step=step,
            outcome="done",
            attempts=1,
            worker="celery@w-4-abcdef",
            started=1.7e9,
            duration=0.001,
            checkpoint=ckpt,
            usage={"total_tokens": 1234} if n == 1 else None,
        )
        for n, ((depth, step), ckpt) in enumerate(zip(steps, ids, strict=True))
    ]
    shown = views.short_ids(ids, refs.MIN_CHECKPOINT)
    assert {len(s) for s in shown.values()} == {28}
    out = Console(width=80, record=True, color_system=None)
    out.print(render.steps_table(rows, shown, one_row=one_row))
    lines = out.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    for depth, step in steps:
        (line,) = [line for line in lines if f"{'  ' * depth}{step} " in line]
        assert ("1,234" in line) is (step == "a1#1")
    if not one_row:  # nothing is cut: an id folds onto the rows below its step's
        text = "".join(line.split("│")[-2].strip() for line in lines if "│" in line)
        assert all(ckpt in text for ckpt in ids)
