"""What a `gieok serve` does with the event relay (store/relay.py): a few times a second it reads the
events that a `gieok mcp` on the same memory wrote there, and publishes each into its own live stream
(where it gets the stream's next id, so a client resuming with `since` finds it in order, with no
gap) — and, for the one server that claims the event first, queues it for the tenant's webhooks.

At start a server takes up the events no server has taken yet (written while none ran), then every
new one. With Redis there is nothing to relay: every process appends to the shared log itself.

The other way, what a server erased is told to the others through the same rows (`tell`): each
worker of `gieok serve --workers N` keeps a stream of its own, and a deletion one of them made must
redact the others' too — the events of a user erased, of a message deleted or edited, a summary's
withdrawn items, whatever blocks they name. The row is claimed by its writer (its webhooks are
queued already), whose own pump passes it by; and the relay's rows of that data (a `gieok mcp`'s)
are redacted first, as a `gieok mcp`'s erasure redacts them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import Any

import anyio.to_thread

from ..coordination.events import USER_ERASED, redaction_of
from ..errors import GieokError
from ..store.relay import EventRelayStore, RelayedEvent
from .events import EventBus, relay_written

__all__ = ["RelayPump", "POLL_SECONDS", "LOOK_BACK_SECONDS"]

log = logging.getLogger("gieok.server.relay")

POLL_SECONDS = 0.25  # how soon an event written by `gieok mcp` shows up in a server's stream
LOOK_BACK_SECONDS = 5.0  # rows that committed after a later id (PostgreSQL) are still taken up this long
TRIM_SECONDS = 30.0  # how often a server drops the rows kept too long
_MAX_SKIPPED = 1000  # skipped ids looked up again at most (a run of rolled-back writes is not waited for)


class RelayPump:
    """One server process's reader of the relay, publishing into `bus` (and `webhooks`, when the
    server has them: anything with `queue(tenant, event)` and `redact(tenant, held)`)."""

    def __init__(self, table: EventRelayStore, bus: EventBus, webhooks: Any = None) -> None:
        self.table, self.bus, self.webhooks = table, bus, webhooks
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.cursor = 0  # the newest relay id taken up
        self._known = 0  # rows up to this id predate the process: only the unclaimed ones are taken up
        self._seen: dict[int, float] = {}  # relay ids taken up within the look-back, and when
        # ids skipped by the rows read (a transaction that took its id before a later one committed
        # after it, or rolled back), and when: looked up again by id for LOOK_BACK_SECONDS. By id, not
        # by the rows' time — that is the writer's clock, and a writer's clock running behind this
        # one's hid its late rows from a look back by time, one running ahead showed them again.
        self._skipped: dict[int, float] = {}
        self._trimmed = 0.0
        self.relayed = 0

    def begin(self) -> None:
        """Where to start (a worker thread's call): at the oldest row no server took, else after
        the last row."""
        self._known = self.table.last_id()
        first = self.table.first_unclaimed()
        self.cursor = first - 1 if first is not None else self._known

    def step(self, now: float | None = None) -> int:
        """Take up the new rows (a worker thread's call); how many were published."""
        now = time.time() if now is None else now
        rows = {row.relay_id: row for row in self.table.after(self.cursor)}
        if rows and max(rows) - self.cursor <= _MAX_SKIPPED:
            self._skipped.update((i, now) for i in range(self.cursor + 1, max(rows)) if i not in rows)
        for row in self.table.rows(sorted(self._skipped)[:_MAX_SKIPPED]):
            rows.setdefault(row.relay_id, row)
        self._skipped = {i: at for i, at in self._skipped.items() if i not in rows and at > now - LOOK_BACK_SECONDS}
        fresh = [row for relay_id, row in sorted(rows.items()) if relay_id not in self._seen
                 and row.claimed_by != self.holder  # what this process erased, told to the others (`tell`)
                 and (relay_id > self._known or row.claimed_by is None)]
        claimed = self.table.claim([row.relay_id for row in fresh], self.holder) if fresh else set()
        for row in fresh:
            if row.relay_id <= self._known and row.relay_id not in claimed:
                continue  # written before this process started, and another server took it up
            self._publish(row, row.relay_id in claimed)
        for relay_id in rows:
            self._seen.setdefault(relay_id, now)
        self.cursor = max([self.cursor, *rows])
        self._seen = {relay_id: at for relay_id, at in self._seen.items() if at > now - 2 * LOOK_BACK_SECONDS}
        if now - self._trimmed > TRIM_SECONDS:
            self._trimmed = now
            self.table.trim(now)
        return len(fresh)

    def tell(self, tenant: str, type: str, at: float, data: dict[str, Any]) -> None:
        """This server erased data (`type`, `data` as the memory sent them: `redaction_of` says what):
        the relay's rows holding it are redacted, and the event is written for the other servers,
        claimed by this one (a worker thread's call: `EventBus.siblings`)."""
        redaction = redaction_of(type, data)[0]
        if redaction is None:
            return
        relay_id = relay_written(self.table, tenant, type, at, data, redaction, claimed_by=self.holder)
        if type == USER_ERASED:  # names the user: deleted at the close (`ServerState`), once the others read it
            self.bus.relayed_erasures.append((relay_id, time.monotonic(), self.holder))

    def _publish(self, row: RelayedEvent, hooks: bool) -> None:
        event = self.bus.publish(row.tenant, row.type, row.data, at=row.time, relayed=True)
        self.relayed += 1
        if hooks and self.webhooks is not None:
            redaction = redaction_of(row.type, row.data)[0]
            if redaction is not None:
                self.webhooks.redact(row.tenant, redaction)
            self.webhooks.queue(row.tenant, event)

    @classmethod
    def for_server(cls, table: EventRelayStore | None, bus: EventBus, webhooks: Any = None) -> RelayPump | None:
        """The pump of a `gieok serve` process, or None where there is nothing to relay (the events
        are shared through Redis, or this process writes the relay itself)."""
        if table is None or bus.shared is not None or bus.relay is not None:
            return None
        return cls(table, bus, webhooks)

    def start(self) -> None:
        """Run on the current event loop until `stop()`."""
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.run(self._stop))

    async def stop(self) -> None:
        stop, task = getattr(self, "_stop", None), getattr(self, "_task", None)
        if stop is not None and task is not None:
            stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: a step every POLL_SECONDS. A store that is away (a restarting database) is
        tried again on the next step."""
        started = False
        while not stop.is_set():
            try:
                if not started:
                    await anyio.to_thread.run_sync(self.begin)
                    started = True
                await anyio.to_thread.run_sync(self.step)
            except GieokError as exc:
                log.warning("event relay: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_SECONDS)
