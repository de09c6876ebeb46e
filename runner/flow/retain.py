"""A flow's own retention: ``@retention(succeeded="1d")`` or a ``retention`` class attribute.

It overrides the deployment's ``RUNNER_RETENTION`` status by status (see
:mod:`runner.store.policy`); the workers' recovery pass reads it when one of the flow's runs
ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from runner.errors import DefinitionError
from runner.store.policy import Policy, policy_of

C = TypeVar("C", bound=type)


def retention(**durations: str | float) -> Callable[[C], C]:
    """Keep this flow's finished runs in Redis for these durations from their end
    (``succeeded="1d", failed="30d"``; seconds as a number); checked at once."""
    checked = _checked(durations, "@retention")

    def apply(cls: C) -> C:
        cls.retention = dict(checked)  # type: ignore[attr-defined]
        return cls

    return apply


def flow_retention(flow_cls: Any) -> Policy | None:
    """The flow class's own policy (``None``: the deployment's applies)."""
    given = getattr(flow_cls, "retention", None)
    if given is None:
        return None
    if not isinstance(given, dict):
        raise DefinitionError(
            f"{getattr(flow_cls, '__name__', flow_cls)}.retention must be a dict such as "
            '{"succeeded": "7d"}',
        )
    return _checked(given, f"{flow_cls.__name__}.retention")


def _checked(given: dict[str, Any], where: str) -> Policy:
    try:
        return policy_of(given)
    except (ValueError, TypeError) as exc:
        raise DefinitionError(f"{where}: {exc}") from None
