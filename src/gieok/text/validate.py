"""Reject text that must never reach the store, with a message that says why."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInputError, InvalidTypeError, TextTooLongError

__all__ = ["clean_text", "check_encodable"]


def clean_text(value: Any, *, max_chars: int, what: str = "text", setting: str | None = None) -> str:
    """Return `value` stripped of surrounding whitespace, or raise a typed error. `setting`: the
    setting that makes `max_chars`, named in the error (none when the limit is fixed).

    Checks happen on the raw input before any truncation, so an over-long text is
    refused rather than silently cut (a bug of the system this project replaces).
    """
    if not isinstance(value, str):
        raise InvalidTypeError(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > max_chars:
        named = f" ({setting})" if setting else ""
        raise TextTooLongError(f"{what} has {len(value):,} characters; the limit is {max_chars:,}{named}")
    check_encodable(value, what)
    stripped = value.strip()
    if not stripped:
        raise InvalidInputError(f"{what} is empty or only whitespace")
    return stripped


def check_encodable(value: str, what: str) -> None:
    """NUL bytes and lone surrogates cannot be stored as UTF-8 text: refuse them."""
    if "\x00" in value:
        raise InvalidInputError(f"{what} contains a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(f"{what} contains a lone surrogate and is not valid Unicode") from None
