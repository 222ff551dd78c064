"""Sorting provider failures into the kinds the router acts on differently.

The router needs to know *why* a call failed, not only that it did: a 429 means "rest this
key" (retrying it at once only burns quota), a 5xx or a cut connection means "try again in a
moment", a refused key means "use another key", and anything else (a malformed request, an
unknown model) will fail again on every key of that provider. Every provider maps its errors
through `error_for_status`, so the same HTTP status means the same thing everywhere.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Mapping

from ...errors import LLMAuthError, LLMError, LLMRateLimitError, LLMTransientError

__all__ = ["error_for_status", "error_detail", "parse_retry_after", "parse_duration", "TRANSIENT_STATUSES"]

# 408 request timeout, 409 conflict/aborted, 425 too early, 5xx server side; 429 is handled apart.
TRANSIENT_STATUSES = frozenset({408, 409, 425, 500, 502, 503, 504, 520, 522, 524, 529})
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*s?\s*$")


def parse_duration(value: object) -> float | None:
    """Seconds from "37s" / "1.5s" (protobuf Duration JSON, as in Gemini's RetryInfo) or a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return float(match.group(1))
    return None


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """The Retry-After header: delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    seconds = parse_duration(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_detail(body: str) -> str:
    """The human part of an error body: `error.message` of the usual JSON shape, else the text."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return body.strip()


def error_for_status(where: str, status: int, detail: str, headers: Mapping[str, str] | None = None,
                     retry_after: float | None = None) -> LLMError:
    """The exception for an HTTP error status (or an error event inside a stream)."""
    message = f"{where}: HTTP {status}: {detail[:300]}".rstrip(": ")
    if status == 429:
        if retry_after is None and headers is not None:
            retry_after = parse_retry_after(headers.get("retry-after"))
        return LLMRateLimitError(message, retry_after=retry_after)
    if status in (401, 403):
        return LLMAuthError(message)
    if status in TRANSIENT_STATUSES or status >= 500:
        return LLMTransientError(message)
    return LLMError(message)
