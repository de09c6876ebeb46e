"""``runner dev``: everything a laptop needs, in one command that every other process finds.

It starts a Redis whose data lives in the project (``./.runner/redis``, AOF on, so runs
survive a restart), N Celery workers whose allow-list is the flow modules named on the
command line, Flower and the console (with a token it makes, and a login link), then prints
the one ``export`` line another shell may use. It also writes ``./.runner/dev.json`` (the
Redis URL and its pid): the CLI, ``Flow.submit``, ``runner.submit`` and ``celery -A
runner.worker worker`` started without ``RUNNER_REDIS_URL`` in this folder or below find the
instance through it; a worker started by hand there (``runner worker``) takes its
allow-list too. When a file of the project the workers run changes, it restarts them (and
the console, which imports the flows too) so the next step or resume runs the new code, and
says ``workers ready`` when they are back. A Redis of its own that exits is started again on
its data and port (one line); Flower keeps its history in ``./.runner/flower.db``. Ctrl-C
(or SIGTERM) stops everything it started, the workers at once; the data stays.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from runner.console import is_loopback
from runner.distributed.processes import WorkerProcess
from runner.embedded import (
    DevInstance,
    EmbeddedRedis,
    dev_advice,
    find_dev,
    mask_url,
    ping,
    port_free,
    publish_flow_modules,
    write_dev,
)
from runner.errors import FlowImportError, RunnerError, StoreUnavailable
from runner.flow.rates import check_name
from runner.settings import RunnerSettings, default_queue

from ._app import commands
from ._session import FLAG, BadUsage, session
from .reload import Watch
from .worker import APP_MODULE

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""

SUPERVISE_EVERY = 1.0
"""Seconds between checks that the workers still run (a dead one is restarted)."""
FLOWER_START_TIMEOUT = 20.0
"""Seconds Flower (and the console) get to open their port."""
POOLS = ("prefork", "threads")
"""Worker pools `runner dev --pool` starts: processes for CPU-bound steps, threads for
I/O-bound ones (and async methods)."""
STOP_GRACE = 15.0
"""Seconds a running step gets to finish when a worker is stopped (a restart, Ctrl-C); then
the worker is killed and recovery hands the step to another through its lease."""
STOP_IDLE = 3.0
"""Seconds a worker gets to stop when its steps cannot commit anyway (the Redis is down):
a warm shutdown would wait on the dead connection for all of :data:`STOP_GRACE`."""
FLOWER_PORT = 5555
"""Flower's port unless ``--flower-port`` or a loopback ``RUNNER_UI_FLOWER_URL`` says another."""


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
        int,
        typer.Option(
            "--concurrency", "-c", min=1, metavar="N", help="Processes (or threads) per worker."
        ),
    ] = 2,
    pool_kind: Annotated[
        str,
        typer.Option(
            "--pool",
            "-P",
            metavar="prefork|threads",
            help="Worker pool: prefork (CPU-bound steps) or threads (I/O-bound steps, e.g. "
            "--pool threads --concurrency 50).",
        ),
    ] = "prefork",
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            "-Q",
            metavar="NAME,...",
            help="Queues the workers consume, by name (`default`, `gpu`, ...); default: "
            "RUNNER_WORKER_QUEUES, else the default queue.",
            show_default=False,
        ),
    ] = None,
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
        int | None,
        typer.Option(
            "--flower-port",
            min=1,
            max=65535,
            metavar="PORT",
            help="Flower's port (default: that of RUNNER_UI_FLOWER_URL, 5555).",
            show_default=False,
        ),
    ] = None,
    flower: Annotated[
        bool, typer.Option("--flower/--no-flower", help="Start Flower.", metavar=FLAG)
    ] = True,
    ui_port: Annotated[
        int | None,
        typer.Option(
            "--ui-port",
            min=1,
            max=65535,
            metavar="PORT",
            help="The console's port (default: RUNNER_UI_PORT, 8765).",
            show_default=False,
        ),
    ] = None,
    ui: Annotated[
        bool, typer.Option("--ui/--no-ui", help="Start the console (`runner ui`).", metavar=FLAG)
    ] = True,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload/--no-reload",
            help="Restart the workers when a file of this folder they import changes.",
            metavar=FLAG,
        ),
    ] = True,
) -> None:
    """Start a local Redis (data in ./.runner), workers, Flower, the console; print `export`.

    Every `runner` command, Flow.submit and `celery -A runner.worker worker` run in this
    folder (or below) without RUNNER_REDIS_URL find this Redis through ./.runner/dev.json.
    The console can act: it uses RUNNER_UI_TOKEN, else a token made now, whose login link
    is printed. When a flow module (or a file of this folder it imports) changes, the
    workers restart: a running step finishes first, and the next one (or `runner resume`)
    runs the new code. Runs until Ctrl-C; the data stays in ./.runner (remove that folder
    to start afresh).
    """
    settings = session(ctx).settings()
    if pool_kind not in POOLS:
        raise BadUsage(f"--pool {pool_kind!r}: must be one of {', '.join(POOLS)}")
    for queue in queues.split(",") if queues is not None else ():
        check_name(queue.strip(), "--queues")
    names = _allow_list(modules or settings.flow_modules)
    home = Path.cwd() / settings.dev_dir
    with contextlib.ExitStack() as stack:
        _stop_on_sigterm(stack)
        url, server = _redis(stack, settings, home, port)
        publish_flow_modules(home, names)  # producers here refuse other flows up front
        env = _child_env(settings, url, names)
        if queues is not None:
            env["RUNNER_WORKER_QUEUES"] = queues
        watch = Watch(names, Path.cwd(), env) if reload else None
        app_settings = settings.model_copy(update={"redis_url": url})
        pool = [_worker(env, home, i, concurrency, pool_kind) for i in range(workers)]
        services: list[Service] = []
        stack.callback(_stop_children, pool, services, url)
        _wait_ready(pool, app_settings)
        if workers:
            _say(f"{workers} worker(s), queue {settings.queue}, allow-list: {', '.join(names)}")
        flower_port = flower_port or _flower_port(settings)
        flower_url = _start_flower(services, env, home, flower_port) if flower else None
        ui_port = ui_port or settings.ui_port
        console = (
            _start_console(services, env, home, ui_port, flower_url, settings.ui_token)
            if ui
            else None
        )
        typer.echo(_export_line(settings, url))
        _say(f"ready; Ctrl-C stops it all (the data stays in {home}; remove it to start afresh)")
        _supervise(pool, app_settings, watch, console, _RedisWatch(server, home, names))


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
) -> tuple[str, EmbeddedRedis | None]:
    """The configured Redis, or a fresh ``redis-server`` on ``home/redis`` recorded in
    dev.json (returned too: :class:`_RedisWatch` restarts it)."""
    if settings.redis_url:
        ping(settings.redis_url)
        _say(f"using the configured Redis {mask_url(settings.redis_url)}")
        return settings.redis_url, None
    last = find_dev(home.parent)
    if last is not None and last.path.parent != home:
        last = None  # a parent project's instance: this folder gets its own
    if last is not None and last.alive:
        try:
            ping(last.redis_url)
        except StoreUnavailable:
            # The words the CLI says of it: `runner dev` restarts its own Redis, so one
            # whose Redis still does not answer is stuck, and only a new one helps.
            raise StoreUnavailable(
                f"`runner dev` already runs here, but its Redis ({last.redis_url}) "
                f"{dev_advice(last)}"
            ) from None
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
    return server.url, server


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


def _worker(
    env: dict[str, str], home: Path, index: int, concurrency: int, pool: str = "prefork"
) -> WorkerProcess:
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"worker-{index + 1}.log"
    return WorkerProcess(
        env, concurrency=concurrency, pool=pool, log=log, cwd=Path.cwd(), stop_timeout=STOP_GRACE
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


def _stop_children(pool: list[WorkerProcess], services: list[Service], url: str) -> None:
    """Stop the workers, Flower and the console all at once (each stop waits on its own
    process, so together they take as long as the slowest). A worker gets a warm shutdown
    (a running step finishes, up to :data:`STOP_GRACE`), or, when its Redis (``url``) does
    not answer, :data:`STOP_IDLE`: no step could commit, and a warm shutdown would wait on
    the dead connection all that time (recovery runs those steps again through their
    leases)."""
    try:
        ping(url)
    except StoreUnavailable:
        for worker in pool:
            worker.stop_timeout = STOP_IDLE
    stops = [*(service.stop for service in services), *(worker.stop for worker in pool)]
    with ThreadPoolExecutor(max_workers=max(1, len(stops))) as stopping:
        list(stopping.map(lambda stop: stop(), stops))


@dataclass
class _RedisWatch:
    """``runner dev``'s own Redis, checked every round: one that exited is started again on
    the same data and port (said in one line), and if it will not start, that is said
    once, with the advice the CLI gives."""

    server: EmbeddedRedis | None
    home: Path
    names: list[str]
    failed: bool = False

    def check(self) -> None:
        server = self.server
        if server is None or server.running or self.failed:
            return
        port = server.port
        try:
            url = server.restart()
        except RunnerError as exc:
            self.failed = True
            _say(
                f"its Redis (port {port}) exited and did not start again ({exc}); "
                "stop `runner dev` (Ctrl-C) and start it again"
            )
            return
        write_dev(self.home, server)
        publish_flow_modules(self.home, self.names)
        moved = "" if server.port == port else f" (on port {server.port}: restart `runner dev`)"
        _say(f"its Redis (port {port}) exited; started it again on its data{moved}: {url}")


def _supervise(
    pool: list[WorkerProcess],
    settings: RunnerSettings,
    watch: Watch | None,
    console: Service | None,
    redis_watch: _RedisWatch,
) -> None:
    """Block until interrupted, restarting our Redis or a worker that died (e.g. ``kill
    -9`` in a test), and with ``watch`` every worker and the console when the project's
    code changes."""
    rounds = watch.changes(SUPERVISE_EVERY) if watch else _every(SUPERVISE_EVERY)
    try:
        for changed in rounds:
            redis_watch.check()
            if changed and watch:
                _reload(changed, watch, pool, settings, console)
            for worker in pool:
                if worker.proc is not None and worker.proc.poll() is not None:
                    _say(f"worker {worker.name} exited ({worker.proc.returncode}); restarting it")
                    worker.start()
    except KeyboardInterrupt:
        _say("stopping")


def _every(seconds: float) -> Iterator[list[Path]]:
    while True:
        time.sleep(seconds)
        yield []


def _reload(
    changed: list[Path],
    watch: Watch,
    pool: list[WorkerProcess],
    settings: RunnerSettings,
    console: Service | None,
) -> None:
    """Restart the workers (and the console) on the new code, unless it no longer imports."""
    here = Path.cwd().resolve()
    shown = ", ".join(
        str(p.relative_to(here)) if p.is_relative_to(here) else str(p) for p in changed
    )
    try:
        watch.refresh()
    except FlowImportError as exc:  # stopping the workers now would leave none that starts
        _say(f"{shown} changed but does not import ({exc}); the workers keep the code they run")
        return
    _say(f"{shown} changed; restarting the workers")
    # A warm shutdown, all at once: each takes no new step, a running one finishes (or, past
    # the stop timeout, is killed and recovery hands it to a new worker through its lease).
    with ThreadPoolExecutor() as stopping:
        list(stopping.map(WorkerProcess.stop, pool))
    try:
        _wait_ready(pool, settings)
    except RunnerError as exc:
        _say(str(exc))
        return
    # The console imports the flows too (their graphs, the fork form, resume's checks).
    if console is not None:
        console.stop()
        if (why := console.start()) is not None:
            _say(f"the console did not restart: {why}")
    _say(f"workers ready ({len(pool)}) on the new code")


@dataclass
class Service:
    """Flower or the console: a child process serving one port on loopback."""

    argv: list[str]
    """Arguments of this Python (``-m ...``)."""
    env: dict[str, str]
    log: Path
    port: int
    option: str
    """The ``runner dev`` option that picks another port."""
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str | None:
        """Start it and wait until it listens: ``None``, else why it did not (one line)."""
        if not port_free(self.port):  # else whatever listens there would pass for it
            return f"port {self.port} is in use ({self.option} PORT picks another)"
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, *self.argv],
                env={**os.environ, **self.env},
                cwd=Path.cwd(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if _listening(self.proc, self.port):
            return None
        code = self.proc.poll()
        self.stop()
        said = _last_line(self.log, offset)
        if code is None:
            late = f"it did not open port {self.port} within {FLOWER_START_TIMEOUT:g}s"
            return f"{late} ({said})" if said else late
        return f"{said} (exit code {code}; log: {self.log})" if said else f"exit code {code}"

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after 10 s); a no-op if it is not running."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _flower_port(settings: RunnerSettings) -> int:
    # Started where the console links to it, when that link is on this machine.
    link = urlsplit(settings.ui_flower_url or "")
    return link.port if link.port and is_loopback(link.hostname or "") else FLOWER_PORT


def _start_flower(
    services: list[Service], env: dict[str, str], home: Path, port: int
) -> str | None:
    """Flower on loopback (added to ``services``, which ``runner dev`` stops on its way
    out); its URL, or ``None`` if it did not start (saying why)."""
    if importlib.util.find_spec("flower") is None:
        _say("Flower is not installed (it comes with celery-flows: pip install celery-flows)")
        return None
    argv = ["-m", "celery", "-A", APP_MODULE, "flower", f"--port={port}", "--address=127.0.0.1"]
    # Persistent: the tasks it has seen survive a restart of `runner dev`, as the runs do.
    argv += ["--persistent=True", f"--db={home / 'flower.db'}"]
    # Local only (bound to loopback): its HTTP API may answer without a login.
    env = {**env, "FLOWER_UNAUTHENTICATED_API": "true"}
    flower = Service(argv, env, home / "flower.log", port, "--flower-port")
    services.append(flower)
    if (why := flower.start()) is not None:
        _say(f"Flower did not start: {why}")
        return None
    _say(f"Flower http://127.0.0.1:{port}")
    return f"http://127.0.0.1:{port}"


def _start_console(
    services: list[Service],
    env: dict[str, str],
    home: Path,
    port: int,
    flower: str | None,
    token: str | None,
) -> Service | None:
    """The console on loopback, able to act: with ``token``, else one made now whose login
    link is printed (as Jupyter does), added to ``services``; ``None`` if it did not start
    (saying why)."""
    made = not token
    token = token or secrets.token_urlsafe(24)
    argv = ["-m", "runner.cli", "ui", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--flower-url", flower] if flower else []
    # The token goes in the environment, not on the command line other users can read.
    console = Service(
        argv, {**env, "RUNNER_UI_TOKEN": token}, home / "console.log", port, "--ui-port"
    )
    services.append(console)
    if (why := console.start()) is not None:
        _say(f"the console did not start: {why}")
        return None
    link = f"http://127.0.0.1:{port}/"
    # Opening the link once logs the browser in (a session cookie) and drops it from the URL.
    _say(
        f"console {link}?token={token}" if made else f"console {link} (log in with RUNNER_UI_TOKEN)"
    )
    return console


def _listening(proc: subprocess.Popen[bytes], port: int) -> bool:
    deadline = time.monotonic() + FLOWER_START_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.1)
    return False


def _last_line(log: Path, offset: int) -> str:
    """The last non-blank line written to ``log`` after ``offset`` (a traceback's error)."""
    with contextlib.suppress(OSError), open(log, "rb") as f:
        f.seek(offset)
        lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
        return " ".join(lines[-1].split()) if lines else ""
    return ""
