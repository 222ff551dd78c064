"""Every error leaves the server as JSON: `{"error": {"type": ..., "message": ...}}` with a 4xx
for what the caller can fix and a 5xx only for what they cannot."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    AuthenticationError,
    EmbedderError,
    GieokError,
    InvalidInputError,
    InvalidTypeError,
    LLMError,
    NotFoundError,
    PermissionDeniedError,
    StoreError,
)

__all__ = ["error_body", "error_response", "install_error_handlers", "status_of"]

log = logging.getLogger("gieok.server")

_STATUS: list[tuple[type[Exception], int, str]] = [
    (AuthenticationError, 401, "unauthenticated"),
    (PermissionDeniedError, 403, "forbidden"),
    (NotFoundError, 404, "not_found"),
    (InvalidInputError, 400, "invalid_input"),
    (InvalidTypeError, 400, "invalid_input"),
    (EmbedderError, 503, "embedder_unavailable"),
    (StoreError, 503, "store_unavailable"),
    (LLMError, 502, "llm_unavailable"),
]
_HTTP_TYPES = {400: "bad_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type",
               422: "validation_error", 429: "rate_limited"}


def error_body(type_: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message, **extra}}


def error_response(status: int, type_: str, message: str, **extra: Any) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(type_, message, **extra), status_code=status, headers=headers)


def status_of(exc: Exception) -> tuple[int, str]:
    for kind, status, name in _STATUS:
        if isinstance(exc, kind):
            return status, name
    return 500, "internal_error"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GieokError)
    async def gieok_error(request: Request, exc: GieokError) -> JSONResponse:
        status, name = status_of(exc)
        if status >= 500:
            log.error("%s %s: %s", request.method, request.url.path, exc)
        return error_response(status, name, str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [{"where": ".".join(str(p) for p in e.get("loc", ())), "problem": e.get("msg", "")}
                    for e in exc.errors()[:20]]
        first = problems[0] if problems else {"where": "request", "problem": "invalid"}
        return error_response(422, "validation_error", f"{first['where']}: {first['problem']}", details=problems)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, _HTTP_TYPES.get(exc.status_code, "http_error"), str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "internal_error", "the server failed; see its log")
