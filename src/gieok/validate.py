"""Argument checks for the public API: every rejection is a typed GieokError."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

from .errors import InvalidInputError, InvalidTypeError
from .text.validate import check_encodable, clean_text
from .types import Kind

__all__ = ["check_kind", "check_kinds", "check_importance", "check_time", "storable_time", "check_message_time",
           "check_words", "check_metadata", "check_speaker", "check_speaker_names", "check_k", "check_batch",
           "clean_text"]

_KINDS = {k.value for k in Kind}
MAX_WORD_CHARS = 200
MAX_WORDS = 64
MAX_SPEAKER_NAMES = 1000


def check_kind(value: Any) -> str:
    if isinstance(value, Kind):
        return value.value
    if not isinstance(value, str):
        raise InvalidTypeError(f"kind must be a string, not {type(value).__name__}")
    if value not in _KINDS:
        raise InvalidInputError(f"unknown kind {value!r}; choose one of {', '.join(sorted(_KINDS))}")
    return value


def check_kinds(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, Kind)):
        return (check_kind(value),)
    if not isinstance(value, Iterable):
        raise InvalidTypeError(f"kinds must be a list of strings, not {type(value).__name__}")
    return tuple(dict.fromkeys(check_kind(v) for v in value))


def check_importance(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"importance must be a number between 0 and 1, not {type(value).__name__}")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidInputError(f"importance must be between 0 and 1, got {value}")
    return float(value)


def check_time(value: Any, what: str = "time", *, zone: tzinfo = UTC, future: bool = True,
               now: float | None = None) -> float | None:
    """Accept None, epoch seconds, a datetime or an ISO-8601 string (naive: in `zone`, UTC unless
    the caller says), as epoch seconds. Refused: what no calendar shows (before the year 1 or from
    the year 5138 on), epoch milliseconds (named as such) and, with `future=False`, a time more than
    a day ahead of `now` — a stored time must be one every reader can show."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidTypeError(f"{what} must be a datetime, ISO string or epoch seconds, not bool")
    expected = "epoch seconds (e.g. 1790000000) or ISO 8601 (e.g. 2026-11-15T14:30:00+09:00)"
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise InvalidInputError(f"{what} must be finite")
        when = float(value)
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInputError(f"{what} {value[:40]!r} is not an ISO-8601 date/time") from None
        when = _datetime_seconds(parsed, what, zone)
    elif isinstance(value, datetime):
        when = _datetime_seconds(value, what, zone)
    else:
        raise InvalidTypeError(f"{what} must be a datetime, ISO string or epoch seconds, not {type(value).__name__}")
    _check_calendar(when, value, what, expected)
    if not future and when > (time.time() if now is None else now) + FUTURE_SLACK_SECONDS:
        raise InvalidInputError(f"{what} {value!r} is more than a day in the future "
                                f"({datetime.fromtimestamp(when, UTC):%Y-%m-%d %H:%M} UTC)")
    return when


def storable_time(seconds: float | None) -> float | None:
    """`seconds` if a stored time may hold it (`check_time` accepts it), else None (the writer's
    now): what a row written before times were checked passes on to what is made from it, so that
    the block of a message stored with a time in milliseconds is written, not refused forever."""
    try:
        return check_time(seconds, "time")
    except InvalidInputError:
        return None


def _datetime_seconds(value: datetime, what: str, zone: tzinfo) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    try:
        return value.timestamp()
    except (OverflowError, OSError, ValueError):
        raise InvalidInputError(f"{what} {value.isoformat()} is out of range") from None


_EARLIEST = -62_135_424_000.0  # 0001-01-03 UTC: a day in any zone, a calendar date still
_MILLIS_FROM = 1e11  # 5138-11-16 in seconds, 1973-03-03 in milliseconds: a larger number is milliseconds


def _check_calendar(when: float, value: Any, what: str, expected: str) -> None:
    """A time no calendar shows is refused: a number from 1e11 on read as epoch milliseconds when
    it is one (below 1e14: before the year 5138 in milliseconds), else out of range."""
    if _EARLIEST <= when < _MILLIS_FROM:
        return
    if isinstance(value, (int, float)) and _MILLIS_FROM <= when < _MILLIS_FROM * 1000:
        raise InvalidInputError(f"{what} {value!r} looks like epoch milliseconds; send {expected} "
                                f"(milliseconds / 1000)")
    raise InvalidInputError(f"{what} {value!r} is out of range (years 1 to 5138); send {expected}")


FUTURE_SLACK_SECONDS = 86_400.0  # a message's clock may run ahead of ours, but not by more than a day


def check_message_time(value: Any, what: str = "time", *, zone: tzinfo = UTC, now: float | None = None) -> float | None:
    """When a message was said, as epoch seconds: None (the caller's now), epoch seconds, a
    datetime or an ISO-8601 string — one without a zone read in `zone`. Refused, naming `what` and
    the unit expected: what cannot be a real message's time — before 1970-01-01, zero or negative,
    epoch milliseconds (JavaScript's `Date.now()`), or more than a day ahead of `now`."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidTypeError(f"{what} must be an ISO-8601 string or epoch seconds, not bool")
    expected = "epoch seconds (e.g. 1790000000) or ISO 8601 (e.g. 2026-11-15T14:30:00+09:00)"
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise InvalidInputError(f"{what} must be a finite number of {expected}")
        when = float(value)
        _check_calendar(when, value, what, expected)
    elif isinstance(value, (str, datetime)):
        when = _iso_seconds(value, what, zone, expected)
    else:
        raise InvalidTypeError(f"{what} must be {expected}, not {type(value).__name__}")
    if when <= 0:
        raise InvalidInputError(f"{what} {value!r} is not after 1970-01-01; send {expected}")
    now = time.time() if now is None else now
    if when > now + FUTURE_SLACK_SECONDS:
        raise InvalidInputError(f"{what} {value!r} is more than a day in the future "
                                f"({datetime.fromtimestamp(when, UTC):%Y-%m-%d %H:%M} UTC); send {expected}")
    return when


def _iso_seconds(value: str | datetime, what: str, zone: tzinfo, expected: str) -> float:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInputError(f"{what} {str(value)[:40]!r} is not an ISO-8601 date/time; "
                                    f"send {expected}") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    if value.year < 1970:
        raise InvalidInputError(f"{what} {value.isoformat()} is before 1970; send {expected}")
    try:
        return value.timestamp()
    except (OverflowError, OSError, ValueError):
        raise InvalidInputError(f"{what} {value.isoformat()} is out of range; send {expected}") from None


def check_words(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidTypeError(f"{what} must be a list of strings")
    words = []
    for item in value:
        words.append(clean_text(item, max_chars=MAX_WORD_CHARS, what=f"each of {what}"))
    if len(words) > MAX_WORDS:
        raise InvalidInputError(f"{what} has {len(words)} entries; the limit is {MAX_WORDS}")
    return list(dict.fromkeys(words))


def check_metadata(value: Any, max_chars: int) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"metadata must be a mapping, not {type(value).__name__}")
    try:
        encoded = json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"metadata must be JSON-serialisable: {exc}") from None
    if len(encoded) > max_chars:
        raise InvalidInputError(f"metadata is {len(encoded):,} characters as JSON; the limit is {max_chars:,}")
    _check_strings(value, "metadata")
    return json.loads(encoded)


def _check_strings(value: Any, where: str) -> None:
    """json.dumps escapes NUL and lone surrogates, so look at every key and string inside."""
    if isinstance(value, str):
        check_encodable(value, where)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_strings(key, where)
            _check_strings(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_strings(item, where)


def check_speaker(value: Any) -> str | None:
    if value is None:
        return None
    return clean_text(value, max_chars=MAX_WORD_CHARS, what="speaker")


def check_speaker_names(value: Any) -> dict[str, str]:
    """Stored speaker → the name people call them by (see `Memory.search`)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"speaker_names must be a mapping of speaker to name, not {type(value).__name__}")
    if len(value) > MAX_SPEAKER_NAMES:
        raise InvalidInputError(f"speaker_names has {len(value):,} entries; the limit is {MAX_SPEAKER_NAMES:,}")
    return {clean_text(speaker, max_chars=MAX_WORD_CHARS, what="each speaker in speaker_names"):
            clean_text(name, max_chars=MAX_WORD_CHARS, what="each name in speaker_names")
            for speaker, name in value.items()}


def check_k(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"k must be an integer, not {type(value).__name__}")
    if not 1 <= value <= 1000:
        raise InvalidInputError(f"k must be between 1 and 1000, got {value}")
    return value


def check_batch(value: Any) -> int:
    """A batch size (`Store.iter_blocks`: blocks per read). 0 read as a limit streamed no block at
    all — an empty memory, silently."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"batch must be an integer, not {type(value).__name__}")
    if value < 1:
        raise InvalidInputError(f"batch must be at least 1 (blocks per read), got {value}")
    return value
