"""The event relay (schema 17 on SQLite, 19 on PostgreSQL; in the deployment's home store): the
events of a process that has no event stream of its own — `gieok mcp` — written down, so that every
`gieok serve` on the same memory streams them (server/relay.py).

Without Redis each server process keeps its tenants' streams in its own memory and numbers their
events itself. A `gieok mcp` process writes the same memory, but its events reached nobody, and the
ids it took from the shared sequence showed up in the servers' streams as a `stream.gap` of events
that no stream ever had. Now it writes each event here instead, with no id; each server reads the
rows it has not seen a few times a second and publishes them into its own stream, where they get
the stream's next id, so a resume with `since` finds them in order and misses nothing. One server
(whichever claims the row first, `claimed_by`) also queues its webhooks: once per event, not once
per worker. Rows are kept `KEEP_SECONDS`, long enough for a server that was down to pick them up.

A server without Redis writes here too, but only what it erased (a forgotten block, a deleted or
edited message, a user's erasure, withdrawn summary items), claimed by itself: the other servers of
the deployment (`--workers N`) redact their own streams with it, as the erasing one did.

A row holds nothing to migrate or export (it lives a day at most).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .sql import SqlSession

__all__ = ["RelayedEvent", "EventRelayStore", "EventRelayTable", "KEEP_SECONDS", "ERASED_KEEP_SECONDS"]

KEEP_SECONDS = 86_400.0  # a relayed event older than this is dropped (as webhook retries end after a day)
# a `user.erased` row names the erased user (the servers need it to redact their buffers): it goes after this
# long, when every running server has read it (they read several times a second); one that starts later has
# nothing buffered to redact
ERASED_KEEP_SECONDS = 60.0
_TRIM_EVERY = 100  # appends between two trims


@dataclass(frozen=True, slots=True)
class RelayedEvent:
    relay_id: int
    tenant: str
    time: float
    type: str
    data: dict[str, Any]
    claimed_by: str | None


class EventRelayStore(Protocol):
    """The relay's rows, shared by every process of a deployment."""

    def append(self, tenant: str, type: str, time: float, data: dict[str, Any], claimed_by: str | None = None) -> int:
        ...

    def after(self, relay_id: int, limit: int = 500) -> list[RelayedEvent]: ...

    def rows(self, relay_ids: Sequence[int]) -> list[RelayedEvent]: ...

    def last_id(self) -> int: ...

    def trim(self, now: float) -> int: ...

    def first_unclaimed(self) -> int | None: ...

    def claim(self, relay_ids: Sequence[int], holder: str) -> set[int]: ...

    def redact(self, tenant: str, held: Callable[[str, dict[str, Any]], bool], replacement: dict[str, Any]) -> int:
        ...

    def withdraw(self, relay_ids: Sequence[int], claimed_by: str | None = None) -> int: ...


def _row(row: Sequence[Any]) -> RelayedEvent:
    return RelayedEvent(int(row[0]), str(row[1]), float(row[2]), str(row[3]), json.loads(row[4]), row[5])


_COLUMNS = "relay_id, tenant, time, type, data, claimed_by"




class EventRelayTable:
    """`EventRelayStore` in SQL that SQLite and PostgreSQL both speak (the table: each one's schema)."""

    def __init__(self, store: SqlSession) -> None:
        self.store = store
        self._appended = 0

    def append(self, tenant: str, type: str, time: float, data: dict[str, Any], claimed_by: str | None = None) -> int:
        """A row for the servers to stream; `claimed_by`: one written by a server itself (what it erased,
        for the others), taken up already — by the others into their streams only, not their webhooks."""
        body = json.dumps(data, ensure_ascii=False, default=str)
        with self.store.transaction() as conn:
            relay_id = int(conn.execute("INSERT INTO event_relay(tenant, time, type, data, claimed_by) "
                                        "VALUES (?, ?, ?, ?, ?) RETURNING relay_id",
                                        (tenant, time, type, body, claimed_by)).fetchone()[0])
            self._appended += 1
        if self._appended % _TRIM_EVERY == 1:  # the first append, then every _TRIM_EVERY
            self.trim(time)
        return relay_id

    def trim(self, now: float) -> int:
        """Drop what is kept too long: rows after `KEEP_SECONDS`, `user.erased` ones after
        `ERASED_KEEP_SECONDS` (ids are never handed out again, so readers never skip a row)."""
        with self.store.transaction() as conn:
            return int(conn.execute("DELETE FROM event_relay WHERE time < ? OR (type = 'user.erased' AND time < ?)",
                                    (now - KEEP_SECONDS, now - ERASED_KEEP_SECONDS)).rowcount)

    def after(self, relay_id: int, limit: int = 500) -> list[RelayedEvent]:
        """The rows after `relay_id`, oldest first."""
        return [_row(row) for row in self.store.fetch(
            f"SELECT {_COLUMNS} FROM event_relay WHERE relay_id > ? ORDER BY relay_id LIMIT ?", (relay_id, limit))]

    def rows(self, relay_ids: Sequence[int]) -> list[RelayedEvent]:
        """The rows of these ids that exist (committed), oldest first: a reader's look back at the
        ids it skipped, in case their transactions commit after a later one's (PostgreSQL)."""
        if not relay_ids:
            return []
        marks = ", ".join("?" for _ in relay_ids)
        return [_row(row) for row in self.store.fetch(
            f"SELECT {_COLUMNS} FROM event_relay WHERE relay_id IN ({marks}) ORDER BY relay_id", tuple(relay_ids))]

    def last_id(self) -> int:
        rows = self.store.fetch("SELECT MAX(relay_id) FROM event_relay")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def first_unclaimed(self) -> int | None:
        """The oldest row no server has taken yet (written while none ran)."""
        rows = self.store.fetch("SELECT MIN(relay_id) FROM event_relay WHERE claimed_by IS NULL")
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def claim(self, relay_ids: Sequence[int], holder: str) -> set[int]:
        """Take the rows no other process took; returns the ones `holder` has now."""
        if not relay_ids:
            return set()
        marks = ", ".join("?" for _ in relay_ids)
        with self.store.transaction() as conn:
            conn.execute(f"UPDATE event_relay SET claimed_by = ? WHERE claimed_by IS NULL AND relay_id IN ({marks})",
                         (holder, *relay_ids))
            rows = conn.execute(f"SELECT relay_id FROM event_relay WHERE claimed_by = ? AND relay_id IN ({marks})",
                                (holder, *relay_ids)).fetchall()
        return {int(row[0]) for row in rows}

    def withdraw(self, relay_ids: Sequence[int], claimed_by: str | None = None) -> int:
        """Delete the rows of these ids that no server took up (`claimed_by` None), or that `claimed_by`
        holds: a `user.erased` names the user, and once the servers running have read it (or none
        took it: none runs, and one that starts later has nothing buffered) it names them for nobody."""
        if not relay_ids:
            return 0
        marks = ", ".join("?" for _ in relay_ids)
        held = "claimed_by IS NULL" if claimed_by is None else "claimed_by = ?"
        with self.store.transaction() as conn:
            return int(conn.execute(f"DELETE FROM event_relay WHERE {held} AND relay_id IN ({marks})",
                                    (*([] if claimed_by is None else [claimed_by]), *relay_ids)).rowcount)

    def redact(self, tenant: str, held: Callable[[str, dict[str, Any]], bool], replacement: dict[str, Any]) -> int:
        """A user or blocks were erased (`coordination.events.redaction_of`): the rows of `tenant`
        that `held` (their type, their data) says hold them are kept redacted. Reads the tenant's
        rows of the last day: `gieok mcp` processes and servers' erasures write here."""
        body = json.dumps(replacement, ensure_ascii=False)
        changed = [int(row[0]) for row in self.store.fetch(
            "SELECT relay_id, type, data FROM event_relay WHERE tenant = ?", (tenant,))
                   if held(str(row[1]), json.loads(row[2]))]
        if changed:
            with self.store.transaction() as conn:
                conn.executemany("UPDATE event_relay SET data = ? WHERE relay_id = ?", [(body, i) for i in changed])
        return len(changed)
