"""The live event stream: what the memory and the bot do, as it happens, per tenant.

Each tenant has its own sequence (1, 2, 3 …) and a bounded ring buffer of its latest events, so a
client that reconnects with `since=N` gets what it missed, and is told (`stream.gap`) when the
buffer no longer reaches back that far. Sequences are per tenant so that nobody learns from the
numbers how busy another tenant is. Publishing is thread-safe and never blocks: the memory emits
from worker threads; each subscriber is an asyncio queue fed through its loop, and one that
falls too far behind is cut off (it reconnects with `since`) rather than holding memory.

Event types: memory.added, memory.forgotten, memory.promoted, search.answered, summary.updated,
fact.added, fact.superseded, fact.duplicate, guard.fired, turn.timings, pipeline.* (other
pipeline events), and stream.gap (sent to a subscriber only).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "EventBus", "Feed", "Subscription", "SUBSCRIBER_QUEUE"]

SUBSCRIBER_QUEUE = 2000  # events a subscriber may be behind before it is cut off


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    type: str
    time: float
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "type": self.type, "time": self.time, "data": self.data}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), ensure_ascii=False, default=str)


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
    seq: int = 0
    subscribers: set[Subscription] = field(default_factory=set)


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


class EventBus:
    """Per-tenant sequences and ring buffers of events; `publish` from any thread, `feed` to
    consume one tenant's events in an event loop."""

    def __init__(self, buffer: int = 10_000, *, clock: Callable[[], float] = time.time) -> None:
        self.buffer = max(1, buffer)
        self.clock = clock
        self._logs: dict[str, _TenantLog] = {}
        self._lock = threading.Lock()

    def _log(self, tenant: str) -> _TenantLog:
        log = self._logs.get(tenant)
        if log is None:
            log = self._logs[tenant] = _TenantLog(deque(maxlen=self.buffer))
        return log

    def publish(self, tenant: str, type: str, data: dict[str, Any]) -> Event:
        with self._lock:
            log = self._log(tenant)
            log.seq += 1
            event = Event(log.seq, type, self.clock(), data)
            log.buffer.append(event)
            subscribers = list(log.subscribers)
        for subscriber in subscribers:
            try:
                subscriber.loop.call_soon_threadsafe(subscriber.deliver, event)
            except RuntimeError:  # its loop is closed: the client is gone
                self._drop(tenant, subscriber)
        return event

    def listener(self, tenant: str) -> Callable[[str, dict[str, Any]], None]:
        """What a tenant's memory calls (`Memory.listener`) to publish into this bus."""
        def publish(type: str, data: dict[str, Any]) -> None:
            self.publish(tenant, type, data)

        return publish

    def last_seq(self, tenant: str) -> int:
        with self._lock:
            log = self._logs.get(tenant)
            return log.seq if log else 0

    def recent(self, tenant: str, type: str | None = None, n: int = 100) -> list[Event]:
        """The tenant's last `n` buffered events (of one `type` when given), oldest first: what
        the dashboard charts without subscribing (the search latencies of the last searches)."""
        found: list[Event] = []
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

    def feed(self, tenant: str, since: int | None = None) -> Feed:
        """A feed of `tenant`'s events (call it in the consumer's event loop): with `since`, first
        the buffered ones after it (`since=0`: all the buffer holds), then live ones as they come.
        Close it when done."""
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

    def subscribers(self, tenant: str) -> int:
        with self._lock:
            log = self._logs.get(tenant)
            return len(log.subscribers) if log else 0
