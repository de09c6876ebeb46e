"""The checkpoint store protocol every provider implements.

Small and dull on purpose (ten methods). A provider only moves records; the
orchestrator decides what they mean. Rules every provider keeps (the conformance
suite in ``tests/test_store_conformance.py`` checks them):

* ``commit`` is atomic: it assigns the next gapless sequence number, writes the
  snapshot, adds it to the run's history, prunes beyond ``max_checkpoints``
  (never a checkpoint a fork points to) and updates the run's metadata and the
  run index, or does none of it.
* A commit naming an ``activation`` happens once per activation: the same attempt
  token again returns the first checkpoint and writes nothing; another token
  raises :class:`~runner.errors.StaleAttempt` and writes nothing.
* ``expected_seq`` turns ``commit`` into compare-and-set: if the run's sequence is
  not ``expected_seq`` it raises :class:`~runner.errors.CommitConflict`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from runner.store.models import Checkpoint, RunInfo, RunStatus


@runtime_checkable
class CheckpointStore(Protocol):
    """Durable history of runs: snapshots, their order and run metadata."""

    max_checkpoints: int
    """Default history length kept per run (0 = unlimited)."""

    def commit(
        self,
        checkpoint: Checkpoint,
        *,
        expected_seq: int | None = None,
        max_checkpoints: int | None = None,
    ) -> Checkpoint:
        """Write ``checkpoint`` as the run's next one; return it with ``seq`` set."""
        ...

    def get(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint with this id; :class:`CheckpointNotFound` if none."""
        ...

    def latest(self, run_id: str) -> Checkpoint | None:
        """The run's newest checkpoint, or ``None`` for an unknown run."""
        ...

    def history(self, run_id: str, *, limit: int = 50, offset: int = 0) -> list[Checkpoint]:
        """The run's checkpoints, newest first, ``limit`` from ``offset``."""
        ...

    def runs(
        self, *, limit: int = 50, offset: int = 0, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """Runs by last update, newest first, optionally only one status."""
        ...

    def run(self, run_id: str) -> RunInfo | None:
        """A run's metadata, or ``None`` for an unknown run."""
        ...

    def update_run(self, run_id: str, **fields: Any) -> RunInfo:
        """Set metadata fields (e.g. ``status``) of an existing run."""
        ...

    def delete_run(self, run_id: str) -> bool:
        """Remove a run and all its checkpoints; ``False`` if it did not exist."""
        ...

    def prune(self, run_id: str, keep: int, *, dry_run: bool = False) -> list[str]:
        """Delete all but the newest ``keep`` checkpoints (fork points are kept).

        Returns the ids deleted (or that would be, with ``dry_run``).
        """
        ...

    def fork(
        self,
        checkpoint_id: str,
        *,
        new_run_id: str,
        branch: str | None = None,
        state: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Start run ``new_run_id`` from a copy of a checkpoint, lineage recorded.

        The source run is untouched except that the checkpoint is pinned against
        pruning. ``state`` replaces the copied state when given.
        """
        ...

    def close(self) -> None:
        """Release connections or files."""
        ...
