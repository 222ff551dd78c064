"""The webhook delivery loop of a serve process (one of its duties, beside server/duties.py's timer).

It claims due deliveries from the store's queue (store/webhooks.py: one worker per attempt, a dead
worker's claims lapse), signs each as the Standard Webhooks spec says, posts it to the address its
URL resolves to now (server/webhook_addresses.py) and records what the receiver said:

- 2xx: delivered.
- 410 Gone: the receiver does not want these any more: the endpoint is disabled and what is queued
  for it fails (register it again to start over).
- anything else — another status, a timeout (`webhook_timeout_seconds`), a refused connection, an
  address the rules refuse now — the delivery is tried again later: `webhook_retry_seconds` after the
  first failure, twice as long after each one after that (between half and the whole of it, at
  random, so receivers coming back are not hit by every sender at once), at most
  `webhook_retry_max_seconds` apart, until the event is `webhook_give_up_seconds` old (a day), when
  it is failed. Redirects are not followed (a 3xx is a failure).

A receiver that is down is not asked again for every queued event: when an endpoint's first attempt
of a round fails, the endpoint rests for the same doubling delay (kept in the store, so every worker
leaves it alone), and only events never tried yet get their one attempt meanwhile — one of them
getting through is how a receiver that came back is noticed at once, without waiting for the rest to
end. When it ends, one delivery probes the receiver: the oldest of those tried least, so an event the
receiver chokes on does not hold the others back. Each endpoint is posted to by one task at a time,
in event order after the probe (best effort: a retried event comes after the ones that got through
meanwhile). Every event is delivered at least once: a receiver dedupes by `webhook-id`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import anyio.to_thread
import httpx

from .. import __version__
from ..errors import GieokError
from ..store.webhooks import ClaimedDelivery, EndpointRow, WebhookStore
from .settings import ServerSettings
from .webhook_addresses import AddressRefusedError, Resolver, Target, check_url, resolve_target, system_resolver

__all__ = ["WebhookDeliverer", "sign", "retry_delay", "SECRET_PREFIX", "BATCH", "USER_AGENT"]

log = logging.getLogger("gieok.server.webhooks")

SECRET_PREFIX = "whsec_"
BATCH = 25  # deliveries claimed at a time; one endpoint's are posted one after another
CONCURRENT_ENDPOINTS = 16  # endpoints posted to at once
PURGE_EVERY_SECONDS = 3600.0
KEEP_SECONDS = 7 * 86_400.0  # delivered and failed deliveries are listed this long, then forgotten
ERROR_CHARS = 300
STOP_SECONDS = 2.0  # a stopping process lets posts under way finish this long, then gives them back
USER_AGENT = f"gieok-webhooks/{__version__}"


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` keyed with the secret's bytes
    (what follows `whsec_`, base64-decoded): the Standard Webhooks signature."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def retry_delay(failures: int, first: float, most: float, rng: random.Random | None = None) -> float:
    """Seconds before the next attempt after `failures` failures in a row: `first`, doubling, at
    most `most`; then between half and the whole of it, at random."""
    delay = min(first * 2 ** max(0, failures - 1), most)
    return delay * (rng or random).uniform(0.5, 1.0)


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int | None  # None: no HTTP answer (refused, timed out, address refused)
    error: str | None  # None: delivered

    @property
    def delivered(self) -> bool:
        return self.error is None


class _Clients:
    """The HTTP clients: one for http, and one per host name for https. A connection is pooled by
    the address it went to, while its TLS certificate was checked for one name: two names on one
    address must not share one. Each is made when a delivery first needs it: an httpx client loads
    the system's certificates when it is made (~0.2 s here), which a server without webhooks, and
    every start of one, should not pay."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.plain: httpx.AsyncClient | None = None
        self.tls: dict[str, httpx.AsyncClient] = {}

    def _new(self) -> httpx.AsyncClient:
        # trust_env=False: a proxy from the environment would connect to the name, not the checked address
        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout), follow_redirects=False, trust_env=False,
                                 limits=httpx.Limits(max_connections=CONCURRENT_ENDPOINTS * 2,
                                                     max_keepalive_connections=CONCURRENT_ENDPOINTS),
                                 headers={"User-Agent": USER_AGENT})

    def for_target(self, target: Target) -> httpx.AsyncClient:
        if target.scheme != "https":
            if self.plain is None:
                self.plain = self._new()
            return self.plain
        client = self.tls.get(target.host)
        if client is None:
            client = self.tls[target.host] = self._new()
        return client

    async def aclose(self) -> None:
        for client in (self.plain, *self.tls.values()):
            if client is not None:
                await client.aclose()


class WebhookDeliverer:
    """Claims, posts and records; `run` until stopped, woken early when this process queues an event.
    Each endpoint's deliveries are posted by a task of their own, so a receiver that hangs until the
    time limit holds up nobody else's."""

    def __init__(self, table: WebhookStore, settings: ServerSettings, *, resolver: Resolver = system_resolver,
                 clock: Callable[[], float] = time.time, disabled: Callable[[str], None] = lambda tenant: None) -> None:
        self.table = table
        self.disabled = disabled  # told the tenant whose endpoint a 410 disabled (its events stop being queued)
        self.settings = settings
        self.resolver = resolver
        self.clock = clock
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.wake = asyncio.Event()
        self._posting: dict[int, asyncio.Task[None]] = {}  # endpoint id -> the task posting to it
        self._claimed: set[int] = set()  # deliveries this process holds now (given back when it stops)
        self._purged = clock() - PURGE_EVERY_SECONDS + 60.0  # the first purge a minute after start, not at it

    @property
    def lease_seconds(self) -> float:
        """How long a claim holds: a whole batch posted to one endpoint at the time limit each."""
        return BATCH * (self.settings.webhook_timeout_seconds + 1.0) + 10.0

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: claim what is due and post it; then wait for the next poll or a wake-up."""
        clients = _Clients(self.settings.webhook_timeout_seconds)
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    claimed = await self.round(clients)
                except GieokError as exc:  # the store away for a moment: the next poll tries again
                    log.warning("webhook deliveries: %s", exc)
                    claimed = 0
                if not claimed:  # else there may be more due at once
                    await self._sleep(stop)
        finally:
            await self._wind_down()
            await clients.aclose()

    async def _wind_down(self) -> None:
        """Posts under way get STOP_SECONDS to finish; what was not recorded then goes back, due at once."""
        posting = list(self._posting.values())
        if posting:
            _, unfinished = await asyncio.wait(posting, timeout=STOP_SECONDS)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*posting, return_exceptions=True)
        if self._claimed:
            with contextlib.suppress(GieokError):
                await anyio.to_thread.run_sync(self.table.release, sorted(self._claimed), self.holder)
            self._claimed.clear()

    async def _sleep(self, stop: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=self.settings.webhook_poll_seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def round(self, clients: _Clients) -> int:
        """Claim what is due (but for the endpoints being posted to) and start posting it; returns
        how many deliveries were claimed."""
        now = self.clock()
        if now - self._purged >= PURGE_EVERY_SECONDS:
            self._purged = now
            await anyio.to_thread.run_sync(self.table.purge, now - KEEP_SECONDS)
        if len(self._posting) >= CONCURRENT_ENDPOINTS or \
                not await anyio.to_thread.run_sync(self.table.has_due, now):
            return 0
        claimed = await anyio.to_thread.run_sync(self.table.claim, self.holder, now, self.lease_seconds, BATCH,
                                                 sorted(self._posting))
        if not claimed:
            return 0
        self._claimed.update(c.delivery_id for c in claimed)
        groups: dict[int, list[ClaimedDelivery]] = {}
        for delivery in claimed:
            groups.setdefault(delivery.endpoint_id, []).append(delivery)
        endpoints = await anyio.to_thread.run_sync(self.table.endpoints_by_id, list(groups))
        for endpoint_id, deliveries in groups.items():
            task = asyncio.create_task(self._post_all(clients, endpoints.get(endpoint_id), deliveries))
            self._posting[endpoint_id] = task
            task.add_done_callback(functools.partial(self._posted, endpoint_id))
        return len(claimed)

    def _posted(self, endpoint_id: int, task: asyncio.Task[None]) -> None:
        self._posting.pop(endpoint_id, None)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("webhook delivery to endpoint %s: %s", endpoint_id, error,
                        exc_info=None if isinstance(error, GieokError) else error)
        self.wake.set()  # its endpoint may have more due

    async def _post_all(self, clients: _Clients, endpoint: EndpointRow | None,
                        deliveries: list[ClaimedDelivery]) -> None:
        try:
            await self._deliver_to(clients, endpoint, deliveries)
        except asyncio.CancelledError:
            raise  # the loop is stopping: it gives back what is left
        except BaseException:
            await self._give_back([d.delivery_id for d in deliveries])
            raise

    async def _give_back(self, delivery_ids: list[int]) -> None:
        """Release those of these deliveries this process still holds (not recorded: tried again)."""
        held = [i for i in delivery_ids if i in self._claimed]
        if held:
            await anyio.to_thread.run_sync(self.table.release, held, self.holder)
            self._claimed.difference_update(held)

    async def _deliver_to(self, clients: _Clients, endpoint: EndpointRow | None,
                          deliveries: list[ClaimedDelivery]) -> None:
        """One endpoint's share: the probe first (the oldest of those tried least), then the others
        in event order; once the receiver looks down, only events never tried get their attempt
        and the others go back untried (module docstring)."""
        if endpoint is None:  # deleted meanwhile with its queue, and what another process queued beside the delete
            await anyio.to_thread.run_sync(self.table.drop_orphans, deliveries[0].endpoint_id)
            self._claimed.difference_update(d.delivery_id for d in deliveries)
            return
        if endpoint.disabled_at is not None:
            for delivery in deliveries:
                await self._record(delivery, _Answer(None, "the endpoint is disabled"), endpoint)
            return
        fewest = min(d.attempts for d in deliveries)
        probe = next(d for d in deliveries if d.attempts == fewest)
        ordered = [probe, *(d for d in deliveries if d is not probe)]
        resting = endpoint.resting_until is not None and endpoint.resting_until > self.clock()
        reached = False
        for delivery in ordered:
            if resting and delivery.attempts > 0:
                await self._give_back([delivery.delivery_id])
                continue
            if self._too_old(delivery):
                await self._record(delivery, _Answer(None, "not delivered within webhook_give_up_seconds"),
                                   endpoint, final=True)
                continue
            answer = await self._attempt(clients, endpoint, delivery)
            if answer.status == 410:  # this delivery was tried (its attempt recorded); the rest are not sent
                await anyio.to_thread.run_sync(self.table.give_up, delivery.delivery_id, self.holder, self.clock(),
                                               410, "the receiver answered 410 Gone")
                await anyio.to_thread.run_sync(self.table.disable_endpoint, endpoint.endpoint_id,
                                               "the receiver answered 410 Gone", self.clock())
                self.disabled(endpoint.tenant)
                self._claimed.difference_update(d.delivery_id for d in deliveries)
                return
            await self._record(delivery, answer, endpoint)
            if answer.delivered:
                if not reached and (endpoint.failures or resting):
                    await anyio.to_thread.run_sync(self.table.wake_endpoint, endpoint.endpoint_id)
                reached, resting = True, False
            elif not reached and not resting:  # the receiver looks down: rest it
                now = self.clock()
                delay = retry_delay(endpoint.failures + 1, self.settings.webhook_retry_seconds,
                                    self.settings.webhook_retry_max_seconds)
                await anyio.to_thread.run_sync(self.table.rest_endpoint, endpoint.endpoint_id, now, now + delay)
                resting = True

    def _too_old(self, delivery: ClaimedDelivery) -> bool:
        return self.clock() >= delivery.created_at + self.settings.webhook_give_up_seconds

    async def _record(self, delivery: ClaimedDelivery, answer: _Answer, endpoint: EndpointRow, *,
                      final: bool = False) -> None:
        now = self.clock()
        table, holder = self.table, self.holder
        self._claimed.discard(delivery.delivery_id)
        if answer.delivered:
            await anyio.to_thread.run_sync(table.delivered, delivery.delivery_id, holder, now, answer.status or 0)
            return
        error = (answer.error or "")[:ERROR_CHARS]
        give_up_at = delivery.created_at + self.settings.webhook_give_up_seconds
        if final or endpoint.disabled_at is not None or now >= give_up_at:
            await anyio.to_thread.run_sync(table.give_up, delivery.delivery_id, holder, now, answer.status, error)
            return
        next_try = now + retry_delay(delivery.attempts + 1, self.settings.webhook_retry_seconds,
                                     self.settings.webhook_retry_max_seconds)
        await anyio.to_thread.run_sync(table.retry, delivery.delivery_id, holder, now, min(next_try, give_up_at),
                                       answer.status, error)

    async def _attempt(self, clients: _Clients, endpoint: EndpointRow,
                       delivery: ClaimedDelivery) -> _Answer:
        """One POST: signed now, to the address the name resolves to now (checked)."""
        settings = self.settings
        try:
            target = check_url(endpoint.url)
            address = await resolve_target(target, public_only=settings.webhook_public_only, resolver=self.resolver,
                                           timeout=settings.webhook_timeout_seconds)
        except AddressRefusedError as exc:
            return _Answer(None, f"refused: {exc}")
        now = self.clock()
        timestamp = int(now)
        msg_id = str(delivery.event_id)
        signatures = [sign(endpoint.secret, msg_id, timestamp, delivery.body)]
        if endpoint.previous_secret and endpoint.previous_until is not None and now < endpoint.previous_until:
            signatures.append(sign(endpoint.previous_secret, msg_id, timestamp, delivery.body))
        headers = {"Host": target.host_header, "Content-Type": "application/json", "webhook-id": msg_id,
                   "webhook-timestamp": str(timestamp), "webhook-signature": " ".join(signatures)}
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        client = clients.for_target(target)
        request = client.build_request("POST", target.url_for(address), content=delivery.body.encode("utf-8"),
                                       headers=headers, extensions=extensions)
        try:
            response = await client.send(request, stream=True)  # the receiver's body is never read
            await response.aclose()
        except httpx.TimeoutException:
            return _Answer(None, f"timed out after {settings.webhook_timeout_seconds:g} s")
        except httpx.HTTPError as exc:
            return _Answer(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        if 200 <= response.status_code < 300:
            return _Answer(response.status_code, None)
        return _Answer(response.status_code, f"HTTP {response.status_code}")
