"""Sorting provider failures into the kinds the router acts on differently.

The router needs to know *why* a call failed, not only that it did: a 429 means "rest this
key" (retrying it at once only burns quota), a 5xx or a cut connection means "try again in a
moment", a refused key means "use another key", and anything else (a malformed request, an
unknown model) will fail again on every key of that provider. Every provider maps its errors
through `error_for_status`, so the same HTTP status means the same thing everywhere.

Timeouts are their own kind, `LLMTimeoutError` (a transient error that names what did not come
in time): a provider that does not connect, or does not start answering, is the provider's
trouble, so the router moves to the next provider at once instead of retrying it with backoff.
How long a client waits for the first token depends on whether there is anything to fall back
to: the router marks the last provider it can try with `last_resort`, and `first_token_budget`
then gives it the whole-answer timeout — cutting the only model left short helps nobody.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

from ...errors import LLMAuthError, LLMError, LLMRateLimitError, LLMTransientError

__all__ = ["error_for_status", "error_detail", "parse_retry_after", "parse_duration", "TRANSIENT_STATUSES",
           "LLMTimeoutError", "TimeoutPhase", "last_resort", "first_token_budget"]

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


# -- timeouts ----------------------------------------------------------------------------------

TimeoutPhase = Literal["connect", "first_token", "stall", "total"]


class LLMTimeoutError(LLMTransientError):
    """A provider did not answer in time: `phase` says what was late, `seconds` how long was waited.

    - "connect": no TCP/TLS connection within the connect timeout;
    - "first_token": no first text of a stream, or no response to a plain call, within the
      first-token timeout (counted from the start of the request);
    - "stall": an answer under way sent nothing for the whole-answer timeout;
    - "total": a plain call's answer took longer than the whole-answer timeout.
    """

    def __init__(self, message: str, *, phase: TimeoutPhase, seconds: float) -> None:
        super().__init__(message)
        self.phase: TimeoutPhase = phase
        self.seconds = seconds


_LAST_RESORT: ContextVar[bool] = ContextVar("gieok_llm_last_resort", default=False)


@contextmanager
def last_resort(active: bool = True) -> Iterator[None]:
    """Within this block, calls go to the last provider left: no fallback follows a timeout."""
    token = _LAST_RESORT.set(active)
    try:
        yield
    finally:
        _LAST_RESORT.reset(token)


def first_token_budget(first_token: float, whole: float) -> float:
    """How long a call may wait for its first token: `first_token`, or inside `last_resort` the
    whole-answer timeout (when it is longer), since no other provider would answer sooner."""
    return max(first_token, whole) if _LAST_RESORT.get() else first_token
