"""The PostgreSQL + pgvector backend: `--db postgresql://user:pass@host/db[?schema=name]`.

psycopg 3 with a connection pool; forward migrations like SQLite's; vectors in pgvector with an
HNSW index searched iteratively (filtered searches still return k); BM25 over gieok's own tokens;
one hash chain per schema kept whole by an advisory lock around appends (store.py says why)."""

from .admin import drop_memory
from .store import PostgresStore

__all__ = ["PostgresStore", "drop_memory"]
