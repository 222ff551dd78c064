"""Leases: one process at a time does a named piece of work (a tenant's background duties), in
whichever process holds the lease; a process that dies lets it lapse and another takes over. Kept
in the store itself, so several `gieok serve` workers on one SQLite file or one PostgreSQL agree
without Redis. A row per name: who holds it and until when."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from ..errors import StoreError
from .sql import SqlSession

__all__ = ["LeaseStore", "LeaseTable", "LEASE_POLL_SECONDS"]

LEASE_POLL_SECONDS = 0.02  # how often `held` looks again while another holder has the lease


class LeaseStore(Protocol):
    """Named, expiring leases shared by every process of a store."""

    def acquire(self, name: str, holder: str, seconds: float, now: float | None = None) -> bool: ...

    def release(self, name: str, holder: str) -> None: ...

    def held(self, name: str, holder: str, seconds: float, *, wait: float) -> AbstractContextManager[None]: ...


class LeaseTable:
    """`LeaseStore` in SQL that SQLite and PostgreSQL both speak."""

    def __init__(self, store: SqlSession, *, server_clock: str | None = None) -> None:
        self.store = store
        # A query for the database server's clock (PostgreSQL): a lease's end is then written and
        # compared on one clock, so a process whose own clock runs ahead cannot take a live holder's
        # lease (nor one running behind keep a dead holder's). None (SQLite): every process of the
        # file is on one machine, whose clock is this process's.
        self.server_clock = server_clock

    def acquire(self, name: str, holder: str, seconds: float, now: float | None = None) -> bool:
        """Take (or renew) the lease `name` for `seconds` unless another live holder has it. `now`:
        the store's clock when None (what processes should pass), a given time otherwise (tests)."""
        with self.store.transaction() as conn:
            if now is None:
                now = time.time() if self.server_clock is None else float(conn.execute(self.server_clock).fetchone()[0])
            conn.execute("INSERT INTO leases(name, holder, expires_at) VALUES (?, ?, ?) ON CONFLICT(name) DO NOTHING",
                         (name, holder, now + seconds))
            taken = conn.execute("UPDATE leases SET holder = ?, expires_at = ? WHERE name = ? AND "
                                 "(holder = ? OR expires_at < ?)", (holder, now + seconds, name, holder, now))
            return taken.rowcount > 0

    def release(self, name: str, holder: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))

    @contextmanager
    def held(self, name: str, holder: str, seconds: float, *, wait: float) -> Iterator[None]:
        """The lease `name` for the length of the block (for `seconds` at most: a holder that dies
        lets it lapse), given back after. While another live holder has it, waits up to `wait`
        seconds, then raises StoreError (503 over HTTP: try again)."""
        deadline = time.monotonic() + wait
        while not self.acquire(name, holder, seconds):
            if time.monotonic() > deadline:
                raise StoreError(f"{name} has been held by another process for over {wait:g} s; try again")
            time.sleep(LEASE_POLL_SECONDS)
        try:
            yield
        finally:
            self.release(name, holder)
