"""The live event stream: what the memory and the bot do, as it happens, per tenant.

Each tenant has its own sequence (1, 2, 3 …) and a bounded ring buffer of its latest events, so a
client that reconnects with `since=N` gets what it missed, and is told (`stream.gap`) when the
buffer no longer reaches back that far. Sequences are per tenant so that nobody learns from the
numbers how busy another tenant is. Publishing is thread-safe and never blocks: the memory emits
from worker threads; each subscriber is an asyncio queue fed through its loop, and one that
falls too far behind is cut off (it reconnects with `since`) rather than holding memory.

With Redis (the `redis` setting) the log is shared instead: every process appends to the
tenant's Redis stream (`coordination.SharedEventLog`) and every feed reads it, so a client of any
`gieok serve` worker sees the events of every worker and every bot process, with one sequence.

Event types: memory.added, memory.forgotten, memory.promoted, search.answered, summary.updated, summary.withdrawn,
fact.added, fact.superseded, fact.duplicate, guard.fired, turn.claimed, turn.timings, pipeline.* (other
pipeline events), and stream.gap (sent to a subscriber only).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..coordination import Event, SharedEventLog
from ..coordination.events import MEMORY_FORGOTTEN, REDACTED, USER_ERASED, Redaction, event_marks, redaction_of
from ..errors import CoordinationUnavailableError, GieokError, InvalidInputError
from ..memory.events import ErasedElsewhere
from ..store.relay import EventRelayStore
from ..store.sequences import EventSequenceStore

__all__ = ["Event", "EventBus", "Feed", "SharedFeed", "Subscription", "SUBSCRIBER_QUEUE", "SinceAheadError",
           "RESERVE"]

_log = logging.getLogger("gieok.server.events")
RESERVE = 100  # event ids a process reserves at a time in the home store (one write per this many events)


class SinceAheadError(InvalidInputError):
    """`since` names an event this stream never had: 409 (`since_ahead`), with the latest id."""

    def __init__(self, since: int, latest: int) -> None:
        super().__init__(f"since={since} is ahead of this stream, whose latest event is {latest}: it is not an id "
                         f"of this server's stream (another deployment, or a memory restored from a backup). Resume "
                         f"with since={latest} for what comes next, or since=0 for what the buffer holds")
        self.since, self.latest = since, latest

SHARED_WAIT_MS = 1000  # a shared feed's blocking read: how soon it notices it was closed
SHARED_RECENT_SCAN = 5000  # events `recent` looks through for one type in a shared log

SUBSCRIBER_QUEUE = 2000  # events a subscriber may be behind before it is cut off


@dataclass(eq=False)
class Subscription:
    """One client's live feed: the events published after it subscribed."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Event | None] = field(default_factory=lambda: asyncio.Queue(SUBSCRIBER_QUEUE))
    lagged: bool = False

    def deliver(self, event: Event) -> None:  # runs in the subscriber's loop
        if self.lagged:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.lagged = True
            self.queue._queue.clear()  # type: ignore[attr-defined]  # nothing it holds is wanted now
            self.queue.put_nowait(None)



@dataclass
class _TenantLog:
    buffer: deque[Event]
    seq: int = 0  # the last id issued (by this process, or before it started: its floor)
    reserved: int = 0  # ids up to this one are this process's to issue (home store reservation)
    subscribers: set[Subscription] = field(default_factory=set)
    # mark (`event_marks`: a block it names, the message it came from …) -> ids of the buffered events
    # holding it: a deleted or edited message's redactions find their events here instead of reading
    # the whole buffer (32 ms at 10,000)
    named: dict[str, list[int]] = field(default_factory=dict)
    prune_at: int = 0  # `named` is rid of the marks of events gone from the buffer when it grows past this

    def add(self, event: Event) -> None:
        """`event` at the end of the buffer, indexed by its marks."""
        self.buffer.append(event)
        for mark in event_marks(event.type, event.data):
            self.named.setdefault(mark, []).append(event.seq)
        if len(self.named) > max(self.prune_at, 4 * (self.buffer.maxlen or len(self.buffer))):
            oldest = self.buffer[0].seq
            self.named = {mark: kept for mark, seqs in self.named.items()
                          if (kept := [seq for seq in seqs if seq >= oldest])}
            # the buffered events may hold more marks than 4 a slot: not again at the very next add
            self.prune_at = 2 * len(self.named)

    def redact(self, redaction: Redaction) -> None:
        """The buffered events `redaction` says carry erased data, replaced by `REDACTED` (same ids):
        those the index has for its marks, or, without marks (a user's erasure), those its `held`
        picks out of the whole buffer."""
        if redaction.marks is not None:
            seqs = {seq for mark in redaction.marks for seq in self.named.pop(mark, ())}
            if not seqs:
                return
            self.buffer = deque((Event(e.seq, e.type, e.time, dict(REDACTED)) if e.seq in seqs else e
                                 for e in self.buffer), maxlen=self.buffer.maxlen)
            return
        self.buffer = deque((Event(e.seq, e.type, e.time, dict(REDACTED)) if redaction.held(e) else e
                             for e in self.buffer), maxlen=self.buffer.maxlen)


class Feed:
    """One consumer's events: the replay, then live ones. `next()` may be cancelled safely (a
    WebSocket waits on it and on the client at once); it returns None once the feed is over —
    after a final `stream.lagged` event when the consumer fell too far behind."""

    def __init__(self, bus: EventBus, tenant: str, subscriber: Subscription, replay: deque[Event]) -> None:
        self._bus, self._tenant, self._subscriber, self._replay = bus, tenant, subscriber, replay
        self._over = False

    async def next(self) -> Event | None:
        if self._replay:
            return self._replay.popleft()
        if self._over:
            return None
        event = await self._subscriber.queue.get()
        if event is None:
            self.close()
            return Event(0, "stream.lagged", self._bus.clock(), {
                "message": "this client fell too far behind; reconnect with since=<last seq seen>"})
        return event

    def close(self) -> None:
        self._over = True
        self._bus._drop(self._tenant, self._subscriber)


def _gap(since: int, oldest: int, now: float) -> Event:
    return Event(0, "stream.gap", now, {
        "requested_since": since, "oldest_available": oldest, "missed": oldest - since - 1,
        "message": "the buffer no longer reaches back that far; events in between are lost"})


class SharedFeed:
    """One consumer's events from the shared log: a task reads the tenant's Redis stream after
    the last sequence seen and queues what it finds (so `next()` may be cancelled safely). A jump
    in the sequence — events trimmed before this reader got to them — becomes a `stream.gap`
    event; Redis going away ends the feed after a `stream.lagged` event (the client resumes with
    `since`)."""

    def __init__(self, bus: EventBus, tenant: str, after: int) -> None:
        assert bus.shared is not None
        self._bus, self._tenant, self._log = bus, tenant, bus.shared
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self._over = False
        self._task = asyncio.get_running_loop().create_task(self._pump(after))

    async def _pump(self, after: int) -> None:
        client = self._log.connection.async_client(blocking_seconds=SHARED_WAIT_MS / 1000)
        try:
            while True:
                for logged in await self._log.read_after(client, self._tenant, after, SHARED_WAIT_MS):
                    if logged.seq > after + 1:
                        await self._queue.put(_gap(after, logged.seq, self._bus.clock()))
                    await self._queue.put(logged)
                    after = logged.seq
        except CoordinationUnavailableError as exc:
            await self._queue.put(Event(0, "stream.lagged", self._bus.clock(), {
                "message": f"the shared event log is unreachable ({exc}); reconnect with since=<last seq seen>"}))
            await self._queue.put(None)
        finally:
            await client.aclose()

    async def next(self) -> Event | None:
        if self._over:
            return None
        event = await self._queue.get()
        if event is None:
            self.close()
        return event

    def close(self) -> None:
        if not self._over:
            self._over = True
            self._task.cancel()
            self._bus._feed_closed(self._tenant)


def relay_written(relay: EventRelayStore, tenant: str, type: str, at: float, data: dict[str, Any],
                  redaction: Redaction | None, claimed_by: str | None = None) -> int:
    """`type`/`data` written to the relay for the servers to stream (the relay's id): an erasure
    (`redaction`) first redacts the relay's rows that held the data, as each server's buffer then
    does; its row is whole (a `user.erased` names the user), for the servers to redact with it."""
    if redaction is not None:
        held = redaction.held
        relay.redact(tenant, lambda held_type, held_data: held(Event(0, held_type, 0.0, held_data)), dict(REDACTED))
    return relay.append(tenant, type, at, data, claimed_by=claimed_by)


class EventBus:
    """Per-tenant sequences and ring buffers of events; `publish` from any thread, `feed` to
    consume one tenant's events in an event loop. With `shared`, the sequences and buffers are
    the deployment's Redis streams instead (module docstring)."""

    def __init__(self, buffer: int = 10_000, *, clock: Callable[[], float] = time.time,
                 shared: SharedEventLog | None = None, sequences: EventSequenceStore | None = None) -> None:
        self.buffer = max(1, buffer)
        self.clock = clock
        self.shared = shared
        self.sequences = sequences  # where ids survive a restart (the home store); None: from 1 in each process
        # A process without a stream of its own (`gieok mcp`): events go to the store's relay, and every
        # `gieok serve` on the memory streams them with ids of its own (server/relay.py)
        self.relay: EventRelayStore | None = None
        # the relay rows of `user.erased` this process wrote — they name the user — with when, and who
        # claimed them (a server telling its siblings: itself; None: for the servers to take up)
        self.relayed_erasures: list[tuple[int, float, str | None]] = []
        # A server process's own stream among others (`--workers N`, no Redis): what an erasure here
        # redacted is told to them, who redact theirs (`RelayPump.tell`; set by the server's pump)
        self.siblings: Callable[[str, str, float, dict[str, Any]], None] | None = None
        self._logs: dict[str, _TenantLog] = {}
        self._lock = threading.Lock()
        self._shared_feeds: dict[str, int] = {}  # tenant -> open shared feeds in this process

    def _log(self, tenant: str) -> _TenantLog:
        log = self._logs.get(tenant)
        if log is None:
            floor = self.sequences.next_seq(tenant) - 1 if self.sequences is not None else 0
            log = self._logs[tenant] = _TenantLog(deque(maxlen=self.buffer), seq=floor, reserved=floor)
        return log

    def _next_seq(self, tenant: str, log: _TenantLog) -> int:
        """The next id of `tenant`'s stream (under the lock): reserved a block at a time."""
        if self.sequences is not None and log.seq >= log.reserved:
            start = self.sequences.reserve(tenant, RESERVE)
            log.seq = max(log.seq, start - 1)  # another process reserved in between: its ids are skipped
            log.reserved = start + RESERVE - 1
        log.seq += 1
        return log.seq

    def close(self) -> None:
        """Give back the ids reserved and not used (a clean stop: the next process goes on from here)."""
        if self.sequences is None:
            return
        with self._lock:
            unused = [(tenant, log.reserved, log.seq) for tenant, log in self._logs.items() if log.reserved > log.seq]
        for tenant, reserved, used in unused:
            self.sequences.give_back(tenant, reserved + 1, used)

    def check_since(self, tenant: str, since: int | None) -> None:
        """`SinceAheadError` when `since` is beyond the latest event of `tenant`'s stream."""
        if since is not None and since > (latest := self.last_seq(tenant)):
            raise SinceAheadError(since, latest)

    def publish(self, tenant: str, type: str, data: dict[str, Any], *, at: float | None = None,
                relayed: bool = False) -> Event:
        """An event that says data was erased (`coordination.events.redaction_of`: a user's erasure, a
        forgotten block, a deleted or edited message, summary items withdrawn) first redacts the
        buffered events that held that data (`user.erased` is published with counts only), and is
        told to the `siblings` unless it came from them (`relayed`). `at`: when it happened (an
        event relayed from another process); default now. With a `relay` the event gets no id here
        (seq 0): the servers that stream it give it theirs."""
        if self.shared is not None:
            now = self.clock() if at is None else at
            seq = self.shared.append(tenant, type, now, data)
            return Event(seq, type, now, redaction_of(type, data)[1])
        redaction, published = redaction_of(type, data)
        if self.relay is not None:
            now = self.clock() if at is None else at
            relay_id = relay_written(self.relay, tenant, type, now, data, redaction)
            if type == USER_ERASED:
                self.relayed_erasures.append((relay_id, time.monotonic(), None))
            return Event(0, type, now, published)
        with self._lock:
            log = self._log(tenant)
            if redaction is not None:
                log.redact(redaction)
            event = Event(self._next_seq(tenant, log), type, self.clock() if at is None else at, published)
            log.add(event)
            subscribers = list(log.subscribers)
        if redaction is not None and self.siblings is not None and not relayed:
            try:
                self.siblings(tenant, type, event.time, data)
            except GieokError as exc:  # the store is away: the others redact at their next read or replay
                _log.warning("could not tell the other server processes of an erasure: %s", exc)
        for subscriber in subscribers:
            try:
                subscriber.loop.call_soon_threadsafe(subscriber.deliver, event)
            except RuntimeError:  # its loop is closed: the client is gone
                self._drop(tenant, subscriber)
        return event

    def forgotten_elsewhere(self, tenant: str, blocks: Sequence[int] | None,
                            forgotten_among: Callable[[Sequence[int]], list[int]]) -> None:
        """Blocks of `tenant` another process erased (None: which, its memory cannot tell — those of
        the buffered events' blocks that are forgotten, asked of the store): this process's buffer
        redacts its events of them, as the erasing process's `memory.forgotten` did there. Nothing
        to do when the log is shared (Redis, the relay): the erasing process redacted it."""
        if self.shared is not None or self.relay is not None:
            return
        named = self._buffered_blocks(tenant) if blocks is None else []
        erased = blocks if blocks is not None else (forgotten_among(named) if named else [])
        redaction = redaction_of(MEMORY_FORGOTTEN, {"block_indices": list(erased)})[0]
        if redaction is not None:  # as the erasing process's `memory.forgotten` redacted its own
            with self._lock:
                log = self._logs.get(tenant)
                if log is not None:
                    log.redact(redaction)

    def holds_blocks_of(self, tenant: str) -> bool:
        """Whether this process's own buffer (not a shared log) holds events of `tenant` naming
        blocks: a replay of them asks the tenant's memory first which are still live
        (`TenantRegistry.refresh`), as another worker may have erased them."""
        return bool(self._buffered_blocks(tenant))

    def _buffered_blocks(self, tenant: str) -> list[int]:
        """The blocks named by the events this process's own buffer holds of `tenant` (its mark
        index, without the marks of events the buffer let go and the index still keeps); none
        when the log is shared (Redis, the relay)."""
        if self.shared is not None or self.relay is not None:
            return []
        with self._lock:
            log = self._logs.get(tenant)
            if log is None or not log.buffer:
                return []
            oldest = log.buffer[0].seq
            return [int(mark[1:]) for mark, seqs in log.named.items() if mark[0] == "b" and seqs[-1] >= oldest]

    def erased_elsewhere(self, tenant: str) -> ErasedElsewhere:
        """What a tenant's memory calls (`MemoryEvents.on_erased_elsewhere`) when another process
        erased its blocks."""
        return functools.partial(self.forgotten_elsewhere, tenant)

    def listener(self, tenant: str) -> Callable[[str, dict[str, Any]], None]:
        """What a tenant's memory calls (`Memory.listener`) to publish into this bus."""
        def publish(type: str, data: dict[str, Any]) -> None:
            self.publish(tenant, type, data)

        return publish

    def last_seq(self, tenant: str) -> int:
        if self.shared is not None:
            return self.shared.last_seq(tenant)
        with self._lock:
            return self._log(tenant).seq

    def recent(self, tenant: str, type: str | None = None, n: int = 100) -> list[Event]:
        """The tenant's last `n` buffered events (of one `type` when given), oldest first: what
        the dashboard charts without subscribing (the search latencies of the last searches)."""
        found: list[Event] = []
        if self.shared is not None:
            scanned = self.shared.latest(tenant, n if type is None else SHARED_RECENT_SCAN)
            found = [e for e in scanned if type is None or e.type == type][:n]
            return found[::-1]
        with self._lock:
            log = self._logs.get(tenant)
            for event in reversed(log.buffer if log else ()):
                if len(found) >= n:
                    break
                if type is None or event.type == type:
                    found.append(event)
        return found[::-1]

    def _drop(self, tenant: str, subscriber: Subscription) -> None:
        with self._lock:
            log = self._logs.get(tenant)
            if log is not None:
                log.subscribers.discard(subscriber)

    def feed(self, tenant: str, since: int | None = None) -> Feed | SharedFeed:
        """A feed of `tenant`'s events (call it in the consumer's event loop): with `since`, first
        the buffered ones after it (`since=0`: all the buffer holds), then live ones as they come.
        Close it when done."""
        if self.shared is not None:
            after = self.shared.last_seq(tenant) if since is None else since
            with self._lock:
                self._shared_feeds[tenant] = self._shared_feeds.get(tenant, 0) + 1
            return SharedFeed(self, tenant, after)
        subscriber = Subscription(asyncio.get_running_loop())
        with self._lock:  # replay and subscription at one instant: nothing falls between them
            log = self._log(tenant)
            replay: list[Event] = []
            if since is not None:
                replay = [event for event in log.buffer if event.seq > since]
                oldest = log.buffer[0].seq if log.buffer else log.seq + 1
                if since < log.seq and oldest > since + 1:
                    replay.insert(0, Event(0, "stream.gap", self.clock(), {
                        "requested_since": since, "oldest_available": oldest,
                        "missed": oldest - since - 1,
                        "message": "the buffer no longer reaches back that far; events in between are lost"}))
            log.subscribers.add(subscriber)
        return Feed(self, tenant, subscriber, deque(replay))

    def _feed_closed(self, tenant: str) -> None:
        with self._lock:
            self._shared_feeds[tenant] = max(0, self._shared_feeds.get(tenant, 0) - 1)

    def subscribers(self, tenant: str) -> int:
        """Feeds of `tenant` open in this process."""
        with self._lock:
            if self.shared is not None:
                return self._shared_feeds.get(tenant, 0)
            log = self._logs.get(tenant)
            return len(log.subscribers) if log else 0
