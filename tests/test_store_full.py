"""A store that says "full" first (:mod:`runner.store.memory`), on private ``redis-server``
processes with a small ``maxmemory`` and ``noeviction``: past the high-water mark a submit is
refused (in Python, on the CLI, on the console's API) while running runs finish; Redis's own
limit never leaves half a commit; ``runner store`` and the gauges show the memory."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from runner.errors import StoreFull
from runner.store.codec import Codec
from runner.store.models import Checkpoint, RunStatus
from runner.store.redis import RedisProvider
from tests._dist_support import runner_cli
from tests.conftest import WorkerPool, _settings_kwargs
from tests.redis_servers import redis_server

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[str]:
    """A private Redis with an 8 MB ``maxmemory`` under ``noeviction``."""
    with redis_server(
        tmp_path, "--maxmemory", str(8 * MB), "--maxmemory-policy", "noeviction"
    ) as server:
        yield f"redis://127.0.0.1:{server.port}/0"


@pytest.mark.processes
def test_redis_judges_a_script_by_the_memory_at_its_start(small_redis: str) -> None:
    # What the commit's atomicity rests on (Redis 7, noeviction): a script that starts under
    # the limit runs to its end even if it crosses it; one that starts over it has its first
    # write refused before anything is written.
    client = redis.Redis.from_url(small_redis)
    crossing = "for j = 1, 120 do redis.call('SET', KEYS[1] .. j, string.rep('x', 100000)) end"
    assert client.eval(crossing + " return 1", 1, "big") == 1
    info = client.info("memory")
    assert info["used_memory"] > info["maxmemory"]
    assert client.exists(*[f"big{j}" for j in range(1, 121)]) == 120
    refused = (
        "redis.call('GET', 'big1') redis.call('SET', KEYS[1], 'a') redis.call('SET', KEYS[2], 'b')"
    )
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.eval(refused, 2, "first", "second")
    assert client.exists("first", "second") == 0
    client.close()


def consistent(client: redis.Redis, store: RedisProvider, run_id: str) -> int:
    """Check one run's keys agree (no half-written commit); its number of checkpoints."""
    k = store.keys
    meta = {key.decode(): value.decode() for key, value in client.hgetall(k.meta(run_id)).items()}
    history = client.zrange(k.history(run_id), 0, -1, withscores=True)
    ids = [cid.decode() for cid, _ in history]
    seq = int(meta["seq"])
    assert [int(score) for _, score in history] == list(range(1, seq + 1)), run_id
    assert meta["latest"] == ids[-1]
    assert {cid.decode() for cid in client.hkeys(k.snapshots(run_id))} == set(ids)
    lookup = client.hmget(k.checkpoints_of(run_id), ids)
    assert all(found == run_id.encode() for found in lookup)
    for cid, raw in client.hgetall(k.refs(run_id)).items():
        assert cid.decode() in ids
        names, versions = json.loads(raw)
        wanted = [f"{v}:{name}" for name, v in zip(names, versions, strict=True)]
        assert all(value is not None for value in client.hmget(k.values(run_id), wanted))
    for activation, entry in client.hgetall(k.attempts(run_id)).items():
        assert entry.decode().rsplit("|", 1)[1] in ids, activation
    read = store.history(run_id, limit=10_000)
    assert [c.seq for c in read] == list(range(seq, 0, -1))
    return seq


@pytest.mark.processes
@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
def test_commits_until_redis_is_out_of_memory_leave_no_half_commit(
    small_redis: str, sealed: bool
) -> None:
    codec = Codec([("k1", bytes(32))]) if sealed else None
    store = RedisProvider(small_redis, prefix="oom", max_checkpoints=0, codec=codec)
    client = redis.Redis.from_url(small_redis)
    runs = [f"run-{n}" for n in range(4)]
    refused: list[Checkpoint] = []
    written = 0
    for i in range(100_000):
        run = runs[i % len(runs)]
        # Runs 0 and 1 keep small states (inside the snapshot), 2 and 3 large ones by field,
        # changing one 20 KB field and one small one each commit.
        if i % len(runs) < 2:
            state: dict[str, Any] = {"id": run, "i": i, "note": "x" * 2000}
        else:
            state = {"id": run, "i": i, "page": f"{i}" * 20_000, "fixed": "y" * 20_000}
        ckpt = Checkpoint(
            run_id=run,
            event="method_execution_finished",
            step="step",
            activation=f"step#{i}",
            attempt=uuid.uuid4().hex,
            state=state,
        )
        try:
            store.commit(ckpt)
            written += 1
        except StoreFull as exc:
            assert "out of memory (maxmemory)" in str(exc)
            refused.append(ckpt)
            if len(refused) >= 40:
                break
    assert written > 50 and len(refused) == 40
    total = sum(consistent(client, store, run) for run in runs)
    assert total == written
    for ckpt in refused:
        assert client.hget(store.keys.checkpoints_of(ckpt.run_id), ckpt.id) is None
        assert client.hget(store.keys.attempts(ckpt.run_id), ckpt.activation or "") is None

    # Room again (the limit raised): commits go on, each run where it stopped.
    client.config_set("maxmemory", str(64 * MB))
    store.commit(Checkpoint(run_id=runs[2], event="method_execution_finished", state={"id": "x"}))
    assert consistent(client, store, runs[2]) >= 2
    store.close()
    client.close()


# --- a deployment on a Redis near its limit ---------------------------------------------------


def fill(client: redis.Redis, fraction: float) -> None:
    """Write filler keys until Redis uses ``fraction`` of its ``maxmemory``."""
    limit, n = int(client.info("memory")["maxmemory"]), 0
    while client.info("memory")["used_memory"] < fraction * limit:
        pipe = client.pipeline(transaction=False)
        for _ in range(20):
            pipe.set(f"filler:{n}", "f" * 50_000)
            n += 1
        pipe.execute()


@pytest.mark.slow
def test_a_full_store_refuses_submits_while_running_runs_finish(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    from runner.distributed.app import make_app
    from runner.distributed.client import submit
    from runner.distributed.engine import Runtime
    from runner.observe.metrics import StoreMemoryUse
    from runner.settings import RunnerSettings
    from tests.console_support import serving
    from tests.flows.full import WaitingFlow, gate_key

    with redis_server(
        tmp_path, "--maxmemory", str(64 * MB), "--maxmemory-policy", "noeviction"
    ) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        env = {**worker_env, "RUNNER_REDIS_URL": url, "RUNNER_BROKER_URL": url}
        pool = WorkerPool(env, str(tmp_path))
        pool.start()
        settings = RunnerSettings(**_settings_kwargs(env))
        rt = Runtime.create(make_app(settings), settings)
        client = redis.Redis.from_url(url)
        try:
            tag = uuid.uuid4().hex[:8]
            running = [submit(WaitingFlow, {"tag": tag}, rt=rt) for _ in range(2)]
            for handle in running:
                deadline = time.monotonic() + 30
                while not rt.store.leases(handle.run_id):  # its first step runs
                    assert time.monotonic() < deadline, "the step never started"
                    time.sleep(0.05)

            fill(client, 0.92)
            with pytest.raises(StoreFull, match="past the 90% high-water mark"):
                submit(WaitingFlow, {"tag": tag}, rt=rt)
            cli_env = {"RUNNER_REDIS_URL": url, "RUNNER_PREFIX": settings.prefix}
            cli_env["RUNNER_QUEUE"] = settings.queue
            refused = wide_cli(cli_env, "submit", "tests.flows.full:WaitingFlow")
            assert refused.returncode == 1, refused.stdout + refused.stderr
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: the store is full: Redis at")
            shown = wide_cli(cli_env, "store")
            assert shown.returncode == 1 and "FULL (submits refused)" in shown.stdout
            with serving(rt, token="t") as base:
                answer = httpx.post(
                    f"{base}/api/runs",
                    json={"flow": "tests.flows.full:WaitingFlow", "inputs": {"tag": tag}},
                    headers={"Authorization": "Bearer t"},
                    timeout=10,
                )
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["type"] == "StoreFull"
            gauges = {
                metric.name: metric.samples[0].value
                for metric in StoreMemoryUse(rt.store).collect()
            }
            assert gauges["runner_store_memory_limit_bytes"] == 64 * MB
            assert gauges["runner_store_memory_used_bytes"] > 0.9 * 64 * MB
            assert gauges["runner_store_memory_free_bytes"] < 0.1 * 64 * MB

            # The runs already running go on committing: their 50 KB states land.
            client.set(gate_key(tag), 1)
            for handle in running:
                assert handle.wait(timeout=60) is RunStatus.SUCCEEDED
                latest = rt.store.latest(handle.run_id)
                assert latest is not None and len(latest.state["notes"]) == 50_000
            assert len(rt.store.runs(limit=100)) == 2  # nothing else was created
        finally:
            client.close()
            rt.close()
            pool.discard()


@pytest.mark.processes
def test_runner_store_shows_the_limit_and_warns_of_an_evicting_policy(tmp_path: Path) -> None:
    with redis_server(
        tmp_path, "--maxmemory", str(64 * MB), "--maxmemory-policy", "allkeys-lru"
    ) as server:
        env = {"RUNNER_REDIS_URL": f"redis://127.0.0.1:{server.port}/0", "RUNNER_PREFIX": "mem"}
        # RUNNER_STORE_MAX_BYTES lower than maxmemory is the limit.
        shown = wide_cli({**env, "RUNNER_STORE_MAX_BYTES": str(32 * MB)}, "store", "--json")
        assert shown.returncode == 0, shown.stderr
        (found,) = json.loads(shown.stdout)
        assert (found["limit"], found["high_water"]) == (32 * MB, int(32 * MB * 0.9))
        assert found["free"] == 32 * MB - found["used"] and found["full"] is False
        assert found["policy"] == "allkeys-lru"
        text = wide_cli({**env, "RUNNER_STORE_HIGH_WATER": "0.5"}, "store")
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0].startswith(f"{env['RUNNER_REDIS_URL']}: used ")
        assert "limit 64.0 MB" in lines[0] and "high-water 32.0 MB" in lines[0]
        assert "maxmemory-policy is allkeys-lru, not noeviction" in text.stdout


def wide_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``runner ARGS...`` wide enough that a table does not fold."""
    return runner_cli(env, *args, COLUMNS="200")
