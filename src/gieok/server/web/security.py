"""The dashboard's session and its defences.

The login form takes an API key, checks it against the key table (throttled: `server/sessions.py`),
opens a server-side session and keeps only its opaque id in the `gieok_session` cookie:
`HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page makes the browser send
it), `Path=/`, `Max-Age` of the session's absolute limit, and `Secure` when the request came over
https (behind a TLS proxy: `--proxy-headers`). The cookie is never the key: the session ends on
logout, after its idle or absolute limit, and when the key is revoked (`deps.principal_of` checks
it on every request; open event streams re-check it every few seconds).

Every state-changing dashboard request is a POST whose `Origin` (or, without one, `Referer`) must
be this server's own origin: a second defence beside SameSite against cross-site request
forgery (SameSite lets another port of the same host through). `deps.principal_of` applies the
same rule to every request the cookie authenticates that could change something (any method but
GET, HEAD, OPTIONS, e.g. `POST /v1/import`) and to the event WebSocket. Pages are sent with a
content security policy that allows this origin's scripts, styles and connections only (no inline
script, no framing), and are never cached.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from ...errors import PermissionDeniedError
from ..deps import SESSION_COOKIE, same_origin

__all__ = ["SESSION_COOKIE", "SECURITY_HEADERS", "set_session", "clear_session", "check_origin", "safe_next"]

SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
                                "form-action 'self'; frame-ancestors 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",  # pages hold the memory's contents: nothing keeps a copy
}


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_session(response: Response, request: Request, session_id: str, *, max_age: float) -> None:
    response.set_cookie(SESSION_COOKIE, session_id, max_age=int(max_age), httponly=True, samesite="strict", path="/",
                        secure=_secure(request))


def clear_session(response: Response, request: Request) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=_secure(request))


def check_origin(request: Request) -> None:
    """Refuse (403) a state-changing request that does not come from this server's own pages:
    its Origin, or its Referer when a browser sent no Origin, must be this origin (the scheme and
    the Host the request was sent to). A request with neither is refused too."""
    if not same_origin(request):
        raise PermissionDeniedError("this form was not sent from this dashboard (Origin check failed)")


def safe_next(value: Any) -> str:
    """Where to go after logging in: a path on this server only (never `//elsewhere`)."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith(("//", "/\\")):
        return "/"
    if any(ch in value for ch in "\r\n\\") or len(value) > 500:
        return "/"
    return value
