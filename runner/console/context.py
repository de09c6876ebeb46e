"""What the console's request handlers share: the :class:`Console` on ``app.state``, and the
one place where errors become responses (JSON for the API, HTML for pages)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.requests import Request

from runner.distributed.engine import Runtime
from runner.errors import (
    CheckpointNotFound,
    DefinitionError,
    InvalidInputs,
    RunnerError,
    RunNotFound,
    RunStateError,
    StoreFull,
    StoreUnavailable,
)

from .security import SESSION_COOKIE, USER_COOKIE, Guard, safe_next


@dataclass
class Console:
    """What every request handler needs, kept on ``app.state.console``."""

    rt: Runtime
    guard: Guard
    flower_url: str | None
    templates: Jinja2Templates
    user: str | None = None
    """``RUNNER_UI_USER``: who acts through this console when the login names nobody."""

    def author(self, request: Request) -> str:
        """Who ``request`` acts as, recorded with its answers and cancels: the name its login
        gave (basic auth's user name, ``/login``'s name), else ``RUNNER_UI_USER``, else
        ``console``."""
        return self.guard.user(request) or self.user or "console"

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        """Render template ``name`` with the guard's view of the request."""
        context.update(
            csrf=self.guard.csrf,
            read_only=self.guard.read_only,
            flower_url=self.flower_url,
        )
        return self.templates.TemplateResponse(request, name, context, status_code=status)


def console_of(request: Request) -> Console:
    """The :class:`Console` of the app serving ``request``."""
    console: Console = request.app.state.console
    return console


def status_for(exc: RunnerError) -> int:
    """The HTTP status of a runner error: 404 unknown id, 422 bad input, 409 refused, 503
    the store is unreachable or full."""
    if isinstance(exc, RunNotFound | CheckpointNotFound):
        return 404
    if isinstance(exc, InvalidInputs | DefinitionError):
        return 422
    if isinstance(exc, RunStateError):
        return 409
    if isinstance(exc, StoreUnavailable | StoreFull):
        return 503
    return 500


def wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api") or (
        "HX-Request" not in request.headers
        and ("application/json" in request.headers.get("accept", ""))
    )


def error_response(request: Request, status: int, body: dict[str, Any]) -> Response:
    """An error as JSON (API calls) or HTML (a page, or a fragment htmx swaps in)."""
    if wants_json(request):
        return JSONResponse({"error": body}, status_code=status)
    console: Console | None = getattr(request.app.state, "console", None)
    name = "error.html" if "HX-Request" not in request.headers else "_error.html"
    if console is None:
        return HTMLResponse(body["message"], status_code=status)
    return console.page(request, name, status=status, error=body, code=status)


def logged_in(guard: Guard, target: str, user: str | None = None) -> Response:
    """A redirect to ``target`` that sets the session cookie (and, with ``user``, the signed
    name the browser acts as; without, a name kept from an earlier login goes)."""
    response = RedirectResponse(safe_next(target), status_code=303)
    assert guard.session is not None
    week = 7 * 86400
    response.set_cookie(
        SESSION_COOKIE, guard.session, httponly=True, samesite="strict", max_age=week
    )
    if user:
        signed = f"{user}.{guard.user_mark(user)}"
        response.set_cookie(USER_COOKIE, signed, httponly=True, samesite="strict", max_age=week)
    else:
        response.delete_cookie(USER_COOKIE)
    return response
