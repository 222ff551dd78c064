"""Turn a `db` setting into a store: a file path opens SQLite, a `postgresql://` URL opens
PostgreSQL. The one place that knows which backends exist."""

from __future__ import annotations

import os

from ..config.settings import is_database_url
from ..errors import MissingExtraError
from .base import Store
from .sqlite import SQLiteStore

__all__ = ["open_store", "is_database_url"]


def open_store(location: str | os.PathLike[str], *, busy_timeout_ms: int = 10_000, hnsw_m: int = 32,
               hnsw_ef_construction: int = 120, hnsw_ef_search: int = 96) -> Store:
    """Open (creating and migrating when new) the store at `location`. The `hnsw_*` settings shape
    PostgreSQL's pgvector index (SQLite's graph lives in the engine, which reads them itself)."""
    if is_database_url(location):
        try:  # psycopg is the `postgres` extra: only a PostgreSQL URL needs it
            from .postgres import PostgresStore
        except ImportError as exc:
            raise MissingExtraError("a PostgreSQL db", "postgres", exc.name) from None
        return PostgresStore(str(location), busy_timeout_ms=busy_timeout_ms, hnsw_m=hnsw_m,
                             hnsw_ef_construction=hnsw_ef_construction, hnsw_ef_search=hnsw_ef_search)
    return SQLiteStore(location, busy_timeout_ms=busy_timeout_ms)
