"""What every command shares: the store or runtime, output, input parsing and the exit-code
rule.

Commands that only read (``runs``, ``status``, ``steps``, ...) go through
:attr:`Session.reader`, the deployment's store alone; only commands that send steps or talk
to workers build the Celery app (:attr:`Session.rt`), so reading never imports Celery.

Exit codes (the same for every command):

* ``0`` done: the operation worked; a waited-for run succeeded or paused for input;
* ``1`` a run failed or was cancelled, an operation was refused (e.g. resuming a running
  run), waiting timed out, or Redis is unreachable;
* ``2`` bad input: a malformed option or Redis URL, an unknown run, checkpoint, flow or
  step, a flow outside the workers' allow-list, inputs the flow's state rejects.

Every error is one line on stderr (``error: no run abc123``); ``runner --debug`` adds the
traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import typer

from runner.embedded import BadRedisUrl, shared_redis_url
from runner.errors import (
    CheckpointNotFound,
    DefinitionError,
    InvalidInputs,
    InvalidSettings,
    RunnerError,
    RunNotFound,
)
from runner.settings import RunnerSettings, get_settings, reset_settings
from runner.store.base import CheckpointStore, DeploymentStore
from runner.store.connection import BadRedisSettings
from runner.store.redis import RedisProvider

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console

    # The runtime carries the Celery app: imported when a command builds it.
    from runner.distributed.engine import Runtime

OK, FAILED, USAGE = 0, 1, 2

FLAG = ""
"""Metavar of on/off options, so help shows ``--wait`` as a flag (typer shows ``<bool>``)."""


class BadUsage(RunnerError):
    """A command-line value the runner cannot use (malformed ``--input``, unreadable file)."""


BAD_INPUT: tuple[type[RunnerError], ...] = (
    BadUsage,
    BadRedisUrl,
    BadRedisSettings,
    RunNotFound,
    CheckpointNotFound,
    DefinitionError,
    InvalidInputs,
    InvalidSettings,
)
"""Errors caused by what the user typed: exit code 2. Every other error exits 1."""


def exit_code_for(exc: BaseException) -> int:
    """``2`` for bad input (see :data:`BAD_INPUT`), ``1`` for everything else."""
    return USAGE if isinstance(exc, BAD_INPUT) else FAILED


class Reader(Protocol):
    """What commands read runs through: the deployment's store. A :class:`StoreView` is one,
    and so is a command's :class:`~runner.distributed.engine.Runtime`."""

    @property
    def store(self) -> DeploymentStore:
        """The deployment's checkpoint store."""
        ...


class History(Protocol):
    """What the checkpoint commands (``checkpoints``, ``show``, ``diff``, ``prune``,
    ``resume``) read runs through: a :class:`Reader`, or with ``--location`` a JSON
    directory or SQLite file (:mod:`runner.cli.location`)."""

    @property
    def store(self) -> CheckpointStore:
        """The store holding the runs."""
        ...


@dataclass(frozen=True)
class StoreView:
    """The deployment's store alone: what a command that only reads builds (no Celery app)."""

    store: RedisProvider


@dataclass
class Session:
    """One invocation: global options, and the store or runtime, built on first use and
    closed at exit."""

    redis_url: str | None = None
    """``--redis-url``; overrides ``RUNNER_REDIS_URL``."""
    debug: bool = False
    """``--debug``: show tracebacks."""
    _settings: RunnerSettings | None = field(default=None, repr=False)
    _rt: Runtime | None = field(default=None, repr=False)
    _view: StoreView | None = field(default=None, repr=False)

    def settings(self) -> RunnerSettings:
        """Settings read from the environment at first use, with ``--redis-url`` applied."""
        if self._settings is None:
            settings = get_settings()  # read again if a RUNNER_* variable changed (tests)
            if self.redis_url:
                settings = settings.model_copy(update={"redis_url": self.redis_url})
            self._settings = settings
        return self._settings

    @property
    def reader(self) -> Reader:
        """The deployment's store, for reading: the runtime once a command has built one,
        else the store alone (no Celery app)."""
        if self._rt is not None:
            return self._rt
        if self._view is None:
            settings = self.settings()
            # The configured Redis or `runner dev`'s, as for the runtime (pings it).
            url = shared_redis_url(settings.redis_url)
            self._view = StoreView(RedisProvider(url, prefix=settings.prefix))
        return self._view

    @property
    def rt(self) -> Runtime:
        """The producer runtime (Celery app + Redis store), for commands that send steps or
        talk to workers."""
        if self._rt is None:
            # Celery and kombu are imported here, by the commands that need the app.
            from runner.distributed.app import make_app
            from runner.distributed.engine import Runtime

            settings = self.settings()
            # The configured Redis or `runner dev`'s, never a private one: it would hold no
            # runs and serve no workers.
            self._rt = Runtime.create(make_app(settings), settings)  # pings Redis
        return self._rt

    def close(self) -> None:
        """Close the connections opened; forget the settings read for this invocation."""
        if self._rt is not None:
            self._rt.close()
            self._rt = None
        if self._view is not None:
            self._view.store.close()
            self._view = None
        self._settings = None
        reset_settings()


def session(ctx: typer.Context) -> Session:
    """The :class:`Session` the group callback put on the context."""
    obj = ctx.find_object(Session)
    assert obj is not None, "the runner group callback sets the session"
    return obj


def report(exc: BaseException, *, debug: bool, internal: bool = False) -> None:
    """Print ``exc`` as one ``error:`` line on stderr (with the traceback under ``--debug``)."""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    message = one_line(str(exc)) or type(exc).__name__
    if internal:
        message = f"unexpected {type(exc).__name__}: {message}"
        if not debug:
            message += " (run with --debug for the traceback)"
    typer.echo(f"error: {message}", err=True)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())


# --- output ---------------------------------------------------------------------------------


def console() -> Console:
    """A rich console on stdout; wide when piped, so ids are not wrapped."""
    # rich takes ~30 ms to import: only output that is a view pays it, never --json.
    from rich.console import Console

    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, width=200)
    return out


def print_json(data: Any) -> None:
    """``data`` (JSON values, e.g. ``model_dump(mode="json")``) as indented JSON on stdout."""
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


# --- parsing --------------------------------------------------------------------------------


def text_pairs(pairs: list[str] | None, option: str) -> dict[str, str]:
    """``["k=v", ...]`` as a dict of the values' text; the flow's state model reads them
    (``runner.flow.state.values_from_text``), so a ``str`` field keeps ``02134`` as typed."""
    found: dict[str, str] = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise BadUsage(f"{option} {pair!r} is not of the form key=value")
        found[key.strip()] = value
    return found


def load_inputs(
    pairs: list[str] | None, inputs_file: Path | None, model: type[BaseModel] | None
) -> dict[str, Any]:
    """Inputs from ``--inputs-file`` (a JSON object), then ``--input k=v`` on top, read as
    ``model`` (the flow's state model, ``None`` for dict state) types them."""
    from runner.flow.state import values_from_text

    inputs: dict[str, Any] = {}
    if inputs_file is not None:
        try:
            data = json.loads(inputs_file.read_text())
        except OSError as exc:
            raise BadUsage(f"cannot read {inputs_file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise BadUsage(f"{inputs_file} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadUsage(f"{inputs_file} must hold a JSON object, not {type(data).__name__}")
        inputs.update(data)
    inputs.update(values_from_text(model, text_pairs(pairs, "--input")))
    return inputs


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``90``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w`` as seconds."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise BadUsage(f"duration {text!r} is not a number with an optional s/m/h/d/w unit")
    return float(match.group(1)) * _UNIT[match.group(2)]


def usage_line(exc: Any) -> str:
    """A click usage error as one line naming the command's ``--help``."""
    where = exc.ctx.command_path if exc.ctx is not None else "runner"
    return f"error: {one_line(exc.format_message())} (see '{where} --help')"
