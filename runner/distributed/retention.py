"""The retention pass: finished runs leave Redis by policy, archived first.

Called by the workers' recovery pass (one at a time, by its lock) and by ``runner gc``. Two
steps, each over at most ``RUNNER_RETENTION_BATCH`` runs, each Redis call about one run
(:mod:`runner.store.expiry`):

1. **decide**: the runs that ended since the last pass get their expiry, their end plus
   what the flow's policy (``@retention``) or else the deployment's (``RUNNER_RETENTION``)
   keeps for the status they ended in (kept for ever if neither names it);
2. **expire**: each run whose expiry passed is copied whole to ``RUNNER_ARCHIVE`` (if set)
   and, once that write is confirmed, deleted from Redis by a script that deletes it only
   if it is still finished, unpinned and at the sequence number the archive holds. A crash
   between the two leaves the run in both; the next pass archives it again (replacing the
   copy) and deletes it.

Paused, running (sleeping, scheduled) and corrupt runs never enter the indexes; a run
resumed after its expiry was decided is dropped from them when it comes due.

``RUNNER_ARCHIVE_PAUSE_FILE`` (tests only): after an archive write is confirmed, the pass
creates that file and waits there, so a test can kill the archiving process between the
archive write and the delete.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import FlowImportError, InvalidInputs, RunnerError, RunNotFound, StoreError
from runner.flow.loading import load_flow
from runner.flow.retain import flow_retention
from runner.settings import RunnerSettings
from runner.store import codec as codecs
from runner.store.archive import Archive, archive_run, open_archive
from runner.store.codec import Codec
from runner.store.expiry import RetainingStore
from runner.store.models import RunInfo
from runner.store.policy import EXPIRING, Policy, kept_for

log = logging.getLogger("runner.worker")

PAUSE_FILE = "RUNNER_ARCHIVE_PAUSE_FILE"
"""Test hook (see the module docstring)."""


def pin(store: object, run_id: str, pinned: bool = True) -> None:
    """Keep ``run_id`` in Redis for ever (``pinned``), or let its retention apply again:
    the one way ``runner pin``/``unpin``, a bulk pin and the console's pin do it.
    :class:`RunNotFound` for an unknown run; :class:`InvalidInputs` for a store that does
    not expire runs."""
    if not isinstance(store, RetainingStore):
        raise InvalidInputs("this store does not expire runs")
    if not store.pin_run(run_id, pinned):
        raise RunNotFound(f"no run {run_id}", run_id=run_id)


@dataclass
class Collected:
    """What one pass did (or, dry, would do)."""

    decided: dict[str, float] = field(default_factory=dict)
    """Run id -> when it expires (``inf``: kept), for the runs decided now."""
    expired: list[str] = field(default_factory=list)
    """Runs deleted from Redis (or that would be)."""
    archived: list[str] = field(default_factory=list)
    """Runs copied to the archive."""


def collect(
    store: RetainingStore,
    settings: RunnerSettings,
    flows: Mapping[str, Any] | None = None,
    *,
    now: float | None = None,
    dry_run: bool = False,
) -> Collected:
    """One retention pass over at most ``settings.retention_batch`` runs per step."""
    now = time.time() if now is None else now
    batch, found = settings.retention_batch, Collected()
    policies = _Policies(settings, flows or {})
    for run_id, ended_at in store.ended_runs(batch):
        info = store.run(run_id)
        expires = ended_at + policies.kept(info) if info is not None else math.inf
        if dry_run:
            if expires <= now:
                found.expired.append(run_id)
            continue
        if store.decide_expiry(run_id, ended_at, expires) == 1:
            found.decided[run_id] = expires
    try:
        archive = (
            None
            if dry_run or not settings.archive
            else archive_of(settings.archive, codecs.of_settings(settings))
        )
    except StoreError as exc:
        log.error("retention: archive unusable, expired runs stay in Redis: %s", exc)
        return found
    for run_id, _at in store.due_runs(now, batch):
        info = store.run(run_id)
        finished = info is not None and info.status.value in EXPIRING
        if dry_run:
            if finished:
                found.expired.append(run_id)
            continue
        if info is None or not finished:
            # Resumed or gone: the script drops it from the index (seq -1 never deletes).
            store.expire_run(run_id, now, -1)
            continue
        try:
            if _expire(store, archive, info, now, found):
                found.expired.append(run_id)
        except StoreError as exc:
            # The archive (or Redis) failed: nothing was deleted; the next pass tries again,
            # on a fresh connection to the archive (a restarted server drops this one).
            log.error("retention: run %s stays in Redis: %s", run_id, exc)
            forget_archive(settings.archive)
            break
    return found


def enforce_retention(rt: Any, now: float) -> Collected:
    """The recovery pass's duty: :func:`collect` with the worker's flows."""
    store = rt.store
    if not isinstance(store, RetainingStore):
        return Collected()
    done = collect(store, rt.settings, rt.flows, now=now)
    if done.expired:
        log.info(
            "retention: %d run(s) expired%s",
            len(done.expired),
            f", {len(done.archived)} archived" if done.archived else "",
        )
    return done


def _expire(
    store: RetainingStore, archive: Archive | None, info: RunInfo, now: float, found: Collected
) -> bool:
    """Archive (if set) then delete one due run; whether it was deleted."""
    seq: int | None = info.seq
    if archive is not None:
        seq = archive_run(store, archive, info.run_id)
        if seq is None:
            return False  # changed while read, or gone: the next pass looks again
        found.archived.append(info.run_id)
        _pause_here()
    return store.expire_run(info.run_id, now, seq) == "gone"


def _pause_here() -> None:
    marker = os.environ.get(PAUSE_FILE)
    if marker:
        Path(marker).touch()
        time.sleep(120)  # the test kills this process here


_archives: dict[tuple[str, Codec | None], Any] = {}
"""Archives opened by this process, by location and codec (one connection each)."""


def archive_of(location: str, codec: Codec | None = None) -> Any:
    """The archive at ``location``, sealing with ``codec`` (see
    :func:`~runner.store.archive.open_archive`), opened once per process."""
    found = _archives.get((location, codec))
    if found is None:
        found = _archives[(location, codec)] = open_archive(location, codec)
    return found


def forget_archive(location: str) -> None:
    """Close the archive at ``location`` if this process opened it (reopened when next used)."""
    for key in [key for key in _archives if key[0] == location]:
        found = _archives.pop(key)
        with contextlib.suppress(StoreError):  # it is being dropped for failing
            found.close()


def close_archives() -> None:
    """Close the archives this process opened (a test's, or at exit)."""
    while _archives:
        _archives.popitem()[1].close()


class _Policies:
    """Each flow's policy, read once a pass: the registered class (a worker's), else the
    class imported from the allow-list (``RUNNER_FLOW_MODULES``), else none."""

    def __init__(self, settings: RunnerSettings, flows: Mapping[str, Any]) -> None:
        self.settings, self.flows = settings, flows
        self.deployment = settings.retention_policy
        self.cache: dict[str, Policy | None] = {}

    def kept(self, info: RunInfo) -> float:
        path = info.flow or ""
        if path not in self.cache:
            self.cache[path] = self._of(info)
        return kept_for(info.status.value, self.deployment, self.cache[path])

    def _of(self, info: RunInfo) -> Policy | None:
        flow_cls = self.flows.get(str(info.name))
        if flow_cls is None or flow_cls.flow_path() != info.flow:
            flow_cls = self._imported(info.flow or "")
        try:
            return None if flow_cls is None else flow_retention(flow_cls)
        except RunnerError as exc:
            log.error("retention of flow %s: %s; the deployment's applies", info.flow, exc)
            return None

    def _imported(self, path: str) -> Any | None:
        module = path.partition(":")[0]
        allowed = self.settings.flow_modules
        if not any(module == m or module.startswith(m + ".") for m in allowed):
            return None
        try:
            return load_flow(path)
        except FlowImportError:
            return None
