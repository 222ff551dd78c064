"""Storage backends behind the `Store` protocol. SQLite is the embedded default."""

from .base import BM25Filter, IndexRows, NewBlock, Store, VerifyReport
from .sqlite import SQLiteStore

__all__ = ["Store", "SQLiteStore", "NewBlock", "IndexRows", "BM25Filter", "VerifyReport"]
