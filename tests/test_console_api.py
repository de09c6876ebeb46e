"""The console's JSON API against real Redis and real workers: reads, actions, and bad
input (unknown ids, invalid state, missing token, missing CSRF) as clear 4xx JSON errors
that change nothing."""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runner.distributed import client
from runner.distributed.client import RunHandle
from runner.distributed.engine import Runtime
from runner.store.models import RunStatus
from tests._dist_support import eventually
from tests.console_support import FLOWER, console_workers, failed_review, serving, snapshot
from tests.flows import crews, dist

TOKEN = "t0ken-for-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def rt(worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    with console_workers(worker_env, str(tmp_path_factory.mktemp("console-api"))) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def acting(rt: Runtime) -> Iterator[httpx.Client]:
    """A client of a console started with a token, sending it as a bearer header."""
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url, headers=BEARER) as http:
        yield http


@pytest.fixture(scope="module")
def readonly(rt: Runtime) -> Iterator[httpx.Client]:
    """A client of a console started without a token (read-only)."""
    with serving(rt) as url, httpx.Client(base_url=url) as http:
        yield http


@pytest.fixture(scope="module")
def failed_run(rt: Runtime) -> str:
    return failed_review(rt, topic="api")


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The JSON error body of a response that must have ``status``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()["error"]
    assert body["type"] and body["message"]
    return body


def test_a_failed_run_shows_its_failed_step_error_and_timeline(
    readonly: httpx.Client, failed_run: str
) -> None:
    found = readonly.get("/api/runs", params={"status": "failed", "q": failed_run}).json()
    assert [r["run_id"] for r in found["runs"]] == [failed_run]
    assert found["runs"][0]["name"] == "ReviewFlow"

    run = readonly.get(f"/api/runs/{failed_run}").json()
    assert run["run"]["status"] == "failed"
    states = {m["name"]: (m["state"], m["count"]) for m in run["methods"]}
    assert states == {
        "outline": ("done", 1),
        "write": ("done", 1),
        "check": ("failed", 0),
        "publish": ("pending", 0),
    }
    assert run["error"]["step"] == "check"
    assert run["error"]["type"] == "ValueError"
    assert "over the limit of 10 chars" in run["error"]["message"]
    assert "Traceback" in run["error"]["traceback"]
    assert "class n_check failed" in run["mermaid"]
    events = [c["event"] for c in run["timeline"]]
    assert events[:2] == ["flow_failed", "method_execution_failed"]  # the run's closing first
    assert events[-1] == "flow_started"
    write = next(c for c in run["timeline"] if c["step"] == "write")
    # The task id is one path segment: its `#` is encoded, not a fragment.
    assert write["flower"] == f"{FLOWER}/task/{failed_run}%3A0%3Awrite%231"
    assert run["lineage"]["run_id"] == failed_run and run["lineage"]["forks"] == []


def section(page: str, element_id: str) -> str:
    """The HTML of the ``<section id=...>`` of a page (sections do not nest)."""
    match = re.search(rf'<section[^>]*id="{element_id}".*?</section>', page, re.S)
    assert match is not None, f"no section #{element_id}"
    return match.group(0)


def test_a_run_shows_its_inputs_and_the_result_the_cli_prints(
    rt: Runtime, readonly: httpx.Client
) -> None:
    handle = client.submit("tests.console_flows:ReviewFlow", {"topic": "io", "limit": 500}, rt=rt)
    result = handle.result(timeout=15)
    assert result == "published (accepted)"
    run = readonly.get(f"/api/runs/{handle.run_id}").json()
    assert run["inputs"] == {"topic": "io", "limit": 500, "draft": "", "verdict": ""}
    assert run["result"] == result  # what `runner submit --wait` prints after "succeeded: "

    page = readonly.get(f"/runs/{handle.run_id}").text
    assert '<tr data-input="topic">' in section(page, "inputs")
    assert '<pre class="json">500</pre>' in section(page, "inputs")
    assert "published (accepted)" in section(page, "result")


def test_a_failed_runs_inputs_keep_the_trigger_payload_and_it_has_no_result(
    rt: Runtime, readonly: httpx.Client
) -> None:
    handle = client.submit(
        "tests.flows.dist:Triggered", {"crewai_trigger_payload": {"ticket": 7}}, rt=rt
    )
    assert handle.wait(timeout=15) is RunStatus.FAILED
    run = readonly.get(f"/api/runs/{handle.run_id}").json()
    assert run["inputs"] == {"seen": {}, "crewai_trigger_payload": {"ticket": 7}}
    assert run["result"] is None
    assert 'id="result"' not in readonly.get(f"/runs/{handle.run_id}").text


def test_a_fork_shows_the_state_it_started_from_as_its_inputs(
    rt: Runtime, acting: httpx.Client
) -> None:
    source = failed_review(rt, topic="io")
    response = acting.post(
        f"/api/checkpoints/{source}/fork", json={"set": {"limit": 900}, "rerun": ["check"]}
    )
    assert response.status_code == 201, response.text
    fork_id = response.json()["run_id"]
    assert RunHandle(fork_id, rt).wait(timeout=15) is RunStatus.SUCCEEDED
    run = acting.get(f"/api/runs/{fork_id}").json()
    assert run["inputs"] == {
        "topic": "io",
        "limit": 900,
        "draft": "outline of io: first draft",
        "verdict": "",
    }
    assert run["result"] == "published (accepted)"
    # Each step links to the fork's own task; the checkpoint copied from the source does not.
    links = {c["event"]: c["flower"] for c in run["timeline"] if c["step"] == "check"}
    assert links == {
        "forked": None,
        "method_execution_finished": f"{FLOWER}/task/{fork_id}%3A0%3Acheck%232",
    }


def test_resume_sits_next_to_the_error_or_the_cli_command_when_read_only(
    acting: httpx.Client, readonly: httpx.Client, failed_run: str
) -> None:
    error = section(acting.get(f"/runs/{failed_run}").text, "error")
    assert f'hx-post="/runs/{failed_run}/resume"' in error
    assert "runner resume" not in error

    page = readonly.get(f"/runs/{failed_run}").text
    error = section(page, "error")
    assert "hx-post" not in error
    assert f"resume it from a shell with <code>runner resume {failed_run}</code>" in error
    # No fork control without a token: the fork panel gives the command instead.
    latest = readonly.get(f"/api/runs/{failed_run}").json()["checkpoint"]
    fork = section(page, "fork-panel")
    assert "Choose" not in fork and "fork-link" not in page
    assert f"<code>runner fork {latest} --set FIELD=VALUE --rerun STEP</code>" in fork


def test_fork_form_is_the_state_schema_filled_from_the_checkpoint(
    readonly: httpx.Client, failed_run: str
) -> None:
    form = readonly.get(f"/api/checkpoints/{failed_run}/fork-form").json()
    fields = {f["name"]: (f["kind"], f["value"]) for f in form["fields"]}
    assert fields == {
        "topic": ("text", "api"),
        "limit": ("integer", "10"),
        "draft": ("text", "outline of api: first draft"),
        "verdict": ("text", ""),
    }
    assert form["schema"]["properties"]["limit"]["type"] == "integer"
    assert form["steps"] == ["outline", "write", "check", "publish"]
    preview = readonly.get(f"/api/checkpoints/{failed_run}/rerun", params={"step": "write"}).json()
    assert preview["rerun"] == ["write", "check", "publish"]
    assert preview["starts"] == ["write"]


def test_fork_with_edited_state_and_rerun_finishes_on_the_workers(
    rt: Runtime, acting: httpx.Client, failed_run: str
) -> None:
    source = rt.store.latest(failed_run)
    assert source is not None
    response = acting.post(
        f"/api/checkpoints/{source.id}/fork",
        json={"set": {"limit": 500}, "rerun": ["write"], "branch": "bigger"},
    )
    assert response.status_code == 201, response.text
    fork_id = response.json()["run_id"]
    assert RunHandle(fork_id, rt).wait(timeout=15) is RunStatus.SUCCEEDED

    diff = acting.get("/api/diff", params={"a": source.id, "b": fork_id}).json()
    assert diff["state"]["changed"]["limit"] == [10, 500]
    assert diff["state"]["changed"]["verdict"] == ["", "accepted"]
    assert "publish#1" in diff["completed"]["only_b"]

    tree = acting.get(f"/api/runs/{fork_id}").json()["lineage"]
    assert tree["run_id"] == failed_run
    [point] = tree["forks"]
    assert point["checkpoint_id"] == source.id
    assert [(r["run_id"], r["branch"], r["current"]) for r in point["runs"]] == [
        (fork_id, "bigger", True)
    ]
    # The source run is untouched.
    latest = rt.store.latest(failed_run)
    assert latest is not None and latest.id == source.id


def test_invalid_state_names_each_field_and_stores_nothing(
    rt: Runtime, acting: httpx.Client, failed_run: str
) -> None:
    before = snapshot(rt)
    response = acting.post(
        f"/api/checkpoints/{failed_run}/fork",
        json={"set": {"limit": "lots", "colour": "red"}},
    )
    body = error_of(response, 422)
    assert body["type"] == "FieldErrors"
    assert "colour" in body["errors"]
    response = acting.post(f"/api/checkpoints/{failed_run}/fork", json={"set": {"limit": "x"}})
    assert "valid integer" in error_of(response, 422)["errors"]["limit"]
    assert snapshot(rt) == before


def test_unknown_ids_are_404_and_change_nothing(
    rt: Runtime, acting: httpx.Client, failed_run: str
) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    ghost = f"no-such-{random.Random(seed).getrandbits(40):x}"
    before = snapshot(rt)
    assert error_of(acting.get(f"/api/runs/{ghost}"), 404)["type"] == "RunNotFound"
    assert error_of(acting.get(f"/api/checkpoints/{ghost}"), 404)["type"] == "CheckpointNotFound"
    assert (
        ghost
        in error_of(acting.get("/api/diff", params={"a": ghost, "b": failed_run}), 404)["message"]
    )
    assert error_of(acting.post(f"/api/runs/{ghost}/resume", json={}), 404)
    assert error_of(acting.post(f"/api/runs/{ghost}/cancel"), 404)
    assert error_of(acting.post(f"/api/checkpoints/{ghost}/fork", json={}), 404)
    unknown_step = acting.post(f"/api/checkpoints/{failed_run}/fork", json={"rerun": ["nope"]})
    assert error_of(unknown_step, 422)["type"] == "UnknownStep"
    assert snapshot(rt) == before


def test_malformed_requests_are_422_json(acting: httpx.Client, failed_run: str) -> None:
    body = error_of(acting.get("/api/runs", params={"status": "sleeping"}), 422)
    assert "status" in body["message"]
    body = error_of(acting.post(f"/api/checkpoints/{failed_run}/fork", json={"sett": {}}), 422)
    assert "sett" in body["message"]
    body = error_of(acting.post(f"/api/checkpoints/{failed_run}/fork", content=b"{not json"), 422)
    assert body["type"] == "BadRequest"


def test_refused_actions_are_409_and_change_nothing(
    rt: Runtime, acting: httpx.Client, failed_run: str
) -> None:
    fork = acting.post(f"/api/checkpoints/{failed_run}/fork", json={"set": {"limit": 500}})
    done = fork.json()["run_id"]
    assert RunHandle(done, rt).wait(timeout=15) is RunStatus.SUCCEEDED
    before = snapshot(rt)
    assert "already succeeded" in error_of(acting.post(f"/api/runs/{done}/resume"), 409)["message"]
    assert "already succeeded" in error_of(acting.post(f"/api/runs/{done}/cancel"), 409)["message"]
    taken = acting.post(f"/api/checkpoints/{failed_run}/fork", json={"run_id": done})
    assert "already exists" in error_of(taken, 409)["message"]
    assert snapshot(rt) == before


def test_resume_with_inputs_continues_at_the_failed_step(rt: Runtime, acting: httpx.Client) -> None:
    run_id = failed_review(rt, topic="again")
    response = acting.post(f"/api/runs/{run_id}/resume", json={"inputs": {"limit": 1000}})
    assert response.status_code == 202, response.text
    assert response.json()["run_id"] == run_id
    assert RunHandle(run_id, rt).wait(timeout=15) is RunStatus.SUCCEEDED
    steps = [c["step"] for c in acting.get(f"/api/runs/{run_id}").json()["timeline"]]
    assert steps.count("outline") == 1  # completed steps are never re-run


def test_without_a_token_the_console_is_read_only(
    rt: Runtime, readonly: httpx.Client, failed_run: str
) -> None:
    before = snapshot(rt)
    for path in (
        f"/api/runs/{failed_run}/resume",
        f"/api/runs/{failed_run}/cancel",
        f"/api/checkpoints/{failed_run}/fork",
    ):
        body = error_of(readonly.post(path, json={}, headers=BEARER), 403)
        assert body["type"] == "ReadOnly" and "RUNNER_UI_TOKEN" in body["message"]
    assert snapshot(rt) == before
    assert readonly.get(f"/api/runs/{failed_run}").status_code == 200


def test_with_a_token_every_call_needs_it(rt: Runtime, failed_run: str) -> None:
    before = snapshot(rt)
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url) as anon:
        assert error_of(anon.get("/api/runs"), 401)["type"] == "Unauthorized"
        wrong = {"Authorization": "Bearer not-it"}
        assert error_of(anon.post(f"/api/runs/{failed_run}/resume", headers=wrong), 401)
        page = anon.get(f"/runs/{failed_run}", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"].startswith("/login?next=")
        # Basic auth (the password is the token) is sent by browsers by themselves, so a
        # POST with it needs the CSRF token too.
        basic = anon.post(f"/api/runs/{failed_run}/resume", auth=("me", TOKEN), json={})
        assert error_of(basic, 403)["type"] == "CsrfFailed"
        assert anon.get("/api/runs", auth=("me", TOKEN)).status_code == 200
    assert snapshot(rt) == before


def test_login_sets_a_session_that_needs_csrf_for_actions(rt: Runtime, failed_run: str) -> None:
    before = snapshot(rt)
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url) as browser:
        form = browser.get("/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        bad = browser.post("/login", data={"token": "nope", "csrf": csrf.group(1)})
        assert bad.status_code == 401 and "Wrong token" in bad.text
        ok = browser.post(
            "/login",
            data={"token": TOKEN, "csrf": csrf.group(1), "next": "//evil.example/"},
            follow_redirects=False,
        )
        assert ok.status_code == 303 and ok.headers["location"] == "/"
        assert browser.get(f"/api/runs/{failed_run}").status_code == 200
        refused = browser.post(f"/api/runs/{failed_run}/cancel")
        assert error_of(refused, 403)["type"] == "CsrfFailed"
        elsewhere = browser.post(
            f"/api/runs/{failed_run}/cancel",
            headers={"X-CSRF-Token": csrf.group(1), "Origin": "http://evil.example"},
        )
        assert error_of(elsewhere, 403)["type"] == "CsrfFailed"
    assert snapshot(rt) == before


def test_pages_escape_state_and_error_text(rt: Runtime, acting: httpx.Client) -> None:
    script = "<script>alert(1)</script>"
    run_id = failed_review(rt, topic=script)
    page = acting.get(f"/runs/{run_id}")
    assert page.status_code == 200
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert script not in page.text and escaped in page.text  # the error message
    for fragment in (f"/fragments/checkpoints/{run_id}", f"/fragments/fork/{run_id}"):
        text = acting.get(fragment).text
        assert script not in text and escaped in text
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_openapi_document_lists_the_api(readonly: httpx.Client) -> None:
    doc = readonly.get("/api/openapi.json").json()
    assert {"/api/runs", "/api/runs/{run_id}", "/api/checkpoints/{ref}/fork", "/api/diff"} <= set(
        doc["paths"]
    )
    assert "/runs/{run_id}" not in doc["paths"]  # pages are not API


def test_unknown_host_header_is_refused(readonly: httpx.Client) -> None:
    # DNS rebinding: another site's name pointing at 127.0.0.1 reaches a loopback console.
    response = readonly.get("/api/runs", headers={"Host": "evil.example"})
    assert response.status_code == 400


def test_crew_task_output_is_editable_and_later_tasks_rerun(
    rt: Runtime, acting: httpx.Client
) -> None:
    tag = f"console-{random.randrange(1 << 30):x}"
    print(f"tag {tag}")
    handle = client.submit("tests.flows.crews:crew_a", {"topic": "bees", "tag": tag}, rt=rt)
    assert handle.wait(timeout=15) is RunStatus.SUCCEEDED
    form = acting.get(f"/api/checkpoints/{handle.run_id}/fork-form").json()
    assert form["outputs"] == [
        {"task": "a1", "raw": "a1(bees)"},
        {"task": "a2", "raw": "a2(a1(bees))"},
        {"task": "a3", "raw": "a3(a2(a1(bees)))"},
    ]
    assert [f["name"] for f in form["fields"]] == ["inputs"]  # outputs are edited per task
    response = acting.post(
        f"/api/checkpoints/{handle.run_id}/fork", json={"outputs": {"a2": "EDITED"}}
    )
    assert response.status_code == 201, response.text
    fork = RunHandle(response.json()["run_id"], rt)
    assert fork.wait(timeout=15) is RunStatus.SUCCEEDED
    outputs = acting.get(f"/api/checkpoints/{fork.run_id}").json()["state"]["outputs"]
    assert outputs["a3"]["raw"] == "a3(EDITED)"
    assert crews.counts(tag) == {"a1": 1, "a2": 1, "a3": 2}


def test_child_runs_are_listed_with_their_parent(rt: Runtime, readonly: httpx.Client) -> None:
    tag = f"console-{random.randrange(1 << 30):x}"
    print(f"tag {tag}")
    handle = client.submit("tests.flows.crews:HostFlow", {"topic": "ants", "tag": tag}, rt=rt)
    assert handle.wait(timeout=20) is RunStatus.SUCCEEDED
    run = readonly.get(f"/api/runs/{handle.run_id}").json()
    [child] = run["children"]
    assert (child["activation"], child["name"], child["status"]) == (
        "stage#1",
        "crew_a",
        "succeeded",
    )
    assert run["run"]["children"] == 1
    inner = readonly.get(f"/api/runs/{child['run_id']}").json()
    assert inner["parent"] == {"run_id": handle.run_id, "activation": "stage#1"}
    assert inner["run"]["child_of"]["run_id"] == handle.run_id
    listed = readonly.get("/api/runs", params={"limit": 500}).json()["runs"]
    order = [(r["run_id"], r["depth"]) for r in listed]
    at = order.index((handle.run_id, 0))
    assert order[at + 1] == (child["run_id"], 1)  # nested right under its parent


def test_a_paused_run_resumes_with_an_input(rt: Runtime, acting: httpx.Client) -> None:
    tag = f"console-{random.randrange(1 << 30):x}"
    print(f"tag {tag}")
    handle = client.submit("tests.flows.cli:ApprovalFlow", {"tag": tag}, rt=rt)
    assert handle.wait(timeout=15) is RunStatus.PAUSED
    run = acting.get(f"/api/runs/{handle.run_id}").json()
    assert run["pause_reason"] == "need approval"
    assert {m["name"]: m["state"] for m in run["methods"]}["approve"] == "paused"
    paused = section(acting.get(f"/runs/{handle.run_id}").text, "paused")
    assert "need approval" in paused and f'hx-post="/runs/{handle.run_id}/resume"' in paused
    with serving(rt) as url, httpx.Client(base_url=url) as readonly:
        paused = section(readonly.get(f"/runs/{handle.run_id}").text, "paused")
    assert f"<code>runner resume {handle.run_id} --input KEY=VALUE</code>" in paused
    response = acting.post(f"/api/runs/{handle.run_id}/resume", json={"inputs": {"approved": True}})
    assert response.status_code == 202, response.text
    assert handle.wait(timeout=15) is RunStatus.SUCCEEDED


def test_cancel_stops_a_running_run(rt: Runtime, acting: httpx.Client) -> None:
    handle = client.submit("tests.flows.dist:DistGated", {}, rt=rt)
    gate = dist.key(handle.run_id, "gate", "two")
    try:
        eventually(lambda: dist.executions(rt.store.client, handle.run_id, "two"), timeout=10)
        run = acting.get(f"/api/runs/{handle.run_id}").json()
        assert {m["name"]: m["state"] for m in run["methods"]}["two"] == "running"
        response = acting.post(f"/api/runs/{handle.run_id}/cancel")
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "cancelled"
    finally:
        rt.store.client.set(gate, 1)  # the step was stopped: nothing more runs
    assert handle.wait(timeout=15) is RunStatus.CANCELLED
    time.sleep(0.5)
    assert dist.executions(rt.store.client, handle.run_id, "three") == 0


def _runner(*args: str, code: str | None = None) -> list[str]:
    """The ``runner`` command line (or ``python -c code`` with ``runner`` as argv)."""
    if code is not None:
        return [sys.executable, "-c", code, *args]
    return [sys.executable, "-m", "runner.cli", *args]


def test_runner_ui_serves_the_deployment_and_refuses_a_public_address_without_token(
    worker_env: dict[str, str], rt: Runtime, failed_run: str
) -> None:
    env = {**os.environ, **worker_env}
    env.pop("RUNNER_UI_TOKEN", None)
    refused = subprocess.run(
        _runner("ui", "--host", "0.0.0.0"), env=env, capture_output=True, text=True
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "error: refusing to listen on 0.0.0.0 without a token: set RUNNER_UI_TOKEN, "
        "or listen on 127.0.0.1"
    ]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env["RUNNER_PREFIX"] = rt.settings.prefix  # the console tests' private deployment
    proc = subprocess.Popen(
        _runner("ui", "--port", str(port)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "(read-only" in proc.stdout.readline()
        deadline = time.monotonic() + 15
        while True:
            try:
                found = httpx.get(f"http://127.0.0.1:{port}/api/runs", params={"q": failed_run})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
                time.sleep(0.1)
        assert [r["run_id"] for r in found.json()["runs"]] == [failed_run]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


@pytest.mark.processes
def test_runner_ui_without_the_console_libraries_says_how_to_install_them(
    worker_env: dict[str, str],
) -> None:
    # The console's libraries made unimportable, as in a broken install.
    code = (
        "import sys; sys.modules['fastapi'] = None; sys.argv = ['runner', 'ui']; "
        "from runner.cli import main; main()"
    )
    env = {**os.environ, **worker_env}
    result = subprocess.run(_runner(code=code), env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: the console needs fastapi, jinja2, python-multipart and uvicorn (fastapi is "
        "missing); they come with celery-flows: pip install celery-flows"
    ]


def test_an_open_page_still_acts_after_the_console_restarts(rt: Runtime) -> None:
    # `runner dev` restarts the console when a flow module changes; a page opened before the
    # restart keeps its CSRF token, which the new process must still accept.
    failed_run = failed_review(rt)
    before = snapshot(rt)
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url) as browser:
        form = browser.get("/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        browser.post("/login", data={"token": TOKEN, "csrf": csrf.group(1)})
        cookies = browser.cookies
    with serving(rt, token=TOKEN) as url, httpx.Client(base_url=url, cookies=cookies) as page:
        refused = page.post(
            f"/api/runs/{failed_run}/cancel", headers={"X-CSRF-Token": csrf.group(1) + "x"}
        )
        assert error_of(refused, 403)["type"] == "CsrfFailed"
        assert snapshot(rt) == before
        resumed = page.post(
            f"/api/runs/{failed_run}/resume", headers={"X-CSRF-Token": csrf.group(1)}
        )
        assert resumed.status_code < 400, resumed.text
