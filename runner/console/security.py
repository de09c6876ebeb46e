"""Who may do what in the console.

* No token: read-only. Every POST is refused (403), whatever the caller sends.
* A token (``RUNNER_UI_TOKEN``): every page and API call needs it, as
  ``Authorization: Bearer <token>``, as the password of basic auth, or as the session
  cookie set by ``/login`` (or by opening a ``?token=`` link once).
* Who acts (recorded with answers and cancels): the name given beside the token (basic
  auth's user name, ``/login``'s name field, kept in a cookie signed with the token), else
  ``RUNNER_UI_USER``.
* Every POST not authenticated by a bearer header (which a browser never adds by itself)
  must carry the process's CSRF token in ``X-CSRF-Token``; pages send it on every htmx
  request. A POST whose ``Origin`` is another site is refused too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

SESSION_COOKIE = "runner_ui_session"
USER_COOKIE = "runner_ui_user"
"""The name a browser logged in as (``/login``'s optional name), signed with the token."""
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Guard:
    """The console's token, session cookie and CSRF token."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        self.csrf = (
            hmac.new(self.token.encode(), b"runner-ui-csrf", hashlib.sha256).hexdigest()
            if self.token
            else secrets.token_urlsafe(32)
        )
        """Pages embed it; other sites cannot read it. Derived from the token, so a page left
        open across a console restart (``runner dev`` reloading) still acts; without a token
        nothing can act, and a fresh value serves."""
        self.session = (
            hmac.new(self.token.encode(), b"runner-ui-session", hashlib.sha256).hexdigest()
            if self.token
            else None
        )
        """Cookie value of a logged-in browser (derived, so the token is not stored in it)."""

    @property
    def read_only(self) -> bool:
        """No token was given: nothing can be changed through the console."""
        return self.token is None

    def check_token(self, value: str) -> bool:
        """``value`` is the console's token."""
        return self.token is not None and _same(value, self.token)

    def credentials(self, request: Request) -> str | None:
        """How ``request`` proved it knows the token: ``bearer``, ``basic``, ``cookie`` or
        ``None``."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.check_token(value.strip()):
            return "bearer"
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                decoded = ""
            if self.check_token(decoded.partition(":")[2]):
                return "basic"
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie and self.session and _same(cookie, self.session):
            return "cookie"
        return None

    def user(self, request: Request) -> str | None:
        """The name ``request`` gave beside the token: basic auth's user name (``name:token``),
        else the name its browser logged in with (:data:`USER_COOKIE`); ``None``: none."""
        how = self.credentials(request)
        if how == "basic":
            value = request.headers.get("authorization", "").partition(" ")[2]
            name = base64.b64decode(value.strip(), validate=True).decode().partition(":")[0]
            return name.strip() or None
        signed = request.cookies.get(USER_COOKIE, "")
        name, _, mark = signed.rpartition(".")
        if how == "cookie" and name and _same(mark, self.user_mark(name)):
            return name
        return None

    def user_mark(self, name: str) -> str:
        """The signature of the login name ``name`` (:data:`USER_COOKIE` holds ``name.mark``)."""
        key = (self.token or "").encode()
        return hmac.new(key, b"runner-ui-user:" + name.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, request: Request, value: str | None = None) -> bool:
        """The request carries the CSRF token (``value``, else the header) and, if it
        says where it comes from, comes from this site."""
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.headers.get("host", ""):
            return False
        given = value if value is not None else request.headers.get(CSRF_HEADER, "")
        return _same(given, self.csrf)


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path on this site, never another site."""
    # Browsers read "/\\host" like "//host": another site.
    if not target or not target.startswith("/") or target[1:2] in ("/", "\\"):
        return "/"
    return target
