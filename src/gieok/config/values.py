"""Parsers for the settings that hold several values in one string (an environment variable
can only hold a string): comma-separated names and ids, API key lists, self-corrections and
the LLM chain. Each runs once, when the settings are made; the rest of gieok reads typed values.

A leaf module: it imports nothing of gieok but the errors, so both the settings and the LLM
package build on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["ChainEntry", "CHAIN_PROVIDERS", "parse_chain", "chain_setting", "comma_list", "key_list", "merge_keys",
           "corrections", "digit_ids"]

CHAIN_PROVIDERS = ("gemini", "openai", "llamacpp")
_ALIASES = {"openai-compat": "openai", "openai_compat": "openai", "llama.cpp": "llamacpp", "gguf": "llamacpp"}


def _items(value: Any, separators: str) -> list[str]:
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
    return tuple(_items(value, ","))


def key_list(value: Any) -> tuple[str, ...]:
    """API keys separated by commas or newlines; repeats dropped, order kept."""
    return tuple(dict.fromkeys(_items(value, ",\n")))


def merge_keys(*groups: Iterable[str]) -> tuple[str, ...]:
    """Keys of several settings (`gemini_api_key` and `gemini_api_keys`) as one list, first seen first."""
    return tuple(dict.fromkeys(key for group in groups for key in group if key))


def corrections(value: Any) -> tuple[tuple[str, str], ...]:
    """`"저는 AI 어시스턴트=>나는 누리; Nuri=>누리"` → `(("저는 AI 어시스턴트", "나는 누리"), ("Nuri", "누리"))`."""
    pairs: list[tuple[str, str]] = []
    for item in _items(value, ";"):
        wrong, arrow, right = item.partition("=>")
        if not arrow or not wrong.strip():
            raise ConfigError(f"self_corrections entries look like 'wrong=>right', got {item!r}")
        pairs.append((wrong.strip(), right.strip()))
    return tuple(pairs)


def digit_ids(value: Any) -> tuple[int, ...]:
    """Numeric user ids (Discord snowflakes), comma-separated."""
    ids = _items(value, ",")
    bad = [item for item in ids if not item.isdigit()]
    if bad:
        raise ConfigError(f"expected numeric ids, got {', '.join(map(repr, bad))}")
    return tuple(int(item) for item in ids)


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One element of `llm_chain`: `provider:model`, for `openai` optionally `@base_url`."""

    provider: str
    model: str
    base_url: str = ""

    @property
    def label(self) -> str:
        """How logs and health name it; the endpoint is part of it when the entry names one."""
        return f"{self.provider}:{self.model}" + (f"@{self.base_url}" if self.base_url else "")


def parse_chain(spec: Any) -> tuple[ChainEntry, ...]:
    """`"gemini:gemini-2.5-flash, openai:qwen2.5:7b@http://127.0.0.1:11434/v1"` → entries.

    Only the first ':' separates provider from model (Ollama tags contain ':'); for `openai`
    a trailing `@http(s)://…` names another endpoint than `openai_base_url`.
    """
    entries: list[ChainEntry] = []
    for item in _items(spec, ","):
        provider, sep, rest = item.partition(":")
        provider = _ALIASES.get(provider.strip().lower(), provider.strip().lower())
        rest = rest.strip()
        if provider not in CHAIN_PROVIDERS or not sep or not rest:
            raise ConfigError(f"llm_chain entry {item!r} must be provider:model with provider one of "
                              f"{', '.join(CHAIN_PROVIDERS)} (e.g. gemini:gemini-2.5-flash)")
        model, base_url = rest, ""
        if provider == "openai" and "@" in rest:
            model, _, base_url = rest.rpartition("@")
            model, base_url = model.strip(), base_url.strip()
            if not base_url.startswith(("http://", "https://")) or not model:
                raise ConfigError(f"llm_chain entry {item!r}: after '@' comes an http(s) base URL")
        entry = ChainEntry(provider, model, base_url)
        if any(e.label == entry.label for e in entries):
            raise ConfigError(f"llm_chain names {entry.label!r} twice")
        entries.append(entry)
    if not entries:
        raise ConfigError("llm_chain names no provider")
    return tuple(entries)


def chain_setting(value: Any) -> tuple[ChainEntry, ...]:
    """The `llm_chain` setting: empty means "choose by the keys configured" (`create_llm`)."""
    return parse_chain(value) if _items(value, ",") else ()
