"""Request body limits, enforced before a handler reads anything: a declared Content-Length
over the limit is refused at once, and a body that streams past it is cut off. Both answer
413 with the JSON error body."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import error_body

__all__ = ["BodyLimit"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class _TooLarge(StarletteHTTPException):
    """An HTTP exception, so that FastAPI, reading the body for a handler, answers 413 with it
    instead of calling it a parse error."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the body is over the limit of {limit:,} bytes")


class BodyLimit:
    def __init__(self, app: App, *, default: int, larger: dict[str, int] | None = None) -> None:
        self.app = app
        self.default = default
        self.larger = larger or {}  # path -> its own limit (the import route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.larger.get(scope.get("path", ""), self.default)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > limit
            except ValueError:
                await _refuse(send, 400, "bad_request", "Content-Length is not a number")
                return
            if too_large:
                await _refuse(send, 413, "payload_too_large", f"the body is over the limit of {limit:,} bytes")
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except _TooLarge:
            if not started:
                await _refuse(send, 413, "payload_too_large", f"the body is over the limit of {limit:,} bytes")


async def _refuse(send: Send, status: int, kind: str, message: str) -> None:
    body = json.dumps(error_body(kind, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
