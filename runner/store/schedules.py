"""Schedules: flows started on a cron expression or every N seconds, kept in Redis.

A schedule's ticks are instants in UTC: for ``every``, the multiples of its period since the
Unix epoch (the same for every process, whenever it was added); for ``cron``, the times the
expression names (parsed by ``cronsim``). :mod:`runner.distributed.schedules` fires them.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, Field

from runner.errors import InvalidInputs, RunStateError

from . import codec as codecs
from .keys import RedisHandle

log = logging.getLogger("runner.store")

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A schedule name: it starts the ids of the runs it makes."""


class Schedule(BaseModel):
    """What to start and when."""

    name: str
    flow: str
    """``pkg.mod:Flow``."""
    inputs: dict[str, Any] = Field(default_factory=dict)
    cron: str | None = None
    """A five-field cron expression, in UTC."""
    every: float | None = None
    """A period in seconds (at least 1)."""
    catch_up: bool = False
    """Fire every tick missed while no worker ran (else only the latest one)."""
    priority: int | None = None
    """The priority each tick's run is submitted with (0 lowest, 9 highest); ``None``: each
    step takes its method's ``priority=``, else the default. ``submit`` refuses a bad one;
    the CLI checks it when the schedule is added."""
    paused: bool = False
    created_at: float = Field(default_factory=time.time)

    def tick_after(self, at: float) -> float:
        """The schedule's first tick strictly after ``at``."""
        if self.every is not None:
            return (int(at // self.every) + 1) * self.every
        assert self.cron is not None
        start = datetime.fromtimestamp(at, UTC)
        for tick in CronSim(self.cron, start):
            if tick.timestamp() > at:  # cronsim may yield ``start`` itself
                return tick.timestamp()
        raise AssertionError("cronsim ends only on expressions it refuses")

    def ticks(self, after: float) -> Iterator[float]:
        """Its ticks after ``after``, in order."""
        tick = self.tick_after(after)
        while True:
            yield tick
            tick = self.tick_after(tick)

    def describe(self) -> str:
        """``cron 0 3 * * *`` or ``every 30s``."""
        if self.cron is not None:
            return f"cron {self.cron}"
        assert self.every is not None
        return f"every {self.every:g}s"


def run_id_of(name: str, tick: float) -> str:
    """The id of the run a schedule's tick starts: the same in every process, so a tick
    fired twice makes one run (see ``submit(id=...)``)."""
    stamp = datetime.fromtimestamp(tick, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{name}-{stamp}"


def make_schedule(
    name: str,
    flow: str,
    inputs: dict[str, Any] | None = None,
    *,
    cron: str | None = None,
    every: float | None = None,
    catch_up: bool = False,
    priority: int | None = None,
) -> Schedule:
    """A valid :class:`Schedule` (``InvalidInputs`` naming what is wrong)."""
    if NAME.fullmatch(name) is None:
        raise InvalidInputs(
            f"schedule name {name!r}: letters, digits, '_', '.', '-' (at most 64), "
            "starting with a letter or digit"
        )
    if (cron is None) == (every is None):
        raise InvalidInputs("give a schedule --cron or --every (one of them)")
    if every is not None and not every >= 1:
        raise InvalidInputs(f"every must be at least 1 second, not {every!r}")
    if cron is not None:
        try:
            CronSim(cron, datetime.now(UTC))
        except CronSimError as exc:
            raise InvalidInputs(f"--cron {cron!r}: {exc}") from None
    return Schedule(
        name=name,
        flow=flow,
        inputs=dict(inputs or {}),
        cron=cron,
        every=every,
        catch_up=catch_up,
        priority=priority,
    )


class ScheduleBook:
    """A deployment's schedules and their next ticks, in its Redis."""

    def __init__(self, store: RedisHandle) -> None:
        self.client: Any = store.client
        self.codec: codecs.Codec | None = getattr(store, "codec", None)
        """Seals each schedule's inputs (see :mod:`runner.store.codec`), if set."""
        self.key = store.keys.schedules()
        self.ticks_key = store.keys.ticks()

    def add(self, schedule: Schedule) -> None:
        """Store a new schedule; its first tick is the first after now
        (``RunStateError`` if the name is taken)."""
        if not self.client.hsetnx(self.key, schedule.name, self.dump(schedule)):
            raise RunStateError(
                f"schedule {schedule.name} exists; remove it first", schedule=schedule.name
            )
        self.client.hset(self.ticks_key, schedule.name, repr(schedule.tick_after(time.time())))

    def get(self, name: str) -> Schedule:
        """The schedule ``name`` (``InvalidInputs`` if there is none)."""
        raw = self.client.hget(self.key, name)
        if raw is None:
            raise InvalidInputs(f"no schedule {name}", schedule=name)
        return self.load(name, raw)

    def all(self) -> list[Schedule]:
        """Every schedule, by name; one that cannot be read is left out, said at ERROR."""
        found = []
        for name, raw in self.client.hgetall(self.key).items():
            try:
                found.append(self.load(name.decode(), raw))
            except ValueError as exc:
                log.error(
                    "schedule %s cannot be read, and does not fire (runner schedule remove %s): %s",
                    name.decode(),
                    name.decode(),
                    exc,
                )
        return sorted(found, key=lambda s: s.name)

    def set_paused(self, name: str, paused: bool) -> Schedule:
        """Pause or resume ``name``; a resumed schedule fires from its next tick after now
        unless it catches up."""
        schedule = self.get(name).model_copy(update={"paused": paused})
        self.client.hset(self.key, name, self.dump(schedule))
        if not paused and not schedule.catch_up:
            self.client.hset(self.ticks_key, name, repr(schedule.tick_after(time.time())))
        return schedule

    def remove(self, name: str) -> None:
        """Delete ``name`` (``InvalidInputs`` if there is none); its runs stay."""
        if not self.client.hdel(self.key, name):
            raise InvalidInputs(f"no schedule {name}", schedule=name)
        self.client.hdel(self.ticks_key, name)

    def next_tick(self, name: str) -> float | None:
        """The time of ``name``'s next tick not yet fired."""
        raw = self.client.hget(self.ticks_key, name)
        return None if raw is None else float(raw)

    def advance(self, name: str, tick: float) -> None:
        """Record that ``name``'s ticks before ``tick`` were fired."""
        self.client.hset(self.ticks_key, name, repr(tick))

    def dump(self, schedule: Schedule) -> str:
        """The stored JSON of ``schedule``: its inputs sealed when encryption is on."""
        if self.codec is None:
            return schedule.model_dump_json()
        clear = schedule.model_dump(mode="json", exclude={"inputs"})
        where = codecs.field_context(f"schedule:{schedule.name}", "inputs")
        clear["sealed"] = self.codec.seal(json.dumps(schedule.inputs).encode(), where)
        return json.dumps(clear, separators=(",", ":"))

    def load(self, name: str, raw: bytes) -> Schedule:
        """A stored schedule, its sealed inputs opened (with the key, else the error naming
        it)."""
        data = json.loads(raw)
        sealed = data.pop("sealed", None) if isinstance(data, dict) else None
        if isinstance(sealed, str):
            where = codecs.field_context(f"schedule:{name}", "inputs")
            what = f"the inputs of schedule {name}"
            data["inputs"] = json.loads(codecs.open_value(self.codec, sealed, where, what))
        return Schedule.model_validate(data)

    def as_json(self, schedule: Schedule) -> dict[str, Any]:
        """``schedule`` with its next tick, as ``runner schedule list --json`` prints it."""
        return schedule_json(schedule, self.next_tick(schedule.name))


def schedule_json(schedule: Schedule, next_tick: float | None) -> dict[str, Any]:
    """``schedule`` with its ``next_tick``, as ``runner schedule list --json`` prints it."""
    return {**json.loads(schedule.model_dump_json()), "next_tick": next_tick}
