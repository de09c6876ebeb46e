"""Rate and concurrency limits that hold across every worker of a deployment.

A method's own limits (``rate_limit="5/s"``, ``concurrency=2``) and the named limits it
counts against (``limits=["openai"]``, rates from :func:`set_limit` or ``RUNNER_LIMITS``),
each per key when ``limit_key`` computes one from the run's state, are checked in one Redis
script call (the store's ``admit``, :mod:`runner.store.limits`) when an attempt begins,
after it took the step's lease and before it runs anything:

* **rates** by GCRA: at most ``burst`` starts at once (one period's worth unless
  ``burst=`` says otherwise), then one per interval; so any one period holds at most the
  burst plus the limit;
* **concurrency** by slots: the attempt's token scored by lease expiry, renewed with the
  lease by this process's ``limit-slots`` thread, dropped when the attempt ends in any way;
  a killed worker's slot lapses with its lease, trimmed by the next admission.

A step a limit holds back is **deferred**: the attempt hands its step to a message with a
countdown (when the limit will let it start; a short poll for a concurrency slot) and frees
its pool slot at once, under the same lease rules as a retry (see ``docs/delivery.md``).
It is noted in the limit's waiting set, which ``runner limits`` and the console show.
Its turn is reserved; if it comes back late (the worker holding its message was killed, and
the messages came back together), it keeps the turn but starts only as the rate's starts
allow, so the bound above holds for what actually starts.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from runner.errors import StoreError
from runner.flow.graph import MethodSpec
from runner.flow.rates import Rate, check_name, parse_limits, parse_rate
from runner.settings import RunnerSettings
from runner.store.base import DeploymentStore
from runner.store.limits import CONCURRENCY, RateLimit, SlotLimit

from . import outage
from .services import services

log = logging.getLogger("runner.worker")

POLL_SECONDS = 0.25
"""How long a step waiting for a concurrency slot waits before it asks again (plus jitter)."""


@dataclass(frozen=True)
class Waiting:
    """A step a limit holds back: ``limit`` (a ``kind`` of limit) lets it start in about
    ``seconds``."""

    limit: str
    kind: str
    seconds: float


@dataclass(frozen=True)
class Limits:
    """The limits one step counts against, by the names they are kept under."""

    rates: tuple[tuple[str, Rate], ...]
    slots: tuple[tuple[str, int], ...]


def set_limit(
    name: str, rate: str, *, burst: int | None = None, store: DeploymentStore | None = None
) -> Rate:
    """Set the named limit ``name`` to ``rate`` (``"500/m"``) for the whole deployment:
    every worker uses it from the next step on, over ``RUNNER_LIMITS``. ``store``: the
    deployment's store (default: the producer runtime's)."""
    from runner.distributed.client import runtime

    parsed = parse_rate(rate, burst, what=f"limit {check_name(name, 'limit name')}")
    store = runtime().store if store is None else store
    store.set_rate(name, rate, parsed.burst)
    return parsed


def named_rates(store: DeploymentStore, settings: RunnerSettings) -> dict[str, Rate]:
    """The named limits: ``RUNNER_LIMITS``, overridden by those set with :func:`set_limit`."""
    found = parse_limits(settings.limits)
    for name, (rate, burst) in store.named_rates().items():
        found[name] = parse_rate(rate, burst)
    return found


_warned: set[str] = set()


def limits_of(spec: MethodSpec, flow_name: str, state: Any, named: dict[str, Rate]) -> Limits:
    """The limits of a step of ``spec`` (of flow ``flow_name``) on the run's ``state``."""
    suffix = ""
    if spec.limit_key is not None:
        try:
            suffix = f"[{spec.limit_key(state)}]"
        except Exception as exc:
            # The step still counts against the limit, under a key of its own kind.
            log.error(
                "limit_key of %s.%s raised %r: limiting it under key '?'", flow_name, spec.name, exc
            )
            suffix = "[?]"
    own = f"{flow_name}.{spec.name}{suffix}"
    rates = [(own, spec.rate)] if spec.rate is not None else []
    for name in spec.limits:
        rate = named.get(name)
        if rate is None:
            if name not in _warned:
                _warned.add(name)
                log.warning(
                    "limit %r of %s.%s is not set (RUNNER_LIMITS or runner.set_limit): "
                    "not limiting it",
                    name,
                    flow_name,
                    spec.name,
                )
            continue
        rates.append((f"{name}{suffix}", rate))
    slots = [(own, spec.concurrency)] if spec.concurrency else []
    return Limits(tuple(rates), tuple(slots))


def state_of(flow_cls: Any, state: dict[str, Any]) -> Any:
    """The run's state as its methods see it (the model, or the dict), for ``limit_key``."""
    model = flow_cls.state_type()
    return state if model is None else model.model_validate(state)


class Gate:
    """Admits this process's steps under their limits and keeps their slots."""

    def __init__(self, store: DeploymentStore, lease_seconds: float) -> None:
        self.store, self.lease_seconds = store, lease_seconds
        self._held: dict[tuple[str, str], None] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def admit(self, limits: Limits, token: str, member: str) -> Waiting | None:
        """Take ``limits`` for the attempt ``token`` of ``member`` (``run|step``), or say how
        long it waits."""
        refused = self.store.admit(
            [RateLimit(n, r.interval, r.burst, str(r), r.period) for n, r in limits.rates],
            [SlotLimit(n, count) for n, count in limits.slots],
            token,
            member,
            self.lease_seconds,
            POLL_SECONDS,
        )
        if refused is not None:
            # Slots free up when attempts end, unknown when: polls are spread out.
            jitter = random.uniform(0, POLL_SECONDS) if refused.kind == CONCURRENCY else 0.0
            return Waiting(refused.name, refused.kind, refused.seconds + jitter)
        with self._lock:
            for name, _ in limits.slots:
                self._held[(name, token)] = None
        if limits.slots:
            self._keep_renewing()
        return None

    def release(self, limits: Limits, token: str) -> None:
        """Give back the slots the attempt ``token`` holds (it ended, whatever the way)."""
        if not limits.slots:
            return
        with self._lock:
            for name, _ in limits.slots:
                self._held.pop((name, token), None)
        self.store.release_slots([name for name, _ in limits.slots], token)

    def renew(self) -> None:
        """Renew every slot this process's attempts hold (one script call)."""
        with self._lock:
            held = list(self._held)
        if held:
            self.store.renew_slots(held, self.lease_seconds)

    def _keep_renewing(self) -> None:
        # One thread per gate, started on first use (a forked pool child has gates and
        # threads of its own: :func:`gate_of`).
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._renewing, name="limit-slots", daemon=True)
        self._thread.start()

    def _renewing(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.lease_seconds / 3):
            try:
                self.renew()
            except StoreError as exc:  # the slot lapses with the lease if this lasts
                if not outage.report(exc):  # a lost connection is said once, per worker
                    log.warning("could not renew concurrency slots: %s", exc)


def gate_of(store: DeploymentStore, lease_seconds: float) -> Gate:
    """This process's gate on ``store`` (a forked child makes its own)."""
    return services().one((Gate, id(store)), lambda: Gate(store, lease_seconds))


@contextmanager
def admission(
    store: DeploymentStore,
    settings: RunnerSettings,
    flow_cls: Any,
    spec: MethodSpec,
    state: dict[str, Any],
    member: str,
    token: str,
) -> Iterator[Waiting | None]:
    """Admit a step under its limits for the block (``None``), or yield how it waits.
    Slots taken are given back when the block ends, however it ends."""
    if not spec.limited:
        yield None
        return
    named = named_rates(store, settings) if spec.limits else {}
    limits = limits_of(spec, flow_cls.flow_name(), state_of(flow_cls, state), named)
    gate = gate_of(store, settings.lease_seconds)
    waiting = gate.admit(limits, token, member)
    try:
        yield waiting
    finally:
        if waiting is None:
            gate.release(limits, token)
