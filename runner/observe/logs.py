"""Worker logs for machines: ``RUNNER_LOG_FORMAT=json`` writes one JSON object a line.

Every line has ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``process`` and ``message``
(and ``exc_info``, the traceback, when there is one). A line logged while a step runs, in
the process running it (the method's own logging, the runner's, Celery's lines about the
task), also has ``run_id``, ``flow``, ``step`` (the activation, ``plan#1``) and ``attempt``:
they are read from the Celery task being run, so no call site passes them. Celery's lines
about a step in the worker's main process (``Task ... received``) have them too, read from
the task id (``<run id>:<epoch>:<step>``) and arguments (``run=... step=... attempt=N``)
Celery logs with them.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from celery import current_task, signals


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with the step's fields when a step is running."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.process,
            "message": record.getMessage(),
        }
        line.update(step_fields() or celery_step_fields(record))
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        return json.dumps(line, default=str)


def step_fields() -> dict[str, Any]:
    """``run_id``, ``flow``, ``step`` and ``attempt`` of the step this thread runs, if any."""
    task = current_task
    if not task:
        return {}
    kwargs = task.request.kwargs or {}
    if "run_id" not in kwargs or "activation" not in kwargs:
        return {}  # a task that is not a step (the recovery task)
    return {
        "run_id": kwargs["run_id"],
        "flow": str(task.name).rpartition(".")[0],
        "step": kwargs["activation"],
        "attempt": int(kwargs.get("attempt", 1)),
    }


_ATTEMPT = re.compile(r"\battempt=(\d+)")


def celery_step_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The step fields of a Celery record about a step task outside it (its ``id``, ``name``
    and ``kwargs`` repr are the record's arguments)."""
    args = record.args
    if not isinstance(args, Mapping) or "id" not in args or "name" not in args:
        return {}
    parts = str(args["id"]).rsplit(":", 2)  # a run id may hold a ':', an epoch or step not
    if len(parts) != 3 or not parts[1].isdigit():
        return {}  # not a step's task id
    run_id, _epoch, step = parts
    attempt = _ATTEMPT.search(str(args.get("kwargs", "")))
    return {
        "run_id": run_id,
        "flow": str(args["name"]).rpartition(".")[0],
        "step": step,
        "attempt": int(attempt.group(1)) if attempt else 1,
    }


def install_json() -> None:
    """Give the handlers Celery sets up (the worker's, and its pool processes' again) the
    JSON formatter."""
    formatter = JsonFormatter()

    def on_setup(logger: Any = None, **_: Any) -> None:
        for handler in getattr(logger, "handlers", []):
            handler.setFormatter(formatter)

    signals.after_setup_logger.connect(on_setup, weak=False)
    signals.after_setup_task_logger.connect(on_setup, weak=False)
