"""``POST /api/runs``: the console's API submits runs as ``runner submit`` does, idempotently
with an ``id``, and refuses bad input with a 4xx JSON error that stores nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from runner.distributed.client import RunHandle
from runner.distributed.engine import Runtime
from runner.store.models import RunStatus
from tests.console_support import console_workers, serving, snapshot
from tests.flows.dist import executions

TOKEN = "submit-t0ken"
GREET = "tests.flows.timing:GreetFlow"


@pytest.fixture(scope="module")
def rt(worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    with console_workers(worker_env, str(tmp_path_factory.mktemp("console-submit"))) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def api(rt: Runtime) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url, headers=headers) as http:
        yield http


def error_type(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"]["type"])


def test_a_submit_starts_a_run_that_finishes_on_the_workers(rt: Runtime, api: httpx.Client) -> None:
    made = api.post("/api/runs", json={"flow": GREET, "inputs": {"customer": "ana"}})
    assert made.status_code == 202, made.text
    handle = RunHandle(made.json()["run_id"], rt)
    assert handle.result(timeout=30) == len("hello ana")


def test_concurrent_submits_of_one_id_make_one_run(
    rt: Runtime, api: httpx.Client, redis_client: redis.Redis
) -> None:
    run_id = f"api-{uuid.uuid4().hex[:8]}"
    body = {"flow": GREET, "inputs": {"customer": "bo"}, "id": run_id}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: api.post("/api/runs", json=body), range(8)))
    assert {a.status_code for a in answers} == {202}
    assert {a.json()["run_id"] for a in answers} == {run_id}
    assert RunHandle(run_id, rt).result(timeout=30) == len("hello bo")
    again = api.post("/api/runs", json=body)  # a retry after the run finished: that run
    assert again.status_code == 202 and again.json()["status"] == RunStatus.SUCCEEDED.value
    assert executions(redis_client, run_id, "greet") == 1
    before = snapshot(rt)
    other = api.post("/api/runs", json={**body, "inputs": {"customer": "cy"}})
    assert error_type(other, 409) == "RunExists"
    rejected = api.post("/api/runs", json={**body, "if_exists": "reject"})
    assert error_type(rejected, 409) == "RunExists"
    assert snapshot(rt) == before


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({"flow": "tests.flows.timing:NoSuchFlow"}, 422, "FlowImportError"),
        ({"flow": GREET, "inputs": {"nope": 1}}, 422, "InvalidInputs"),
        ({"flow": "tests.test_allow_list:StrayFlow"}, 422, "FlowNotAllowed"),
        ({"flow": GREET, "if_exists": "sometimes"}, 422, "BadRequest"),
        ({"flow": GREET, "countdown": -1}, 422, "BadRequest"),
        ({"inputs": {}}, 422, "BadRequest"),
    ],
)
def test_bad_submits_are_4xx_json_and_store_nothing(
    rt: Runtime, api: httpx.Client, body: dict[str, Any], status: int, kind: str
) -> None:
    before = snapshot(rt)
    assert error_type(api.post("/api/runs", json=body), status) == kind
    assert snapshot(rt) == before


def test_a_read_only_console_submits_nothing(rt: Runtime) -> None:
    before = snapshot(rt)
    with serving(rt) as url:
        refused = httpx.post(f"{url}/api/runs", json={"flow": GREET}, timeout=10)
    assert error_type(refused, 403) == "ReadOnly"
    assert snapshot(rt) == before
