"""Commands that only read runs import neither Celery nor kombu, and ``runner runs`` imports
neither the runtime, the flow core nor the other commands' modules: a cold ``runner runs``
costs about what its own libraries (redis, pydantic, typer) cost to import
(``bench/cli_cold.py`` measures it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.distributed.client import submit
from tests.flows.cli import GatedFlow, gate_key
from tests.test_cli import tag  # noqa: F401  (fixture)

pytestmark = pytest.mark.processes  # each test runs the CLI in a fresh interpreter

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
from runner.cli import main

found = []
watched = json.loads(sys.argv[2])
for args in json.loads(sys.argv[1]):
    sys.argv = ["runner", *args]
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    loaded = [name for name in watched if name in sys.modules]
    found.append({"args": args, "code": code, "loaded": loaded})
print("PROBE " + json.dumps(found))
"""


CELERY = ["celery", "kombu"]
RUNTIME = ["runner.distributed.engine", "runner.distributed.client", "runner.flow.orchestrator"]
HEAVY = [
    "cryptography.hazmat",  # AES-GCM of RUNNER_ENCRYPTION_KEYS (redis-py imports the package)
    "psycopg",  # a postgresql:// archive
    "prometheus_client",  # the workers' /metrics
    "opentelemetry.sdk.trace",  # RUNNER_OTEL (redis-py imports opentelemetry's metrics SDK)
    "opentelemetry.instrumentation",
    "yaml",
    "jsonschema",
    "cronsim",  # schedules
    "runner.observe",
    "runner.store.archive",
    "runner.store.rekey",
    "pydantic_settings",  # the settings read their sources themselves (runner/settings.py)
    "dotenv",  # only when RUNNER_ENV_FILE names a file
]
"""Libraries (and runner's modules over them) of features a reading command does not use, in
a deployment that does not enable them (no encryption keys here)."""
STORE_BOOKS = [
    f"runner.store.{name}" for name in ("limits", "queues", "schedules", "timers", "memory")
]
"""The deployment's records a listing never reads (imported by the store on first use)."""
OTHER_COMMANDS = [
    f"runner.cli.{name}"
    for name in (
        "ops",
        "history",
        "retain",
        "dev",
        "worker",
        "fleet",
        "ui",
        "limits",
        "deploy",
        "schedules",
        "storage",
    )
]


def probe(
    commands: list[list[str]], env: dict[str, str], watched: list[str] = CELERY
) -> list[dict[str, Any]]:
    """Run ``commands`` one after the other in one fresh interpreter, as the console script
    does; for each, its exit code and which of the ``watched`` modules were imported by then
    (the last one's output under ``out``)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands), json.dumps(watched)],
        env={**os.environ, **env, "COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, done.stderr
    found: list[dict[str, Any]] = json.loads(lines[-1].removeprefix("PROBE "))
    found[-1]["out"] = done.stdout
    return found


def test_reading_commands_import_neither_celery_nor_kombu(
    rt: Any,
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    tag: str,  # noqa: F811
) -> None:
    redis_client.set(gate_key(tag), 1)
    handle = submit(GatedFlow, {"tag": tag}, rt=rt)
    handle.wait(timeout=30)
    run_id = handle.run_id
    newest_first = rt.store.history(run_id, limit=1000)
    first, last = newest_first[-1].id, newest_first[0].id
    reading = [
        ["--help"],
        ["runs", "--help"],
        ["runs", "--json"],
        ["runs"],
        ["status", run_id],
        ["status", run_id[:8], "--json"],
        ["checkpoints", run_id],
        ["show", last],
        ["steps", run_id, "--json"],
        ["diff", first, last],
        ["watch", run_id],
    ]
    found = probe(reading, worker_env)
    assert [(f["args"], f["code"]) for f in found] == [(args, 0) for args in reading]
    assert [f for f in found if f["loaded"]] == []
    # `runner --help` imports every command's module: the others, in a process of their own.
    commands = reading[1:]
    found = probe(commands, worker_env, HEAVY)
    assert [(f["args"], f["code"], f["loaded"]) for f in found] == [
        (args, 0, []) for args in commands
    ]


def test_listing_runs_imports_neither_the_runtime_nor_the_other_commands(
    rt: Any,
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    tag: str,  # noqa: F811
) -> None:
    redis_client.set(gate_key(tag), 1)
    handle = submit(GatedFlow, {"tag": tag}, rt=rt)
    handle.wait(timeout=30)
    watched = CELERY + HEAVY + RUNTIME + OTHER_COMMANDS + STORE_BOOKS
    found = probe([["runs"], ["runs", "--json"]], worker_env, watched)
    assert [(f["code"], f["loaded"]) for f in found] == [(0, []), (0, [])]
    assert handle.run_id in found[-1]["out"]
    # Its JSON is printed without rich (a view's library) and without the flow events.
    found = probe([["runs", "--json"]], worker_env, [*watched, "rich", "runner.flow.events"])
    assert [(f["code"], f["loaded"]) for f in found] == [(0, [])]


def test_help_imports_no_command_s_runtime(worker_env: dict[str, str]) -> None:
    # `runner --help` loads every command module to list it: what their commands run (the
    # runtime, recovery, the resume planner, schedules' cron, archives) waits for a call.
    later = ["runner.distributed.control", "runner.distributed.recovery", "runner.flow.plans"]
    found = probe([["--help"]], worker_env, CELERY + HEAVY + RUNTIME + later)
    assert [(f["code"], f["loaded"]) for f in found] == [(0, [])]


def test_help_lists_every_command_and_a_typo_suggests_the_closest(
    worker_env: dict[str, str],
) -> None:
    # Commands are loaded on demand: --help loads them all (in their order), and an
    # unknown name too, so the error can name the command meant.
    found = probe([["--help"]], worker_env, OTHER_COMMANDS)
    assert found[0]["code"] == 0 and found[0]["loaded"] == OTHER_COMMANDS
    panel = found[0]["out"].split("─ Commands ─", 1)[1].split("╰", 1)[0]
    listed = [line.split()[1] for line in panel.splitlines() if line.startswith("│ ")]
    assert listed == [
        *("submit", "status", "watch", "runs", "cancel"),
        *("resume", "fork", "recover", "prune", "upgrade"),
        *("checkpoints", "steps", "show", "diff", "graph"),
        *("pin", "unpin", "gc", "restore", "chat"),
        *("worker", "workers", "dev", "ui", "limits", "check-deploy", "schedule"),
        *("rekey", "store"),
    ]
    typo = subprocess.run(
        [sys.executable, "-m", "runner", "chekpoints"],
        env={**os.environ, **worker_env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert typo.returncode == 2
    assert typo.stderr.strip() == (
        "error: No such command 'chekpoints'. Did you mean 'checkpoints'? (see 'runner --help')"
    )


def test_the_probe_sees_celery_once_a_command_sends(
    rt: Any,
    worker_env: dict[str, str],
    tag: str,  # noqa: F811
) -> None:
    sending = ["submit", "tests.flows.cli:GatedFlow", "--input", f"tag={tag}", "--json"]
    found = probe([["runs", "--json"], sending], worker_env)
    assert [f["code"] for f in found] == [0, 0]
    assert found[0]["loaded"] == [] and found[1]["loaded"] == ["celery", "kombu"]


def test_the_cli_does_not_load_the_authoring_api_of_crews(
    redis_client: redis.Redis,
) -> None:
    # `import runner` resolves its public names on first use (`from runner import Crew` loads
    # crews); importing the package for the CLI's sake loads none of them.
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, runner.cli; "
            "print(sorted(m for m in ('runner.crew', 'runner.crew.crew') if m in sys.modules))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert found.stdout.strip() == "[]"
