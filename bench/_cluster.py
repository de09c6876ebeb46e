"""A throwaway local Redis Cluster: ``redis-server --cluster-enabled yes`` masters on free
loopback ports, joined by ``redis-cli --cluster create``; used by ``bench/store_commit.py``
and ``tests/test_cluster.py``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import redis


def cluster_tools() -> bool:
    """Whether ``redis-server`` and ``redis-cli`` are on ``PATH``."""
    return bool(shutil.which("redis-server") and shutil.which("redis-cli"))


@contextmanager
def local_cluster(masters: int = 3, root: Path | None = None) -> Iterator[list[int]]:
    """Yield the ports of ``masters`` running, joined cluster masters; stop them afterwards.

    Data (``nodes.conf``, ``server.log``) goes to ``root`` (default: a temporary directory,
    removed afterwards); nothing is persisted (no RDB, no AOF).
    """
    with _folder(root) as folder:
        ports = _free_ports(masters)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for port in ports:
                node = folder / str(port)
                node.mkdir()
                procs.append(
                    subprocess.Popen(
                        [
                            "redis-server",
                            "--port", str(port),
                            "--bind", "127.0.0.1",
                            "--cluster-enabled", "yes",
                            "--cluster-config-file", str(node / "nodes.conf"),
                            "--dir", str(node),
                            "--save", "",
                            "--appendonly", "no",
                            "--logfile", str(node / "server.log"),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )  # fmt: skip
            for port in ports:
                _wait(partial(_answers, port), f"node {port} answers")
            subprocess.run(
                [
                    "redis-cli", "--cluster", "create",
                    *(f"127.0.0.1:{port}" for port in ports),
                    "--cluster-replicas", "0", "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )  # fmt: skip
            for port in ports:
                _wait(partial(_cluster_ok, port), f"node {port} reports cluster_state:ok")
            yield ports
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextmanager
def _folder(root: Path | None) -> Iterator[Path]:
    """``root`` as given, or a temporary directory removed afterwards."""
    if root is not None:
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="runner-cluster-") as tmp:
        yield Path(tmp)


def _free_ports(n: int) -> list[int]:
    """``n`` loopback ports free now whose cluster bus ports (+10000) are free too."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def _wait(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"local cluster: {what} not true after {timeout}s")
        time.sleep(0.1)


def _answers(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=0.5) as node:
            return bool(node.ping())
    except redis.RedisError:
        return False


def _cluster_ok(port: int) -> bool:
    with redis.Redis(port=port, socket_timeout=0.5) as node:
        info = node.execute_command("CLUSTER", "INFO").decode()
    return "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info
