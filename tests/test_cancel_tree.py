"""Cancelling a run cancels its whole tree: a child run (a crew a step started) is cancelled
with its parent, with a cancel's guarantees (its running task is stopped, no later task
runs, nothing is committed after the cancel) and a reason naming the parent; resuming the
parent resumes the child where it stopped, its completed tasks not run again. The same
holds for ``runner cancel``, the API and a run's deadline (one function cancels). A child
cancelled directly fails its parent's step, as before."""

from __future__ import annotations

import json

import httpx
import pytest
import redis

from runner.distributed import control
from runner.distributed.cancel import follow_parent
from runner.distributed.client import RunHandle, submit
from runner.distributed.engine import Runtime, commit_on_latest
from runner.flow import transition as tr
from runner.flow.children import child_run_id
from runner.store.models import FLOW_CANCELLED, RunStatus
from tests._dist_support import eventually, history, leases_lapsed
from tests.console_support import serving
from tests.flows.crew_tree import CrewPair, CrewTree
from tests.flows.dist import executions, key
from tests.test_cli import Cli, cli  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


def _child_crawling(
    rt: Runtime, r: redis.Redis, parent: RunHandle, activation: str = "stage#1"
) -> tuple[RunHandle, int]:
    """The child run of the parent's ``activation`` once its slow task s2 runs, and the pid
    running it."""
    child = RunHandle(child_run_id(parent.run_id, activation), rt)
    eventually(lambda: executions(r, child.run_id, "s2") == 1)
    pid = int(r.lrange(key(child.run_id, "pids", "s2"), 0, 0)[0])
    assert _alive(pid)
    return child, pid


def _tree_stopped(
    rt: Runtime, r: redis.Redis, parent: RunHandle, *crawling: tuple[RunHandle, int]
) -> list[str]:
    """The parent and its ``crawling`` children are cancelled, each child's task process is
    gone, no later task ran and no commit followed any cancel; the children's reasons."""
    for _, pid in crawling:
        eventually(lambda pid=pid: not _alive(pid), timeout=5)
    # Every lease of the tree lapsed and recovery passes went by: they leave it stopped.
    leases_lapsed(rt, parent.run_id, *(child.run_id for child, _ in crawling))
    assert parent.status() is RunStatus.CANCELLED
    assert history(rt, parent.run_id)[-1].event == FLOW_CANCELLED
    assert executions(r, parent.run_id, "finish") == 0
    reasons = []
    for child, _ in crawling:
        stopped = child.latest()
        assert stopped.status is RunStatus.CANCELLED
        assert stopped.event == FLOW_CANCELLED
        assert history(rt, child.run_id)[-1].id == stopped.id  # nothing committed after it
        assert stopped.in_flight == ["s2#1"]  # the stopped task was not completed
        assert [executions(r, child.run_id, t) for t in ("s1", "s2", "s3")] == [1, 1, 0]
        reason = stopped.meta.cancel_reason
        assert reason is not None and f"its parent run {parent.run_id} was cancelled" in reason
        reasons.append(reason)
    return reasons


def _resumed_tree_finishes(rt: Runtime, r: redis.Redis, parent: RunHandle, child: str) -> None:
    """Resuming the parent resumes the child at its stopped task: each completed task ran
    exactly once, the stopped one twice, and the parent finishes with the crew's output."""
    assert control.resume(parent.run_id, rt=rt).result(timeout=30) == "s3(s2(s1(bees)))"
    assert [executions(r, child, t) for t in ("s1", "s2", "s3")] == [1, 2, 1]
    assert executions(r, parent.run_id, "finish") == 1
    assert RunHandle(child, rt).status() is RunStatus.SUCCEEDED


def test_runner_cancel_of_a_parent_cancels_its_child_and_resume_finishes_the_tree(
    rt: Runtime,
    redis_client: redis.Redis,
    cli: Cli,  # noqa: F811
) -> None:
    parent = submit(CrewTree, {}, rt=rt)
    child, pid = _child_crawling(rt, redis_client, parent)
    out = json.loads(cli.ok("cancel", parent.run_id, "--json").stdout)
    assert (out["status"], out["children"]) == ("cancelled", [child.run_id])
    [reason] = _tree_stopped(rt, redis_client, parent, (child, pid))
    assert reason == f"its parent run {parent.run_id} was cancelled"
    assert parent.latest().meta.cancel_reason is None  # the parent was cancelled by hand
    shown = json.loads(cli.ok("status", child.run_id, "--json").stdout)
    assert (shown["status"], shown["cancel_reason"]) == ("cancelled", reason)
    _resumed_tree_finishes(rt, redis_client, parent, child.run_id)


def test_every_child_a_parent_waits_on_is_cancelled_and_resumed_with_it(
    rt: Runtime,
    redis_client: redis.Redis,
    cli: Cli,  # noqa: F811
) -> None:
    parent = submit(CrewPair, {}, rt=rt)
    left = _child_crawling(rt, redis_client, parent, "left#1")
    right = _child_crawling(rt, redis_client, parent, "right#1")
    said = cli.ok("cancel", parent.run_id).stdout
    assert "with it child run(s)" in said
    assert left[0].run_id in said and right[0].run_id in said
    _tree_stopped(rt, redis_client, parent, left, right)
    assert control.resume(parent.run_id, rt=rt).result(timeout=30) == "both crews done"
    for child, _ in (left, right):
        assert [executions(redis_client, child.run_id, t) for t in ("s1", "s2", "s3")] == [1, 2, 1]
        assert child.status() is RunStatus.SUCCEEDED
    assert executions(redis_client, parent.run_id, "finish") == 1


def test_the_console_s_cancel_takes_the_child_and_resuming_the_child_there_finishes_the_tree(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    parent = submit(CrewTree, {}, rt=rt)
    child, pid = _child_crawling(rt, redis_client, parent)
    token = "tree-token"
    with (
        serving(rt, token=token) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http,
    ):
        response = http.post(f"/api/runs/{parent.run_id}/cancel")
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "cancelled"
        _tree_stopped(rt, redis_client, parent, (child, pid))
        shown = http.get(f"/api/runs/{child.run_id}").json()
        assert shown["cancel_reason"] == (
            f"its parent run {parent.run_id} was cancelled: cancelled in the console"
        )
        # Resuming the child from the console resumes the parent it was cancelled with (the
        # one rule of control.resume), which resumes the child where it stopped.
        response = http.post(f"/api/runs/{child.run_id}/resume")
        assert response.status_code == 202, response.text
        assert response.json()["run_id"] == parent.run_id
        assert parent.wait(timeout=30) is RunStatus.SUCCEEDED
    assert [executions(redis_client, child.run_id, t) for t in ("s1", "s2", "s3")] == [1, 2, 1]
    assert executions(redis_client, parent.run_id, "finish") == 1


def test_a_parent_s_deadline_cancels_its_child_too_and_resuming_the_child_resumes_the_tree(
    rt: Runtime,
    redis_client: redis.Redis,
    cli: Cli,  # noqa: F811
) -> None:
    parent = submit(CrewTree, {}, deadline=2.5, rt=rt)
    child, pid = _child_crawling(rt, redis_client, parent)
    assert parent.wait(timeout=15) is RunStatus.CANCELLED
    [reason] = _tree_stopped(rt, redis_client, parent, (child, pid))
    assert reason.startswith(f"its parent run {parent.run_id} was cancelled: its deadline passed")
    # runner resume of the child resumes the parent it was cancelled with, which resumes it.
    resumed = cli.ok("resume", child.run_id, "--wait", "--timeout", "30")
    assert f"resuming {parent.run_id}" in resumed.stderr
    assert parent.status() is RunStatus.SUCCEEDED
    assert parent.latest().state["summary"] == "s3(s2(s1(bees)))"
    assert [executions(redis_client, child.run_id, t) for t in ("s1", "s2", "s3")] == [1, 2, 1]
    assert executions(redis_client, parent.run_id, "finish") == 1


def test_cancelling_a_child_fails_its_parent_step_and_resuming_the_parent_finishes(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    parent = submit(CrewTree, {}, rt=rt)
    child, pid = _child_crawling(rt, redis_client, parent)
    child.cancel()
    assert parent.wait(timeout=15) is RunStatus.FAILED
    error = parent.latest().error
    assert error is not None and error.type == "ChildRunFailed"
    assert f"child run {child.run_id} cancelled" in error.message
    eventually(lambda: not _alive(pid), timeout=5)
    assert child.latest().meta.cancel_reason is None  # cancelled by hand
    _resumed_tree_finishes(rt, redis_client, parent, child.run_id)


def test_a_child_started_after_its_parent_s_cancel_looked_for_children_goes_with_it(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    parent = submit(CrewTree, {}, rt=rt)
    child, pid = _child_crawling(rt, redis_client, parent)
    # The parent's cancel committed while its step was creating the child, so the cancel
    # found no child to take along: the step's follow_parent, once the child is started.
    commit_on_latest(
        rt,
        parent.run_id,
        lambda latest: tr.Transition(tr.status_change(latest, FLOW_CANCELLED, RunStatus.CANCELLED)),
    )
    assert child.status() is RunStatus.RUNNING
    cancelled = follow_parent(rt, child.run_id)
    assert cancelled is not None and cancelled.status is RunStatus.CANCELLED
    assert follow_parent(rt, child.run_id) is None  # once
    [reason] = _tree_stopped(rt, redis_client, parent, (child, pid))
    assert reason == f"its parent run {parent.run_id} was cancelled"
    _resumed_tree_finishes(rt, redis_client, parent, child.run_id)
    assert follow_parent(rt, child.run_id) is None  # its parent is no longer cancelled


def test_a_child_whose_canceller_died_after_the_parent_s_cancel_stops_at_its_next_step(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    parent = submit(CrewTree, {"seconds": 1.5}, rt=rt)
    child, _ = _child_crawling(rt, redis_client, parent)
    # Only the parent's cancel committed (its canceller died before the child's): the
    # child's running task commits, and its next task, instead of running, cancels the child.
    commit_on_latest(
        rt,
        parent.run_id,
        lambda latest: tr.Transition(tr.status_change(latest, FLOW_CANCELLED, RunStatus.CANCELLED)),
    )
    eventually(lambda: child.status() is RunStatus.CANCELLED, timeout=30)
    stopped = child.latest()
    assert stopped.in_flight == ["s3#1"]
    assert stopped.meta.cancel_reason == f"its parent run {parent.run_id} was cancelled"
    leases_lapsed(rt, child.run_id)  # the skipped message is gone; nothing runs s3
    assert [executions(redis_client, child.run_id, t) for t in ("s1", "s2", "s3")] == [1, 1, 0]
    assert control.resume(parent.run_id, rt=rt).result(timeout=30) == "s3(s2(s1(bees)))"
    assert [executions(redis_client, child.run_id, t) for t in ("s1", "s2", "s3")] == [1, 1, 1]
