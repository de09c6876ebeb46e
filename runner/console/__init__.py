"""The flow-aware web console (``runner ui``): runs, graphs, checkpoints, diffs, lineage,
and resume / cancel / fork forms, beside Flower.

Two entry points, both importable without the console's libraries (FastAPI, Jinja2,
uvicorn, which come with the package; they raise :class:`ConsoleUnavailable` naming the
missing one instead):

* :func:`serve` runs the console with uvicorn until interrupted (``runner ui`` and
  ``runner dev`` call it);
* :func:`create_app` builds the ASGI app, for any ASGI server or a test.

Every action goes through :mod:`runner.distributed.control` and
:class:`runner.distributed.client.RunHandle`, the API the CLI uses. Without a token the
console is read-only; it refuses to listen on a non-loopback address without one.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from runner.errors import RunnerError

if TYPE_CHECKING:
    from runner.distributed.engine import Runtime
    from runner.settings import RunnerSettings

__all__ = [
    "ConsoleError",
    "ConsoleUnavailable",
    "check_bind",
    "create_app",
    "is_loopback",
    "require_extra",
    "serve",
]

EXTRA_HINT = "they come with celery-flows: pip install celery-flows"


class ConsoleError(RunnerError):
    """The console cannot start as configured (e.g. a public address without a token)."""


class ConsoleUnavailable(ConsoleError):
    """A library the console needs (FastAPI, Jinja2, uvicorn) is not installed."""


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback ``host`` without a token: anyone there could act on runs."""
    if not token and not is_loopback(host):
        raise ConsoleError(
            f"refusing to listen on {host} without a token: set RUNNER_UI_TOKEN, "
            "or listen on 127.0.0.1"
        )


def require_extra() -> None:
    """Raise :class:`ConsoleUnavailable`, naming it, if a library the console needs is
    missing."""
    try:
        import fastapi  # noqa: F401
        import jinja2  # noqa: F401
        import python_multipart  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConsoleUnavailable(
            f"the console needs fastapi, jinja2, python-multipart and uvicorn "
            f"({exc.name} is missing); {EXTRA_HINT}"
        ) from None


def create_app(
    rt: Runtime | None = None,
    *,
    settings: RunnerSettings | None = None,
    token: str | None = None,
    flower_url: str | None = None,
    public: bool = False,
) -> Any:
    """The console's ASGI app (a FastAPI instance).

    ``rt`` is the producer runtime to read and act through (default: one built from
    ``settings``, themselves defaulting to the environment). ``token`` enables actions
    (default: ``settings.ui_token``); ``flower_url`` is linked from steps (default:
    ``settings.ui_flower_url``). ``public`` accepts any Host header (a non-loopback
    bind); otherwise only loopback host names are answered (no DNS rebinding).
    """
    require_extra()
    from runner.console.app import build_app

    return build_app(rt, settings=settings, token=token, flower_url=flower_url, public=public)


def serve(
    host: str | None = None,
    port: int | None = None,
    token: str | None = None,
    *,
    settings: RunnerSettings | None = None,
    rt: Runtime | None = None,
    flower_url: str | None = None,
    log_level: str = "warning",
) -> None:
    """Run the console until interrupted (blocking).

    ``host``, ``port``, ``token`` and ``flower_url`` default to the settings
    (``RUNNER_UI_HOST``, ``RUNNER_UI_PORT``, ``RUNNER_UI_TOKEN``, ``RUNNER_UI_FLOWER_URL``);
    ``rt`` (the runtime to read and act through) to one built from the settings.
    Raises :class:`ConsoleError` for a non-loopback host without a token and
    :class:`ConsoleUnavailable` without its libraries, before listening.
    """
    from runner.settings import get_settings

    settings = settings or get_settings()
    host = host or settings.ui_host
    port = port or settings.ui_port
    token = token or settings.ui_token
    check_bind(host, token)
    require_extra()
    import uvicorn

    app = create_app(
        rt,
        settings=settings,
        token=token,
        flower_url=flower_url,
        public=not is_loopback(host),
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)
