"""Typed records the checkpoint stores read and write.

Everything here is JSON: state and outputs are dumped with ``mode="json"`` before
they reach a record, so a store never sees a Python object it cannot write.
"""

import json
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runner import ids

FLOW_STARTED = "flow_started"
"""A run (or a restart of it) began: the checkpoint holding its start steps."""
FLOW_RESUMED = "flow_resumed"
"""A stopped run continues in a new epoch."""
FLOW_CANCELLED = "flow_cancelled"
FLOW_PAUSED = "flow_paused"
"""A step paused the run for a human."""
METHOD_FINISHED = "method_execution_finished"
METHOD_FAILED = "method_execution_failed"
FLOW_FINISHED = "flow_finished"
"""The run succeeded: its closing checkpoint, right after the step that ended it."""
FLOW_FAILED = "flow_failed"
"""The run failed: its closing checkpoint, right after the step that failed it (``step``
and ``error`` say which and why), or a run failed as a whole (its flow may not run)."""


class RunStatus(StrEnum):
    """Where a run is in its life."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CORRUPT = "corrupt"
    """Quarantined: its data cannot be read (set on the run's metadata by recovery)."""

    @property
    def finished(self) -> bool:
        """True when nothing more will run without a resume (or, if corrupt, a repair)."""
        return self in (
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
            RunStatus.CORRUPT,
        )


class StepError(BaseModel):
    """The error that failed a step."""

    model_config = ConfigDict(defer_build=True)

    type: str
    """Exception class name."""
    message: str
    """``str(exception)``."""
    traceback: str = ""
    """Formatted traceback, when one was available."""
    attempts: int = 1
    """How many attempts of the step were made."""

    @classmethod
    def from_exception(cls, exc: BaseException, attempts: int = 1) -> "StepError":
        """Describe ``exc`` with its formatted traceback."""
        import traceback as tb

        text = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type=type(exc).__name__, message=str(exc), traceback=text, attempts=attempts)


class Lineage(BaseModel):
    """Where a forked run came from."""

    model_config = ConfigDict(defer_build=True)

    parent_run_id: str
    """The run that was forked."""
    parent_checkpoint_id: str
    """The checkpoint of the parent the fork started from."""
    branch: str | None = None
    """A label the user gave the fork."""


class ParentLink(BaseModel):
    """A child run's link to the parent activation waiting on it."""

    model_config = ConfigDict(defer_build=True)

    run_id: str
    activation: str


class UsageMetrics(BaseModel):
    """Tokens and requests LLM calls spent (CrewAI's ``UsageMetrics``, the same fields).

    Recorded per step by the ``Agent``'s LLM adapter and by ``runner.record_usage``
    (:mod:`runner.flow.usage` reads a client's usage fields into this).
    """

    model_config = ConfigDict(extra="ignore", defer_build=True)

    total_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cache_creation_tokens: int = 0
    successful_requests: int = 0

    def add_usage_metrics(self, usage_metrics: "UsageMetrics") -> None:
        """Add ``usage_metrics`` to these counts in place (as CrewAI's does)."""
        for name, value in usage_metrics:
            setattr(self, name, getattr(self, name) + value)

    def __add__(self, other: "UsageMetrics") -> "UsageMetrics":
        both = self.model_copy()
        both.add_usage_metrics(other)
        return both

    def delta_since(self, baseline: "UsageMetrics") -> "UsageMetrics":
        """What these counts (a client's lifetime counters) grew by since ``baseline`` was
        read from them, never below 0 (as CrewAI's)."""
        return UsageMetrics(**{k: max(v - getattr(baseline, k), 0) for k, v in self})

    @classmethod
    def from_provider_dict(cls, usage_data: Mapping[str, Any] | None) -> "UsageMetrics | None":
        """One request's usage from a provider's usage dict, read as CrewAI reads it
        (``None`` for none): ``prompt_tokens`` / ``prompt_token_count`` (Gemini) /
        ``input_tokens`` (Anthropic, LangChain; with Anthropic's cache counters beside it the
        uncached part, so they are added), the completion and cache aliases, OpenAI's
        ``prompt_tokens_details`` and LangChain's ``input_token_details`` /
        ``output_token_details`` dicts; the total is prompt plus completion; a count that is
        not a number counts 0."""
        if not usage_data:
            return None
        data = usage_data
        prompt = _first_count(data, PROMPT_KEYS)
        if "input_tokens" in data and any(k in data for k in _ANTHROPIC_CACHE):
            prompt = sum(_count(data.get(k)) for k in ("input_tokens", *_ANTHROPIC_CACHE))
        completion = _first_count(data, COMPLETION_KEYS)
        prompt_details = _details(data, "prompt_tokens_details")
        input_details = _details(data, "input_token_details")
        output_details = {
            **_details(data, "completion_tokens_details"),
            **_details(data, "output_token_details"),
        }
        cached = (
            _first_count(data, ("cached_prompt_tokens", "cached_tokens", "cache_read_input_tokens"))
            or _count(prompt_details.get("cached_tokens"))
            or _count(input_details.get("cache_read"))
        )
        created = _first_count(
            data, ("cache_creation_tokens", "cache_creation_input_tokens")
        ) or _count(input_details.get("cache_creation"))
        reasoning = (
            _first_count(data, ("reasoning_tokens", "thoughts_token_count"))
            or _count(output_details.get("reasoning_tokens"))
            or _count(output_details.get("reasoning"))
        )
        return cls(
            total_tokens=prompt + completion,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_prompt_tokens=cached,
            cache_creation_tokens=created,
            reasoning_tokens=reasoning,
            successful_requests=1,
        )

    @property
    def empty(self) -> bool:
        """Nothing recorded: no request, no token."""
        return not any(value for _, value in self)


PROMPT_KEYS = ("prompt_tokens", "prompt_token_count", "input_tokens")
"""A provider's names of the prompt's token count (OpenAI, Gemini, Anthropic/LangChain)."""
COMPLETION_KEYS = ("completion_tokens", "candidates_token_count", "output_tokens")
"""... and of the completion's."""
_ANTHROPIC_CACHE = ("cache_read_input_tokens", "cache_creation_input_tokens")


def _count(value: Any) -> int:
    """A token count as an int; anything else (``None``, ``"n/a"``) counts 0, as in CrewAI."""
    if isinstance(value, bool):
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _first_count(data: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    """The first non-zero count among ``keys``."""
    return next((n for n in (_count(data.get(k)) for k in keys) if n), 0)


def _details(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    found = data.get(key)
    return found if isinstance(found, Mapping) else {}


class RunUsage(BaseModel):
    """What a run's steps (their child runs included) spent, kept in every checkpoint;
    each step's own part is its checkpoint's :attr:`Checkpoint.usage`."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    total: UsageMetrics = Field(default_factory=UsageMetrics)
    """Every step attempt the run committed, over all its starts and resumes."""
    last: UsageMetrics = Field(default_factory=UsageMetrics)
    """Since the run's latest start or resume (``flow.usage_metrics``)."""
    done: dict[str, UsageMetrics] = Field(default_factory=dict)
    """Method -> what its completed activations spent: a resume does not spend it again."""
    saved: UsageMetrics | None = None
    """Set by a resume: what the completed steps it skipped had spent (their ``done``)."""


class ChildLink(BaseModel):
    """A parent activation's link to the child run it started (e.g. a crew)."""

    model_config = ConfigDict(defer_build=True)

    run_id: str
    flow: str
    """Import path of the child."""
    name: str
    """The child's flow name (the workers' registry key)."""
    waiting: bool = True
    """True until the activation commits with the child's output."""
    before: dict[str, Any] = Field(default_factory=dict)
    """State fields the method changed before it started the child: their old values."""
    after: dict[str, Any] = Field(default_factory=dict)
    """... and their new values (applied when the activation commits)."""
    usage: UsageMetrics | None = None
    """What the method spent before it started the child (added to the child's own)."""
    epoch: int | None = None
    """The parent's epoch the link was made in: it waits in that epoch only. A resume (or
    any new epoch) runs the activation again, which links the child again (resuming it if it
    stopped with its parent); until then its end is not the activation's. ``None``: a link
    of an older release, waiting in any epoch."""


class Awaiting(BaseModel):
    """What a paused run waits for: a person's answer to one step (``@human_feedback``'s
    review of a method's output, or ``self.ask``'s question)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    kind: str
    """``feedback`` (the method ran; its output is under review and it never runs again) or
    ``ask`` (the method re-runs from its start, its N-th ``ask`` returning the N-th answer)."""
    message: str
    activation: str = ""
    """The activation id that waits (``review#1``; filled in when the pause is committed)."""
    method: str = ""
    output: Any = None
    """``feedback``: the method's output under review."""
    emit: list[str] | None = None
    """``feedback``: the outcome labels the answer is collapsed to (its listeners run)."""
    default_outcome: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    deadline: float | None = None
    """When the run goes on without an answer (``ask(timeout=)``; epoch seconds)."""
    asked_at: float = Field(default_factory=time.time)


class Answer(BaseModel):
    """A person's answer to what a run awaited, kept in the run's checkpoints from then on."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    text: str | None = None
    """The feedback or answer; ``None`` when the deadline passed without one."""
    outcome: str | None = None
    """An ``emit`` label chosen directly (a console button), instead of collapsing ``text``."""
    by: str | None = None
    """Who answered (the CLI's ``--by``, the console's user), when known."""
    at: float = Field(default_factory=time.time)
    awaited: Awaiting
    """What this answers."""


class Scheduling(BaseModel):
    """What ``submit`` asked of the run's steps: when they may go, by when the run must end,
    how urgently they are sent, and the submission they came from."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    submitted: str | None = None
    """The hash of the flow and inputs the run was submitted with: a second submit of its id
    with the same hands back this run (``submit(id=...)``)."""
    not_before: float | None = None
    """No step of the run is sent before this time (epoch seconds): a delayed start
    (``submit(countdown=...)``); recovery sends them once it has passed."""
    deadline: float | None = None
    """When the run is cancelled if it has not finished (``submit(deadline=...)``)."""
    priority: int | None = None
    """The run's priority (``submit(priority=...)``, 0 lowest to 9 highest), kept by every
    checkpoint so its steps keep it through recovery, retries and resumes; ``None``: each
    step takes its method's ``priority=`` or the default."""


class Human(BaseModel):
    """What the run asked of people and what they said: its pause, the question or review
    it waits on, the answers and reviews given."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    pause_reason: str | None = None
    """Why the run waits for a human."""
    awaiting: Awaiting | None = None
    """Set while the run is paused for a person's answer (``control.answer`` gives it)."""
    answers: dict[str, list[Answer]] = Field(default_factory=dict)
    """Activation id -> the answers given to it, in order (as ``replay.sleeps`` are kept)."""
    feedback: list[dict[str, Any]] = Field(default_factory=list)
    """The reviews (``@human_feedback``) the run's committed steps came to, in commit order,
    each a ``HumanFeedbackResult`` as JSON: a step on workers sees them as the flow's
    ``human_feedback_history`` and ``last_human_feedback``."""
    reviews: dict[str, Awaiting] = Field(default_factory=dict)
    """Activation id -> the review (``@human_feedback``) its method's output went to, from
    its first pause on: sent again before it is answered (another step's pause took the
    run's ``awaiting``), the step asks again without running its method."""


class Links(BaseModel):
    """The run's place among runs: the parent activation waiting on it, the children its
    activations started."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    parent: ParentLink | None = None
    """Set on a child run."""
    children: dict[str, ChildLink] = Field(default_factory=dict)
    """Activation id -> the child run it started."""


class Replay(BaseModel):
    """What an activation's method reached before it stopped (a sleep, a pause), so that its
    later attempts, on whichever code, replay it alike; kept until the activation commits."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    sleeps: dict[str, list[float]] = Field(default_factory=dict)
    """Activation id -> the wake-up times of the durable sleeps (``self.sleep``) its method
    reached, in order; a step re-run after its wake-up passes the sleeps already recorded."""
    patches: dict[str, dict[str, bool]] = Field(default_factory=dict)
    """Activation id -> the patch decisions (``self.patched("change-id")``) its method made,
    recorded when it paused or slept: its later attempts, on whichever code, decide alike
    (kept, as ``sleeps``, until the activation commits)."""


class Versions(BaseModel):
    """The code versions the run and its state belong to (:mod:`runner.flow.versions`)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    pinned: str | None = None
    """The code version that started the run (its latest start or restart, or its fork):
    with ``RUNNER_VERSION_POLICY=pinned`` its steps run only on workers of that version."""
    upgrades: list[str] = Field(default_factory=list)
    """The state upgrades (``@state_upgrade``) the run's state went through, in order, each
    ``"<from version> -> <to version>"``: each ran once, when code of the second version
    first loaded a state the first wrote (:mod:`runner.flow.versions`)."""


META_GROUPS: dict[str, type[BaseModel]] = {
    "scheduling": Scheduling,
    "human": Human,
    "links": Links,
    "replay": Replay,
    "versions": Versions,
}
""":class:`RunMeta`'s groups: its field name -> the model of the group. How each group (or
each of its fields) carries into a new epoch is :data:`runner.flow.epochs.RULES`'s."""

GROUP_OF: dict[str, str] = {
    field: group for group, model in META_GROUPS.items() for field in model.model_fields
}
"""A grouped field's plain name (``priority``) -> its group (``scheduling``); a field's
name is unique across the groups and the top level."""


class RunMeta(BaseModel):
    """What the engine keeps about a run beside its state and record, in every checkpoint:
    a few fields of its own and the groups of :data:`META_GROUPS`.

    Changed only by :meth:`updated` (a new model: checkpoints are replaced, never changed in
    place). Metadata stored before it was grouped (every field at the top level) is read
    into the groups.
    """

    model_config = ConfigDict(extra="ignore", defer_build=True)

    name: str | None = None
    """The flow's display name: the prefix of its Celery task names, the workers' registry key."""
    epoch: int = 0
    """Bumped by every resume and restart: an attempt from an earlier epoch commits nothing,
    unless :attr:`carried` names its activation with that epoch."""
    carried: dict[str, int] = Field(default_factory=dict)
    """Activations whose attempt from an earlier epoch goes on in this one -> that epoch: a
    paused run that goes on from where it stands (an answer, a resume of its latest
    checkpoint) does not stop a parallel step still running (it commits into the new epoch
    instead of running again). Dropped when the activation commits."""
    ready: list[str] = Field(default_factory=list)
    """Activations this checkpoint made ready (to dispatch after the commit)."""
    resumed_from: str | None = None
    """The checkpoint a resume continued from."""
    forked_from: str | None = None
    """The checkpoint a fork started from."""
    conflicts: list[str] = Field(default_factory=list)
    """State fields this commit overwrote that a parallel step had also written."""
    trigger_payload: Any = None
    """CrewAI's ``crewai_trigger_payload`` input of a run on workers (not state): handed to
    every attempt of a method declaring that parameter."""
    cancel_reason: str | None = None
    """Why the run was cancelled: its deadline passed, its parent was cancelled, or who
    cancelled it from the console; ``None``: by hand otherwise (``runner cancel``)."""
    opener: str | None = None
    """The activation whose first attempt tells listeners the run started (``flow_started``,
    on workers): the first one made ready by the checkpoint that started, restarted,
    resumed or forked the run."""
    opened_at: float | None = None
    """When that checkpoint was made (what ``flow_finished`` and ``flow_failed`` measure
    the run's duration from)."""
    usage: RunUsage | None = None
    """Tokens the run spent (``None`` until a step records some)."""
    scheduling: Scheduling = Field(default_factory=Scheduling)
    human: Human = Field(default_factory=Human)
    links: Links = Field(default_factory=Links)
    replay: Replay = Field(default_factory=Replay)
    versions: Versions = Field(default_factory=Versions)

    @model_validator(mode="before")
    @classmethod
    def _lift(cls, data: Any) -> Any:
        # Metadata written before it was grouped has the groups' fields at the top level
        # (a group's own value, if both are there, wins).
        if not isinstance(data, dict) or GROUP_OF.keys().isdisjoint(data):
            return data
        data = dict(data)
        lifted: dict[str, dict[str, Any]] = {}
        for name in [k for k in data if k in GROUP_OF]:
            lifted.setdefault(GROUP_OF[name], {})[name] = data.pop(name)
        for group, values in lifted.items():
            held = data.get(group)
            if held is None:
                data[group] = values
            elif isinstance(held, dict):
                data[group] = {**values, **held}
        return data

    def field(self, name: str) -> Any:
        """The value of field ``name``: a top-level one or a group's, by its plain name."""
        group = GROUP_OF.get(name)
        return getattr(self if group is None else getattr(self, group), name)

    def updated(self, **changes: Any) -> "RunMeta":
        """A copy with ``changes``: top-level fields, the groups' fields by their plain
        names (``priority=``, ``awaiting=``), or whole groups (``human=Human()``, a group's
        fields given beside it applied onto it). The one way metadata changes; a
        ``TypeError`` names a field it does not have. Values are taken as given (as
        ``model_copy`` takes them): the callers give models, not JSON."""
        top: dict[str, Any] = {}
        grouped: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            if name in GROUP_OF:
                grouped.setdefault(GROUP_OF[name], {})[name] = value
            elif name in META_GROUPS and isinstance(value, dict):
                top[name] = META_GROUPS[name].model_validate(value)
            elif name in type(self).model_fields:
                top[name] = value
            else:
                raise TypeError(f"run metadata has no field {name!r}")
        for group, values in grouped.items():
            top[group] = top.get(group, getattr(self, group)).model_copy(update=values)
        return self.model_copy(update=top)


def _split(activation_id: str) -> tuple[str, int]:
    """``"method#n"`` as ``("method", n)``; ``n`` is 0 when the id is malformed."""
    return ids.split_activation(activation_id) or (activation_id, 0)


def _tracked(
    in_flight: list[str],
    dispatched: dict[str, int],
    forgotten: dict[str, int],
    done: dict[str, tuple[int, int]],
) -> set[str]:
    """The activations a record keeps notes on: those in flight, each method's latest one
    (``fork --rerun`` re-creates it with its trigger and causes) and each method's latest
    committed one (the emitter an ``and_`` join names as a cause)."""
    kept = set(in_flight)
    kept.update(ids.activation_id(m, n) for m, n in dispatched.items() if n > forgotten.get(m, 0))
    kept.update(ids.activation_id(m, n) for m, (n, _) in done.items())
    return kept


class ExecutionRecord(BaseModel):
    """The orchestrator's bookkeeping of a run (:mod:`runner.flow.orchestrator` gives it its
    meaning), stored in every checkpoint.

    Its size is bounded by the flow graph and the activations in flight, never by the run's
    length: per method a count and its latest commit rather than every activation, and
    triggers, causes and lineage only of the activations that can still matter. A record
    written before it was bounded (a ``completed`` list of every activation) is upgraded
    when it is read.
    """

    model_config = ConfigDict(extra="ignore", defer_build=True)

    emitted: dict[str, int] = Field(default_factory=dict)
    """Event (method name or router label) -> times emitted."""
    dispatched: dict[str, int] = Field(default_factory=dict)
    """Method -> activations created so far (the ``n`` of its latest activation)."""
    forgotten: dict[str, int] = Field(default_factory=dict)
    """Method -> the ``n`` up to which a ``fork --rerun`` forgot its activations."""
    done: dict[str, tuple[int, int]] = Field(default_factory=dict)
    """Method -> (``n`` of its most recently committed activation, :attr:`commits` once that
    one committed): orders the methods by their latest commit."""
    commits: int = 0
    """Activations committed so far (those a ``fork --rerun`` forgot included)."""
    in_flight: list[str] = Field(default_factory=list)
    """Activations made ready (and dispatched, or about to be) but not committed."""
    outputs: dict[str, Any] = Field(default_factory=dict)
    """Method -> output of its latest completed activation (a JSON value)."""
    routes: dict[str, str] = Field(default_factory=dict)
    """Router -> the label its latest completed activation returned."""
    triggers: dict[str, str | None] = Field(default_factory=dict)
    """Activation -> the event that fired it (``None`` for a start at kickoff), for the
    activations in flight and each method's latest and latest committed one."""
    causes: dict[str, list[str]] = Field(default_factory=dict)
    """Activation -> the activations whose commits made it ready (all the inputs of an
    ``and_`` join; none for kickoff), kept for the same activations as :attr:`triggers`."""
    lineage: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Activation -> ``{L: k}`` when ``L#k`` is the latest activation of the multi-leaf
    ``or_`` listener ``L`` among the activation itself and its (transitive) causes; kept
    for the activations of :attr:`triggers` and their causes, omitted when empty."""
    seen: dict[str, list[str]] = Field(default_factory=dict)
    """``and_`` listener -> leaves emitted since it last fired."""
    fired: dict[str, int] = Field(default_factory=dict)
    """Multi-leaf ``or_`` listener -> times it fired."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        # Today's records have ``done`` (and no ``completed`` of their own: a copy added
        # beside one, as a view of the checkpoint does, is ignored).
        if (
            isinstance(data, dict)
            and isinstance(data.get("completed"), list)
            and "done" not in data
        ):
            try:
                return _from_history(data)
            except (TypeError, AttributeError) as exc:
                # A ValueError is what pydantic reports as a validation error of the record.
                raise ValueError(f"unreadable record of a previous version: {exc}") from None
        return data

    @property
    def completed(self) -> list[str]:
        """Every committed activation still on record, grouped by method, the methods in
        the order of their latest commit (commit order for a run without loops)."""
        flying = set(self.in_flight)
        acts = []
        for method in sorted(self.done, key=lambda m: self.done[m][1]):
            first = self.forgotten.get(method, 0) + 1
            for n in range(first, self.dispatched.get(method, 0) + 1):
                act = ids.activation_id(method, n)
                if act not in flying:
                    acts.append(act)
        return acts

    def is_completed(self, activation_id: str) -> bool:
        """Whether ``activation_id`` committed (and no ``fork --rerun`` forgot it)."""
        method, n = _split(activation_id)
        return (
            self.forgotten.get(method, 0) < n <= self.dispatched.get(method, 0)
            and activation_id not in self.in_flight
        )

    def trim(self) -> None:
        """Drop the notes on activations that can no longer matter (on a record being
        built; a stored record is never changed in place)."""
        kept = _tracked(self.in_flight, self.dispatched, self.forgotten, self.done)
        self.triggers, self.causes, self.lineage = _kept_notes(
            kept, self.triggers, self.causes, self.lineage
        )


def _from_history(data: dict[str, Any]) -> dict[str, Any]:
    """A record written before records were bounded (every completed activation listed,
    the triggers and causes of all of them), in today's form with the same meaning.

    Lineage is computed for every method, not only ``or_`` listeners (the graph is not
    known here): extra entries are never asked for.
    """
    completed = [str(a) for a in data["completed"]]
    in_flight = [str(a) for a in data.get("in_flight") or []]
    dispatched = {str(m): int(n) for m, n in (data.get("dispatched") or {}).items()}
    for act in [*completed, *in_flight]:
        method, n = _split(act)
        dispatched[method] = max(dispatched.get(method, 0), n)
    done = {}
    for i, act in enumerate(completed, 1):
        method, n = _split(act)
        done[method] = (n, i)
    present = {*completed, *in_flight}
    forgotten = {}
    for method, count in dispatched.items():
        gone = [n for n in range(1, count + 1) if ids.activation_id(method, n) not in present]
        if gone:
            forgotten[method] = max(gone)
    causes = {str(a): [str(c) for c in cs] for a, cs in (data.get("causes") or {}).items()}
    lineage: dict[str, dict[str, int]] = {}
    # Causes commit before what they cause is created, so commit order (then the
    # activations in flight) visits every cause first; a forgotten cause is only itself.
    for act in [*completed, *in_flight]:
        method, n = _split(act)
        line = {method: n}
        for cause in causes.get(act, []):
            for name, k in lineage.get(cause, dict([_split(cause)])).items():
                line[name] = max(line.get(name, 0), k)
        lineage[act] = line
    kept = _tracked(in_flight, dispatched, forgotten, done)
    triggers, causes, lineage = _kept_notes(kept, data.get("triggers") or {}, causes, lineage)
    return {
        **{k: v for k, v in data.items() if k != "completed"},
        "dispatched": dispatched,
        "forgotten": forgotten,
        "done": done,
        "commits": len(completed),
        "in_flight": in_flight,
        "triggers": triggers,
        "causes": causes,
        "lineage": lineage,
    }


def _kept_notes(
    kept: set[str],
    triggers: dict[str, str | None],
    causes: dict[str, list[str]],
    lineage: dict[str, dict[str, int]],
) -> tuple[dict[str, str | None], dict[str, list[str]], dict[str, dict[str, int]]]:
    """Triggers and causes of the ``kept`` activations; lineage of those and their causes."""
    causes = {a: c for a, c in causes.items() if a in kept}
    lines = kept | {c for cs in causes.values() for c in cs}
    return (
        {a: t for a, t in triggers.items() if a in kept},
        causes,
        {a: line for a, line in lineage.items() if a in lines},
    )


_COPIES = ("completed", "outputs", "in_flight")
"""Record fields checkpoints of the previous version also carried at the top level."""


class Checkpoint(BaseModel):
    """One durable snapshot of a run, written when a step or the run changes."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    id: str = Field(default_factory=ids.checkpoint_id)
    """Time-sortable id, unique across runs."""
    run_id: str
    """The run this checkpoint belongs to (the flow state's ``id``)."""
    seq: int = 0
    """Position in the run's history, assigned by the store (1, 2, 3, ... gapless)."""
    event: str
    """What happened: ``flow_started``, ``method_execution_finished``,
    ``method_execution_failed``, ``flow_paused``, ``flow_resumed``, ``flow_cancelled``,
    ``flow_failed``, ``child_run_started``, ``forked``, or ``method_finished`` (a state
    saved by ``@persist``)."""
    step: str | None = None
    """The flow method or crew task the event is about."""
    activation: str | None = None
    """Idempotency key of a step commit (``method#n``); one commit per activation."""
    attempt: str | None = None
    """Token of the attempt that committed (fencing of late duplicate attempts)."""
    status: RunStatus = RunStatus.RUNNING
    """Run status as of this checkpoint."""
    state: dict[str, Any] = Field(default_factory=dict)
    """The flow state, JSON."""
    record: ExecutionRecord = Field(default_factory=ExecutionRecord)
    """The orchestrator's bookkeeping: steps done and in flight, outputs, router outcomes,
    join progress; bounded by the flow graph, whatever the run's length."""
    flow: str | None = None
    """Import path of the flow or crew, ``pkg.mod:Class``."""
    fingerprint: str | None = None
    """Fingerprint of the flow's graph when the checkpoint was written."""
    version: str | None = None
    """The code version that wrote the checkpoint (``RUNNER_APP_VERSION``, else a hash of the
    flow's graph and state schema: :mod:`runner.flow.versions`); ``None`` before versions
    were recorded. A checkpoint no code wrote (an answer, a cancel) keeps the one before."""
    lineage: Lineage | None = None
    """Set on runs created by a fork."""
    created_at: float = Field(default_factory=time.time)
    """Unix time the checkpoint was made."""
    error: StepError | None = None
    """The error, when the event is a failure."""
    meta: RunMeta = Field(default_factory=RunMeta)
    """What the engine keeps about the run: name, epoch, ready steps, parent/children."""
    worker: str | None = None
    """Host name of the worker (or process) that ran the step of this checkpoint."""
    duration: float | None = None
    """Seconds the step's method ran (its last attempt)."""
    attempts: int | None = None
    """Attempts the step took (1 = first try)."""
    usage: UsageMetrics | None = None
    """Tokens the step's method spent (its last attempt, as ``duration``), a child run it
    started included; ``None`` when it recorded none."""

    @model_validator(mode="before")
    @classmethod
    def _fold_copies(cls, data: Any) -> Any:
        # Checkpoints written before records were bounded also carried top-level copies
        # of the record's completed list, outputs and in-flight list; a record that lacks
        # them (or a caller that passes only these) gets them from there.
        if not isinstance(data, dict) or not any(k in data for k in _COPIES):
            return data
        data = dict(data)
        copies = {k: data.pop(k) for k in _COPIES if k in data}
        record = data.get("record")
        if record is None or isinstance(record, dict):
            data["record"] = {**copies, **(record or {})}
        return data

    @property
    def completed(self) -> list[str]:
        """Committed activations (see :attr:`ExecutionRecord.completed`)."""
        return self.record.completed

    @property
    def outputs(self) -> dict[str, Any]:
        """Latest output of each completed step, JSON."""
        return self.record.outputs

    @property
    def in_flight(self) -> list[str]:
        """Activations dispatched or ready but not yet committed."""
        return self.record.in_flight


class RunInfo(BaseModel):
    """A run's metadata: the fields of its metadata hash."""

    model_config = ConfigDict(defer_build=True)

    run_id: str
    status: RunStatus = RunStatus.PENDING
    flow: str | None = None
    """Import path of the flow or crew."""
    name: str | None = None
    """Display name of the flow or crew."""
    latest: str | None = None
    """Id of the newest checkpoint."""
    seq: int = 0
    """Sequence number of the newest checkpoint."""
    event: str | None = None
    """Event of the newest checkpoint."""
    step: str | None = None
    """Step of the newest checkpoint."""
    created_at: float = 0.0
    updated_at: float = 0.0
    parent_run_id: str | None = None
    parent_checkpoint_id: str | None = None
    branch: str | None = None
    error: str | None = None
    """``Type: message`` of the last failure."""
    # What a listing of runs shows and selects by, kept here so that it reads no checkpoint
    # (``runner runs``, every selection): each mirrors the newest checkpoint.
    version: str | None = None
    """The code version that wrote the newest checkpoint (``runner runs --version``)."""
    child_of: str | None = None
    """The run one of whose steps started this one (a crew's run), if any."""
    # A plain default (pydantic copies it): `list` as a factory has pydantic read a builtin's
    # signature from text, ~2 ms of a cold `runner runs` (bench/cli_cold.py).
    child_runs: list[str] = Field(default=[])
    """The child runs its steps started, in the order they started."""
    not_before: float | None = None
    """When a delayed start (``submit(countdown=...)``) may begin."""

    @field_validator("child_runs", mode="before")
    @classmethod
    def _children_from_json(cls, value: Any) -> Any:
        # A store that keeps fields as text (Redis' metadata hash) holds the list as JSON.
        return json.loads(value) if isinstance(value, str | bytes) else value
