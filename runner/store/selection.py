"""Which runs a list or a bulk action means: one selection model for the CLI, the API and
the console.

A selection is written as space-separated ``key=value`` terms, every term must hold::

    flow=research status=failed,paused since=1h until=2026-11-28T04:00:00+00:00 id~tick

* ``flow=`` a flow's name or import path (``pkg.mod:Cls``, or its class name); commas: any of;
* ``status=`` one or more statuses, comma-separated;
* ``since=`` / ``until=`` last updated at or after / before: an age (``90s``, ``15m``, ``1h``,
  ``2d``, ``1w``) or an ISO time with its zone;
* ``id~`` text found in the run id (case-insensitive); ``text~`` in id, flow, step, error or
  branch (the console's search box);
* ``version=`` the code version that wrote the run's latest checkpoint; commas: any of.

Runs come newest update first, read page by page through the store's run index
(:meth:`~runner.store.base.CheckpointStore.runs`), which lets a ``since`` stop the read early.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any, NamedTuple

from runner.errors import InvalidInputs
from runner.store.base import CheckpointStore
from runner.store.models import RunInfo, RunStatus

PAGE = 200
"""Runs read from the index per round trip."""
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
KEYS = ("flow", "status", "since", "until", "id", "text", "version")
_TERM = re.compile(r"^(?P<key>[a-z]+)(?P<op>~|=)(?P<value>.*)$")
_AGE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[smhdw])$")


class BadSelection(InvalidInputs):
    """A ``--where`` text (or the API's ``where``) that does not parse: one line naming the
    term and what is accepted."""


class Where(NamedTuple):
    """What a selection keeps: every field set must hold (an empty one keeps every run)."""

    flows: tuple[str, ...] = ()
    statuses: tuple[RunStatus, ...] = ()
    since: float | None = None
    """Updated at or after this Unix time."""
    until: float | None = None
    """Updated before this Unix time."""
    id_text: str = ""
    text: str = ""
    versions: tuple[str, ...] = ()
    source: str = ""
    """The text it was parsed from (for messages; no filter)."""

    @property
    def empty(self) -> bool:
        """True when it keeps every run."""
        return self._replace(source="") == Where()

    def keeps(self, info: RunInfo) -> bool:
        """Whether the run's record passes every filter."""
        if self.statuses and info.status not in self.statuses:
            return False
        if self.versions and info.version not in self.versions:
            return False
        if self.flows and not any(flow_matches(info, flow) for flow in self.flows):
            return False
        if self.since is not None and info.updated_at < self.since:
            return False
        if self.until is not None and info.updated_at >= self.until:
            return False
        if self.id_text and self.id_text.lower() not in info.run_id.lower():
            return False
        return not self.text or _has_text(info, self.text)


def flow_matches(info: RunInfo, flow: str) -> bool:
    """Whether ``flow`` names the run's flow: its name, import path or class name."""
    return flow in (info.name, info.flow) or (info.flow or "").endswith(f":{flow}")


def _has_text(info: RunInfo, text: str) -> bool:
    needle = text.lower()
    hay = (info.run_id, info.flow, info.name, info.step, info.error, info.branch, info.event)
    return any(needle in value.lower() for value in hay if value)


def parse(text: str | None, now: float) -> Where:
    """The selection ``text`` writes (see the module); :class:`BadSelection` otherwise."""
    found: dict[str, Any] = {}
    for term in (text or "").split():
        match = _TERM.match(term)
        if match is None:
            raise _bad(term, "a term is key=value (or id~text, text~text)")
        key, op, value = match["key"], match["op"], match["value"]
        if key not in KEYS:
            raise _bad(term, f"unknown key {key!r}")
        if (op == "~") != (key in ("id", "text")):
            raise _bad(term, f"write {key}{'~' if key in ('id', 'text') else '='}VALUE")
        if key in found:
            raise _bad(term, f"{key} is given twice (use commas for any of)")
        if not value:
            raise _bad(term, "the value is empty")
        found[key] = _value(key, value, term, now)
    return Where(
        flows=found.get("flow", ()),
        statuses=found.get("status", ()),
        since=found.get("since"),
        until=found.get("until"),
        id_text=found.get("id", ""),
        text=found.get("text", ""),
        versions=found.get("version", ()),
        source=(text or "").strip(),
    )


def _value(key: str, value: str, term: str, now: float) -> Any:
    if key == "status":
        known = {s.value: s for s in RunStatus}
        wrong = [v for v in value.split(",") if v not in known]
        if wrong:
            raise _bad(term, f"status is one of {', '.join(known)}")
        return tuple(known[v] for v in value.split(","))
    if key in ("flow", "version"):
        return tuple(v for v in value.split(",") if v)
    if key in ("since", "until"):
        return instant(value, now, term)
    return value


def instant(value: str, now: float, term: str | None = None) -> float:
    """``value`` as a Unix time: an age before ``now`` (``1h``) or an ISO time with a zone."""
    age = _AGE.match(value)
    if age is not None:
        return now - float(age["n"]) * UNITS[age["unit"]]
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise _bad(
            term or value, "a time is an age (30s, 15m, 1h, 2d, 1w) or an ISO time with its zone"
        )
    return at.timestamp()


def _bad(term: str, why: str) -> BadSelection:
    return BadSelection(f"bad selection term {term!r}: {why}", term=term)


def matching(
    store: CheckpointStore, where: Where, *, page: int = PAGE, top_level: bool = False
) -> Iterator[RunInfo]:
    """The runs ``where`` keeps, newest update first; with ``top_level``, not child runs (a
    crew a flow step started). Reads the index a page at a time, and stops at the first run
    updated before ``where.since``. Only the runs' records are read: each mirrors its latest
    checkpoint's version and parent run (:func:`~runner.store._common.run_info_after`)."""
    status = where.statuses[0] if len(where.statuses) == 1 else None
    offset = 0
    while True:
        batch = store.runs(limit=page, offset=offset, status=status)
        yield from (i for i in batch if where.keeps(i) and not (top_level and i.child_of))
        old = where.since is not None and batch and batch[-1].updated_at < where.since
        if len(batch) < page or old:
            return
        offset += page


class Page(NamedTuple):
    """One page of a selection: its runs and how many runs the selection holds in all."""

    runs: list[RunInfo]
    total: int
    offset: int

    @property
    def more(self) -> int:
        """Runs of the selection after this page."""
        return max(self.total - self.offset - len(self.runs), 0)


def page_of(
    store: CheckpointStore,
    where: Where,
    *,
    offset: int = 0,
    limit: int | None = 50,
    top_level: bool = False,
    page: int = PAGE,
) -> Page:
    """The runs ``where`` keeps from ``offset`` (at most ``limit``; ``None``: all of them),
    and the selection's count (the console's "1-50 of 312", the CLI's "N more")."""
    runs: list[RunInfo] = []
    total = 0
    for info in matching(store, where, top_level=top_level, page=page):
        if total >= offset and (limit is None or len(runs) < limit):
            runs.append(info)
        total += 1
    return Page(runs=runs, total=total, offset=offset)
