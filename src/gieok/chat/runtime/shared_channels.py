"""What several bot processes (Discord shards, replicas) share about the conversation, in Redis:

- **claims**: a message seen by two replicas is taken in by one (`claim_message`);
- **inboxes**: each channel's messages waiting for a turn, in arrival order, whichever process
  received them (`enqueue` / `drain`);
- **leases**: one process at a time runs a channel's turns (`try_lease` / `renew` / `release`),
  so a channel is debounced, batched and answered in one place and never twice; a lease that is
  not renewed (its process died) expires and another process takes the channel, its inbox and
  what the dead one had drained but not answered (the in-flight list). Each take of a lease
  counts up the channel's **fencing token**, which the store checks where the turn is written
  (`ConversationStore.check_fence`): a process that stalled past its lease cannot write a late turn;
- **wake-ups**: a pub/sub message tells the channel's owner that its inbox grew, or every process
  that the active channels changed;
- **active channels**: the set of channels the bot speaks in unprompted;
- **rate limits**: one unsolicited reply per channel and across all channels per window,
  reserved atomically so two processes cannot both take the same window.

Every hot-path call is asynchronous (the runtime's event loop never blocks on the network); the
rare administrative ones (`set_active`, seeding) are synchronous. Scripts make each multi-key
step atomic; the reasoning for why no message can be stranded is in `runtime/core.py`
(`_release_or_continue`)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ...coordination.connection import RedisConnection, redis_errors

__all__ = ["SharedChannels", "WAKE_INBOX", "WAKE_ACTIVE"]

log = logging.getLogger(__name__)

WAKE_INBOX = "inbox"  # a channel's inbox grew: its owner should drain it
WAKE_ACTIVE = "active"  # the active channels changed: reload them
# A message a replica watches (`claim_message` said -1) stays watched this many watch intervals
# after its last ask: a watcher late by an interval or two still finds its claim holding the
# channel's later messages back, and one that died lets them go after this long.
WATCH_MISSES = 3
# A drain's answer is kept this many leases for the same attempt asked again (`drain`): past a
# lease without its renewals the lease is gone anyway, and the drain answers None.
DRAIN_KEPT_LEASES = 4

# KEYS: seen, the channel's claim counter, claims not yet queued (zset by order), their deadlines
# and claimants (hash), the claimant's presence, the message's watch · ARGV: owner, ttl ms, message
# id, hold ms, lease ms, presence key prefix, watch ms — the message is ours (newly, already, or
# taken over): its place in the channel's order (> 0); 0 when another process took it and queued
# it; -1 while another process holds the claim and is alive. A claim whose process died before it
# queued the message (its presence, renewed with its leases, lapsed) is taken over by the next
# process that asks, in the same place: a replica that lost the claim watches it until it is
# queued (`BotCore`), so a process killed between its claim and its `enqueue` loses no message.
# Each ask of a watcher (-1) marks the message watched for a few watch intervals. Until it is
# queued, messages claimed after it wait in the inbox (`_DRAIN`): a process slow to store it (the
# database restarting) must not have a later message of the channel answered before it. The seen
# value is "owner|order", and "owner|order|q" once queued.
_CLAIM = """
local v = redis.call('GET', KEYS[1])
local order
if v then
  local owner, place, queued = string.match(v, '^(.*)|(%d+)(|?q?)$')
  if owner == ARGV[1] then return tonumber(place) end
  if queued ~= '' then return 0 end
  if redis.call('EXISTS', ARGV[6] .. owner) == 1 then
    redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[7])
    return -1
  end
  order = tonumber(place)
else
  order = redis.call('INCR', KEYS[2])
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. order, 'PX', ARGV[2])
redis.call('ZADD', KEYS[3], order, ARGV[3])
local t = redis.call('TIME')
local due = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[4])
redis.call('HSET', KEYS[4], ARGV[3], due .. '|' .. ARGV[1])
redis.call('SET', KEYS[5], '1', 'PX', ARGV[5])
return order
"""
# KEYS: inbox, waiting set, claims not yet queued, their deadlines, the message's seen key ·
# ARGV: channel key, payload, message id ('' for none), owner — queued (1), no longer holding
# back the messages claimed after it, and its claim settled (no other process takes it over); 0
# and nothing queued when another process holds its claim now (it took the claim over while this
# one was stopped: it queues the message itself). Safe to repeat: a message this owner queued
# already is not queued twice, and the answer is 1 again (a retry whose first answer was lost to a
# dropped connection after Redis carried it out).
_ENQUEUE = """
local v = ARGV[3] ~= '' and redis.call('GET', KEYS[5])
if v then
  local owner, queued = string.match(v, '^(.*)|%d+(|?q?)$')
  if owner ~= ARGV[4] then return 0 end
  if queued ~= '' then return 1 end
end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
if ARGV[3] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('HDEL', KEYS[4], ARGV[3])
  if v and string.sub(v, -2) ~= '|q' then redis.call('SET', KEYS[5], v .. '|q', 'KEEPTTL') end
end
return 1
"""
# KEYS: inbox, waiting set, lease, in flight, claims not yet queued, their deadlines, the last
# drain's answer · ARGV: channel key, owner, presence key prefix, the channel's watch key prefix,
# the drain's attempt id ('' for none), how long its answer is kept (ms) — everything queued that
# no earlier-claimed message is still on its way to (`_CLAIM`; a claim stops holding others back at
# its deadline, or once its process is gone — its presence, renewed with its leases, lapsed — and
# no replica watches it: a watched one is about to be taken over in its place, and a later message
# answered before it would be out of order);
# nothing (false) unless the caller holds the lease, so a process that lost it while stalled cannot
# take messages from the one that holds it now. What is drained stays in the channel's in-flight
# list until a turn took it (`done`): if the process dies first, the next holder finds it there. A
# channel is on the waiting set while its inbox or its in-flight list holds anything, so the
# processes' sweeps find the channel of a dead process that had drained its messages (and the
# messages held back here).
# Safe to repeat: the answer is kept under the attempt id (the channel's last drain only), and the
# same attempt asked again gets the same messages — a drain whose answer was lost (the connection
# dropped after Redis carried it out) would otherwise leave them in flight, unseen, to be answered
# after later ones or dropped at the release. Taking the lease moves the in-flight list back to the
# inbox, and forgets the kept answer with it (`_TAKE`).
_DRAIN = """
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return false end
if ARGV[5] ~= '' then
  local last = redis.call('GET', KEYS[7])
  if last and string.sub(last, 1, #ARGV[5] + 1) == ARGV[5] .. '|' then
    return cjson.decode(string.sub(last, #ARGV[5] + 2))
  end
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local due = redis.call('HGETALL', KEYS[6])
for i = 1, #due, 2 do
  local deadline, claimant = string.match(due[i + 1], '^(%d+)|(.*)$')
  if tonumber(deadline) <= now or (redis.call('EXISTS', ARGV[3] .. claimant) == 0
                                   and redis.call('EXISTS', ARGV[4] .. due[i]) == 0) then
    redis.call('ZREM', KEYS[5], due[i])
    redis.call('HDEL', KEYS[6], due[i])
  end
end
local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
local limit = first[2] and tonumber(first[2]) or nil
local items = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
local taken = {}
for i = 1, #items do
  local order = limit and cjson.decode(items[i])['order']
  if limit and type(order) == 'number' and order > limit then
    redis.call('RPUSH', KEYS[1], items[i])
  else
    redis.call('RPUSH', KEYS[4], items[i])
    taken[#taken + 1] = items[i]
  end
end
if redis.call('LLEN', KEYS[4]) == 0 and redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], ARGV[1])
end
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[7], ARGV[5] .. '|' .. (#taken > 0 and cjson.encode(taken) or '[]'), 'PX', ARGV[6])
end
return taken
"""
# KEYS: inbox, waiting set · ARGV: channel key, payloads (oldest first) — back at the head
_REQUEUE = """
for i = #ARGV, 2, -1 do redis.call('LPUSH', KEYS[1], ARGV[i]) end
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""
# KEYS: in flight, inbox, waiting set · ARGV: channel key, payloads a turn took (or duplicates)
_DONE = """
for i = 2, #ARGV do redis.call('LREM', KEYS[1], 1, ARGV[i]) end
if redis.call('LLEN', KEYS[1]) == 0 and redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('SREM', KEYS[3], ARGV[1])
end
return 1
"""
# KEYS: lease, fence counter, inbox, waiting set, in flight, the last drain's answer · ARGV: owner,
# ttl ms, channel key — the lease taken (or already ours, then extended) with the channel's next
# fencing token, else 0. What an earlier holder drained and no turn took goes back to the head of
# the inbox (it died, or lost the lease, before answering; a message it did answer is refused by
# its claim in the store), so the answer `_DRAIN` kept of it is forgotten. Safe to repeat: the
# lease is the caller's either way, with a newer token.
_TAKE = """
local taken = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not taken then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local stranded = redis.call('LRANGE', KEYS[5], 0, -1)
if #stranded > 0 then
  for i = #stranded, 1, -1 do redis.call('LPUSH', KEYS[3], stranded[i]) end
  redis.call('DEL', KEYS[5])
  redis.call('SADD', KEYS[4], ARGV[3])
end
redis.call('DEL', KEYS[6])
return redis.call('INCR', KEYS[2])
"""
# KEYS: fence counter · ARGV: the store's token — the counter moved past it (Redis lost its data)
_FENCE_FLOOR = """
local now = tonumber(redis.call('GET', KEYS[1]) or '0')
if now < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return redis.call('INCR', KEYS[1])
"""
# KEYS: lease · ARGV: owner, ttl ms
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: lease, in flight, inbox, waiting set · ARGV: owner, channel key — only our own lease is
# removed (with nothing in flight: the holder releases a channel when every message it drained
# has had its turn)
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  if redis.call('LLEN', KEYS[3]) == 0 then redis.call('SREM', KEYS[4], ARGV[2]) end
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# KEYS: channel window, global window · ARGV: channel ms, global ms (0: no window), the
# reservation's id — safe to repeat: windows this reservation took answer 1 again
_RESERVE = """
for i = 1, 2 do
  local holder = redis.call('GET', KEYS[i])
  if holder and holder ~= ARGV[3] then return 0 end
end
if tonumber(ARGV[1]) > 0 then redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[1]) end
if tonumber(ARGV[2]) > 0 then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2]) end
return 1
"""


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class SharedChannels:
    """The Redis side of the chat runtime (module docstring). One per process; `owner` is the
    process's identity in leases."""

    def __init__(self, connection: RedisConnection, *, lease_seconds: float = 30.0,
                 claim_seconds: float = 86_400.0, hold_seconds: float = 75.0, watch_seconds: float = 1.0) -> None:
        self.connection = connection
        self.owner = connection.owner
        self.lease_seconds = lease_seconds
        self.claim_seconds = claim_seconds
        self.hold_seconds = hold_seconds  # how long a claimed message not yet queued holds back later ones
        # how often a replica that lost a claim asks again (`BotCore`); the message counts as
        # watched for WATCH_MISSES of these after an ask
        self.watch_seconds = watch_seconds
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._errors = redis_errors()

    # -- clients ---------------------------------------------------------------------------------
    def _key(self, *parts: str) -> str:
        return self.connection.key(*parts)

    def _async(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self.connection.async_client()
            self._loop = loop
        return self._client

    async def _call(self, work: Callable[[Any], Awaitable[Any]]) -> Any:
        try:
            return await work(self._async())
        except self._errors as exc:
            raise self.connection.unavailable(exc) from None

    def _sync(self, work: Callable[[Any], Any]) -> Any:
        try:
            return work(self.connection.client)
        except self._errors as exc:
            raise self.connection.unavailable(exc) from None

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # -- claims ----------------------------------------------------------------------------------
    async def claim_message(self, channel_key: str, message_id: str) -> int:
        """The message's place in its channel's order (> 0) for the first process to claim it
        (replicas all receive it) — and again for that process (a retry whose answer was lost to
        a dropped connection) — and for a process that takes over the claim of one that died
        before it queued the message; 0 for the others once it is queued, -1 while its claimant
        lives and has not queued it yet (ask again every `watch_seconds`: `_CLAIM`). Messages of
        the channel claimed after it are not drained until it is queued (`enqueue` with its id) or
        `hold_seconds` have passed, or its claimant is gone and no replica asked for a while."""
        keys = [self._seen(channel_key, message_id), self._key("order", channel_key),
                self._claimed(channel_key), self._key("claimed-until", channel_key), self._alive(self.owner),
                self._watch(channel_key, message_id)]
        return int(await self._call(lambda r: r.eval(_CLAIM, 6, *keys, self.owner, _ms(self.claim_seconds),
                                                     message_id, _ms(self.hold_seconds), _ms(self.lease_seconds),
                                                     self._alive(""), _ms(WATCH_MISSES * self.watch_seconds))))

    def _seen(self, channel_key: str, message_id: str) -> str:
        return self._key("seen", channel_key, message_id)

    def _alive(self, owner: str) -> str:
        """A process's presence: renewed with its leases (`renew`), gone a lease after it stops."""
        return self._key("alive", owner)

    def _watch(self, channel_key: str, message_id: str) -> str:
        """A replica waits to take the message over: its claim keeps holding later ones back."""
        return self._key("watch", channel_key, message_id)

    def _claimed(self, channel_key: str) -> str:
        return self._key("claimed", channel_key)

    # -- inboxes ---------------------------------------------------------------------------------
    def _inbox(self, channel_key: str) -> str:
        return self._key("inbox", channel_key)

    async def enqueue(self, channel_key: str, payload: dict[str, Any], message_id: str | None = None) -> bool:
        """Queue a message for the channel's turn; `message_id`: the claim it settles (its
        payload carries its place, `order`, from `claim_message`). False, and nothing queued,
        when another process took the claim over (this one was stopped past its presence)."""
        data = json.dumps(payload, ensure_ascii=False)
        keys = [self._inbox(channel_key), self._key("waiting"), self._claimed(channel_key),
                self._key("claimed-until", channel_key), self._seen(channel_key, message_id or "")]
        return bool(await self._call(lambda r: r.eval(_ENQUEUE, 5, *keys, channel_key, data, message_id or "",
                                                      self.owner)))

    async def drain(self, channel_key: str, attempt: str = "") -> list[dict[str, Any]] | None:
        """Everything in the channel's inbox (bar what waits for an earlier-claimed message still
        on its way: `claim_message`), oldest first, and the inbox empty after; None when
        this process does not hold the channel's lease (any more). The messages stay in flight
        until `done`: a process that takes the channel next gets back those no turn took.
        `attempt`: an id of the caller's for this drain — asked again with the same id (its
        answer was lost: the connection dropped after Redis drained), the same messages come back
        (the channel's last drain is kept `DRAIN_KEPT_LEASES` leases)."""
        keys = [self._inbox(channel_key), self._key("waiting"), self._lease(channel_key), self._inflight(channel_key),
                self._claimed(channel_key), self._key("claimed-until", channel_key), self._last_drain(channel_key)]
        items = await self._call(lambda r: r.eval(_DRAIN, 7, *keys, channel_key, self.owner, self._alive(""),
                                                  self._watch(channel_key, ""), attempt,
                                                  _ms(DRAIN_KEPT_LEASES * self.lease_seconds)))
        if items is None:
            return None
        payloads = [json.loads(item) for item in items]
        if all(isinstance(p.get("order"), int) for p in payloads):  # in the order they were claimed
            payloads.sort(key=lambda p: p["order"])
        return payloads

    async def done(self, channel_key: str, payloads: list[dict[str, Any]]) -> None:
        """Drained messages a turn took (or that were duplicates): no longer in flight."""
        if payloads:
            data = [json.dumps(p, ensure_ascii=False) for p in payloads]
            keys = [self._inflight(channel_key), self._inbox(channel_key), self._key("waiting")]
            await self._call(lambda r: r.eval(_DONE, 3, *keys, channel_key, *data))

    def _inflight(self, channel_key: str) -> str:
        return self._key("inflight", channel_key)

    def _last_drain(self, channel_key: str) -> str:
        return self._key("drained", channel_key)

    async def requeue_front(self, channel_key: str, payloads: list[dict[str, Any]]) -> None:
        """Put drained messages back at the head of the inbox (a lease lost before their turn)."""
        if payloads:
            data = [json.dumps(p, ensure_ascii=False) for p in payloads]
            keys = [self._inbox(channel_key), self._key("waiting")]
            await self._call(lambda r: r.eval(_REQUEUE, 2, *keys, channel_key, *data))

    async def queued(self, channel_key: str) -> int:
        return int(await self._call(lambda r: r.llen(self._inbox(channel_key))))

    async def waiting(self) -> set[str]:
        """Channels whose inbox or in-flight list holds messages."""
        return set(await self._call(lambda r: r.smembers(self._key("waiting"))))

    # -- leases ----------------------------------------------------------------------------------
    def _lease(self, channel_key: str) -> str:
        return self._key("lease", channel_key)

    async def try_lease(self, channel_key: str) -> int:
        """Take the channel's lease (or extend ours): its new fencing token (> 0), which the store
        checks where the channel's turns are written — or 0 when another process holds it."""
        keys = [self._lease(channel_key), self._key("fence", channel_key), self._inbox(channel_key),
                self._key("waiting"), self._inflight(channel_key), self._last_drain(channel_key)]
        return int(await self._call(lambda r: r.eval(_TAKE, 6, *keys, self.owner, _ms(self.lease_seconds),
                                                     channel_key)))

    async def fence_floor(self, channel_key: str, stored: int) -> int:
        """A token newer than `stored` (the store's): Redis lost its counter (a restart without
        its data), and the store's fence only moves forward."""
        key = self._key("fence", channel_key)
        return int(await self._call(lambda r: r.eval(_FENCE_FLOOR, 1, key, int(stored))))

    async def renew(self, channel_keys: Iterable[str]) -> set[str]:
        """Extend our leases, and our presence (`_alive`); returns the channels whose lease we no
        longer hold."""
        keys = list(channel_keys)

        async def renew_all(r: Any) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            pipe.set(self._alive(self.owner), "1", px=_ms(self.lease_seconds))
            for key in keys:
                pipe.eval(_RENEW, 1, self._lease(key), self.owner, _ms(self.lease_seconds))
            return list(await pipe.execute())

        results = (await self._call(renew_all))[1:]
        return {key for key, ok in zip(keys, results) if not ok}

    async def release(self, channel_key: str) -> None:
        keys = [self._lease(channel_key), self._inflight(channel_key), self._inbox(channel_key), self._key("waiting")]
        await self._call(lambda r: r.eval(_RELEASE, 4, *keys, self.owner, channel_key))

    async def lease_holder(self, channel_key: str) -> str | None:
        holder = await self._call(lambda r: r.get(self._lease(channel_key)))
        return str(holder) if holder is not None else None

    # -- wake-ups --------------------------------------------------------------------------------
    async def notify(self, kind: str, channel_key: str = "") -> None:
        message = json.dumps({"kind": kind, "key": channel_key})
        await self._call(lambda r: r.publish(self._key("wake"), message))

    async def listen(self, on_wake: Callable[[str, str], None], ready: asyncio.Event | None = None,
                     stopping: Callable[[], bool] = lambda: False) -> None:
        """Call `on_wake(kind, channel_key)` for every wake-up until cancelled, or until `stopping()`
        (checked each second: a cancellation taken for a dropped connection still ends it). A
        dropped connection is retried; what was missed meanwhile is found by the owner's next
        drain and the periodic sweep, never lost (wake-ups only make things prompt)."""
        channel = self._key("wake")
        while not stopping():
            client = self.connection.async_client(blocking_seconds=1.0)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                if ready is not None:
                    ready.set()
                while not stopping():
                    message = await pubsub.get_message(timeout=1.0)
                    if message is None or message.get("type") != "message":
                        continue
                    try:
                        body = json.loads(message["data"])
                        on_wake(str(body["kind"]), str(body.get("key", "")))
                    except (ValueError, KeyError, TypeError):
                        log.warning("ignored a malformed wake-up on %s", channel)
            except self._errors as exc:
                log.warning("Redis wake-ups interrupted (%s); reconnecting", exc)
                await asyncio.sleep(0.5)
            finally:
                try:
                    await pubsub.aclose()
                    await client.aclose()
                except Exception:  # the connection is already gone
                    pass

    # -- active channels -------------------------------------------------------------------------
    def seed_active(self, stored: Iterable[str]) -> set[str]:
        """The shared set of active channels, filled from the store the first time any process of
        the deployment starts (the store stays the durable record)."""
        members = self._key("active")

        def seed(r: Any) -> set[str]:
            if r.set(self._key("active", "seeded"), self.owner, nx=True):
                keys = list(stored)
                if keys:
                    r.sadd(members, *keys)
            return set(r.smembers(members))

        return set(self._sync(seed))

    def set_active(self, channel_key: str, active: bool) -> None:
        members = self._key("active")
        self._sync(lambda r: r.sadd(members, channel_key) if active else r.srem(members, channel_key))
        message = json.dumps({"kind": WAKE_ACTIVE, "key": channel_key})
        self._sync(lambda r: r.publish(self._key("wake"), message))

    async def active_keys(self) -> set[str]:
        return set(await self._call(lambda r: r.smembers(self._key("active"))))

    # -- rate limits -----------------------------------------------------------------------------
    async def reserve_reply(self, channel_key: str, channel_seconds: float, global_seconds: float,
                            reservation: str = "") -> bool:
        """Take the channel's and the deployment's reply window for an unsolicited reply, or say
        that one was taken within them (by any process). `reservation`: an id of the caller's —
        asked again with it (the answer was lost), the windows it took answer True again."""
        keys = [self._key("rate", "channel", channel_key), self._key("rate", "global")]
        channel_ms = _ms(channel_seconds) if channel_seconds > 0 else 0
        global_ms = _ms(global_seconds) if global_seconds > 0 else 0
        held_by = reservation or f"{self.owner}|{uuid.uuid4().hex}"
        return bool(await self._call(lambda r: r.eval(_RESERVE, 2, *keys, channel_ms, global_ms, held_by)))

    async def note_reply(self, channel_key: str, channel_seconds: float, global_seconds: float) -> None:
        """The reply went out now: its windows start from now."""
        async def mark(r: Any) -> None:
            pipe = r.pipeline(transaction=False)
            if channel_seconds > 0:
                pipe.set(self._key("rate", "channel", channel_key), 1, px=_ms(channel_seconds))
            if global_seconds > 0:
                pipe.set(self._key("rate", "global"), 1, px=_ms(global_seconds))
            await pipe.execute()

        await self._call(mark)
