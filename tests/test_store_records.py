"""The deployment's own records through the store protocol (:class:`DeploymentStore`) on
Redis: limits, queue consumers, run timers, schedules and id prefixes, each decoded by the
store module that owns its keys. No worker needed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from runner.errors import InvalidInputs, RunStateError, StoreUnavailable
from runner.store.base import DeploymentStore
from runner.store.limits import RateLimit, SlotLimit
from runner.store.models import Checkpoint
from runner.store.redis import RedisProvider
from runner.store.schedules import make_schedule
from runner.store.timers import STARTS
from tests.redis_servers import short_patience


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    provider = RedisProvider(redis_url, prefix=prefix)
    yield provider
    for key in provider.client.scan_iter(f"{prefix}:*"):
        provider.client.delete(key)
    provider.close()


def test_the_redis_provider_is_a_deployment_store(store: RedisProvider) -> None:
    assert isinstance(store, DeploymentStore)


def test_a_rate_s_use_is_read_with_the_interval_its_admission_recorded(
    store: DeploymentStore,
) -> None:
    # 2 per second, burst 3: the text reads "2/s (burst 3)", which no parser is asked again.
    rate = RateLimit("Flow.call", interval=0.5, burst=3, text="2/s (burst 3)")
    for n in range(3):
        assert store.admit([rate], [], f"t{n}", f"r{n}|call#1", 30, 0.25) is None
    refused = store.admit([rate], [], "t3", "r3|call#1", 30, 0.25)
    assert refused is not None and (refused.kind, refused.name) == ("rate", "Flow.call")
    assert 0 < refused.seconds <= 0.5
    (use,) = store.limit_uses()
    assert (use.name, use.kind, use.spec) == ("Flow.call", "rate", "2/s (burst 3)")
    assert use.in_use == 4  # three starts and the waiting step's reserved turn
    # Within the window: the three starts of the burst, the reserved turn left out.
    assert (use.used, use.of, use.period) == (3, 3, None)  # no period given: no window named
    assert use.use == "3 of 3"
    assert [(run, step) for run, step, _ in use.waiting] == [("r3", "call#1")]


def test_steps_back_late_from_their_reserved_turns_start_no_faster_than_the_rate(
    store: DeploymentStore,
) -> None:
    """Deferred steps a killed worker held come back together, after their turns: one may
    start, the others keep their places and wait an interval each, not all start at once."""
    rate = RateLimit("Flow.call", interval=0.05, burst=1, text="20/s")
    assert store.admit([rate], [], "t0", "r0|call#1", 30, 0.25) is None
    turns = [store.admit([rate], [], f"t{n}", f"r{n}|call#1", 30, 0.25) for n in range(1, 5)]
    assert all(t is not None for t in turns)
    time.sleep(max(t.seconds for t in turns if t is not None) + 0.1)  # every turn has passed
    back = [store.admit([rate], [], f"t{n}", f"r{n}|call#1", 30, 0.25) for n in range(1, 5)]
    assert back[0] is None
    assert all(r is not None and r.kind == "rate" and 0 < r.seconds <= 0.05 for r in back[1:])
    (use,) = store.limit_uses()
    assert sorted(run for run, _, _ in use.waiting) == ["r2", "r3", "r4"]  # still reserved
    time.sleep(0.05)
    assert store.admit([rate], [], "t2", "r2|call#1", 30, 0.25) is None
    assert store.admit([rate], [], "t3", "r3|call#1", 30, 0.25) is not None


def test_a_spec_an_older_release_wrote_reads_as_its_text_until_rewritten(
    store: RedisProvider,
) -> None:
    store.admit([RateLimit("old", 1.0, 1, "1/s")], [], "t", "r|s#1", 30, 0.25)
    store.client.hset(store.keys.limit_specs(), "rate:old", "1/s")  # the old record
    (use,) = store.limit_uses()
    assert (use.spec, use.in_use, use.use) == ("1/s", 0, "0")  # no burst known: the count
    store.admit([RateLimit("old", 1.0, 1, "1/s")], [], "t2", "r|s#2", 30, 0.25)
    (use,) = store.limit_uses()
    assert (use.spec, use.in_use) == ("1/s", 2)


def test_slots_are_taken_renewed_and_given_back(store: DeploymentStore) -> None:
    slot = SlotLimit("Flow.narrow", 1)
    assert store.admit([], [slot], "a", "r1|narrow#1", 30, 0.25) is None
    refused = store.admit([], [slot], "b", "r2|narrow#1", 30, 0.25)
    assert refused is not None and (refused.kind, refused.seconds) == ("concurrency", 0.25)
    store.renew_slots([("Flow.narrow", "a")], 30)
    (use,) = store.limit_uses()
    assert (use.spec, use.in_use) == ("1", 1)
    assert use.use == "1 of 1 slots"
    store.release_slots(["Flow.narrow"], "a")
    assert store.admit([], [slot], "b", "r2|narrow#1", 30, 0.25) is None


def test_named_rates_are_kept_as_given(store: DeploymentStore) -> None:
    store.set_rate("openai", "500/m", 20)
    assert store.named_rates() == {"openai": ("500/m", 20)}


def test_a_queue_s_consumers_lapse_unless_said_again_and_go_on_retiring(
    store: DeploymentStore,
) -> None:
    store.announce_queues(["q.gpu", "q"], "w1", ttl=30)
    store.announce_queues(["q.gpu"], "w2", ttl=0.2)
    assert store.queue_consumers("q.gpu") == ["w1", "w2"]
    time.sleep(0.3)
    assert store.queue_consumers("q.gpu") == ["w1"]
    store.retire_queues(["q.gpu", "q"], "w1")
    assert store.queue_consumers("q.gpu") == store.queue_consumers("q") == []


def test_timers_are_due_in_order_and_dropped_only_when_due(store: DeploymentStore) -> None:
    store.set_timer(STARTS, "late", 200.0)
    store.set_timer(STARTS, "early", 100.0)
    assert store.due_timers(STARTS, 150.0) == ["early"]
    assert store.due_timers(STARTS, 300.0) == ["early", "late"]
    assert store.timer_at(STARTS, "late") == 200.0
    assert not store.drop_timer(STARTS, "late", 150.0)
    assert store.drop_timer(STARTS, "late", 250.0)
    assert store.timer_at(STARTS, "late") is None


def test_schedules_are_added_once_paused_advanced_and_removed(store: DeploymentStore) -> None:
    schedule = make_schedule("nightly", "pkg.mod:Flow", every=60)
    store.add_schedule(schedule)
    with pytest.raises(RunStateError):
        store.add_schedule(schedule)
    assert [s.name for s in store.schedules()] == ["nightly"]
    assert store.pause_schedule("nightly", True).paused and store.schedule("nightly").paused
    store.advance_schedule("nightly", 1234.0)
    assert store.next_tick("nightly") == 1234.0
    store.remove_schedule("nightly")
    with pytest.raises(InvalidInputs):
        store.schedule("nightly")


def test_runs_and_checkpoints_are_found_by_prefix(store: DeploymentStore) -> None:
    first = store.commit(Checkpoint(run_id="abc-1[x]", event="flow_started"))
    store.commit(Checkpoint(run_id="abd-2", event="flow_started"))
    assert sorted(store.run_ids("ab")) == ["abc-1[x]", "abd-2"]
    assert store.run_ids("abc-1[") == ["abc-1[x]"]  # glob characters are taken as typed
    # Ids are time-sortable: another commit in the same millisecond may share a short prefix.
    found = store.checkpoint_ids(first.id[:16])
    assert first.id in found and all(i.startswith(first.id[:16]) for i in found)
    assert store.checkpoint_ids(first.id) == [first.id]


def test_the_records_of_an_unreachable_redis_are_store_unavailable() -> None:
    with short_patience():  # producers wait RUNNER_STORE_RETRY for Redis: 0.5 s here
        store = RedisProvider("redis://127.0.0.1:1/0", prefix="nowhere")
    for call in (
        lambda: store.limit_uses(),
        lambda: store.queue_consumers("q"),
        lambda: store.due_timers(STARTS, 0.0),
        lambda: store.schedules(),
        lambda: store.run_ids("a"),
    ):
        with pytest.raises(StoreUnavailable):
            call()
    store.close()
