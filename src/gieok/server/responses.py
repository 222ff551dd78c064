"""JSON responses built from the engine's own dicts. A route that returns a plain dict has FastAPI
walk it through `jsonable_encoder` first, which costs ~1.8 ms for ten search hits (the JSON
encoding itself ~0.2 ms); the engine's `as_dict()` forms are JSON-ready already."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

__all__ = ["json_response"]


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(payload, status_code=status, headers=headers)
