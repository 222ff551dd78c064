"""The API keys of `gieok serve` (schema v5). `KeyStore` is the port `server/auth.py` is written
against; `KeyTable` implements it once in portable SQL over any `SqlSession`, sharing the
store's connection and transactions like the conversation tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .sql import SqlSession

__all__ = ["KeyRow", "KeyStore", "KeyTable"]

_COLUMNS = ("key_id", "prefix", "key_hash", "tenant", "role", "name", "created_at", "revoked_at", "last_used_at")


@dataclass(frozen=True, slots=True)
class KeyRow:
    key_id: int
    prefix: str
    key_hash: str
    tenant: str
    role: str
    name: str
    created_at: float
    revoked_at: float | None
    last_used_at: float | None

    def as_dict(self) -> dict[str, Any]:
        """Everything but the hash: what `gieok keys list` and the keys API show."""
        return {"id": self.key_id, "prefix": self.prefix, "tenant": self.tenant, "role": self.role,
                "name": self.name, "created_at": self.created_at, "revoked_at": self.revoked_at,
                "last_used_at": self.last_used_at}


class KeyStore(Protocol):
    """Persistence of API keys (only their SHA-256 and a visible prefix)."""

    def insert(self, prefix: str, key_hash: str, tenant: str, role: str, name: str, when: float) -> KeyRow: ...

    def by_prefix(self, prefix: str) -> KeyRow | None: ...

    def by_id(self, key_id: int) -> KeyRow | None: ...

    def all(self, tenant: str | None = None) -> list[KeyRow]: ...

    def revoke(self, key_id: int, when: float, tenant: str | None = None) -> bool: ...

    def touch(self, key_id: int, when: float) -> None: ...


class KeyTable:
    """`KeyStore` in SQL that SQLite and PostgreSQL both speak."""

    def __init__(self, store: SqlSession) -> None:
        self.store = store

    def insert(self, prefix: str, key_hash: str, tenant: str, role: str, name: str, when: float) -> KeyRow:
        """A new key row. A prefix that exists already is a `StoreError` (the column is unique)."""
        with self.store.transaction() as conn:
            key_id = int(conn.execute("INSERT INTO api_keys(prefix, key_hash, tenant, role, name, created_at) "
                                      "VALUES (?, ?, ?, ?, ?, ?) RETURNING key_id",
                                      (prefix, key_hash, tenant, role, name, when)).fetchone()[0])
        return KeyRow(key_id, prefix, key_hash, tenant, role, name, when, None, None)

    def by_prefix(self, prefix: str) -> KeyRow | None:
        rows = self.store.fetch(f"SELECT {', '.join(_COLUMNS)} FROM api_keys WHERE prefix = ?", (prefix,))
        return KeyRow(*rows[0]) if rows else None

    def by_id(self, key_id: int) -> KeyRow | None:
        rows = self.store.fetch(f"SELECT {', '.join(_COLUMNS)} FROM api_keys WHERE key_id = ?", (key_id,))
        return KeyRow(*rows[0]) if rows else None

    def all(self, tenant: str | None = None) -> list[KeyRow]:
        sql = f"SELECT {', '.join(_COLUMNS)} FROM api_keys"
        params: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " WHERE tenant = ?"
            params = (tenant,)
        return [KeyRow(*row) for row in self.store.fetch(sql + " ORDER BY key_id", params)]

    def revoke(self, key_id: int, when: float, tenant: str | None = None) -> bool:
        """Revoke a live key (of `tenant`, when given), and end its dashboard sessions; False if
        there is no such live key."""
        sql = "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL"
        params: list[Any] = [when, key_id]
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        with self.store.transaction() as conn:
            revoked = conn.execute(sql, params).rowcount > 0
            if revoked:
                conn.execute("DELETE FROM dashboard_sessions WHERE key_id = ?", (key_id,))
            return revoked

    def touch(self, key_id: int, when: float) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE api_keys SET last_used_at = ? WHERE key_id = ?", (when, key_id))
