"""Idempotency keys of the server's writes (schema v8): a client that sends a write again with the
same `Idempotency-Key` (a retry after a dropped connection) gets the first answer, and nothing is
written twice. A row per key, in the tenant's own store: the request's fingerprint, who runs it
while it runs, the blocks it stored (written in the blocks' own transaction, so a process killed
between its commit and its answer leaves a key that says what was stored), then its answer.
`IdempotencyTable` implements the port once in portable SQL."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import StoreError
from ..types import Block
from .sql import SqlSession, SqlWriter

__all__ = ["IdempotencyRow", "IdempotencyStore", "IdempotencyTable", "IdempotencyKeyTakenError", "ORPHANED"]

ORPHANED = ""  # the holder of a key whose request stored its blocks and then failed
_IN_CHUNK = 500  # block indices asked about in one statement

def _nobody(holder: str) -> bool:
    """No holder is known to be gone (the default of `claim`'s `dead`)."""
    return False


_COLUMNS = ("idem_key", "fingerprint", "status", "response", "holder", "created_at", "written")


class IdempotencyKeyTakenError(StoreError):
    """The key a write runs under was taken over by a retry (its holder looked gone): the write is
    refused, so only one of the two stores anything."""


@dataclass(frozen=True, slots=True)
class IdempotencyRow:
    key: str
    fingerprint: str
    status: int | None  # None while the first request runs
    response: str | None  # its answer (JSON) once it has one
    holder: str  # the process running it
    created_at: float
    written: str | None = None  # the block indices it stored (JSON), set in their transaction

    @property
    def written_indices(self) -> list[int] | None:
        return None if self.written is None else [int(i) for i in json.loads(self.written)]


class IdempotencyStore(Protocol):
    """The idempotency keys of one tenant's writes."""

    def claim(self, key: str, fingerprint: str, holder: str, now: float, *, expire_before: float,
              stale_before: float, dead: Callable[[str], bool] = _nobody) -> IdempotencyRow | None: ...

    def finish(self, key: str, holder: str, status: int, response: str) -> None: ...

    def written_hook(self, key: str, holder: str) -> Callable[[SqlWriter, Sequence[Block]], None]: ...

    def abandon(self, key: str, holder: str) -> None: ...

    def get(self, key: str) -> IdempotencyRow | None: ...

    def redact_answers(self, blocks: set[int], needles: Sequence[str]) -> int: ...

    def redact_written(self, blocks: Collection[int]) -> int: ...


class IdempotencyTable:
    """`IdempotencyStore` in SQL that SQLite and PostgreSQL both speak."""

    def __init__(self, store: SqlSession) -> None:
        self.store = store

    def claim(self, key: str, fingerprint: str, holder: str, now: float, *, expire_before: float,
              stale_before: float, dead: Callable[[str], bool] = _nobody) -> IdempotencyRow | None:
        """Take `key` for a request about to run: None when it is this caller's to run (new, expired,
        or left pending by a holder that is gone — `dead(holder)`, asked only of a row pending with
        the same request, or since before `stale_before` — before
        it stored anything), else the row of the request that has it (running, done with its
        answer, or gone after storing its blocks: `written` says which, for the answer)."""
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM idempotency_blocks WHERE idem_key IN "
                         "(SELECT idem_key FROM idempotency_keys WHERE created_at < ?)", (expire_before,))
            conn.execute("DELETE FROM idempotency_keys WHERE created_at < ?", (expire_before,))
            taken = conn.execute("INSERT INTO idempotency_keys(idem_key, fingerprint, holder, created_at) "
                                 "VALUES (?, ?, ?, ?) ON CONFLICT(idem_key) DO NOTHING",
                                 (key, fingerprint, holder, now)).rowcount > 0
            if taken:
                return None
            row = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM idempotency_keys WHERE idem_key = ?",
                               (key,)).fetchone()
            if row is None:
                return None  # pragma: no cover - deleted between the two statements
            found = IdempotencyRow(*row)
            if found.status is None and found.written is None and found.fingerprint == fingerprint and (
                    found.created_at < stale_before or dead(found.holder)):
                conn.execute("UPDATE idempotency_keys SET holder = ?, created_at = ? WHERE idem_key = ? AND holder = ?",
                             (holder, now, key, found.holder))
                return None
            return found

    def finish(self, key: str, holder: str, status: int, response: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE idempotency_keys SET status = ?, response = ? WHERE idem_key = ? AND holder = ?",
                         (status, response, key, holder))

    def written_hook(self, key: str, holder: str) -> Callable[[SqlWriter, Sequence[Block]], None]:
        """An append hook (`Memory.add(within=…)`) that records the stored blocks' indices on the key
        in their own transaction; refuses the write (IdempotencyKeyTakenError) when the key is no
        longer this holder's."""
        def mark(tx: SqlWriter, blocks: Sequence[Block]) -> None:
            row = tx.execute("SELECT written FROM idempotency_keys WHERE idem_key = ? AND holder = ? "
                             "AND status IS NULL", (key, holder)).fetchone()
            if row is None:
                raise IdempotencyKeyTakenError(f"the Idempotency-Key {key!r} was taken over by a retry")
            indices = (json.loads(row[0]) if row[0] else []) + [b.block_index for b in blocks]
            tx.execute("UPDATE idempotency_keys SET written = ? WHERE idem_key = ? AND holder = ?",
                       (json.dumps(indices), key, holder))
            tx.executemany("INSERT INTO idempotency_blocks(block_index, idem_key) VALUES (?, ?)",
                           [(b.block_index, key) for b in blocks])
        return mark

    def abandon(self, key: str, holder: str) -> None:
        """Forget a key whose request failed before it stored anything: a retry runs it again. One
        that failed after its blocks were stored keeps them, with no holder (`ORPHANED`): a retry
        answers from them."""
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM idempotency_keys WHERE idem_key = ? AND holder = ? AND status IS NULL "
                         "AND written IS NULL", (key, holder))
            conn.execute("UPDATE idempotency_keys SET holder = ? WHERE idem_key = ? AND holder = ? AND status IS NULL",
                         (ORPHANED, key, holder))

    def get(self, key: str) -> IdempotencyRow | None:
        rows = self.store.fetch(f"SELECT {', '.join(_COLUMNS)} FROM idempotency_keys WHERE idem_key = ?", (key,))
        return IdempotencyRow(*rows[0]) if rows else None

    def redact_written(self, blocks: Collection[int]) -> int:
        """Kept answers of the writes that stored one of `blocks` (forgotten since: their answers
        hold the blocks' text) keep their key and status but lose their body (`REDACTED`), as
        `redact_answers` does; found through `idempotency_blocks`, not by reading every kept answer.
        Returns how many."""
        wanted = sorted({int(b) for b in blocks})
        keys: set[str] = set()
        for start in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[start:start + _IN_CHUNK]
            keys.update(str(row[0]) for row in self.store.fetch(
                "SELECT DISTINCT idem_key FROM idempotency_blocks "
                f"WHERE block_index IN ({', '.join('?' * len(chunk))})", chunk))
        if not keys:
            return 0
        with self.store.transaction() as conn:
            return sum(conn.execute("UPDATE idempotency_keys SET response = ? WHERE idem_key = ? "
                                    "AND response IS NOT NULL AND response <> ?", (REDACTED, key, REDACTED)).rowcount
                       for key in sorted(keys))

    def redact_answers(self, blocks: set[int], needles: Sequence[str]) -> int:
        """Kept answers that hold erased data — they name or stored one of `blocks`, or contain one
        of `needles` — keep their key and status but lose their body (`REDACTED`): a retry still
        stores nothing twice, and the erased data is not answered back. Returns how many."""
        redacted = []
        for row in self.store.fetch(f"SELECT {', '.join(_COLUMNS)} FROM idempotency_keys WHERE response IS NOT NULL "
                                    "AND response <> ?", (REDACTED,)):
            found = IdempotencyRow(*row)
            if set(found.written_indices or ()) & blocks or _mentions(found.response or "", blocks, needles):
                redacted.append(found.key)
        if redacted:
            with self.store.transaction() as conn:
                conn.executemany("UPDATE idempotency_keys SET response = ? WHERE idem_key = ?",
                                 [(REDACTED, key) for key in redacted])
        return len(redacted)


REDACTED = json.dumps({"redacted": "the data this answer held was erased"})


def _mentions(response: str, blocks: set[int], needles: Sequence[str]) -> bool:
    if any(needle and needle in response for needle in needles):
        return True
    try:
        data = json.loads(response)
    except ValueError:
        return False
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("block_index") in blocks:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
