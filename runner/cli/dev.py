"""``runner dev``: everything a laptop needs, in one command that every other process finds.

It starts a Redis whose data lives in the project (``./.runner/redis``, AOF on, so runs
survive a restart), N Celery workers whose allow-list is the flow modules named on the
command line, Flower and (when installed) the console, then prints the one ``export`` line
another shell may use. It also writes ``./.runner/dev.json`` (the Redis URL and its pid):
the CLI, ``Flow.submit``, ``runner.submit`` and ``celery -A workers worker`` started without
``RUNNER_REDIS_URL`` in this folder or below find the instance through it. Ctrl-C (or
SIGTERM) stops everything it started; the data stays.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from runner.distributed.processes import WorkerProcess
from runner.embedded import DevInstance, EmbeddedRedis, find_dev, mask_url, ping, write_dev
from runner.errors import RunnerError, StoreUnavailable
from runner.settings import RunnerSettings, default_queue

from ._app import app
from ._session import FLAG, BadUsage, session

SUPERVISE_EVERY = 1.0
"""Seconds between checks that the workers still run (a dead one is restarted)."""
FLOWER_START_TIMEOUT = 20.0
"""Seconds Flower (and the console) get to open their port."""


@app.command()
def dev(
    ctx: typer.Context,
    modules: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="MODULE...",
            help="Flow modules the workers may run (pkg.mod, or pkg.mod:Flow); "
            "default: RUNNER_FLOW_MODULES.",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", "-n", min=0, metavar="N", help="Celery workers to start.")
    ] = 1,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, metavar="N", help="Processes per worker.")
    ] = 2,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=1,
            max=65535,
            metavar="PORT",
            help="Port of the Redis (default: the last one used here, else a free one).",
            show_default=False,
        ),
    ] = None,
    flower_port: Annotated[
        int, typer.Option("--flower-port", min=1, max=65535, metavar="PORT", help="Flower's port.")
    ] = 5555,
    flower: Annotated[
        bool, typer.Option("--flower/--no-flower", help="Start Flower.", metavar=FLAG)
    ] = True,
    ui_port: Annotated[
        int, typer.Option("--ui-port", min=1, max=65535, metavar="PORT", help="The console's port.")
    ] = 8765,
    ui: Annotated[
        bool, typer.Option("--ui/--no-ui", help="Start the console (`runner ui`).", metavar=FLAG)
    ] = True,
) -> None:
    """Start a local Redis (data in ./.runner), workers, Flower, the console; print `export`.

    Every `runner` command, Flow.submit and `celery -A workers worker` run in this folder
    (or below) without RUNNER_REDIS_URL find this Redis through ./.runner/dev.json. Runs
    until Ctrl-C; the data stays in ./.runner (remove that folder to start afresh).
    """
    settings = session(ctx).settings()
    names = _allow_list(modules or settings.flow_modules)
    home = Path.cwd() / settings.dev_dir
    with contextlib.ExitStack() as stack:
        _stop_on_sigterm(stack)
        url = _redis(stack, settings, home, port)
        env = _child_env(settings, url, names)
        app_settings = settings.model_copy(update={"redis_url": url})
        pool = [_worker(env, home, i, concurrency) for i in range(workers)]
        for worker in pool:
            stack.callback(worker.stop)
        _wait_ready(pool, app_settings)
        if workers:
            _say(f"{workers} worker(s), queue {settings.queue}, allow-list: {', '.join(names)}")
        flower_url = _start_flower(stack, env, home, flower_port) if flower else None
        if ui:
            _start_console(stack, env, home, ui_port, flower_url)
        typer.echo(_export_line(settings, url))
        _say(f"ready; Ctrl-C stops it all (the data stays in {home}; remove it to start afresh)")
        _supervise(pool, app_settings)


def _say(text: str) -> None:
    typer.echo(f"runner dev: {text}", err=True)


def _allow_list(given: list[str]) -> list[str]:
    """The modules named (``pkg.mod:Flow`` counts as ``pkg.mod``), each imported here first,
    so a typo is one line now rather than a worker that will not start."""
    from runner.distributed.worker import flows_in

    names = list(dict.fromkeys(item.partition(":")[0] for item in given))
    if not names:
        raise BadUsage(
            "name the flow modules the workers may run, e.g. `runner dev myproject.flows` "
            "(or set RUNNER_FLOW_MODULES)"
        )
    for name in names:
        if not flows_in(name):
            raise BadUsage(f"module {name} defines no Flow or Crew")
    return names


def _stop_on_sigterm(stack: contextlib.ExitStack) -> None:
    # SIGTERM (a process manager, `kill`) stops everything in order, as Ctrl-C does.
    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    stack.callback(signal.signal, signal.SIGTERM, previous)


def _redis(
    stack: contextlib.ExitStack, settings: RunnerSettings, home: Path, port: int | None
) -> str:
    """The configured Redis, or a fresh ``redis-server`` on ``home/redis`` recorded in dev.json."""
    if settings.redis_url:
        ping(settings.redis_url)
        _say(f"using the configured Redis {mask_url(settings.redis_url)}")
        return settings.redis_url
    last = find_dev(home.parent)
    if last is not None and last.path.parent != home:
        last = None  # a parent project's instance: this folder gets its own
    if last is not None and last.alive:
        raise StoreUnavailable(
            f"`runner dev` already runs here (pid {last.pid}, {last.redis_url}); "
            "stop it first, or use it"
        )
    home.mkdir(parents=True, exist_ok=True)
    (home / ".gitignore").write_text("# runner dev's data: not for version control\n*\n")
    server = EmbeddedRedis(
        data_dir=home / "redis", port=port or _last_port(last), executable=_last_server(last)
    )
    stack.enter_context(server)
    write_dev(home, server)
    _say(f"Redis {server.url} (AOF on, data in {home / 'redis'})")
    return server.url


def _last_port(last: DevInstance | None) -> int:
    # The same port as last time keeps the export line other shells hold valid.
    if last is None:
        return 0
    with contextlib.suppress(ValueError, IndexError):
        return int(last.redis_url.rsplit(":", 1)[1].split("/")[0])
    return 0


def _last_server(last: DevInstance | None) -> str | None:
    # The same redis-server as last time: another one on PATH may be too old for its AOF.
    exe = last.redis_server if last is not None else None
    return exe if exe and os.access(exe, os.X_OK) else None


def _child_env(settings: RunnerSettings, url: str, names: list[str]) -> dict[str, str]:
    """What the workers and Flower run with: this Redis, the allow-list, the project importable."""
    path = os.pathsep.join(p for p in (str(Path.cwd()), os.environ.get("PYTHONPATH")) if p)
    return {
        "RUNNER_REDIS_URL": url,
        "RUNNER_FLOW_MODULES": ",".join(names),
        "RUNNER_QUEUE": settings.queue,
        "PYTHONPATH": path,
    }


def _export_line(settings: RunnerSettings, url: str) -> str:
    """``export RUNNER_REDIS_URL=...``, plus the settings a shell must share with the workers
    when they differ from the defaults (prefix, queue, broker)."""
    values = {"RUNNER_REDIS_URL": url}
    if settings.prefix != RunnerSettings.model_fields["prefix"].default:
        values["RUNNER_PREFIX"] = settings.prefix
    if settings.queue != default_queue(settings.prefix):
        values["RUNNER_QUEUE"] = settings.queue
    if settings.broker_url:
        values["RUNNER_BROKER_URL"] = settings.broker_url
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


def _worker(env: dict[str, str], home: Path, index: int, concurrency: int) -> WorkerProcess:
    home.mkdir(parents=True, exist_ok=True)
    return WorkerProcess(
        env, concurrency=concurrency, log=home / f"worker-{index + 1}.log", cwd=Path.cwd()
    )


def _wait_ready(pool: list[WorkerProcess], settings: RunnerSettings) -> None:
    if not pool:
        return
    from runner.distributed.app import make_app

    probe = make_app(settings)
    try:
        for worker in pool:
            worker.start()
        for worker in pool:
            try:
                worker.wait_ready(probe, timeout=60)
            except RuntimeError as exc:
                raise RunnerError(f"a worker did not start: {exc}") from None
    finally:
        probe.close()


def _supervise(pool: list[WorkerProcess], settings: RunnerSettings) -> None:
    """Block until interrupted, restarting a worker that died (e.g. ``kill -9`` in a test)."""
    try:
        while True:
            time.sleep(SUPERVISE_EVERY)
            for worker in pool:
                if worker.proc is not None and worker.proc.poll() is not None:
                    _say(f"worker {worker.name} exited ({worker.proc.returncode}); restarting it")
                    worker.start()
    except KeyboardInterrupt:
        _say("stopping")


def _start_flower(
    stack: contextlib.ExitStack, env: dict[str, str], home: Path, port: int
) -> str | None:
    """Flower on loopback; its URL, or ``None`` if it did not start."""
    if importlib.util.find_spec("flower") is None:
        _say("Flower is not installed (pip install 'runner[flower]'); not started")
        return None
    argv = ["-m", "celery", "-A", "workers", "flower", f"--port={port}", "--address=127.0.0.1"]
    # Local only (bound to loopback): its HTTP API may answer without a login.
    proc = _service(stack, argv, {**env, "FLOWER_UNAUTHENTICATED_API": "true"}, home / "flower.log")
    if not _listening(proc, port):
        _say(f"Flower did not start on port {port}; see {home / 'flower.log'}")
        return None
    _say(f"Flower http://127.0.0.1:{port}")
    return f"http://127.0.0.1:{port}"


def _start_console(
    stack: contextlib.ExitStack, env: dict[str, str], home: Path, port: int, flower: str | None
) -> None:
    # The console (`runner ui`) is optional: started when this install has it.
    if importlib.util.find_spec("runner.console") is None or "ui" not in _commands():
        return
    argv = ["-m", "runner.cli", "ui", "--port", str(port)]
    argv += ["--flower-url", flower] if flower else []
    proc = _service(stack, argv, env, home / "console.log")
    if _listening(proc, port):
        _say(f"console http://127.0.0.1:{port}")
    else:
        _say(f"the console did not start on port {port}; see {home / 'console.log'}")


def _commands() -> set[str]:
    return {
        str(cmd.name or getattr(cmd.callback, "__name__", "")) for cmd in app.registered_commands
    }


def _service(
    stack: contextlib.ExitStack, argv: list[str], env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            env={**os.environ, **env},
            cwd=Path.cwd(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    stack.callback(_stop, proc)
    return proc


def _listening(proc: subprocess.Popen[bytes], port: int) -> bool:
    deadline = time.monotonic() + FLOWER_START_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
