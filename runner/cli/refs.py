"""Ids as people type and read them: unique prefixes, git-style.

Every command takes a run or checkpoint id, or any prefix of one that is unique, and says
when a prefix is ambiguous. Tables show the shortest unique prefix (at least
:data:`MIN_RUN` / :data:`MIN_CHECKPOINT` characters) so an id is never cut: what is shown
can be typed back.

A child run's id is its parent's followed by ``-<method>-<n>``, so a run prefix that
matches a run and its descendants only means that run, and ``<parent prefix>-<rest>``
names the child (tables show children that way).
"""

from __future__ import annotations

import re

from runner import views
from runner.errors import CheckpointNotFound, RunNotFound
from runner.store.base import CheckpointStore, DeploymentStore
from runner.store.models import Checkpoint, RunInfo

from ._session import BadUsage, History

MIN_RUN = views.MIN_RUN
"""Shortest run prefix a table shows (a UUID's first group)."""
MIN_CHECKPOINT = 16
"""Shortest checkpoint prefix a table shows: the 12-digit millisecond time and 4 more."""
SHOWN = 4
"""Candidates an ambiguity error names."""
HISTORY_LIMIT = 10_000
"""Checkpoints read per run where a store has no index of ids to scan (a run keeps at most
``RUNNER_MAX_CHECKPOINTS``)."""


def resolve_run(reader: History, ref: str) -> str:
    """The run id ``ref`` names: a whole id, a unique prefix, or ``<parent prefix>-<rest>``."""
    if reader.store.run(ref) is not None:
        return ref
    found = _runs_matching(reader, ref)
    if not found:
        found = _child_by_parent_prefix(reader, ref)
    if not found:
        raise RunNotFound(f"no run {ref}", run_id=ref)
    return _one(found, ref, "run")


def resolve_checkpoint(reader: History, ref: str) -> Checkpoint:
    """The checkpoint ``ref`` names (a whole id or a unique prefix)."""
    with_prefix = _checkpoints_matching(reader, ref)
    if not with_prefix:
        raise CheckpointNotFound(f"no checkpoint {ref}", checkpoint_id=ref)
    return reader.store.get(_one(with_prefix, ref, "checkpoint"))


def resolve_checkpoint_or_run(reader: History, ref: str) -> Checkpoint:
    """A checkpoint by (a prefix of) its id, else the latest of the run ``ref`` names."""
    ckpts = _checkpoints_matching(reader, ref)
    if len(ckpts) == 1:
        return reader.store.get(ckpts[0])
    if ckpts:
        _one(ckpts, ref, "checkpoint")  # raises: ambiguous
    try:
        run = resolve_run(reader, ref)
    except RunNotFound:
        raise CheckpointNotFound(f"no checkpoint or run {ref}", checkpoint_id=ref) from None
    latest = reader.store.latest(run)
    if latest is None:
        raise CheckpointNotFound(f"run {run} has no checkpoint", checkpoint_id=ref)
    return latest


def short_runs(reader: History, run_ids: list[str]) -> dict[str, str]:
    """How tables show these runs (:func:`runner.views.short_runs`, against every run id)."""
    return views.short_runs(_every_id(reader), run_ids, MIN_RUN)


def all_runs(store: CheckpointStore) -> list[RunInfo]:
    """Every run in the store, read page by page (before anything is changed)."""
    found: list[RunInfo] = []
    page = 500
    while True:
        batch = store.runs(limit=page, offset=len(found))
        found += batch
        if len(batch) < page:
            return found


# --- lookups --------------------------------------------------------------------------------


def _one(found: list[str], ref: str, kind: str) -> str:
    if len(found) == 1:
        return found[0]
    ordered = sorted(found, key=len)
    if kind == "run" and all(f.startswith(ordered[0] + "-") for f in ordered[1:]):
        return ordered[0]  # a run and its child runs: the prefix names the run
    names = ", ".join(sorted(found)[:SHOWN]) + (", ..." if len(found) > SHOWN else "")
    raise BadUsage(
        f"{kind} prefix {ref} is ambiguous: {len(found)} {kind}s match ({names}); "
        "type more of the id"
    )


def _runs_matching(reader: History, ref: str) -> list[str]:
    store = reader.store
    if not isinstance(store, DeploymentStore):  # a --location store: read its list of runs
        return [info.run_id for info in all_runs(store) if info.run_id.startswith(ref)]
    return store.run_ids(ref)


def _checkpoints_matching(reader: History, ref: str) -> list[str]:
    store = reader.store
    if not isinstance(store, DeploymentStore):  # a --location store: a whole id, else every run's
        try:
            return [store.get(ref).id]
        except CheckpointNotFound:
            pass
        return [
            ckpt.id
            for info in all_runs(store)
            for ckpt in store.history(info.run_id, limit=HISTORY_LIMIT)
            if ckpt.id.startswith(ref)
        ]
    return store.checkpoint_ids(ref)


def _child_by_parent_prefix(reader: History, ref: str) -> list[str]:
    """``<parent prefix>-<rest>``: the parent's whole id followed by ``-<rest>``."""
    for cut in (m.start() for m in re.finditer("-", ref)):
        head, rest = ref[:cut], ref[cut:]
        try:
            parent = resolve_run(reader, head)
        except (RunNotFound, BadUsage):
            continue
        if reader.store.run(parent + rest) is not None:
            return [parent + rest]
    return []


def _every_id(reader: History) -> list[str]:
    """Every run id in the index."""
    store = reader.store
    if isinstance(store, DeploymentStore):
        return store.run_ids()
    return [info.run_id for info in all_runs(store)]
