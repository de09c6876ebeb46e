"""Retention: finished runs leave Redis by policy (``RUNNER_RETENTION``, a flow's
``@retention``), counted from their end; paused, sleeping and running runs never do; a
pinned run stays. Real Redis; the pass is :func:`runner.distributed.retention.collect`, as
the workers' recovery pass and ``runner gc`` run it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runner import CheckpointConfig
from runner.distributed.cancel import cancel_run
from runner.distributed.engine import Runtime
from runner.distributed.retention import collect
from runner.errors import DefinitionError
from runner.flow.retain import retention
from runner.store.models import RunStatus
from tests.flows.retained import Ephemeral, KeptLong, Report, ShortLived
from tests.flows.timing import NapFlow
from tests.retention_support import cli, deployment, kickoff, policy

HOUR = 3600.0


@pytest.fixture
def deploy(redis_url: str, prefix: str) -> Iterator[Runtime]:
    """A deployment of this test's own, with no workers."""
    with deployment(redis_url, prefix) as rt:
        yield rt


def test_each_status_is_kept_for_its_own_retention(deploy: Runtime) -> None:
    succeeded = kickoff(deploy)
    failed = kickoff(deploy, fail=True)
    cancelled = kickoff(deploy, pause=True)
    cancel_run(deploy, cancelled, "by the test")
    assert deploy.store.run(cancelled).status is RunStatus.CANCELLED

    done = collect(deploy.store, policy(deploy, "succeeded=0s,failed=1h,cancelled=0s"))

    assert sorted(done.expired) == sorted([succeeded, cancelled])
    assert deploy.store.run(succeeded) is None and deploy.store.run(cancelled) is None
    assert deploy.store.history(succeeded) == []
    info = deploy.store.run(failed)
    assert info is not None and info.status is RunStatus.FAILED
    expires = deploy.store.expiries([failed])[failed].expires_at
    assert expires == pytest.approx(info.updated_at + HOUR, abs=1)
    # Counted from the run's end: an hour on, it goes.
    later = collect(deploy.store, policy(deploy, "failed=1h"), now=info.updated_at + HOUR + 1)
    assert later.expired == [failed] and deploy.store.run(failed) is None


def test_a_status_the_policy_does_not_name_is_kept(deploy: Runtime) -> None:
    run = kickoff(deploy, fail=True)
    collect(deploy.store, policy(deploy, "succeeded=0s"))
    assert math.isinf(deploy.store.expiries([run])[run].expires_at or 0)
    far = collect(deploy.store, policy(deploy, "succeeded=0s"), now=time.time() + 1e9)
    assert far.expired == [] and deploy.store.run(run) is not None


def test_a_paused_run_is_never_expired(deploy: Runtime) -> None:
    paused = kickoff(deploy, pause=True)
    assert deploy.store.run(paused).status is RunStatus.PAUSED
    every = "succeeded=0s,failed=0s,cancelled=0s"
    done = collect(deploy.store, policy(deploy, every), now=time.time() + 1e9)
    assert done.expired == [] and deploy.store.run(paused) is not None
    assert deploy.store.expiries([paused])[paused].expires_at is None


def test_a_sleeping_run_on_workers_is_never_expired(rt: Any) -> None:
    napping = NapFlow.submit({"seconds": 30}, rt=rt)
    deadline = time.time() + 20
    while time.time() < deadline and "nap" not in str(
        rt.store.latest(napping.run_id).meta.replay.sleeps
    ):
        time.sleep(0.1)
    latest = rt.store.latest(napping.run_id)
    assert latest.meta.replay.sleeps, "the run is asleep"
    every = rt.settings.model_copy(update={"retention": "succeeded=0s,failed=0s,cancelled=0s"})
    done = collect(rt.store, every, now=time.time() + 1e9)
    assert napping.run_id not in done.expired
    assert rt.store.run(napping.run_id).status is RunStatus.RUNNING
    cancel_run(rt, napping.run_id, "the test is over")


def test_the_workers_recovery_pass_expires_runs_by_their_flows_policy(rt: Any) -> None:
    gone = Ephemeral.submit({}, rt=rt)  # @retention(succeeded="0s")
    kept = Report.submit({}, rt=rt)  # no policy here or in the workers' settings
    assert gone.wait(timeout=30) is not None and kept.wait(timeout=30) is not None
    deadline = time.time() + 20
    while time.time() < deadline and rt.store.run(gone.run_id) is not None:
        time.sleep(0.2)
    assert rt.store.run(gone.run_id) is None, "deleted by a worker's pass"

    def decided() -> float | None:
        return rt.store.expiries([kept.run_id])[kept.run_id].expires_at

    while time.time() < deadline and decided() is None:
        time.sleep(0.2)
    assert math.isinf(decided() or 0)
    assert rt.store.run(kept.run_id) is not None


def test_a_pinned_run_stays_until_unpinned(deploy: Runtime) -> None:
    kept, other = kickoff(deploy), kickoff(deploy)
    assert deploy.store.pin_run(kept, True)
    done = collect(deploy.store, policy(deploy, "succeeded=0s"))
    assert done.expired == [other]
    assert deploy.store.run(kept) is not None and deploy.store.expiries([kept])[kept].pinned
    assert deploy.store.pin_run(kept, False)
    assert collect(deploy.store, policy(deploy, "succeeded=0s")).expired == [kept]
    assert not deploy.store.pin_run(kept, True)  # gone: nothing to pin


def test_a_flows_own_retention_overrides_the_deployments(deploy: Runtime) -> None:
    short = kickoff(deploy, ShortLived)  # @retention(succeeded="1h")
    long = kickoff(deploy, KeptLong, fail=True)  # retention = {"failed": "7d"}
    plain = kickoff(deploy, Report, fail=True)
    flows = {cls.flow_name(): cls for cls in (ShortLived, KeptLong, Report)}
    done = collect(deploy.store, policy(deploy, "succeeded=0s,failed=0s"), flows)
    assert done.expired == [plain]
    found = deploy.store.expiries([short, long])
    ended = {r: deploy.store.run(r).updated_at for r in (short, long)}
    assert found[short].expires_at == pytest.approx(ended[short] + HOUR, abs=1)
    assert found[long].expires_at == pytest.approx(ended[long] + 7 * 24 * HOUR, abs=1)


def test_a_run_resumed_after_its_expiry_was_decided_is_not_deleted(deploy: Runtime) -> None:
    run = kickoff(deploy, fail=True)
    collect(deploy.store, policy(deploy, "failed=1h"))
    assert deploy.store.expiries([run])[run].expires_at is not None
    # Resumed: running again (its first commit says so), then it pauses.
    source = deploy.store.latest(run)
    again = Report(checkpoint=CheckpointConfig(provider=deploy.store, on_events=["*"]))
    again.kickoff(
        inputs={"fail": False, "pause": True},
        from_checkpoint=CheckpointConfig(provider=deploy.store, restore_from=source.id),
    )
    assert deploy.store.run(run).status is RunStatus.PAUSED
    done = collect(deploy.store, policy(deploy, "failed=1h"), now=time.time() + 2 * HOUR)
    assert done.expired == [] and deploy.store.run(run) is not None
    assert deploy.store.expiries([run])[run].expires_at is None  # out of the index


def test_a_pass_is_bounded_by_its_batch(deploy: Runtime) -> None:
    runs = [kickoff(deploy) for _ in range(5)]
    small = policy(deploy, "succeeded=0s", retention_batch=2)
    first = collect(deploy.store, small)
    assert len(first.decided) == 2 and len(first.expired) == 2
    while collect(deploy.store, small).expired:
        pass
    assert all(deploy.store.run(r) is None for r in runs)


def test_gc_dry_run_lists_what_would_go_and_gc_deletes_it(deploy: Runtime) -> None:
    gone, kept = kickoff(deploy), kickoff(deploy, fail=True)
    env = {"RUNNER_RETENTION": "succeeded=0s,failed=30d"}
    dry = cli(deploy, "gc", "--dry-run", **env)
    assert dry.returncode == 0, dry.stderr
    assert gone in dry.stdout and kept not in dry.stdout
    assert "would expire 1 run(s)" in dry.stdout
    assert deploy.store.run(gone) is not None  # a dry run deletes nothing
    real = cli(deploy, "gc", **env)
    assert real.returncode == 0, real.stderr
    assert "expired 1 run(s)" in real.stdout and deploy.store.run(gone) is None
    listed = cli(deploy, "runs", **env)
    assert listed.returncode == 0, listed.stderr
    assert "expires" in listed.stdout
    ended = deploy.store.run(kept).updated_at
    day = time.strftime("%Y-%m-%d", time.localtime(ended + 30 * 24 * HOUR))
    assert day in listed.stdout  # when the failed run leaves Redis


def test_pin_and_unpin_from_the_cli(deploy: Runtime) -> None:
    run = kickoff(deploy)
    pinned = cli(deploy, "pin", run[:12])
    assert pinned.returncode == 0, pinned.stderr
    assert "pinned" in cli(deploy, "runs").stdout
    assert (
        "would expire 0 run(s)"
        in cli(deploy, "gc", "--dry-run", RUNNER_RETENTION="succeeded=0s").stdout
    )
    assert cli(deploy, "unpin", run).returncode == 0
    assert cli(deploy, "gc", RUNNER_RETENTION="succeeded=0s").returncode == 0
    assert deploy.store.run(run) is None
    unknown = cli(deploy, "pin", "no-such-run")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error:")


def test_a_bad_retention_setting_is_one_line_naming_it(deploy: Runtime) -> None:
    for bad in ("succeeded=7x", "finished=1d", "succeeded"):
        done = cli(deploy, "runs", RUNNER_RETENTION=bad)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "RUNNER_RETENTION" in lines[0], done.stderr


def test_an_archive_that_is_no_location_is_one_line_naming_it(deploy: Runtime) -> None:
    done = cli(deploy, "runs", RUNNER_ARCHIVE="redis://127.0.0.1:6379/5")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "RUNNER_ARCHIVE" in lines[0] and "postgresql://" in lines[0]


def test_a_bad_flow_retention_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError, match="paused"):
        retention(paused="1d")
    with pytest.raises(DefinitionError, match="7 days"):
        retention(succeeded="7 days")


def test_runs_that_ended_before_retention_are_indexed_by_upgrade(
    deploy: Runtime, redis_client: Any
) -> None:
    run = kickoff(deploy)
    redis_client.zrem(deploy.store.keys.ended_of(run), run)  # as an earlier release left it
    assert collect(deploy.store, policy(deploy, "succeeded=0s")).expired == []
    deploy.store.upgrade()
    assert collect(deploy.store, policy(deploy, "succeeded=0s")).expired == [run]
