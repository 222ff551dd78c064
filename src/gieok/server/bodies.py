"""JSON bodies on the REST routes whatever their Content-Type, for callers with an API key.

`curl -d '{"query": "x"}'` sends `Content-Type: application/x-www-form-urlencoded`, and FastAPI
reads only a body declared as JSON: every documented curl line failed with a 422 about "a valid
dictionary" that said nothing of the real cause. This middleware declares the body JSON before
FastAPI looks, once for every `/v1/` route that takes one (a body that is not JSON then gets the
clear 422 of server/errors.py).

Only a request with an `Authorization` header is relaxed. FastAPI's strict Content-Type is a
defence: a page on another site may post a form or `text/plain` to this server without asking
first, and the browser attaches the dashboard's cookie, or needs nothing at all under
`--no-auth`. A browser never attaches an `Authorization` header by itself (setting one makes it
ask first, and this server grants no cross-origin requests), so a request carrying one was sent
on purpose. Without it, a body must still say `application/json`, and one that does not gets a
415 that says so (server/errors.py).

Left alone: `/v1/import`, which reads its NDJSON body itself; the MCP endpoint (`/mcp`, its
own JSON-RPC rules); the dashboard's forms (outside `/v1/`)."""

from __future__ import annotations

import email.message
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["JsonBodies", "SENT_CONTENT_TYPE", "is_json_content_type"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

SENT_CONTENT_TYPE = "gieok.sent_content_type"  # scope key: what the caller sent, for error messages
_JSON = b"application/json"
_METHODS_WITH_BODIES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_OWN_READERS = frozenset({"/v1/import"})  # routes that read their body themselves (NDJSON)


def is_json_content_type(value: str | None) -> bool:
    """`application/json` or `application/<anything>+json`, parameters aside (FastAPI's rule)."""
    if not value:
        return False
    message = email.message.Message()
    message["content-type"] = value
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class JsonBodies:
    """ASGI middleware: on `/v1/` requests that carry an API key, a body is JSON (module docstring)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _relaxed(scope):
            scope = _declared_json(scope)
        await self.app(scope, receive, send)


def _relaxed(scope: Scope) -> bool:
    path = str(scope.get("path", ""))
    if not path.startswith("/v1/") or path in _OWN_READERS or scope.get("method") not in _METHODS_WITH_BODIES:
        return False
    return any(name == b"authorization" for name, _ in scope.get("headers") or [])


def _declared_json(scope: Scope) -> Scope:
    """A copy of `scope` whose Content-Type is `application/json`; what was sent is kept under
    SENT_CONTENT_TYPE so an error can name it."""
    headers = list(scope.get("headers") or [])
    sent = next((value.decode("latin-1") for name, value in headers if name == b"content-type"), None)
    if is_json_content_type(sent):
        return scope
    relaxed = dict(scope)
    relaxed["headers"] = [(name, value) for name, value in headers if name != b"content-type"] + [
        (b"content-type", _JSON)]
    relaxed[SENT_CONTENT_TYPE] = sent
    return relaxed
