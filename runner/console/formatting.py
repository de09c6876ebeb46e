"""Jinja filters of the console's templates: times, durations, JSON values."""

from __future__ import annotations

import json
from typing import Any

import jinja2

from runner.flow.rates import priority_text
from runner.flow.usage import tokens_text
from runner.views import duration, when


def pretty(value: Any) -> str:
    """A JSON value as indented JSON text (escaped by the template like any text)."""
    return json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False)


def short(text: str | None, keep: int = 12) -> str:
    """The start of a long id, enough to tell runs apart in a table."""
    if not text:
        return "-"
    return text if len(text) <= keep else text[:keep] + "…"


def install(env: jinja2.Environment) -> None:
    """Register the filters on ``env``."""
    env.filters.update(
        when=when,
        duration=duration,
        pretty=pretty,
        short=short,
        tokens=tokens_text,
        priority=priority_text,
    )
