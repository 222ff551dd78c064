"""The server's error answers as the engine's exceptions, so code written against `Memory`
catches the same classes against a server: the status (and, for a 503, the error type) picks
the class, and the message is the server's own (`{"error": {"type", "message"}}`,
server/errors.py)."""

from __future__ import annotations

from typing import Any

import httpx

from ..errors import (
    AuthenticationError,
    BlockNotFoundError,
    EmbedderError,
    GieokError,
    InvalidInputError,
    LLMError,
    NotFoundError,
    PermissionDeniedError,
    ServerError,
    ServerUnavailableError,
    StorageFullError,
    StoreError,
)

__all__ = ["error_for", "envelope_of"]

_BY_STATUS: dict[int, type[GieokError]] = {401: AuthenticationError, 403: PermissionDeniedError,
                                           400: InvalidInputError, 422: InvalidInputError, 502: LLMError,
                                           507: StorageFullError}
_UNAVAILABLE_BY_TYPE: dict[str, type[GieokError]] = {"store_unavailable": StoreError,
                                                     "embedder_unavailable": EmbedderError}
_NO_ROUTE = "Not Found"  # Starlette's message for a path no route matches


def envelope_of(response: httpx.Response) -> tuple[str, str]:
    """(type, message) of an error answer; a body that is not the envelope (a proxy's page)
    gives the reason phrase and the start of its text."""
    try:
        data: Any = response.json()
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error.get("type") or ""), error["message"]
    text = response.text.strip()[:200]
    return "", f"{response.reason_phrase or 'error'}{': ' + text if text else ''}"


def error_for(response: httpx.Response, method: str, path: str, base_url: str, *, block: int | None = None,
              attempts: int = 1) -> GieokError:
    """The exception an error answer means."""
    status = response.status_code
    kind, message = envelope_of(response)
    if status in _BY_STATUS:
        return _BY_STATUS[status](message)
    if status == 404:
        if message == _NO_ROUTE:
            return NotFoundError(f"{method} {path}: the server at {base_url} has no such route "
                                 "(is it older than this client?)")
        return BlockNotFoundError(message) if block is not None else NotFoundError(message)
    if status == 413:
        return InvalidInputError(f"the request body was too large for the server: {message}")
    if status == 503:
        if kind in _UNAVAILABLE_BY_TYPE:
            return _UNAVAILABLE_BY_TYPE[kind](message)
        tried = f" after {attempts} attempts" if attempts > 1 else ""
        return ServerUnavailableError(f"the gieok server at {base_url} is unavailable (503{tried}): {message}", 503)
    if status == 405:
        return ServerError(f"{method} {path}: the server at {base_url} does not take this method here "
                           f"(is it older than this client?): {message}", status)
    return ServerError(f"{method} {path}: {status} {kind or 'error'}: {message}", status)
