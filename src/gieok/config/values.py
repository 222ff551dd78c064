"""Parsers for the settings that hold several values in one string (an environment variable
can only hold a string): comma-separated names and API key lists. Each runs once, when the
settings are made; the rest of gieok reads typed values. (The chat's own multi-valued settings —
the LLM chain, self-corrections, owner ids — are parsed in `gieok.chat.settings` with these.)

A leaf module: it imports nothing of gieok but the errors.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError

__all__ = ["split_items", "comma_list", "key_list", "merge_keys"]


def split_items(value: Any, separators: str) -> list[str]:
    """A string split at any of `separators`, or a list (TOML) of strings; blanks dropped."""
    if isinstance(value, str):
        for separator in separators[1:]:
            value = value.replace(separator, separators[0])
        parts = value.split(separators[0])
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        parts = list(value)
    else:
        raise ConfigError(f"expected a string or a list of strings, got {value!r}")
    return [part.strip() for part in parts if part.strip()]


def comma_list(value: Any) -> tuple[str, ...]:
    """`"누리, Nuri"` or `["누리", "Nuri"]` → `("누리", "Nuri")`."""
    return tuple(split_items(value, ","))


def key_list(value: Any) -> tuple[str, ...]:
    """API keys separated by commas or newlines; repeats dropped, order kept."""
    return tuple(dict.fromkeys(split_items(value, ",\n")))


def merge_keys(*groups: Iterable[str]) -> tuple[str, ...]:
    """Keys of several settings (`gemini_api_key` and `gemini_api_keys`) as one list, first seen first."""
    return tuple(dict.fromkeys(key for group in groups for key in group if key))
