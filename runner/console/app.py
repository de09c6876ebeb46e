"""The console's FastAPI app: the JSON API (:mod:`.api`), the pages (:mod:`.pages`), the
guard (:mod:`.security`), Prometheus' ``/metrics`` and one place where errors become
responses."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request

from runner.distributed.engine import Runtime
from runner.distributed.fleet import backlog_reader
from runner.errors import (
    RunnerError,
)
from runner.observe import metrics
from runner.settings import RunnerSettings, get_settings

from . import api, formatting, pages
from .actions import describe
from .context import Console, console_of, error_response, logged_in, status_for
from .security import SAFE_METHODS, Guard

HERE = Path(__file__).parent
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]

_CSP = (
    "default-src 'self'; script-src 'self'; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'"
)  # Mermaid styles its SVG inline; no script is inline.


def _make_runtime(settings: RunnerSettings) -> Runtime:
    from runner.distributed.app import make_app

    return Runtime.create(make_app(settings), settings)  # StoreUnavailable: no shared Redis


def build_app(
    rt: Runtime | None,
    *,
    settings: RunnerSettings | None,
    token: str | None,
    flower_url: str | None,
    public: bool,
) -> FastAPI:
    """See :func:`runner.console.create_app`."""
    settings = settings or (rt.settings if rt is not None else get_settings())
    owned = rt is None
    runtime = rt if rt is not None else _make_runtime(settings)
    guard = Guard(token if token is not None else settings.ui_token)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: state and errors are user text
        undefined=jinja2.StrictUndefined,
    )
    formatting.install(env)
    templates = Jinja2Templates(env=env)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if owned:  # a runtime passed in belongs to the caller
            runtime.close()

    app = FastAPI(
        lifespan=lifespan,
        title="runner console",
        summary="Runs, checkpoints, diffs and lineage of durable flows; resume, cancel, fork.",
        version="1",
        openapi_url="/api/openapi.json",
        docs_url=None,  # the interactive docs load their JavaScript from a CDN
        redoc_url=None,
    )
    app.state.console = Console(
        runtime, guard, flower_url or settings.ui_flower_url or None, templates, settings.ui_user
    )
    app.include_router(api.router)
    app.include_router(pages.router)
    _serve_metrics(app, runtime, settings)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    _install_errors(app)
    app.middleware("http")(_guarded)
    if not public:
        # A page on another site could reach a loopback console through a DNS name of its
        # own pointing at 127.0.0.1 (DNS rebinding); such requests carry that name as Host.
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS)
    return app


def _serve_metrics(app: FastAPI, runtime: Runtime, settings: RunnerSettings) -> None:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    registry = metrics.console_registry(
        runtime.app, runtime.store, [settings.queue], backlog_reader(runtime)
    )

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        """Prometheus' scrape (behind the token, like every page): runs by status and each
        queue's depth and oldest message's age, read when scraped
        (:mod:`runner.observe.metrics`)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RunnerError)
    async def runner_error(request: Request, exc: RunnerError) -> Response:
        return error_response(request, status_for(exc), describe(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        # Still one JSON (or HTML) error; the server logs the traceback.
        body = {"type": "InternalError", "message": f"unexpected {type(exc).__name__}: {exc}"}
        return error_response(request, 500, body)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        problems = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
        body = {"type": "BadRequest", "message": "; ".join(problems), "problems": problems}
        return error_response(request, 422, body)


async def _guarded(request: Request, call_next: Any) -> Response:
    """Authentication (with a token), read-only refusal (without) and CSRF, before routing."""
    console = console_of(request)
    guard = console.guard
    path = request.url.path
    if path.startswith("/static/") or path == "/login":
        return await _secured(await call_next(request))
    how = None
    if not guard.read_only:
        token = request.query_params.get("token")
        if token is not None and request.method == "GET" and not path.startswith("/api"):
            return _login_link(request, guard, token)
        how = guard.credentials(request)
        if how is None:
            return _unauthenticated(request)
    if request.method not in SAFE_METHODS:
        if guard.read_only:
            body = {
                "type": "ReadOnly",
                "message": "the console is read-only: start it with RUNNER_UI_TOKEN to "
                "resume, cancel or fork runs",
            }
            return error_response(request, 403, body)
        if how != "bearer" and not guard.csrf_ok(request):
            body = {
                "type": "CsrfFailed",
                "message": "missing or wrong X-CSRF-Token header (reload the page)",
            }
            return error_response(request, 403, body)
    return await _secured(await call_next(request))


async def _secured(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


def _unauthenticated(request: Request) -> Response:
    body = {
        "type": "Unauthorized",
        "message": "this console needs its token: send 'Authorization: Bearer <RUNNER_UI_TOKEN>' "
        "or log in at /login",
    }
    if request.url.path.startswith("/api") or request.url.path == "/metrics":  # machines
        return JSONResponse(
            {"error": body}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    login = "/login?" + urlencode({"next": target})
    if "HX-Request" in request.headers:
        return Response(status_code=401, headers={"HX-Redirect": login})
    return RedirectResponse(login, status_code=303)


def _login_link(request: Request, guard: Guard, token: str) -> Response:
    """``?token=`` (the link ``runner ui`` prints): log in, then drop it from the URL."""
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    if not guard.check_token(token):
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)
    return logged_in(guard, target)
