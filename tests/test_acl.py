"""Least-privilege ACL users (:func:`runner.distributed.acl.acl_rules`) on a real Redis.

A private ``redis-server`` on a free loopback port gets the three users of the README's
rules and its ``default`` user switched off, so every connection must log in: a worker
(password from ``RUNNER_REDIS_PASSWORD_FILE``) runs a flow a producer (password from
``RUNNER_REDIS_PASSWORD``) submits and resumes, the console's user browses them and is
refused any write. Every denial Redis logs (``ACL LOG``) fails the test.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from runner.distributed import control
from runner.distributed.acl import acl_rules
from runner.distributed.client import submit
from runner.distributed.processes import WORKER_COMMAND
from runner.errors import StoreError
from runner.settings import reset_settings
from runner.store.models import RunStatus
from tests._dist_support import runtime_for
from tests.conftest import WorkerPool
from tests.console_support import serving
from tests.flows.production import ProdGated, ProdSplit
from tests.redis_servers import redis_server

REFUSED = "no permissions|can't run this command"
"""Redis's refusal of a command (a script's own commands are refused in other words)."""
README = Path(__file__).resolve().parent.parent / "README.md"


@contextlib.contextmanager
def runner_env(env: dict[str, str]) -> Iterator[None]:
    """This process's ``RUNNER_*`` credentials set to ``env`` (others removed) meanwhile."""
    names = ("RUNNER_REDIS_USERNAME", "RUNNER_REDIS_PASSWORD", "RUNNER_REDIS_PASSWORD_FILE")
    saved = {name: os.environ.pop(name, None) for name in names}
    os.environ.update(env)
    reset_settings()
    try:
        yield
    finally:
        for name in names:
            os.environ.pop(name, None)
            if saved[name] is not None:
                os.environ[name] = saved[name]  # type: ignore[assignment]
        reset_settings()


def test_the_readme_gives_the_rules_of_a_default_deployment() -> None:
    from runner.distributed.app import make_app
    from runner.settings import RunnerSettings

    settings = RunnerSettings(redis_url="redis://127.0.0.1:6379/0")
    app = make_app(settings)
    try:
        rules = acl_rules(app, settings)
    finally:
        app.close()
    text = README.read_text()
    for role, rule in rules.items():
        assert f"ACL SETUSER runner-{role} on >PASSWORD {rule}" in text, role


@pytest.mark.slow
def test_workers_producers_and_a_read_only_console_run_with_least_privilege(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    secrets = {role: uuid.uuid4().hex for role in ("worker", "producer", "console")}
    with redis_server(tmp_path) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        admin = redis.Redis(port=server.port)
        token = uuid.uuid4().hex[:8]
        env = {
            **worker_env,
            "RUNNER_REDIS_URL": url,
            "RUNNER_PREFIX": f"acl-{token}",
            "RUNNER_QUEUE": f"aclq-{token}",
        }
        probe = runtime_for(env)
        rules = acl_rules(probe.app, probe.settings)
        probe.close()
        for role, rule in rules.items():
            admin.execute_command("ACL", "SETUSER", role, "on", f">{secrets[role]}", *rule.split())
        admin.execute_command("ACL", "SETUSER", "admin", "on", ">admin", "~*", "&*", "+@all")
        admin.execute_command("ACL", "SETUSER", "default", "off")
        admin = redis.Redis(port=server.port, username="admin", password="admin")
        admin.execute_command("ACL", "LOG", "RESET")

        secret_file = tmp_path / "worker-password"
        secret_file.write_text(secrets["worker"] + "\n")
        worker_login = {
            "RUNNER_REDIS_USERNAME": "worker",
            "RUNNER_REDIS_PASSWORD_FILE": str(secret_file),
        }
        pool = WorkerPool({**env, **worker_login}, str(tmp_path))
        try:
            with runner_env(worker_login):  # the pool's readiness ping speaks as a worker
                worker = pool.start()
            shown = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
            assert WORKER_COMMAND in shown and not any(s in shown for s in secrets.values())

            producer_login = {"RUNNER_REDIS_USERNAME": "producer"}
            with runner_env({**producer_login, "RUNNER_REDIS_PASSWORD": secrets["producer"]}):
                rt = runtime_for(env)
                split = submit(ProdSplit, rt=rt)
                assert split.result(timeout=60) == ["a", "b", "c"]
                gated = submit(ProdGated, rt=rt)
                assert gated.wait(timeout=60) is RunStatus.FAILED
                resumed = control.resume(gated.run_id, inputs={"open": True}, rt=rt)
                assert resumed.result(timeout=60) == ["first", "gate", "last"]
                rt.close()

            console_login = {"RUNNER_REDIS_USERNAME": "console"}
            with runner_env({**console_login, "RUNNER_REDIS_PASSWORD": secrets["console"]}):
                rt = runtime_for(env)
                with serving(rt) as console:
                    runs = httpx.get(f"{console}/api/runs", timeout=10).json()["runs"]
                    assert {r["run_id"] for r in runs} == {split.run_id, gated.run_id}
                    page = httpx.get(f"{console}/api/runs/{gated.run_id}", timeout=10)
                    assert page.status_code == 200 and "gate" in page.text
                    # Celery's remote control needs writes this user lacks: the Workers page
                    # lists the worker from its roster in Redis, as not answering.
                    fleet = httpx.get(f"{console}/api/workers", timeout=20)
                    assert fleet.status_code == 200, fleet.text
                    listed = [(w["name"], w["answered"]) for w in fleet.json()["workers"]]
                    assert listed == [(pool.workers[0].name, False)]
                    assert fleet.json()["queues"][0]["depth"] == 0
                assert rt.store.history(gated.run_id, limit=100)
                with pytest.raises(StoreError, match=REFUSED):
                    rt.store.update_run(split.run_id, branch="written by the console")
                with pytest.raises(StoreError, match=REFUSED):
                    control.fork(split.run_id, rerun=["join"], rt=rt)
                with pytest.raises(redis.ResponseError, match=REFUSED):
                    rt.store.client.set(f"{env['RUNNER_PREFIX']}:x", "1")
                rt.close()
            # Only the console's refused writes were denied: workers and producers never.
            denied = admin.acl_log()
            assert {entry["username"] for entry in denied} == {"console"}, denied
            assert worker.poll() is None
        finally:
            pool.discard()
