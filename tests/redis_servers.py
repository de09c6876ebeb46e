"""Private ``redis-server`` processes of the production-Redis tests (TLS, ACL, Sentinel).

Each runs on a free loopback port with no persistence, its log in the test's folder, and is
stopped (by its own pid) when the test ends: the shared Redis on 6379 is never reconfigured.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from runner.embedded import find_redis_server


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class RedisProcess:
    """A running ``redis-server`` (or sentinel) on ``port``."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL it (a crash) and wait for it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@contextlib.contextmanager
def redis_server(folder: Path, *args: str, port: int | None = None) -> Iterator[RedisProcess]:
    """A ``redis-server`` with ``args`` (``--port`` is added unless ``port`` is 0: then the
    caller names its ``--tls-port``); waits until it listens, kills it on exit."""
    port = free_port() if port is None else port
    listen = port
    extra = ["--port", str(port)]
    if port == 0:
        listen = int(args[args.index("--tls-port") + 1])
        extra = ["--port", "0"]
    log = folder / f"redis-{listen}.log"
    command = [
        find_redis_server(),
        *extra,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        # A replica attaching (a test's failover) is served at once, not after 5 s.
        "--repl-diskless-sync-delay",
        "0",
        "--dir",
        str(folder),
        "--logfile",
        str(log),
        *args,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisProcess(listen, proc, log)
    try:
        deadline = time.monotonic() + 10
        while not _listening(listen):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield server
    finally:
        server.kill()


@dataclass(frozen=True)
class Certificates:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(folder: Path) -> Certificates:
    """Make a throwaway CA and the certificates it signs with ``openssl``."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
        *("-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.crt"),
    )
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "san.ext"]), ("client", [])):
        run(
            *("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}"),
            *("-keyout", f"{name}.key", "-out", f"{name}.csr"),
        )
        run(
            *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
            *("-CAcreateserial", "-days", "2", "-out", f"{name}.crt", *ext),
        )
    return Certificates(
        folder / "ca.crt",
        folder / "server.crt",
        folder / "server.key",
        folder / "client.crt",
        folder / "client.key",
    )


SERVICE = "runner-primary"
"""The service name the test sentinels monitor."""


@contextlib.contextmanager
def sentinel(
    folder: Path, primary_port: int, quorum: int = 2, password: str | None = None
) -> Iterator[RedisProcess]:
    """A ``redis-server --sentinel`` watching the primary on ``primary_port`` as
    :data:`SERVICE` (logging in with ``password``): down after 1 s without an answer,
    failover retried after 5 s."""
    port = free_port()
    conf = folder / f"sentinel-{port}.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
        f"logfile {folder / f'sentinel-{port}.log'}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 5000\n"
        + (f"sentinel auth-pass {SERVICE} {password}\n" if password else "")
    )
    with _sentinel_process(folder, conf, port) as server:
        yield server


def tls_args(certs: Certificates) -> list[str]:
    """``redis-server`` options of a TLS node with ``certs`` (clients must show a certificate
    of the same CA; the server's own is shown when it connects out, as a replica does)."""
    return [
        *("--tls-ca-cert-file", str(certs.ca)),
        *("--tls-cert-file", str(certs.server_cert)),
        *("--tls-key-file", str(certs.server_key)),
    ]


@contextlib.contextmanager
def tls_sentinel(
    folder: Path, primary_port: int, certs: Certificates, quorum: int = 2
) -> Iterator[RedisProcess]:
    """A TLS-only sentinel (``port 0``, ``tls-port``) watching the TLS primary on
    ``primary_port`` as :data:`SERVICE` over TLS (``tls-replication yes``), with the timings
    of :func:`sentinel`."""
    port = free_port()
    conf = folder / f"sentinel-{port}.conf"
    conf.write_text(
        f"port 0\ntls-port {port}\nbind 127.0.0.1\ndir {folder}\n"
        f"logfile {folder / f'sentinel-{port}.log'}\n"
        f"tls-ca-cert-file {certs.ca}\ntls-cert-file {certs.server_cert}\n"
        f"tls-key-file {certs.server_key}\ntls-replication yes\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 5000\n"
    )
    with _sentinel_process(folder, conf, port) as server:
        yield server


@contextlib.contextmanager
def _sentinel_process(folder: Path, conf: Path, port: int) -> Iterator[RedisProcess]:
    """``redis-server CONF --sentinel``, listening on ``port``; killed on exit."""
    proc = subprocess.Popen(
        [find_redis_server(), str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisProcess(port, proc, folder / f"sentinel-{port}.log")
    try:
        deadline = time.monotonic() + 10
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sentinel did not start: {server.log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield server
    finally:
        server.kill()


@contextlib.contextmanager
def short_patience(seconds: float = 0.5) -> Iterator[None]:
    """Store clients made inside wait ``seconds`` (``RUNNER_STORE_RETRY``, 30 s by default)
    for an unreachable Redis before they report it."""
    from runner.settings import reset_settings

    before = os.environ.get("RUNNER_STORE_RETRY")
    os.environ["RUNNER_STORE_RETRY"] = str(seconds)
    reset_settings()
    try:
        yield
    finally:
        if before is None:
            del os.environ["RUNNER_STORE_RETRY"]
        else:
            os.environ["RUNNER_STORE_RETRY"] = before
        reset_settings()
