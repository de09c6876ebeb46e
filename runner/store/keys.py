"""Every Redis key the runner uses, built in one place.

Layout (``P`` is the deployment prefix, default ``runner``; ``{R}`` is the run id
as a Redis Cluster hash tag, so all keys of one run live in one slot):

======================  ======  ==============================================
key                     type    holds
======================  ======  ==============================================
``P:{R}:meta``          hash    run metadata (:class:`RunInfo` fields)
``P:{R}:history``       zset    checkpoint ids scored by sequence number
``P:{R}:ckpt:<id>``     string  one checkpoint snapshot, JSON
``P:{R}:attempts``      hash    activation -> ``token|checkpoint id`` (idempotency, fencing)
``P:{R}:acts``          hash    checkpoint id -> the activation it committed (trimming)
``P:{R}:pins``          set     checkpoint ids a fork points to (never pruned)
``P:{R}:dispatched``    hash    activation -> when it was last sent (or its retry is due)
``P:{R}:leases``        zset    running activations scored by lease expiry
``P:{R}:owners``        hash    activation -> attempt token holding its lease
``P:runs``              zset    run ids scored by last update (the run index)
``P:ckpts``             hash    checkpoint id -> run id (lookup by checkpoint id)
``P:active``            zset    run ids whose status is ``running`` (recovery scans it)
``P:<name>-lock``       string  a deployment-wide lock (``recover``: the recovery pass)
``P:{R}:stopped``       channel pub/sub: the run's new status when it stops running
======================  ======  ==============================================

The ``P:runs``/``P:ckpts``/``P:active`` index keys are global: the commit script writes
them together with the run's keys, which a single Redis (and Sentinel) allows;
on Redis Cluster they are the only cross-slot keys.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key builder for one deployment prefix."""

    prefix: str = "runner"

    def run(self, run_id: str, part: str) -> str:
        """A per-run key: ``P:{run_id}:part``."""
        return f"{self.prefix}:{{{run_id}}}:{part}"

    def run_pattern(self, run_id: str) -> str:
        """A SCAN ``MATCH`` pattern of every per-run key of ``run_id``."""
        return self.run(_glob_escape(run_id), "*")

    def meta(self, run_id: str) -> str:
        """The run's metadata hash."""
        return self.run(run_id, "meta")

    def history(self, run_id: str) -> str:
        """The run's checkpoint history sorted set."""
        return self.run(run_id, "history")

    def snapshot_prefix(self, run_id: str) -> str:
        """Prefix of the run's snapshot keys (the id is appended)."""
        return self.run(run_id, "ckpt:")

    def snapshot(self, run_id: str, checkpoint_id: str) -> str:
        """One checkpoint snapshot."""
        return self.snapshot_prefix(run_id) + checkpoint_id

    def attempts(self, run_id: str) -> str:
        """Committed activations and their attempt tokens."""
        return self.run(run_id, "attempts")

    def acts(self, run_id: str) -> str:
        """Checkpoint id -> the activation it committed (to trim ``attempts`` when pruned)."""
        return self.run(run_id, "acts")

    def pins(self, run_id: str) -> str:
        """Checkpoint ids protected from pruning."""
        return self.run(run_id, "pins")

    def dispatched(self, run_id: str) -> str:
        """Activations already sent to workers."""
        return self.run(run_id, "dispatched")

    def leases(self, run_id: str) -> str:
        """Running activations by lease expiry."""
        return self.run(run_id, "leases")

    def owners(self, run_id: str) -> str:
        """Attempt tokens holding the leases."""
        return self.run(run_id, "owners")

    def stopped(self, run_id: str) -> str:
        """Pub/sub channel told the run's status when it stops running (``RunHandle.wait``)."""
        return self.run(run_id, "stopped")

    @property
    def active(self) -> str:
        """Runs whose status is running."""
        return f"{self.prefix}:active"

    def lock(self, name: str) -> str:
        """A deployment-wide lock (``recover``: the periodic recovery pass)."""
        return f"{self.prefix}:{name}-lock"

    @property
    def runs(self) -> str:
        """The global run index."""
        return f"{self.prefix}:runs"

    @property
    def checkpoints(self) -> str:
        """The global checkpoint id -> run id lookup."""
        return f"{self.prefix}:ckpts"


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
