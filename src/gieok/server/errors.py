"""Every error leaves the server as JSON: `{"error": {"type": ..., "message": ...}}` with a 4xx
for what the caller can fix and a 5xx only for what they cannot. What is away for a moment — the
database, Redis, the embedding engine — is a 503 with `Retry-After` (seconds), never a 500: a
client (gieok.client) waits that long and tries again."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    AuthenticationError,
    CoordinationUnavailableError,
    EmbedderError,
    GieokError,
    InvalidInputError,
    InvalidTypeError,
    LLMError,
    NotFoundError,
    PermissionDeniedError,
    StorageFullError,
    StoreError,
)
from ..store.idempotency import IdempotencyKeyTakenError
from .bodies import SENT_CONTENT_TYPE, is_json_content_type
from .events import SinceAheadError

__all__ = ["error_body", "error_response", "install_error_handlers", "status_of", "RETRY_AFTER_SECONDS"]

RETRY_AFTER_SECONDS = 1  # what a 503 asks the client to wait: a restart of PostgreSQL or Redis takes seconds

log = logging.getLogger("gieok.server")

_STATUS: list[tuple[type[Exception], int, str]] = [
    (SinceAheadError, 409, "since_ahead"),
    (IdempotencyKeyTakenError, 409, "idempotency_in_progress"),
    (AuthenticationError, 401, "unauthenticated"),
    (PermissionDeniedError, 403, "forbidden"),
    (NotFoundError, 404, "not_found"),
    (InvalidInputError, 400, "invalid_input"),
    (InvalidTypeError, 400, "invalid_input"),
    (EmbedderError, 503, "embedder_unavailable"),
    (StorageFullError, 507, "storage_full"),  # not a 503: it lasts until someone frees space, no retry helps
    (StoreError, 503, "store_unavailable"),
    (CoordinationUnavailableError, 503, "coordination_unavailable"),
    (LLMError, 502, "llm_unavailable"),
]
_HTTP_TYPES = {400: "bad_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type",
               422: "validation_error", 429: "rate_limited"}


def error_body(type_: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message, **extra}}


def error_response(status: int, type_: str, message: str, **extra: Any) -> JSONResponse:
    headers = None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    elif status == 503:
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return JSONResponse(error_body(type_, message, **extra), status_code=status, headers=headers)


def status_of(exc: BaseException) -> tuple[int, str]:
    for kind, status, name in _STATUS:
        if isinstance(exc, kind):
            return status, name
    if _driver_unavailable(exc):
        return 503, "store_unavailable"
    return 500, "internal_error"


_UNAVAILABLE_NAMES = {"OperationalError", "InterfaceError", "PoolTimeout", "PoolClosed", "ConnectionError",
                      "TimeoutError", "BusyLoadingError"}


def _driver_unavailable(exc: BaseException) -> bool:
    """A database or Redis driver's own "cannot reach the server" error that escaped translation
    into gieok's (psycopg's OperationalError, redis-py's ConnectionError …): still a 503."""
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in ("psycopg", "psycopg_pool", "redis") and cls.__name__ in _UNAVAILABLE_NAMES:
            return True
    return False


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GieokError)
    async def gieok_error(request: Request, exc: GieokError) -> JSONResponse:
        status, name = status_of(exc)
        if status >= 500:
            log.error("%s %s: %s", request.method, request.url.path, exc)
        if isinstance(exc, SinceAheadError):
            return error_response(status, name, str(exc), latest=exc.latest)
        return error_response(status, name, str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        whole_body = _whole_body_problem(request, errors[0]) if len(errors) == 1 else None
        if whole_body is not None:
            return error_response(*whole_body)
        problems = [{"where": ".".join(str(p) for p in e.get("loc", ())), "problem": _problem(e)} for e in errors[:20]]
        first = problems[0] if problems else {"where": "request", "problem": "invalid"}
        return error_response(422, "validation_error", f"{first['where']}: {first['problem']}", details=problems)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's "There was an error parsing the body": a body that is not JSON at all is the same
        # kind of bad body as malformed JSON, and gets the same 422 (invalid_json), whatever the cause
        if isinstance(exc.__cause__, UnicodeDecodeError):
            return error_response(422, "invalid_json", "the body is not valid JSON: it is not UTF-8 text")
        if isinstance(exc.__cause__, RecursionError):
            return error_response(422, "invalid_json", "the body is not valid JSON here: it is nested too deeply")
        return error_response(exc.status_code, _HTTP_TYPES.get(exc.status_code, "http_error"), str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # (a GieokError raised in a middleware — key lookup — comes here, not to the handler above)
        status, name = status_of(exc)
        if status < 500 or status in (503, 507):
            if status >= 500:
                log.error("%s %s: %s", request.method, request.url.path, exc)
            return error_response(status, name, str(exc) if isinstance(exc, GieokError)
                                  else f"a server this one depends on is away: {exc}")
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "internal_error", "the server failed; see its log")


def _problem(error: Any) -> str:
    """A field's problem in words; NaN and the infinities by name (their range check says nothing useful)."""
    if error.get("type") == "finite_number":
        return f"{error.get('input')!s} is not a finite number: NaN and Infinity are refused"
    return str(error.get("msg", ""))


_JSON_KINDS: list[tuple[type, str]] = [(list, "an array"), (str, "a string"), (bool, "true or false"),
                                       (int, "a number"), (float, "a number")]


def _whole_body_problem(request: Request, error: Any) -> tuple[int, str, str] | None:
    """What is wrong with the body as a whole, in words (FastAPI's own say "JSON decode error" or
    "Input should be a valid dictionary", which name neither the cause nor the fix); None when
    the problem is inside a valid JSON object (a field), which the field-by-field message names."""
    loc, kind = tuple(error.get("loc", ())), error.get("type")
    if kind == "json_invalid":
        where = f" at character {loc[1]}" if len(loc) > 1 else ""
        sent = request.scope.get(SENT_CONTENT_TYPE)
        sent_as = f" (it was sent as {sent}; it is read as JSON all the same)" if sent else ""
        return 422, "invalid_json", f"the body is not valid JSON: {error.get('ctx', {}).get('error', 'unreadable')}" \
                                    f"{where}{sent_as}"
    if loc != ("body",):
        return None
    if kind == "missing":
        return 422, "validation_error", "the body is empty: this route takes a JSON object"
    if kind not in ("model_attributes_type", "dict_type", "model_type"):
        return None
    given = error.get("input")
    if isinstance(given, bytes | bytearray):  # FastAPI did not read it as JSON: its Content-Type says otherwise
        content_type = request.headers.get("content-type")
        if not is_json_content_type(content_type):
            sent = f"sent as {content_type}" if content_type else "sent without a Content-Type"
            return 415, "unsupported_media_type", (
                f"the body was {sent}; send JSON with Content-Type: application/json (with an "
                "Authorization: Bearer key, any Content-Type is read as JSON)")
    shape = "null" if given is None else next((name for cls, name in _JSON_KINDS if isinstance(given, cls)),
                                              type(given).__name__)
    return 422, "validation_error", f"the body must be a JSON object ({{...}}), not {shape}"
