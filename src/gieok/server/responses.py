"""JSON responses built from the engine's own dicts. A route that returns a plain dict has FastAPI
walk it through `jsonable_encoder` first, which costs ~1.8 ms for ten search hits; the engine's
`as_dict()` forms are JSON-ready already. They are encoded by orjson: the same bytes as
Starlette's standard-library encoding (compact, UTF-8 unescaped) in a tenth of the time — 0.04 vs
0.59 ms for a 30 KB context, 0.49 vs 4.5 ms for 100 search hits (124 KB)."""

from __future__ import annotations

import json
import math
from datetime import date, datetime, time
from typing import Any

import numpy as np
import orjson
from fastapi.responses import JSONResponse

__all__ = ["FastJSONResponse", "json_response"]

# int keys written as strings, numpy scalars and arrays as numbers, as the standard library would
# (it knows no numpy types at all); NaN, which it would refuse, is written as null
_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


class FastJSONResponse(JSONResponse):
    """A `JSONResponse` rendered by orjson."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content, option=_OPTIONS)
        except orjson.JSONEncodeError:
            # An integer beyond 64 bits, which orjson refuses and JSON allows: a client may store one
            # in a block's metadata, and every answer holding it would be a 500. The standard library
            # writes any integer; what orjson would have changed on the way is changed first.
            return json.dumps(_plain(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _plain(value: Any) -> Any:
    """`value` as orjson with `_OPTIONS` would write it, in types the standard library writes alike."""
    if isinstance(value, dict):
        return {key if isinstance(key, str) else _key(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    return value


def _key(key: Any) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)  # whatever its size
    return orjson.dumps(key, option=_OPTIONS).decode().strip('"') if key is not None else "null"


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return FastJSONResponse(payload, status_code=status, headers=headers)
