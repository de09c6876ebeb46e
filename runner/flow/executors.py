"""What runs a flow, plugged in from above.

The executors (:mod:`runner.flow.local`, :mod:`runner.distributed`) sit above the flow core,
which does not import them; the package (``runner/__init__.py``, which any import of a flow
runs first) sets :data:`EXECUTORS`. This module imports nothing, so setting it costs the
package's import nothing either (``runner runs`` never loads the flow core).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Executors:
    """What runs a flow: :meth:`Flow.kickoff` in this process, :meth:`Flow.submit` on the
    workers. Set once by the package (``runner/__init__.py``), which imports above the flow
    core; these are the calls' signatures (see :func:`runner.flow.local.kickoff` and
    :func:`runner.distributed.client.submit`)."""

    in_process: Callable[..., Any] | None = None
    """``(flow, inputs, restore, restore_from_state_id, strict) -> output``."""
    on_workers: Callable[..., Any] | None = None
    """``(flow_class, inputs, **options) -> RunHandle``."""
    answer_in_process: Callable[..., Any] | None = None
    """``(flow, paused_checkpoint, answer) -> output``: :meth:`Flow.resume` of a run paused
    for a review (see :func:`runner.flow.local.answer`)."""
    declare: Callable[..., Any] | None = None
    """``(contents, path=) -> flow class``: :meth:`Flow.from_declaration`'s class (see
    :func:`runner.crew.declared.declared_flow`)."""


EXECUTORS = Executors()
