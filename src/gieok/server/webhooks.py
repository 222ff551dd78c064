"""Webhooks: a tenant's events — the ones its live stream carries (server/events.py) — posted to
the URLs its admin registered, signed as the Standard Webhooks spec says (`webhook-id`,
`webhook-timestamp`, `webhook-signature`), so any of the spec's libraries verifies them.

This module is the part the rest of the server talks to: registering, listing, rotating and
deleting a tenant's endpoints (the tenant is always the caller's key's), and the outbox — every
event published is queued in the store, one row per endpoint that wants it, in the thread that
published it (server/state.py wraps the event bus's listener with `listener`), and the delivery
loop is woken. The loop itself is server/webhook_delivery.py; where a URL may point,
server/webhook_addresses.py; the tables, store/webhooks.py.

An event is queued as it is published: from then on it is delivered at least once, across
restarts. A process killed between a memory write and the event it publishes loses that event
for webhooks as it does for the live stream."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio.to_thread

from ..coordination.events import REDACTED, Event, Redaction, event_marks, marks_field, redaction_of
from ..errors import GieokError, InvalidInputError, NotFoundError
from ..store.webhooks import MARKS_MAX, DeliveryRow, EndpointRow, WebhookStore
from .events import EventBus
from .settings import ServerSettings
from .webhook_addresses import Resolver, check_url, resolve_target, system_resolver
from .webhook_delivery import SECRET_PREFIX, STOP_SECONDS, WebhookDeliverer

__all__ = ["Webhooks", "new_secret", "event_body", "check_event_names", "MAX_ENDPOINTS", "SECRET_BYTES",
           "ROTATION_GRACE_SECONDS"]

log = logging.getLogger("gieok.server.webhooks")

SECRET_BYTES = 32  # the spec asks for 24 to 64
MAX_ENDPOINTS = 20  # per tenant: each is a copy of every event, and a caller of addresses
MAX_EVENT_NAMES = 64
ROTATION_GRACE_SECONDS = 86_400.0  # after a rotation the old secret signs too, this long
CACHE_SECONDS = 2.0  # a tenant's endpoints are looked up at most this often per process (others' changes)
_EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*(\.\*)?$")
# The live stream's families (docs/server.md, "The live event stream"): a name outside them can
# never match an event, so an endpoint registered with it would wait for nothing.
EVENT_FAMILIES = ("memory", "search", "summary", "fact", "guard", "turn", "user", "pipeline")

EventListener = Callable[[str, dict[str, Any]], None]


def new_secret() -> str:
    """`whsec_` and the base64 of 32 random bytes: the spec's secret format."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def event_body(event: Event) -> str:
    """What a receiver gets: the spec's `type`, `timestamp` and `data`, and the event's `seq` (its
    id in the tenant's stream, also the `webhook-id` header and SSE's `id:`)."""
    stamp = datetime.fromtimestamp(event.time, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps({"type": event.type, "timestamp": stamp, "seq": event.seq, "data": event.data},
                      ensure_ascii=False, default=str, separators=(",", ":"))


def check_event_names(events: Sequence[str] | None) -> tuple[str, ...]:
    """Event types as the stream names them (`memory.added`), or a family (`fact.*`); none: all."""
    if events is None:
        return ()
    if len(events) > MAX_EVENT_NAMES:
        raise InvalidInputError(f"events may name at most {MAX_EVENT_NAMES} event types")
    for name in events:
        if not isinstance(name, str) or not _EVENT_NAME.match(name) or len(name) > 100 \
                or name.split(".", 1)[0] not in EVENT_FAMILIES or "." not in name:
            raise InvalidInputError(f"events: {str(name)[:100]!r} is not an event type (like memory.added) or a "
                                    f"family of them (like fact.*) of {', '.join(f + '.*' for f in EVENT_FAMILIES)}")
    return tuple(dict.fromkeys(events))


class Webhooks:
    """One server process's webhooks: the tenants' endpoints, the outbox, the delivery loop."""

    def __init__(self, table: WebhookStore, settings: ServerSettings, *, resolver: Resolver = system_resolver,
                 clock: Callable[[], float] = time.time) -> None:
        self.table = table
        self.settings = settings
        self.resolver = resolver
        self.clock = clock
        self._cache: dict[str, tuple[float, list[EndpointRow]]] = {}
        self._lock = threading.Lock()
        self.deliverer: WebhookDeliverer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # -- endpoints (the tenant is always the caller's) -----------------------------------------------
    async def register(self, tenant: str, url: str, events: Sequence[str] | None) -> tuple[EndpointRow, str]:
        """A new endpoint of `tenant`; returns it and its secret (shown this once). The URL's host
        must resolve, and only to addresses webhooks may be sent to (webhook_addresses.py)."""
        target = check_url(url)
        names = check_event_names(events)
        await resolve_target(target, public_only=self.settings.webhook_public_only, resolver=self.resolver,
                             timeout=self.settings.webhook_timeout_seconds)
        if len(await anyio.to_thread.run_sync(self.table.endpoints, tenant)) >= MAX_ENDPOINTS:
            raise InvalidInputError(f"a tenant has at most {MAX_ENDPOINTS} webhook endpoints: delete one first")
        secret = new_secret()
        row = await anyio.to_thread.run_sync(self.table.add_endpoint, tenant, url, names, secret, self.clock())
        self._forget(tenant)
        return row, secret

    def endpoints(self, tenant: str) -> list[EndpointRow]:
        return self.table.endpoints(tenant)

    def delete(self, tenant: str, endpoint_id: int) -> None:
        if not self.table.delete_endpoint(endpoint_id, tenant):
            raise NotFoundError(f"no webhook endpoint {endpoint_id} in this tenant")
        self._forget(tenant)

    def rotate(self, tenant: str, endpoint_id: int) -> tuple[EndpointRow, str]:
        """A new secret for the endpoint; the old one signs beside it for ROTATION_GRACE_SECONDS."""
        secret = new_secret()
        row = self.table.rotate_secret(endpoint_id, tenant, secret, self.clock() + ROTATION_GRACE_SECONDS)
        if row is None:
            raise NotFoundError(f"no webhook endpoint {endpoint_id} in this tenant")
        self._forget(tenant)
        return row, secret

    def deliveries(self, tenant: str, endpoint_id: int, *, before: int | None, limit: int) -> list[DeliveryRow]:
        if self.table.endpoint(endpoint_id, tenant) is None:
            raise NotFoundError(f"no webhook endpoint {endpoint_id} in this tenant")
        return self.table.deliveries(endpoint_id, before=before, limit=limit)

    def _forget(self, tenant: str) -> None:
        with self._lock:
            self._cache.pop(tenant, None)

    def _endpoints_of(self, tenant: str) -> list[EndpointRow]:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(tenant)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        rows = self.table.endpoints(tenant)
        with self._lock:
            self._cache[tenant] = (now, rows)
        return rows

    # -- the outbox -----------------------------------------------------------------------------
    def listener(self, bus: EventBus) -> Callable[[str], EventListener]:
        """What the tenants' memories publish through: the bus's listener, and then the outbox."""
        def for_tenant(tenant: str) -> EventListener:
            def publish(type: str, data: dict[str, Any]) -> None:
                redaction = redaction_of(type, data)[0]
                event = bus.publish(tenant, type, data)
                if redaction is not None:
                    self.redact(tenant, redaction)
                self.queue(tenant, event)

            return publish

        return for_tenant

    def queue(self, tenant: str, event: Event) -> int:
        """Queue `event` for every endpoint of `tenant` that wants it, and wake the delivery loop."""
        wanted = [row for row in self._endpoints_of(tenant) if row.wants(event.type)]
        if not wanted or event.seq <= 0:
            return 0
        added = self.table.enqueue(wanted, event.seq, event.type, event_body(event), self.clock(),
                                   marks_field(event_marks(event.type, event.data)))
        self._wake()
        return added

    def redact(self, tenant: str, redaction: Redaction) -> int:
        """A user, blocks or a message were erased: the queued events that held the data are sent
        redacted, as the live stream's buffer keeps them (`coordination.events.redaction_of`). With
        a few marks, only the deliveries whose events hold them are read."""
        marks = redaction.marks
        naming = marks if marks is not None and len(marks) <= MARKS_MAX else None
        changed: dict[int, str] = {}
        for delivery_id, body in self.table.pending_bodies(tenant, naming):
            payload = json.loads(body)
            event = Event(int(payload.get("seq") or 0), str(payload.get("type")), 0.0, payload.get("data") or {})
            if redaction.held(event):
                changed[delivery_id] = json.dumps({**payload, "data": dict(REDACTED)}, ensure_ascii=False,
                                                  separators=(",", ":"))
        self.table.replace_bodies(changed)
        return len(changed)

    def _wake(self) -> None:
        loop, deliverer = self._loop, self.deliverer
        if loop is not None and deliverer is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
                loop.call_soon_threadsafe(deliverer.wake.set)

    # -- the delivery loop ------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None] | None:
        """The delivery loop on this event loop (the app's start-up), once; None when this
        process posts nothing (`webhook_poll_seconds = 0`)."""
        if self._task is None and self.settings.webhook_poll_seconds > 0:
            self.deliverer = WebhookDeliverer(self.table, self.settings, resolver=self.resolver, clock=self.clock,
                                              disabled=self._forget)
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self.deliverer.run(self._stop))
        return self._task

    async def stop(self) -> None:
        """Stop the loop: posts under way get STOP_SECONDS, then are cut off and given back to the
        queue (the next process posts them again: a receiver may see one twice). Before the
        store closes. Only on the loop that started it: another lifespan of the same state (a
        second test client of one app) found it running and leaves it to its starter."""
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            return
        task, stop = self._task, self._stop
        self._task = self._stop = None
        self._loop = None
        if task is None or stop is None:
            return
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_SECONDS + 5.0)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, GieokError):
                await task
        except GieokError as exc:
            log.warning("webhook deliveries stopped: %s", exc)
