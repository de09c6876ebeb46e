"""Encryption at rest (``RUNNER_ENCRYPTION_KEYS``, :mod:`runner.store.codec`) on the real
Redis: no payload in clear in Redis nor in the steps' messages, routing metadata readable,
a value bound to its run, two keys and a rotation (``runner rekey``) stopped half-way and
resumed, and one clear error (exit 1) for a process without the key or with a wrong one."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from runner.errors import EncryptionKeyError
from runner.store.codec import Codec, parse_keys
from runner.store.models import (
    Answer,
    Awaiting,
    Checkpoint,
    ChildLink,
    RunUsage,
    StepError,
    UsageMetrics,
)
from runner.store.redis import RedisProvider
from runner.store.rekey import rekey
from runner.store.schedules import make_schedule
from tests._dist_support import runner_cli
from tests.conftest import WorkerPool, _settings_kwargs, capture_events

ROOT = Path(__file__).resolve().parent.parent
K1 = "k1:" + base64.b64encode(bytes(range(32))).decode()
K2 = "k2:" + base64.b64encode(bytes(range(100, 132))).decode()
K1_WRONG = "k1:" + base64.b64encode(bytes(range(1, 33))).decode()

Store = Callable[[str | None], RedisProvider]


@pytest.fixture
def mark() -> str:
    """A text every payload of the test holds, so a raw dump shows where it is in clear."""
    return f"s3cr3t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[Store]:
    """Opens providers on one prefix with the given ``RUNNER_ENCRYPTION_KEYS`` (``None``:
    none), keeping every checkpoint."""
    opened: list[RedisProvider] = []

    def make(keys: str | None) -> RedisProvider:
        codec = Codec(parse_keys(keys)) if keys else None
        made = RedisProvider(redis_url, prefix=prefix, max_checkpoints=0, codec=codec)
        opened.append(made)
        return made

    yield make
    for made in opened:
        made.close()


def raw_dump(client: redis.Redis, prefix: str) -> bytes:
    """Every key under ``prefix`` and all it holds, as Redis keeps it."""
    out = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        kind = client.type(key)
        if kind == b"hash":
            held: Any = client.hgetall(key)
        elif kind == b"zset":
            held = client.zrange(key, 0, -1)
        elif kind == b"set":
            held = client.smembers(key)
        elif kind == b"list":
            held = client.lrange(key, 0, -1)
        else:
            held = client.get(key)
        out.append(key + b" " + repr(held).encode())
    return b"\n".join(out)


def full_checkpoint(run_id: str, mark: str, **fields: Any) -> Checkpoint:
    """A checkpoint with ``mark`` in every kind of payload a checkpoint holds."""
    given: dict[str, Any] = {
        "event": "method_execution_finished",
        "step": "plan",
        "state": {"id": run_id, "secret": mark, "n": 1},
        "error": StepError(type="ValueError", message=f"bad {mark}", traceback=f"tb {mark}"),
        "usage": UsageMetrics(prompt_tokens=7, total_tokens=7),
        **fields,
    }
    ckpt = Checkpoint(run_id=run_id, **given)
    ckpt.record.outputs["plan"] = f"output {mark}"
    ckpt.record.in_flight = ["write#1"]
    ckpt.meta = ckpt.meta.updated(
        name="SecretFlow",
        trigger_payload={"payload": mark},
        submitted=f"digest-{mark}",
        pause_reason=f"why {mark}",
        awaiting=Awaiting(kind="ask", message=f"q {mark}", method="plan", output=mark),
        reviews={"plan#1": Awaiting(kind="feedback", message=mark, metadata={"m": mark})},
        answers={
            "plan#1": [
                Answer(text=f"a {mark}", by=mark, awaited=Awaiting(kind="ask", message=mark))
            ]
        },
        feedback=[{"feedback": mark}],
        usage=RunUsage(total=UsageMetrics(total_tokens=7)),
        children={
            "plan#1": ChildLink(
                run_id="c", flow="f:F", name="F", before={"k": mark}, after={"k": 1}
            )
        },
    )
    return ckpt


def comparable(ckpt: Checkpoint) -> dict[str, Any]:
    return ckpt.model_dump(mode="json", exclude={"seq"})


def test_redis_holds_no_payload_in_clear_and_reads_it_back_whole(
    store: Store, redis_client: redis.Redis, prefix: str, mark: str
) -> None:
    sealed = store(K1)
    run = f"run-{mark[7:]}"
    small = sealed.commit(full_checkpoint(run, mark))
    # A large state goes by field: each value sealed on its own.
    big = full_checkpoint(run, mark, state={"id": run, "doc": mark * 3000, "short": mark})
    big = sealed.commit(big)
    sealed.add_schedule(
        make_schedule("nightly", "tests.flows.sealed:SecretFlow", {"s": mark}, every=3600)
    )

    raw = raw_dump(redis_client, prefix)
    assert mark.encode() not in raw
    # What routes and recovers a run stays readable without the key.
    for clear in (run, "running", "plan", "write#1", "method_execution_finished", "ValueError"):
        assert clear.encode() in raw, clear
    assert b"enc:k1:" in raw

    assert [comparable(c) for c in reversed(sealed.history(run))] == [
        comparable(small),
        comparable(big),
    ]
    assert comparable(sealed.latest(run)) == comparable(big)  # type: ignore[arg-type]
    info = sealed.run(run)
    assert info is not None and info.error == f"ValueError: bad {mark}"
    assert sealed.schedule("nightly").inputs == {"s": mark}


def test_a_value_copied_to_another_run_does_not_open(
    store: Store, redis_client: redis.Redis, mark: str
) -> None:
    sealed = store(K1)
    one, other = f"one-{mark[7:]}", f"other-{mark[7:]}"
    sealed.commit(full_checkpoint(one, mark))
    target = sealed.commit(full_checkpoint(other, "nothing"))
    k = sealed.keys
    blob = redis_client.hget(k.snapshots(one), sealed.latest(one).id)  # type: ignore[union-attr]
    redis_client.hset(k.snapshots(other), target.id, blob)  # type: ignore[arg-type]
    with pytest.raises(EncryptionKeyError, match="does not open with encryption key 'k1'"):
        sealed.get(target.id)


def test_two_keys_a_rotation_stopped_half_way_and_resumed(
    store: Store, redis_client: redis.Redis, prefix: str, mark: str
) -> None:
    clear, old = store(None), store(K1)
    runs = [f"r{n}-{mark[7:]}" for n in range(6)]
    clear.commit(full_checkpoint(runs[0], mark))  # written before encryption was turned on
    for run in runs[1:]:
        old.commit(full_checkpoint(run, mark, state={"id": run, "doc": mark * 3000}))
    old.add_schedule(
        make_schedule("hourly", "tests.flows.sealed:SecretFlow", {"s": mark}, every=3600)
    )
    before = {run: [comparable(c) for c in old.history(run)] for run in runs}

    # Rotation: the new key first, the old one still listed; new writes use the new key.
    both = store(f"{K2},{K1}")
    assert {run: [comparable(c) for c in both.history(run)] for run in runs} == before
    newer = both.commit(full_checkpoint(runs[1], mark))
    before[runs[1]].insert(0, comparable(newer))
    raw = raw_dump(redis_client, prefix)
    assert b"enc:k1:" in raw and b"enc:k2:" in raw
    with pytest.raises(EncryptionKeyError, match="key 'k2', which this process does not have"):
        old.latest(runs[1])

    # Stopped after two batches of one run: the cursor is kept in Redis...
    first = rekey(both, batch=1, batches=2)
    assert (first.done, first.runs) == (False, 2)
    kept = redis_client.hgetall(both.keys.rekey())
    assert kept[b"kid"] == b"k2" and kept[b"runs"] == b"2"
    # ... and the next rekey goes on from there.
    rest = rekey(both, batch=1)
    assert rest.resumed and rest.done and rest.runs == len(runs)
    assert not redis_client.exists(both.keys.rekey())

    raw = raw_dump(redis_client, prefix)
    assert b"enc:k1:" not in raw and mark.encode() not in raw
    only_new = store(K2)
    assert {run: [comparable(c) for c in only_new.history(run)] for run in runs} == before
    assert only_new.schedule("hourly").inputs == {"s": mark}
    assert rekey(only_new).values == 0  # nothing left to re-seal


@pytest.mark.processes
def test_the_cli_without_the_key_or_with_a_wrong_one_says_so_in_one_line(
    store: Store, redis_url: str, prefix: str, mark: str
) -> None:
    run = f"cli-{mark[7:]}"
    store(K1).commit(full_checkpoint(run, mark))
    env = {"RUNNER_REDIS_URL": redis_url, "RUNNER_PREFIX": prefix}

    shown = wide_cli({**env, "RUNNER_ENCRYPTION_KEYS": K1}, "show", run)
    assert shown.returncode == 0, shown.stderr
    assert mark in shown.stdout

    for keys, says in (
        (None, "is encrypted with key 'k1', which this process does not have"),
        (K1_WRONG, "does not open with encryption key 'k1'"),
        (K2, "is encrypted with key 'k1', which this process does not have"),
    ):
        for command in (["show", run], ["checkpoints", run], ["runs"]):
            done = wide_cli({**env, **({"RUNNER_ENCRYPTION_KEYS": keys} if keys else {})}, *command)
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
            assert mark not in done.stdout + done.stderr

    bad = wide_cli({**env, "RUNNER_ENCRYPTION_KEYS": "k1:not-base64!"}, "runs")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "error: bad setting RUNNER_ENCRYPTION_KEYS: Value error, the key of 'k1' is not base64"
    )


@pytest.mark.processes
def test_rekey_on_the_cli_stops_and_goes_on(store: Store, redis_url: str, prefix: str) -> None:
    old = store(K1)
    for n in range(3):
        old.commit(full_checkpoint(f"c{n}", "x"))
    env = {
        "RUNNER_REDIS_URL": redis_url,
        "RUNNER_PREFIX": prefix,
        "RUNNER_ENCRYPTION_KEYS": f"{K2},{K1}",
    }
    first = wide_cli(env, "rekey", "--batch", "1", "--batches", "1")
    assert first.returncode == 0, first.stderr
    assert "1 run(s) gone through" in first.stdout and "run `runner rekey` again" in first.stdout
    rest = wide_cli(env, "rekey", "--batch", "1", "--json")
    assert rest.returncode == 0, rest.stderr
    assert json.loads(rest.stdout) | {"values": 0} == {
        "key_id": "k2",
        "runs": 3,
        "values": 0,
        "done": True,
        "resumed": True,
    }


# --- on workers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sealed_env(worker_env: dict[str, str]) -> dict[str, str]:
    """The environment of a deployment of its own with encryption on (key ``k1``)."""
    tag = uuid.uuid4().hex[:8]
    return {
        **worker_env,
        "RUNNER_PREFIX": f"enc-{tag}",
        "RUNNER_QUEUE": f"encq-{tag}",
        "RUNNER_ENCRYPTION_KEYS": K1,
    }


@pytest.fixture(scope="module")
def sealed_rt(sealed_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Workers and a producer of :func:`sealed_env`'s deployment."""
    from runner.distributed.app import make_app
    from runner.distributed.engine import Runtime
    from runner.settings import RunnerSettings

    env = sealed_env
    pool = WorkerPool(env, str(tmp_path_factory.mktemp("sealed-workers")))
    pool.start()
    settings = RunnerSettings(**_settings_kwargs(env), encryption_keys=K1)  # type: ignore[arg-type]
    runtime = Runtime.create(make_app(settings), settings)
    yield runtime
    runtime.close()
    pool.discard()


def broker_messages(client: redis.Redis, queue: str, run_id: str) -> list[dict[str, Any]]:
    """The step messages of ``run_id`` in the broker now: queued (the queue's lists) or
    received and held by a worker (kombu's ``unacked`` hash), their bodies decoded."""
    raw = [m for key in client.scan_iter(match=f"{queue}*") for m in client.lrange(key, 0, -1)]
    raw += [json.dumps(json.loads(m)[0]).encode() for m in client.hvals("unacked")]
    found = []
    for item in raw:
        message = json.loads(item)
        if run_id not in json.dumps(message["headers"]):
            continue
        body = (
            base64.b64decode(message["body"])
            if message.get("properties", {}).get("body_encoding") == "base64"
            else message["body"].encode()
        )
        found.append({"headers": message["headers"], "body": json.loads(body)})
    return found


@pytest.mark.slow
def test_steps_on_workers_carry_no_payload_in_their_messages_events_or_flower(
    sealed_rt: Any, sealed_env: dict[str, str], redis_client: redis.Redis, mark: str, tmp_path: Path
) -> None:
    from runner.distributed.client import submit
    from tests.console_support import flower
    from tests.flows.sealed import SecretFlow

    rt = sealed_rt
    inputs = {"tag": mark, "secret": mark, "crewai_trigger_payload": {"p": mark}}
    seen: list[dict[str, Any]] = []
    with flower(sealed_env, str(tmp_path)) as flower_url, capture_events(rt.app) as events:
        handle = submit(SecretFlow, inputs, rt=rt)
        deadline = time.monotonic() + 30
        # The retry of ``read`` waits 1.5-3 s in the broker: its message carries the failed
        # attempt's usage, sealed.
        while time.monotonic() < deadline and not any("spent" in m["body"][1] for m in seen):
            seen += broker_messages(redis_client, rt.settings.queue, handle.run_id)
            time.sleep(0.02)
        handle.wait(timeout=60)
        assert handle.result() == f"wrote read {mark}"
        # Flower's view of the run's tasks (what its pages show), once it has them all.
        deadline = time.monotonic() + 20
        while True:
            tasks = httpx.get(f"{flower_url}/api/tasks", timeout=5).json()
            mine = {k: t for k, t in tasks.items() if handle.run_id in k}
            if len(mine) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    # read (its retry is the same task) and write, as Flower shows them
    assert {t["name"] for t in mine.values()} == {"SecretFlow.read", "SecretFlow.write"}
    assert mark not in json.dumps(mine)
    retried = [m for m in seen if "spent" in m["body"][1]]
    assert retried, "the retry's message was never seen in the broker"
    assert str(retried[0]["body"][1]["spent"]).startswith("enc:k1:")
    assert mark not in json.dumps(seen)
    for message in seen:
        assert set(message["body"][1]) <= {
            "run_id",
            "activation",
            "epoch",
            "deployment",
            "attempt",
            "spent",
        }
    assert [e for e in events if mark in json.dumps(e, default=str)] == []

    # The run's payloads were stored sealed, and the retry's usage was opened and counted.
    assert mark.encode() not in raw_dump(redis_client, rt.settings.prefix)
    read = next(c for c in rt.store.history(handle.run_id) if c.step == "read" and c.usage)
    assert read.usage is not None and read.usage.total_tokens == 80
    latest = rt.store.latest(handle.run_id)
    assert latest is not None and latest.state["notes"] == f"notes on {mark}"
    assert latest.meta.trigger_payload == {"p": mark}


@pytest.mark.slow
def test_a_worker_without_the_key_leaves_the_step_to_one_that_has_it(
    worker_env: dict[str, str], tmp_path: Path, mark: str
) -> None:
    from runner.distributed.app import make_app
    from runner.distributed.client import submit
    from runner.distributed.engine import Runtime
    from runner.settings import RunnerSettings
    from tests.flows.sealed import SecretFlow

    tag = uuid.uuid4().hex[:8]
    env = {**worker_env, "RUNNER_PREFIX": f"nokey-{tag}", "RUNNER_QUEUE": f"nokeyq-{tag}"}
    settings = RunnerSettings(**_settings_kwargs(env), encryption_keys=K1)  # type: ignore[arg-type]
    rt = Runtime.create(make_app(settings), settings)
    keyless = WorkerPool(env, str(tmp_path))
    keyless.start(concurrency=1)
    try:
        handle = submit(SecretFlow, {"tag": mark, "secret": mark}, rt=rt)
        log = Path(tmp_path, "worker-0.log")
        said = f"run {handle.run_id} step read#1 not run here: checkpoint (the latest) of run "
        deadline = time.monotonic() + 30
        while said not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        assert "is encrypted with key 'k1', which this process does not have" in log.read_text()
        assert "Traceback" not in log.read_text()
        assert handle.status().value == "running"  # untouched, not quarantined
        # A worker with the key takes the step when it comes back.
        keyed = WorkerPool({**env, "RUNNER_ENCRYPTION_KEYS": K1}, str(tmp_path / "keyed"))
        (tmp_path / "keyed").mkdir()
        keyless.stop_all()
        keyed.start()
        try:
            handle.wait(timeout=60)
            assert handle.result() == f"wrote read {mark}"
        finally:
            keyed.stop_all()
    finally:
        keyless.stop_all()
        rt.close()


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ("k1", "entry 1 is not <key id>:<base64 key> (a key id is 1-64 of A-Z a-z 0-9 _ . -)"),
        (
            "k1:" + base64.b64encode(b"short").decode(),
            "the key of 'k1' is 5 bytes, not 16, 24 or 32",
        ),
        (f"{K1},{K1_WRONG}", "key id 'k1' is listed twice"),
        (
            "k 1:" + K1.split(":")[1],
            "entry 1 is not <key id>:<base64 key> (a key id is 1-64 of A-Z a-z 0-9 _ . -)",
        ),
    ],
)
def test_a_bad_key_list_is_one_settings_error_that_shows_no_key(keys: str, says: str) -> None:
    from runner.errors import InvalidSettings
    from runner.settings import get_settings

    os.environ["RUNNER_ENCRYPTION_KEYS"] = keys
    try:
        with pytest.raises(InvalidSettings) as caught:
            get_settings()
    finally:
        del os.environ["RUNNER_ENCRYPTION_KEYS"]
    assert str(caught.value) == f"bad setting RUNNER_ENCRYPTION_KEYS: Value error, {says}"
    assert K1.split(":")[1] not in str(caught.value)


def test_the_settings_keep_the_key_list_secret() -> None:
    from runner.settings import RunnerSettings

    settings = RunnerSettings(encryption_keys=f"{K2},{K1}")  # type: ignore[arg-type]
    assert K1.split(":")[1] not in repr(settings) + str(settings.model_dump())


def wide_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``runner ARGS...`` wide enough that a table does not fold."""
    return runner_cli(env, *args, COLUMNS="200")
