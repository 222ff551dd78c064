"""Event sequences of `gieok serve` (schema v9, in the deployment's home store): the next event id
of each tenant's live stream, so ids go on after a restart instead of starting again at 1 (a
client resuming with `since=N` would silently skip the new process's first N events). A process
reserves ids a block at a time (one write per block, not per event) and gives back what it did
not use when it stops; after a crash the ids it had reserved are skipped, never reused."""

from __future__ import annotations

from typing import Protocol

from .sql import SqlSession

__all__ = ["EventSequenceStore", "EventSequenceTable"]


class EventSequenceStore(Protocol):
    """The next event id of each tenant's stream, shared by every process of a deployment."""

    def next_seq(self, tenant: str) -> int: ...

    def reserve(self, tenant: str, count: int) -> int: ...

    def give_back(self, tenant: str, end: int, used: int) -> None: ...

    def raise_to(self, tenant: str, value: int) -> None: ...


class EventSequenceTable:
    """`EventSequenceStore` in SQL that SQLite and PostgreSQL both speak."""

    def __init__(self, store: SqlSession) -> None:
        self.store = store

    def next_seq(self, tenant: str) -> int:
        """The first id nobody was handed yet (1 for a tenant without events)."""
        rows = self.store.fetch("SELECT next_seq FROM event_sequences WHERE tenant = ?", (tenant,))
        return int(rows[0][0]) if rows else 1

    def reserve(self, tenant: str, count: int) -> int:
        """Hand out `count` ids, `start` to `start + count - 1`; returns `start`."""
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO event_sequences(tenant, next_seq) VALUES (?, 1) ON CONFLICT(tenant) DO NOTHING",
                         (tenant,))
            end = int(conn.execute("UPDATE event_sequences SET next_seq = next_seq + ? WHERE tenant = ? "
                                   "RETURNING next_seq", (count, tenant)).fetchone()[0])
        return end - count

    def give_back(self, tenant: str, end: int, used: int) -> None:
        """A stopping process reserved up to `end - 1` and used up to `used`: the ids after `used`
        go back, unless someone reserved after it (then they stay skipped)."""
        with self.store.transaction() as conn:
            conn.execute("UPDATE event_sequences SET next_seq = ? WHERE tenant = ? AND next_seq = ?",
                         (used + 1, tenant, end))

    def raise_to(self, tenant: str, value: int) -> None:
        """Make sure the next id is at least `value` (a shared log's ids recorded here)."""
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO event_sequences(tenant, next_seq) VALUES (?, ?) ON CONFLICT(tenant) DO NOTHING",
                         (tenant, value))
            conn.execute("UPDATE event_sequences SET next_seq = ? WHERE tenant = ? AND next_seq < ?",
                         (value, tenant, value))
