"""One exception hierarchy, so callers can catch `GieokError` and nothing slips past.

Input problems subclass `ValueError`/`TypeError` as well, so code that already guards
with the built-ins keeps working.
"""

from __future__ import annotations

__all__ = [
    "GieokError",
    "InvalidInputError",
    "InvalidTypeError",
    "TextTooLongError",
    "UnknownScopeKeyError",
    "NotFoundError",
    "BlockNotFoundError",
    "StoreError",
    "DatabaseUnwritableError",
    "StorageFullError",
    "CorruptDatabaseError",
    "DatabaseUnavailableError",
    "SchemaTooNewError",
    "CoordinationUnavailableError",
    "LeaseLostError",
    "EmbedderError",
    "EmbedderUnavailableError",
    "EmbedderMismatchError",
    "MemoryReembeddedError",
    "ImportFormatError",
    "ConfigError",
    "MissingExtraError",
    "LLMError",
    "LLMOutputError",
    "LLMRateLimitError",
    "LLMTransientError",
    "LLMAuthError",
    "LLMUnavailableError",
    "AuthenticationError",
    "PermissionDeniedError",
    "ServerError",
    "ServerUnavailableError",
]


class GieokError(Exception):
    """Base of every error gieok raises on purpose."""


class InvalidInputError(GieokError, ValueError):
    """A value was rejected before anything was written."""


class InvalidTypeError(GieokError, TypeError):
    """A value had the wrong type."""


class TextTooLongError(InvalidInputError):
    """Text exceeds the configured `max_text_chars`."""


class UnknownScopeKeyError(InvalidInputError):
    """A scope mapping used a key other than guild / channel / user."""


class NotFoundError(GieokError, KeyError):
    """What was asked for does not exist (or is not the caller's to see)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "not found"


class BlockNotFoundError(NotFoundError):
    """No block has the requested index."""


class StoreError(GieokError):
    """The storage backend failed."""


class DatabaseUnwritableError(StoreError):
    """The database path cannot be created or written."""


class StorageFullError(StoreError):
    """The filesystem holding the database is full (or over its quota): the write was rolled back
    whole, nothing of it stored; what was stored before is intact and readable. Writes succeed
    again, without a restart, once space is freed (HTTP 507)."""


class CorruptDatabaseError(StoreError):
    """The file is not a gieok database or is damaged."""


class DatabaseUnavailableError(StoreError):
    """The database server cannot be reached, or refused the connection."""


class SchemaTooNewError(StoreError):
    """The database was written by a newer gieok than this one."""


class CoordinationUnavailableError(GieokError):
    """Redis (what several bot and server processes share: `redis` setting) cannot be reached,
    or refused the connection."""


class LeaseLostError(GieokError):
    """A write was refused because this process no longer runs the channel: another process took
    its lease since (the store's fencing token for the channel is newer than this process's)."""


class EmbedderError(GieokError):
    """The embedding backend failed."""


class EmbedderUnavailableError(EmbedderError):
    """The configured embedder cannot be loaded (a package is missing)."""


class EmbedderMismatchError(EmbedderError):
    """The database was embedded with another model than the one configured."""


class MemoryReembeddedError(EmbedderMismatchError):
    """Another process re-embedded the memory (`gieok reindex`) after this one opened it: what this
    one holds no longer matches the file. Nothing is read or written through it; open it again (a
    server does so by itself at the next request)."""


class ImportFormatError(InvalidInputError):
    """A JSONL import line is malformed or its chain does not verify."""


class ConfigError(GieokError, ValueError):
    """A setting in the environment or gieok.toml is invalid."""


class MissingExtraError(ConfigError):
    """What was asked for needs an optional part of gieok that is not installed (an extra)."""

    def __init__(self, what: str, extra: str, missing: str | None = None) -> None:
        self.extra = extra
        detail = f" ({missing} is not installed)" if missing else ""
        super().__init__(f"{what} needs the {extra} extra{detail}: pip install 'gieok[{extra}]'")


class LLMError(GieokError):
    """A language-model call failed (after the retries and fallbacks configured)."""


class LLMOutputError(LLMError):
    """A model answered, but not in the shape that was asked for (e.g. no valid JSON)."""


class LLMRateLimitError(LLMError):
    """HTTP 429 / quota exhausted: this key must rest, for `retry_after` seconds if the provider said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LLMTransientError(LLMError):
    """5xx, timeout, dropped connection or a stream cut short: the same request may succeed later."""


class LLMAuthError(LLMError):
    """The provider refused the API key (401 / 403 / invalid key): another key may still work."""


class LLMUnavailableError(LLMError):
    """Every provider in the chain failed; `failures` maps each provider to what it last said."""

    def __init__(self, message: str, failures: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})


class AuthenticationError(GieokError):
    """No API key, or one that is malformed, unknown or revoked (HTTP 401)."""


class PermissionDeniedError(GieokError):
    """The key is valid but its role may not do this (HTTP 403)."""


class ServerError(GieokError):
    """A gieok server (`gieok serve`, through `gieok.client`) failed in a way no closer exception
    names: a 5xx, a conflict, an answer the client cannot read. `status` is the HTTP status, None
    when no answer came. What the engine raises has its own class on the client's side too (a 404
    is a `NotFoundError` there as here)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerUnavailableError(ServerError):
    """The server could not be reached (refused, reset, timed out), or answered 503 to every
    retry; the message names the URL."""
