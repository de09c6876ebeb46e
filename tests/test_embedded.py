"""The embedded Redis: started when none is configured, durable, and never left orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from runner import embedded
from runner.embedded import EmbeddedRedis, mask_url, resolve_redis_url
from runner.errors import StoreUnavailable
from runner.settings import RunnerSettings

REPO = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    """True if ``pid`` is a running process (a zombie nobody reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    if not sys.platform.startswith("linux"):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.mark.processes
def test_embedded_server_answers_with_aof_in_its_data_dir_and_stops(tmp_path: Path) -> None:
    with EmbeddedRedis(data_dir=tmp_path) as server:
        pid = server.pid
        assert pid is not None and alive(pid)
        client = redis.Redis.from_url(server.url)
        try:
            assert client.ping()
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("dir")["dir"] == str(tmp_path)
            client.set("k", "v")
        finally:
            client.close()
    assert not server.running
    assert not alive(pid)
    assert list(tmp_path.rglob("*.aof")), "no AOF file in the data dir"
    assert (tmp_path / "redis.log").exists()


@pytest.mark.processes
def test_temporary_data_dir_is_removed_on_stop() -> None:
    server = EmbeddedRedis()
    server.start()
    data_dir = server.data_dir
    assert data_dir is not None and data_dir.is_dir()
    server.stop()
    assert not data_dir.exists()
    server.stop()  # a second stop is harmless


@pytest.mark.processes
def test_unconfigured_url_starts_one_embedded_server_and_reuses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(embedded, "get_settings", lambda: RunnerSettings(redis_url=None))
    monkeypatch.setattr(embedded, "_shared", None)
    first = resolve_redis_url()
    try:
        assert first == resolve_redis_url()
        assert embedded._shared is not None and embedded._shared.running
        client = redis.Redis.from_url(first)
        try:
            assert client.ping()
        finally:
            client.close()
    finally:
        assert embedded._shared is not None
        embedded._shared.stop()


def test_configured_reachable_url_is_returned_as_is(redis_url: str) -> None:
    assert resolve_redis_url(redis_url) == redis_url


def test_configured_unreachable_url_raises_with_password_masked() -> None:
    with pytest.raises(StoreUnavailable) as info:
        resolve_redis_url("redis://:secret@127.0.0.1:1/0")
    message = str(info.value)
    assert "redis://:***@127.0.0.1:1/0" in message
    assert "secret" not in message and "secret" not in repr(info.value.to_dict())
    assert "\n" not in message


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:secret@host/1", "rediss://user:***@host/1"),
        ("redis://host:6379/0?password=secret&db=2", "redis://host:6379/0?password=***&db=2"),
        ("redis://host:6379/0", "redis://host:6379/0"),
    ],
)
def test_mask_url_hides_the_password(url: str, masked: str) -> None:
    assert mask_url(url) == masked


CHILD = textwrap.dedent(
    """
    import sys, time
    from runner import embedded
    from runner.embedded import resolve_redis_url
    resolve_redis_url()
    print(embedded._shared.pid, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(60)
    else:
        sys.stdin.readline()  # exits once the test has seen the server alive
    """
)


@pytest.mark.parametrize(
    ("how", "signum"),
    [("exit", None), ("wait", signal.SIGINT), ("wait", signal.SIGTERM)],
    ids=["normal-exit", "sigint", "sigterm"],
)
@pytest.mark.processes
def test_child_process_leaves_no_embedded_server_behind(
    tmp_path: Path, how: str, signum: signal.Signals | None
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["RUNNER_EMBEDDED_DIR"] = str(tmp_path)
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, how],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin and child.stdout is not None and child.stderr is not None
        pid = int(child.stdout.readline())
        assert alive(pid)
        if signum is not None:
            child.send_signal(signum)
        else:
            child.stdin.write("\n")
            child.stdin.flush()
        child.wait(timeout=30)
        stderr = child.stderr.read()
    assert wait_gone(pid), f"redis-server {pid} outlived its parent"
    log = (tmp_path / "redis.log").read_text()
    assert "User requested shutdown" in log, "not stopped by the runner's cleanup"
    if signum is signal.SIGINT:
        assert "KeyboardInterrupt" in stderr
        assert child.returncode != 0
    elif signum is not None:
        assert child.returncode == -signum
    else:
        assert child.returncode == 0, stderr


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal is Linux only")
@pytest.mark.processes
def test_embedded_server_dies_with_a_killed_parent(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["RUNNER_EMBEDDED_DIR"] = str(tmp_path)
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, "wait"], cwd=REPO, env=env, stdout=subprocess.PIPE
    ) as child:
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        child.kill()  # no cleanup code runs: only the kernel can stop the server now
        child.wait(timeout=30)
    assert wait_gone(pid), f"redis-server {pid} outlived its killed parent"
