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

:class:`CoordinatedStore` adds what the engine on workers needs beside the history:
dispatch markers and step leases, kept in the same store so a commit can drop the
committing step's lease and mark the steps it makes ready in the same atomic write.
:class:`DeploymentStore` adds the deployment's own records (limits, queue consumers, the
workers' roster, timers, schedules): the whole of what code outside ``runner/store`` may
ask of a store.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from runner.errors import CorruptCheckpoint
from runner.store.models import Checkpoint, RunInfo, RunStatus
from runner.store.roster import FORGET_AFTER, WorkerFacts, WorkerRecord

if TYPE_CHECKING:
    # The deployment's records are imported by the stores that keep them, on first use.
    from runner.store.limits import LimitUse, RateLimit, Refusal, SlotLimit
    from runner.store.memory import StoreMemory
    from runner.store.schedules import Schedule
    from runner.store.streams import StreamAppend, StreamInfo, StreamRead


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


class BeginOutcome(StrEnum):
    """What :meth:`CoordinatedStore.begin_attempt` found for an activation."""

    OK = "ok"
    """The caller now holds the activation's lease."""
    HELD = "held"
    """A live lease of another attempt (:attr:`Begun.holder`) holds it."""
    DONE = "done"
    """The activation is committed; no lease was taken."""
    NO_RUN = "none"
    """There is no such run."""
    READ = "read"
    """Only read: no activation was named (how :meth:`CheckpointStore.latest` reads)."""


class Begun(NamedTuple):
    """The result of :meth:`CoordinatedStore.begin_attempt`: the run's latest checkpoint and
    the lease."""

    latest: Checkpoint | None
    """The run's latest checkpoint (``None``: no such run)."""
    outcome: BeginOutcome
    holder: str = ""
    """The attempt token holding the lease, when :attr:`BeginOutcome.HELD`."""


OutboxCommand = tuple[str, str, Any]
"""One Redis command a commit publishes with: ``(command, key or channel, value)``."""
OUTBOX_COMMANDS = {"lpush": True, "pexpire": True, "publish": False}
"""The commands an outbox may hold, and whether each names a key (a channel is not)."""


class CommitRequest(NamedTuple):
    """One commit of a :class:`CoordinatedStore`: a checkpoint and what is written with it."""

    checkpoint: Checkpoint
    """The run's next checkpoint; with an ``activation`` and ``attempt`` it commits that
    step once, dropping its lease."""
    expected_seq: int | None = None
    """Compare-and-set: the run's sequence number the checkpoint follows (``None``: any);
    another raises :class:`~runner.errors.CommitConflict`."""
    max_checkpoints: int | None = None
    """History kept for the run (``None``: the store's default)."""
    closing: Checkpoint | None = None
    """The run's closing checkpoint (``flow_finished``/``flow_failed``) when ``checkpoint``
    ends the run: written right after it, in the same write, with its state (the same)."""
    dispatching: Sequence[str] = ()
    """Activation keys the caller sends next, marked dispatched (once, ever)."""
    sender: str = ""
    """The sender's soft-lease token: each of ``dispatching`` is held by it for
    ``sender_lease`` seconds (unless a live lease holds it), until the broker has it."""
    sender_lease: float = 0.0
    outbox: Sequence[OutboxCommand] = ()
    """Redis commands that publish the messages of ``dispatching`` on the store's own
    Redis (see :data:`OUTBOX_COMMANDS`), run only if the commit lands: not on a conflict,
    nor when the attempt's commit is a duplicate or stale."""
    carried: Sequence[str] = ()
    """Activation keys whose lease, owner and dispatch marker outlive the new epoch this
    checkpoint opens (steps still running on from the epoch before, when a paused or failed
    run goes on by an answer or a resume); a new epoch or a run's end drops every other's,
    except that a commit failing the run keeps those whose lease is live (a parallel branch
    still running, which a resume of the failed run carries on)."""
    released: tuple[str, str] | None = None
    """``(activation key, attempt token)``: that attempt's lease, dropped in the same write if
    the token still holds it. A step that paused or slept stays in flight, uncommitted, but
    its attempt has ended: an answer that comes right after sends it again."""
    announce: bool = False
    """When the commit stops the run (its last checkpoint's status is not running), tell
    :meth:`CoordinatedStore.stop_notices` subscribers, as :meth:`CoordinatedStore.notify_stopped`
    does: in the commit's own round trip where the store can, else right after it. A
    duplicate commit announces again; a conflict or a stale attempt does not."""


class Coordination(NamedTuple):
    """A run's leases and dispatch markers, read together (what the recovery pass needs)."""

    leases: dict[str, float]
    """Activation key -> lease expiry (unix seconds) of every leased activation."""
    markers: dict[str, float]
    """Activation key -> when it was last dispatched (or when its retry is due)."""


class StopNotices(Protocol):
    """A subscription to one run's stop notices."""

    def next(self, timeout: float) -> str | None:
        """The run's new status when a notice arrives within ``timeout`` seconds, else ``None``."""
        ...


@runtime_checkable
class CoordinatedStore(CheckpointStore, Protocol):
    """A checkpoint store that also keeps dispatch markers and leases (the engine on workers).

    Keys are activation keys (:func:`runner.ids.activation_key_in`). Rules the
    conformance suite checks for every provider implementing this:

    * a commit naming an ``activation`` and an ``attempt`` drops that activation's lease;
      a :class:`CommitRequest`'s ``dispatching`` marks activations dispatched, and its
      ``closing`` checkpoint is written, in the same atomic write;
    * a marker is set once (:meth:`mark_dispatched` returns ``False`` for one already set)
      and re-dated by :meth:`stamp`;
    * a lease is held by one attempt token at a time until it expires, is released, or is
      taken over from a dead holder.
    """

    def commit_request(self, request: CommitRequest) -> Checkpoint:
        """:meth:`CheckpointStore.commit` of ``request.checkpoint`` with all the request
        says, in one atomic write: the step's lease dropped, its ``closing`` checkpoint
        written after it, ``dispatching`` marked (under the ``sender``'s soft lease), the
        ``outbox`` run. Returns the checkpoint with ``seq`` set (a duplicate attempt's
        first commit; nothing else written). A provider that cannot run an outbox raises
        :class:`~runner.errors.StoreError` for a request holding one, writing nothing."""
        ...

    def begin_attempt(self, run_id: str, key: str, token: str, lease_seconds: float) -> Begun:
        """The run's latest checkpoint and, unless ``key`` is committed or another live
        attempt holds it, its lease for ``token`` (for ``lease_seconds``): one round trip."""
        ...

    def claim(
        self, run_id: str, keys: Sequence[str], token: str, lease_seconds: float
    ) -> list[BeginOutcome]:
        """:meth:`begin_attempt`'s lease rule for each of ``keys`` (``OK``, ``HELD`` or ``DONE``;
        ``NO_RUN`` for all when the run does not exist), without reading the run: one
        round trip for soft leases (:mod:`runner.distributed.handoff`)."""
        ...

    def mark_dispatched(
        self, run_id: str, keys: Sequence[str], at: float | None = None
    ) -> list[bool]:
        """Mark activations dispatched (at ``at``, default now); ``True`` for each newly marked."""
        ...

    def stamp(self, run_id: str, key: str, at: float | None = None) -> None:
        """Set ``key``'s marker to ``at`` (default now): sent again, or a retry due then."""
        ...

    def markers(self, run_id: str) -> dict[str, float]:
        """Activation key -> when it was last dispatched."""
        ...

    def leases(self, run_id: str) -> dict[str, float]:
        """Activation key -> lease expiry."""
        ...

    def coordination(self, run_id: str) -> Coordination:
        """The run's leases and markers together."""
        ...

    def renew(self, run_id: str, key: str, token: str, lease_seconds: float) -> bool:
        """Extend the lease ``token`` holds; ``False`` if it is gone or another's."""
        ...

    def take_over(self, run_id: str, key: str, dead: str, token: str, lease_seconds: float) -> bool:
        """Move ``key``'s lease from the attempt ``dead`` to ``token``; ``False`` if it moved."""
        ...

    def release(self, run_id: str, key: str, token: str) -> bool:
        """Drop the lease if ``token`` still holds it; whether it did."""
        ...

    def release_all(self, held: Sequence[tuple[str, str, str]]) -> None:
        """:meth:`release` each ``(run id, key, token)``, in one round trip where it can."""
        ...

    def add_teller(self, run_id: str, token: str, until: float) -> None:
        """Note that attempt ``token`` will tell its step's events after its commit, its word
        good until ``until`` (a time): :meth:`tellers` shows it until it is dropped or lapses."""
        ...

    def drop_teller(self, run_id: str, token: str) -> None:
        """Drop ``token``'s word (:meth:`add_teller`): it told its events, or commits nothing."""
        ...

    def tellers(self, run_id: str, now: float) -> list[str]:
        """The tokens whose word (:meth:`add_teller`) is still good at ``now``."""
        ...

    def active_runs(self) -> list[str]:
        """Ids of runs whose status is running."""
        ...

    def runs_to_check(
        self, committed_before: float, now: float, also: Collection[str] = ()
    ) -> list[str]:
        """Ids of running runs whose last commit is older than ``committed_before``, that
        hold a lease expired at ``now``, or that are in ``also`` (the recovery pass reads
        only these)."""
        ...

    def try_lock(self, name: str, ttl: float) -> bool:
        """Take the deployment-wide lock ``name`` for ``ttl`` seconds unless another holds it."""
        ...

    def notify_stopped(self, run_id: str, status: RunStatus) -> None:
        """Tell :meth:`stop_notices` subscribers that the run stopped running."""
        ...

    def stop_notices(self, run_id: str) -> AbstractContextManager[StopNotices]:
        """A subscription to the run's stop notices while the block runs."""
        ...


@runtime_checkable
class StreamStore(Protocol):
    """A store that keeps each run's stream of live output (:mod:`runner.store.streams` on
    Redis): what steps write while they run, read live and again by entry id."""

    def append_stream(
        self,
        run_id: str,
        step: str,
        writer: str,
        entries: list[tuple[str, str, str]],
        maxlen: int,
        writer_run: str = "",
    ) -> tuple[int, str]:
        """Append ``entries`` (channel, type, payload JSON) of the attempt ``writer`` of
        ``step`` to ``run_id``'s stream, trimmed to ``maxlen``, in one round trip; the
        attempt's number (1, 2, ... per step, by first write) and the last entry's id.
        ``writer_run``: the run that wrote them, when not ``run_id`` (a child run)."""
        ...

    def append_streams(self, appends: list[StreamAppend]) -> list[tuple[int, str]]:
        """:meth:`append_stream` of several batches (any runs) in one round trip where it
        can; each one's attempt number and last entry id, in order."""
        ...

    def read_stream(
        self,
        run_id: str,
        after: str = "0",
        count: int = 500,
        block: float | None = None,
        check_trim: bool = False,
    ) -> StreamRead:
        """Entries after the id ``after`` (at most ``count``; waiting up to ``block`` seconds
        for one) and the newest attempt number of each step; with ``check_trim``, whether the
        cap trimmed entries after ``after`` (:attr:`StreamRead.trimmed`)."""
        ...

    def stream_info(self, run_id: str) -> StreamInfo:
        """The stream's length and first and last entry ids."""
        ...


@runtime_checkable
class DeploymentStore(CoordinatedStore, StreamStore, Protocol):
    """A coordinated store that also keeps a deployment's own records: what the engine on
    workers, the producers, the CLI and the console use, and all they use of the store.

    One-job methods per concern, each owned by one store module on Redis: limits
    (:mod:`runner.store.limits`), queue consumers (:mod:`runner.store.queues`), the workers'
    roster (:mod:`runner.store.roster`), run timers (:mod:`runner.store.timers`), schedules
    (:mod:`runner.store.schedules`) and the runs' streams (:class:`StreamStore`,
    :mod:`runner.store.streams`).
    """

    url: str
    """Where the store is (its password masked only where shown)."""
    cluster: bool
    """The store is on a Redis Cluster (its keys span slots; no outbox)."""

    def upgrade(self) -> int:
        """Rewrite runs stored by an older release in today's layout; how many moved."""
        ...

    def run_ids(self, prefix: str = "") -> list[str]:
        """Ids of the runs that start with ``prefix`` (``runner`` commands' id prefixes)."""
        ...

    def checkpoint_ids(self, prefix: str) -> list[str]:
        """Ids of the checkpoints that start with ``prefix``."""
        ...

    def latest_each(self, run_ids: Sequence[str]) -> dict[str, Checkpoint | None]:
        """:meth:`~CheckpointStore.latest` of each run (``runner runs`` lists a page of runs),
        in one round trip where it can."""
        ...

    # -- limits -------------------------------------------------------------------------------

    def set_rate(self, name: str, rate: str, burst: int) -> None:
        """Set the named limit ``name`` to ``rate`` (already parsed once, by the caller)."""
        ...

    def named_rates(self) -> dict[str, tuple[str, int]]:
        """The named limits :meth:`set_rate` set: name -> ``(rate, burst)``."""
        ...

    def admit(
        self,
        rates: Sequence[RateLimit],
        slots: Sequence[SlotLimit],
        token: str,
        member: str,
        lease_seconds: float,
        poll_seconds: float,
    ) -> Refusal | None:
        """Take every limit for the attempt ``token`` of ``member`` (``run|step``) at once,
        or take none and say which limit holds it back longest."""
        ...

    def release_slots(self, names: Sequence[str], token: str) -> None:
        """Give back the slots of the concurrency limits ``names`` that ``token`` holds."""
        ...

    def renew_slots(self, held: Sequence[tuple[str, str]], lease_seconds: float) -> None:
        """Renew each slot ``(limit name, token)`` for ``lease_seconds``."""
        ...

    def limit_uses(self) -> list[LimitUse]:
        """Every limit in use, its use now and the steps waiting on it."""
        ...

    # -- queue consumers ----------------------------------------------------------------------

    def announce_queues(
        self, queues: Sequence[str], worker: str, ttl: float, facts: WorkerFacts | None = None
    ) -> None:
        """Record that ``worker`` consumes ``queues`` (a queue's version twins
        ``<queue>@<version>`` among them) for the next ``ttl`` seconds and, with ``facts``, its
        record in the workers' roster (lapsing with it): what it says of itself, the code
        versions of the app it runs included (:class:`~runner.store.roster.WorkerFacts`)."""
        ...

    def retire_queues(self, queues: Sequence[str], worker: str) -> None:
        """Record that ``worker`` no longer consumes ``queues``; its roster record goes too."""
        ...

    def queue_consumers(self, queue: str) -> list[str]:
        """Workers whose word that they consume ``queue`` has not lapsed."""
        ...

    # -- the workers' roster ------------------------------------------------------------------

    def workers(self) -> list[WorkerRecord]:
        """Every worker's last roster record, lapsed ones too, by name: its queues, the
        queues its flows route to, its pid, host, runner, Celery and app code versions."""
        ...

    def forget_dead_workers(self, older_than: float = FORGET_AFTER) -> list[str]:
        """Drop the roster records that lapsed more than ``older_than`` seconds ago; their
        workers' names."""
        ...

    # -- run timers ---------------------------------------------------------------------------

    def set_timer(self, kind: str, run_id: str, at: float) -> None:
        """Act on ``run_id`` at ``at`` (unix seconds) for ``kind``; replaces its timer."""
        ...

    def due_timers(self, kind: str, now: float, limit: int = 500) -> list[str]:
        """Runs whose ``kind`` timer is not after ``now``, the earliest first."""
        ...

    def timer_at(self, kind: str, run_id: str) -> float | None:
        """When ``run_id``'s ``kind`` timer is due, or ``None``."""
        ...

    def drop_timer(self, kind: str, run_id: str, now: float) -> bool:
        """Drop ``run_id``'s ``kind`` timer if it is not after ``now``; whether it did."""
        ...

    # -- schedules ----------------------------------------------------------------------------

    def add_schedule(self, schedule: Schedule) -> None:
        """Store a new schedule (:class:`~runner.errors.RunStateError` if the name is taken)."""
        ...

    def schedule(self, name: str) -> Schedule:
        """The schedule ``name`` (:class:`~runner.errors.InvalidInputs` if none)."""
        ...

    def schedules(self) -> list[Schedule]:
        """Every readable schedule, by name."""
        ...

    def pause_schedule(self, name: str, paused: bool) -> Schedule:
        """Pause or resume the schedule ``name``."""
        ...

    def remove_schedule(self, name: str) -> None:
        """Delete the schedule ``name`` (:class:`~runner.errors.InvalidInputs` if none)."""
        ...

    def next_tick(self, name: str) -> float | None:
        """When the schedule ``name``'s next tick not yet fired is."""
        ...

    def advance_schedule(self, name: str, tick: float) -> None:
        """Record that the schedule ``name``'s ticks before ``tick`` were fired."""
        ...

    # -- memory (runner.store.memory) ----------------------------------------------------------

    def memory(self) -> list[StoreMemory]:
        """Each server's used memory, limit and high-water mark (none: not known)."""
        ...

    def check_room(self, incoming: int = 0) -> None:
        """:class:`~runner.errors.StoreFull` if ``incoming`` more bytes take the store past
        its high-water mark (``RUNNER_STORE_HIGH_WATER``)."""
        ...


def latest_readable(store: DeploymentStore, run_ids: list[str]) -> dict[str, Checkpoint | None]:
    """:meth:`~DeploymentStore.latest_each` of ``run_ids``, ``None`` for a run whose latest
    checkpoint cannot be read: they are then read one by one, so one corrupt run does not
    hide the others (the console's list, ``runner upgrade``)."""
    try:
        return store.latest_each(run_ids) if run_ids else {}
    except CorruptCheckpoint:
        found: dict[str, Checkpoint | None] = {}
        for run_id in run_ids:
            try:
                found[run_id] = store.latest(run_id)
            except CorruptCheckpoint:
                found[run_id] = None
        return found
