"""``runner ui``: the web console (:mod:`runner.console`) on this deployment's Redis."""

from __future__ import annotations

import socket
from typing import Annotated

import typer

from ._app import commands
from ._session import session

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""


@app.command()
def ui(
    ctx: typer.Context,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            metavar="ADDR",
            help="Address to listen on (default: RUNNER_UI_HOST).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=1,
            max=65535,
            metavar="PORT",
            help="Port (default: RUNNER_UI_PORT, 8765).",
            show_default=False,
        ),
    ] = None,
    flower_url: Annotated[
        str | None,
        typer.Option(
            "--flower-url",
            metavar="URL",
            help="Flower, linked from each step (default: RUNNER_UI_FLOWER_URL).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the web console: runs, graphs, checkpoints, diffs, lineage; resume, cancel, fork.

    Read-only unless RUNNER_UI_TOKEN is set (the token is then needed for every page: open
    /login once, or send `Authorization: Bearer <token>` to /api). It refuses to
    listen on an address other than loopback without a token. The JSON API is under /api
    (OpenAPI: /api/openapi.json). Runs until Ctrl-C.
    """
    from runner.console import check_bind, require_extra, serve

    require_extra()
    settings = session(ctx).settings()
    host = host or settings.ui_host
    port = port or settings.ui_port
    check_bind(host, settings.ui_token)  # before connecting to anything
    check_free(host, port)
    rt = session(ctx).rt
    shown = f"[{host}]" if ":" in host else host
    link = f"http://{shown}:{port}/"
    if settings.ui_token:  # not printed: logs are no place for it
        typer.echo(f"console: {link} (actions enabled: log in with RUNNER_UI_TOKEN)")
    else:
        typer.echo(f"console: {link} (read-only: set RUNNER_UI_TOKEN to enable actions)")
    serve(host, port, settings=settings, rt=rt, flower_url=flower_url)


def check_free(host: str, port: int) -> None:
    """Raise :class:`~runner.console.ConsoleError` (one line) if the console could not listen
    on ``host:port``, before anything is printed or connected: uvicorn would log its own
    error and exit 3 after the console's address was announced."""
    from runner.console import ConsoleError

    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind(address)
    except OSError as exc:
        raise ConsoleError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", host=host, port=port
        ) from None
