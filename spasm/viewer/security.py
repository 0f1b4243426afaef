"""The viewer's request guard: token, host check, write checks and response headers.

* **Token**: when the server has one (always when bound to a non-loopback address), every
  request carries it: ``?token=…`` (the URL ``spasm view`` prints; it is then kept in an
  HttpOnly, SameSite=Strict cookie), the cookie, or an ``X-Spasm-Token`` header. Without it: 401.
* **Host**: bound to loopback, only ``Host: 127.0.0.1 / localhost / [::1]`` (or another loopback
  address, such as the 127.0.0.2 it is bound to) is served, so a web page cannot reach the viewer
  through a DNS name it points at 127.0.0.1 (DNS rebinding).
* **Writes** (``POST``) must be JSON from the viewer's own origin (``Sec-Fetch-Site``, and an
  ``Origin`` of the same scheme, host *and port*: another server on 127.0.0.1 is another site):
  another site cannot label on the user's behalf.
* **Headers**: a Content-Security-Policy without inline script (``script-src 'self'``), so even
  a bug in escaping could not run an utterance as code; no framing; no referrer (the token is in
  the first URL).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

__all__ = ["CSP", "LOOPBACK_HOSTS", "Guard", "is_loopback"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
#: The eval report is a self-contained page with inline styles and no script at all.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
COOKIE = "spasm_token"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hostname(value: str) -> str:
    return (urlsplit("//" + value).hostname or "").lower()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _authority(scheme: str, netloc: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in; a bad port is ``None``."""
    parts = urlsplit("//" + netloc)
    try:
        port = parts.port
    except ValueError:
        return scheme, "", None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme)


def _origin(origin: str) -> tuple[str, str, int | None]:
    parts = urlsplit(origin)
    return _authority(parts.scheme.lower(), parts.netloc)


class Guard:
    """The middleware (``app.middleware("http")(Guard(...))``)."""

    def __init__(self, token: str | None, allowed_hosts: frozenset[str] | None) -> None:
        self.token = token
        self.allowed_hosts = allowed_hosts

    def _token_ok(self, request: Request) -> tuple[bool, bool]:
        """(carries the token, came in the URL)."""
        assert self.token is not None
        given = request.query_params.get("token")
        if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return True, True
        for candidate in (request.cookies.get(COOKIE), request.headers.get("x-spasm-token")):
            if candidate and hmac.compare_digest(candidate.encode(), self.token.encode()):
                return True, False
        return False, False

    def _refuse(self, request: Request) -> Response | None:
        host_header = request.headers.get("host", "")
        host = _hostname(host_header)
        # Any loopback IP literal (127.0.0.2 when bound there) is safe: DNS rebinding needs a name.
        if self.allowed_hosts is not None and host not in self.allowed_hosts and not (
                _is_ip(host) and is_loopback(host)):
            return PlainTextResponse(f"Host {host!r} is not served: open the viewer at 127.0.0.1.", 421)
        if request.method == "POST":
            if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
                return PlainTextResponse("Labels are only accepted from the viewer's own pages.", 403)
            origin = request.headers.get("origin")
            # The whole origin (scheme, host and port): another server on 127.0.0.1 is another site.
            if origin and _origin(origin) != _authority("http", host_header):
                return PlainTextResponse("Labels are only accepted from the viewer's own pages.", 403)
            if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                return PlainTextResponse("Send labels as application/json.", 415)
        elif request.method not in ("GET", "HEAD"):
            return PlainTextResponse("Method not allowed.", 405)
        return None

    async def __call__(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        refused = self._refuse(request)
        from_url = False
        if refused is None and self.token is not None:
            ok, from_url = self._token_ok(request)
            if not ok:
                refused = PlainTextResponse(
                    "This viewer needs its token: open the URL `spasm view` printed (it ends in "
                    "?token=...), or send the X-Spasm-Token header.", 401)
        response = refused or await call_next(request)
        if from_url and self.token is not None:
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-store")
        return response
