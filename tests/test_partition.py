"""A worker cut off from Redis mid-step loses the step to another worker, and its late
commit after the partition heals is fenced: it changes nothing.

The cut-off worker runs in a network namespace of its own, joined to the host by a veth
pair on a private /30; a redis-server of the test's own listens on the host-side
address only (nothing else is reachable from the namespace, and no other network is
touched). The partition is the host-side veth going down; the heal, it coming back up.
Needs root and ``ip netns`` (CI runs as root); skipped with the reason otherwise.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.distributed.client import submit
from runner.distributed.processes import WorkerProcess
from runner.store.models import RunStatus
from tests._dist_support import eventually, finished
from tests.chaos_support import (
    DEFAULT_INTERVAL,
    DEFAULT_LEASE,
    RedisServer,
    runtime_on,
    start_worker,
)
from tests.flows.reliability import Nap, entries, executions

pytestmark = pytest.mark.slow

NAP = 30.0
"""The cut-off attempt's step: long enough to outlive the partition and the re-run."""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)


def _namespaces_unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if shutil.which("redis-server") is None:
        return "redis-server is not on PATH"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the suite as root)"
    probe = f"rprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 in 10.254.0.0/16 that no interface of the host uses, from a random start: two
    suites partitioning at once (xdist processes, other checkouts) rarely pick the same one
    between one's look and its ``ip addr add``."""
    used = _ip("-4", "addr").stdout
    start = uuid.uuid4().int % 254
    for offset in range(254):
        third = 1 + (start + offset) % 254
        net = ipaddress.IPv4Network(f"10.254.{third}.0/30")
        if f"10.254.{third}." not in used:
            return net
    raise RuntimeError("no free 10.254.x.0/30 on this host")


@pytest.fixture
def island() -> Iterator[dict[str, str]]:
    """A network namespace joined to the host by a veth pair; torn down after the test."""
    why = _namespaces_unavailable()
    if why:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"rpart{tag}", f"rph{tag}", f"rpn{tag}"
    net = _free_subnet()
    host_ip, ns_ip = (str(a) for a in list(net.hosts())[:2])
    steps = [
        ["netns", "add", ns],
        ["link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        ["link", "set", ns_if, "netns", ns],
        ["addr", "add", f"{host_ip}/30", "dev", host_if],
        ["link", "set", host_if, "up"],
        ["-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if],
        ["-n", ns, "link", "set", ns_if, "up"],
        ["-n", ns, "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            done = _ip(*step)
            assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr}"
        yield {"ns": ns, "host_if": host_if, "host_ip": host_ip}
    finally:
        _ip("link", "del", host_if)
        _ip("netns", "del", ns)


def test_a_partitioned_worker_loses_its_step_and_its_late_commit_is_fenced(
    island: dict[str, str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    with RedisServer(tmp_path / "redis", bind=island["host_ip"]) as server:
        env = {
            "RUNNER_REDIS_URL": server.url,
            "RUNNER_PREFIX": f"np-{uuid.uuid4().hex[:8]}",
            "RUNNER_QUEUE": f"np-{uuid.uuid4().hex[:8]}",
            "RUNNER_FLOW_MODULES": "tests.flows.reliability",
        }
        rt = runtime_on(env)
        r = redis.Redis.from_url(server.url)
        zombie = WorkerProcess(
            env,
            concurrency=1,
            log=logs / "zombie.log",
            wrapper=["ip", "netns", "exec", island["ns"]],
        )
        workers = [zombie]
        try:
            zombie.start(rt.app, timeout=60)
            handle = submit(Nap, {"seconds": NAP, "again": 0.5}, rt=rt)
            run = handle.run_id
            first = eventually(lambda: executions(r, run, "nap"), timeout=30)[0]
            assert first["pid"] in zombie.children()
            workers.append(start_worker(env, logs, rt, concurrency=1))

            assert _ip("link", "set", island["host_if"], "down").returncode == 0  # partition
            cut = time.time()
            assert handle.wait(timeout=60) is RunStatus.SUCCEEDED
            again = executions(r, run, "nap")[1]
            print(f"partitioned: the step ran again on the host after {again['t'] - cut:.1f}s")
            assert again["t"] - cut < DEFAULT_LEASE + DEFAULT_INTERVAL + 3
            committed = handle.latest()
            assert committed.state["who"] == f"pid {again['pid']}"

            assert _ip("link", "set", island["host_if"], "up").returncode == 0  # heal
            # The zombie wakes, ends its step and tries to commit it.
            eventually(
                lambda: any(e["e"] == "end" and e["pid"] == first["pid"] for e in entries(r, run)),
                timeout=NAP + 30,
            )
            eventually(lambda: "is a duplicate" in (logs / "zombie.log").read_text(), timeout=30)
            after = handle.latest()
            assert after.id == committed.id and after.seq == committed.seq
            assert after.state == committed.state
            commits = finished(rt, run, "nap")
            assert len(commits) == 1
            assert commits[0].attempt is not None
            assert commits[0].attempt.endswith(f":{again['pid']}")
            assert rt.coord.leases(run) == {}
        finally:
            for worker in workers:
                worker.kill()
            r.close()
            rt.app.close()
            rt.store.close()
