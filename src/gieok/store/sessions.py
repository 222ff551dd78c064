"""Dashboard sessions of `gieok serve` (schema v10, in the deployment's home store, beside the API
keys): the login page trades a key for an opaque session id, and the browser's cookie holds only
that id. A row per session: a SHA-256 of its id (the id itself is never stored), the key it stands
for, when it started and when it was last used. Ended by logging out, by expiry (the server's
idle and absolute limits) and by revoking its key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .sql import SqlSession

__all__ = ["SessionRow", "SessionStore", "SessionTable"]


@dataclass(frozen=True, slots=True)
class SessionRow:
    session_hash: str
    key_id: int
    created_at: float
    last_seen_at: float


class SessionStore(Protocol):
    def create(self, session_hash: str, key_id: int, now: float) -> None: ...

    def get(self, session_hash: str) -> SessionRow | None: ...

    def touch(self, session_hash: str, now: float) -> None: ...

    def delete(self, session_hash: str) -> None: ...

    def delete_for_key(self, key_id: int) -> int: ...

    def purge(self, *, idle_before: float, created_before: float) -> int: ...


class SessionTable:
    """`SessionStore` in SQL that SQLite and PostgreSQL both speak."""

    def __init__(self, store: SqlSession) -> None:
        self.store = store

    def create(self, session_hash: str, key_id: int, now: float) -> None:
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO dashboard_sessions(session_hash, key_id, created_at, last_seen_at) "
                         "VALUES (?, ?, ?, ?)", (session_hash, key_id, now, now))

    def get(self, session_hash: str) -> SessionRow | None:
        rows = self.store.fetch("SELECT session_hash, key_id, created_at, last_seen_at FROM dashboard_sessions "
                                "WHERE session_hash = ?", (session_hash,))
        return SessionRow(*rows[0]) if rows else None

    def touch(self, session_hash: str, now: float) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE dashboard_sessions SET last_seen_at = ? WHERE session_hash = ?", (now, session_hash))

    def delete(self, session_hash: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM dashboard_sessions WHERE session_hash = ?", (session_hash,))

    def delete_for_key(self, key_id: int) -> int:
        with self.store.transaction() as conn:
            return int(conn.execute("DELETE FROM dashboard_sessions WHERE key_id = ?", (key_id,)).rowcount)

    def purge(self, *, idle_before: float, created_before: float) -> int:
        """Drop the sessions past either limit."""
        with self.store.transaction() as conn:
            return int(conn.execute("DELETE FROM dashboard_sessions WHERE last_seen_at < ? OR created_at < ?",
                                    (idle_before, created_before)).rowcount)
