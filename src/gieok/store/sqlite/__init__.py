"""The SQLite backend, the embedded default: one file, WAL, every write one transaction.

store.py (the store: blocks, vectors, FTS5 tokens and every layer's tables), schema.py (its
forward migrations, `PRAGMA user_version`), filters.py (a search's filters as SQL conditions and
FTS5 facets, shared by listings and BM25)."""

from .filters import facet_tokens
from .store import SQLiteStore

__all__ = ["SQLiteStore", "facet_tokens"]
