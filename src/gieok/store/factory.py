"""Turn a `db` setting into a store: a file path opens SQLite, a `postgresql://` URL opens
PostgreSQL. The one place that knows which backends exist."""

from __future__ import annotations

import os

from ..config.settings import is_database_url
from ..errors import ConfigError
from .base import Store
from .sqlite import SQLiteStore

__all__ = ["open_store", "is_database_url"]


def open_store(location: str | os.PathLike[str], *, busy_timeout_ms: int = 10_000) -> Store:
    """Open (creating and migrating when new) the store at `location`."""
    if is_database_url(location):
        raise ConfigError(f"{_without_password(str(location))}: no PostgreSQL backend in this build")
    return SQLiteStore(location, busy_timeout_ms=busy_timeout_ms)


def _without_password(url: str) -> str:
    head, at, tail = url.rpartition("@")
    if not at or ":" not in head.split("://", 1)[-1]:
        return url
    scheme, _, user_password = head.partition("://")
    return f"{scheme}://{user_password.split(':', 1)[0]}:***@{tail}"
