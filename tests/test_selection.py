"""The one selection model (``--where``, the API's ``where``, the console's filters) read
against the real Redis store, and the short run ids every list shows."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from runner.store.models import (
    Checkpoint,
    ChildLink,
    Links,
    ParentLink,
    RunMeta,
    RunStatus,
    Scheduling,
)
from runner.store.redis import RedisProvider
from runner.store.selection import BadSelection, Where, page_of, parse
from runner.views import scheduled_until, short_runs

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("status=failed statu=paused", "unknown key 'statu'"),
        ("status=broken", "status is one of pending, running"),
        ("since=yesterday", "a time is an age (30s, 15m, 1h, 2d, 1w) or an ISO time"),
        ("until=2026-01-02T03:00:00", "with its zone"),
        ("flow", "a term is key=value"),
        ("id=abc", "write id~VALUE"),
        ("flow~x", "write flow=VALUE"),
        ("flow=a flow=b", "flow is given twice (use commas for any of)"),
        ("flow=", "the value is empty"),
    ],
)
def test_a_bad_term_is_refused_in_one_line_naming_it(text: str, says: str) -> None:
    with pytest.raises(BadSelection) as caught:
        parse(text, NOW)
    assert says in caught.value.message
    assert "\n" not in caught.value.message


def test_terms_parse_into_one_selection() -> None:
    where = parse(
        "flow=a,b status=failed,paused since=1h until=2026-01-02T03:00:00+00:00 id~tick version=v2",
        NOW,
    )
    assert where.flows == ("a", "b")
    assert where.statuses == (RunStatus.FAILED, RunStatus.PAUSED)
    assert where.since == NOW - 3600
    assert where.until == 1767322800.0
    assert (where.id_text, where.versions) == ("tick", ("v2",))
    assert parse("", NOW).empty and not where.empty


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    provider = RedisProvider(redis_url, prefix=prefix)
    yield provider
    provider.close()


def _run(store: RedisProvider, run_id: str, status: RunStatus) -> None:
    """A run in the index with ``status``, updated now (its one checkpoint written)."""
    store.commit(
        Checkpoint(run_id=run_id, event="flow_started", status=status, flow="tests.m:GateFlow")
    )


def test_a_selection_pages_the_index_and_counts_every_run_it_keeps(
    store: RedisProvider,
) -> None:
    tag = uuid.uuid4().hex[:6]
    _run(store, f"{tag}-old", RunStatus.FAILED)
    cut = datetime.fromtimestamp(time.time(), UTC).isoformat()
    for i in range(5):
        _run(store, f"{tag}-f{i}", RunStatus.FAILED)
    _run(store, f"{tag}-p", RunStatus.PAUSED)
    _run(store, f"{tag}-ok", RunStatus.SUCCEEDED)

    # Three runs a read: the count spans pages, and the page is the selection's 3rd and 4th.
    recent = parse(f"status=failed,paused since={cut} id~{tag}", time.time())
    page = page_of(store, recent, offset=2, limit=2, page=3)
    assert (page.total, page.more) == (6, 2)
    assert [i.run_id for i in page.runs] == [f"{tag}-f3", f"{tag}-f2"]
    every = page_of(store, Where(id_text=tag.upper()), limit=None, page=3)
    assert every.total == 8 and every.more == 0
    until = parse(f"until={cut} id~{tag}", time.time())
    assert [i.run_id for i in page_of(store, until).runs] == [f"{tag}-old"]


def test_short_ids_are_unique_prefixes_and_keep_the_tail_that_tells_runs_apart() -> None:
    every = [
        "ticker-20261128T040000",
        "ticker-20261128T040500",
        "83fc81fc-1111",
        "83fc81fc-1111-research-1",
        "9a000000-2222",
    ]
    shown = short_runs(every, every)
    assert shown["ticker-20261128T040000"] == "ticker-20261128T0400"
    assert shown["ticker-20261128T040500"] == "ticker-20261128T0405"
    assert shown["83fc81fc-1111"] == "83fc81fc"
    assert shown["83fc81fc-1111-research-1"] == "83fc81fc-research-1"
    assert shown["9a000000-2222"] == "9a000000"


def _family(store: RedisProvider, tag: str) -> tuple[str, str]:
    """Running runs: a parent at version v2 waiting on a child run (a crew one of its steps
    started), and a delayed run at v1; the parent's and child's ids."""
    parent, child = f"{tag}-parent", f"{tag}-child"
    link = ChildLink(run_id=child, flow="tests.m:Crew", name="Crew")
    up = ParentLink(run_id=parent, activation="stage#1")
    later = Scheduling(not_before=time.time() + 3600)
    for run_id, version, meta in (
        (parent, "v2", RunMeta(links=Links(children={"stage#1": link}))),
        (child, "v2", RunMeta(links=Links(parent=up))),
        (f"{tag}-later", "v1", RunMeta(scheduling=later)),
    ):
        store.commit(Checkpoint(run_id=run_id, event="flow_started", version=version, meta=meta))
    return parent, child


def test_a_listing_reads_the_runs_records_and_no_checkpoint(
    store: RedisProvider, redis_client: redis.Redis
) -> None:
    """Parent, children, version and a delayed start come from each run's record, which
    mirrors its latest checkpoint: with every snapshot gone, the listing is the same."""
    tag = uuid.uuid4().hex[:6]
    parent, child = _family(store, tag)
    for run_id in (parent, child, f"{tag}-later"):
        redis_client.delete(store.keys.snapshots(run_id))

    top = page_of(store, Where(id_text=tag), top_level=True).runs
    assert sorted(info.run_id for info in top) == [f"{tag}-later", parent]
    (info,) = [info for info in top if info.run_id == parent]
    assert (info.child_runs, info.version, info.child_of) == ([child], "v2", None)
    assert store.run(child).child_of == parent  # type: ignore[union-attr]
    v1 = page_of(store, parse(f"version=v1 id~{tag}", time.time())).runs
    assert [info.run_id for info in v1] == [f"{tag}-later"]
    waiting = [info.run_id for info in top if scheduled_until(info) is not None]
    assert waiting == [f"{tag}-later"]


def test_upgrade_gives_an_earlier_versions_records_what_a_listing_reads(
    store: RedisProvider, redis_client: redis.Redis
) -> None:
    tag = uuid.uuid4().hex[:6]
    parent, child = _family(store, tag)
    for run_id in (parent, child, f"{tag}-later"):  # as an earlier version wrote them
        redis_client.hdel(store.keys.meta(run_id), "version", "child_of", "child_runs")
    top = page_of(store, Where(id_text=tag), top_level=True).runs
    assert child in [info.run_id for info in top]  # not known to be a child yet

    # One run's latest checkpoint is unreadable: the others are mended all the same.
    snaps = store.keys.snapshots(f"{tag}-later")
    for field in redis_client.hkeys(snaps):
        redis_client.hset(snaps, field, "{not json")
    store.upgrade()
    top = page_of(store, Where(id_text=tag), top_level=True).runs
    assert sorted(info.run_id for info in top) == [f"{tag}-later", parent]
    assert store.run(parent).child_runs == [child]  # type: ignore[union-attr]
    assert store.run(parent).version == "v2"  # type: ignore[union-attr]
    assert store.run(f"{tag}-later").version is None  # type: ignore[union-attr]
