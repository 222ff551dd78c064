"""The live event stream shared by every process of a deployment: one Redis stream per tenant.

Each event gets the tenant's next sequence number and is appended under the stream id
`<seq>-0` in one script, so the order is the same for every reader and `since=N` maps onto
`XRANGE`/`XREAD` from `N`. The stream is capped (`MAXLEN ~ buffer`): a reader that asks for
events older than what it holds is told how many it missed, as the in-process ring buffer does.
Any process appends (a bot's memory, a server's tenants); every server's `/v1/events` reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..store.sequences import EventSequenceStore
from .connection import RedisConnection, redis_errors

__all__ = ["SharedEventLog", "Event", "RESERVE", "USER_ERASED", "MEMORY_FORGOTTEN", "SUMMARY_WITHDRAWN", "Redaction",
           "redaction_of", "event_marks", "blocks_named", "marks_field", "REDACTED"]

RESERVE = 100  # with a store: ids recorded there this far ahead of the last one (one write per this many)

# KEYS: stream, sequence counter · ARGV: max length, event JSON, floor (the first id the counter may
# give when Redis lost it: the home store's record, so ids never start again at 1), the event's marks
# (`m`: `marks_field`, what `_REDACT_MARKED` reads)
_APPEND = """
if tonumber(ARGV[3]) > 1 and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], tonumber(ARGV[3]) - 1)
end
local seq = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], seq .. '-0', 'e', ARGV[2], 'm', ARGV[4])
return seq
"""

# KEYS: stream · ARGV: the first entry id to read, how many, then the erased marks. Deletes, inside
# Redis, the entries among those whose `m` holds one of them — without sending the stream to the
# client to parse (185 ms at 10,000 entries) — and returns {deleted, entries without `m` (appended
# before `m` existed: the client reads those itself), the last id read or ''}. A chunk at a time, so
# other clients' commands run between them rather than waiting for the whole stream.
_REDACT_MARKED = """
local erased = {}
for i = 3, #ARGV do erased[ARGV[i]] = true end
local gone, unread, last = {}, 0, ''
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])) do
  last = entry[1]
  local fields, named = entry[2], nil
  for i = 1, #fields, 2 do
    if fields[i] == 'm' then named = fields[i + 1] end
  end
  if named == nil then
    unread = unread + 1
  else
    for mark in string.gmatch(named, '[^\\n]+') do
      if erased[mark] then table.insert(gone, entry[1]); break end
    end
  end
end
for i = 1, #gone, 500 do
  redis.call('XDEL', KEYS[1], unpack(gone, i, math.min(i + 499, #gone)))
end
return {#gone, unread, last}
"""
_REDACT_CHUNK = 1_000  # stream entries a redaction reads in one script run


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a tenant's live stream: its sequence number in the tenant's stream (0 for the
    notices a feed adds, such as stream.gap), type, time and data. The server streams these."""

    seq: int
    type: str
    time: float
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "type": self.type, "time": self.time, "data": self.data}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), ensure_ascii=False, default=str)


USER_ERASED = "user.erased"  # a memory erased a user: `{"user", "blocks"}` (what its earlier events may hold)
REDACTED = {"redacted": "this event held data that was erased"}


MEMORY_FORGOTTEN = "memory.forgotten"  # a memory erased blocks: `{"block_indices"}` (what earlier events may hold)
SUMMARY_WITHDRAWN = "summary.withdrawn"  # items left a conversation's summary: `{"conversation", "items"}`
# a message deleted, or its old text replaced by an edit: `{"channel", "message_id", …}`
MESSAGE_ERASED = ("pipeline.message_deleted", "pipeline.message_edited")


@dataclass(frozen=True, slots=True)
class Redaction:
    """What an event that says data was erased redacts before it is published (`redaction_of`):
    `held` says whether an earlier event holds that data; `marks`, when set, are exactly the marks
    (`event_marks`) of those events, so a log that keeps them (the buffer's index, Redis's `m`
    field, the webhooks' `marks` column) finds them without reading every event. None for a
    user's erasure: their id in any string, which no mark holds — every event is read."""

    held: Callable[[Event], bool]
    marks: frozenset[str] | None


_REDACTING = frozenset({USER_ERASED, MEMORY_FORGOTTEN, SUMMARY_WITHDRAWN, *MESSAGE_ERASED})


def redaction_of(type: str, data: dict[str, Any]) -> tuple[Redaction | None, dict[str, Any]]:
    """For an event that says data was erased: which earlier events held that data — to be
    redacted wherever they are kept (a buffer, a Redis stream, the relay, webhooks' outbox) before
    it is published — and the data it is published with; `(None, data)` for any other event.

    - `user.erased` (`{"user", "blocks"}`): the events that name the user's id or one of the
      erased blocks; published with counts only (the stream must not say whose data it was).
    - `memory.forgotten` (`{"block_indices"}`: a deleted or edited message's turn, a forgotten
      block, an erased fact): the events that name one of the blocks — the `memory.added` that
      carried its text, a `search.answered` that showed it — published as it is.
    - `summary.withdrawn` (`{"conversation", "items"}`: summary items made from a deleted or edited
      message, or from an erased user's): the conversation's `summary.updated` events, which showed
      the summary with them; published as it is.
    - `pipeline.message_deleted` / `pipeline.message_edited` (`{"message_id", …}`): the events that
      say they came from that message (`"source"`: what the model made of it — a fact it stated,
      one dropped or rejected), whatever became of them; published as they are. (Message ids are
      the sender's, per conversation: one another conversation also used is redacted there too.)"""
    if type == USER_ERASED:
        user = str(data.get("user") or "")
        blocks = _block_set(data.get("blocks"))
        marks = frozenset(f"b{block}" for block in blocks)
        return Redaction(lambda event: _holds(event, marks) or bool(user and _names_user(event.data, user)),
                         None), {"blocks": len(blocks)}
    if type == MEMORY_FORGOTTEN:
        marks = frozenset(f"b{block}" for block in _block_set(data.get("block_indices")))
    elif type == SUMMARY_WITHDRAWN and isinstance(data.get("conversation"), dict):
        marks = frozenset({_conversation_mark(data["conversation"])})
    elif type in MESSAGE_ERASED and isinstance(data.get("message_id"), str):
        marks = frozenset({_mark("s", data["message_id"])})
    else:
        return None, data
    return (Redaction(lambda event: _holds(event, marks), marks) if marks else None), data


def _holds(event: Event, marks: frozenset[str]) -> bool:
    return bool(marks) and not marks.isdisjoint(event_marks(event.type, event.data))


def _block_set(value: Any) -> set[int]:
    return {int(b) for b in value or () if isinstance(b, int)} if isinstance(value, list) else set()


def event_marks(type: str, data: dict[str, Any]) -> set[str]:
    """What an event is found by when data it holds is erased (`Redaction.marks`): `b<N>` for each block
    it names (`blocks_named`), `s<ID>` for the message it says it came from (`"source"`), and for a
    `summary.updated`, the conversation whose summary it showed. The buffer indexes its events by
    them, Redis keeps them beside each entry (`marks_field`), webhooks' queue beside each delivery.
    An event that says what was erased (`redaction_of`'s) has none: it names the erased blocks and
    message, and holds nothing of them — a later look at which blocks are gone (a worker's replay)
    must leave it as it is."""
    if type in _REDACTING:
        return set()
    marks = {f"b{block}" for block in blocks_named(data)}
    source = data.get("source")
    if isinstance(source, str):
        marks.add(_mark("s", source))
    if type == "summary.updated" and isinstance(data.get("conversation"), dict):
        marks.add(_conversation_mark(data["conversation"]))
    return marks


def marks_field(marks: set[str] | frozenset[str]) -> str:
    """Marks as one string, each between line breaks (no mark holds one): what Redis keeps beside an
    entry and SQL matches with `LIKE` (`%` + line break + mark + line break + `%`)."""
    return "\n" + "\n".join(sorted(marks)) + "\n"


def _mark(kind: str, value: str) -> str:
    return kind + value.replace("\n", " ")


def _conversation_mark(conversation: dict[str, Any]) -> str:
    return "c" + json.dumps([conversation.get("guild"), conversation.get("channel")], ensure_ascii=False)


def blocks_named(data: Any) -> set[int]:
    """Every block an event's data names, at any depth: `block_index`, `block` or `source_block`
    holding an integer, `block_indices`, `blocks` or `forgotten` holding a list of them."""
    found: set[int] = set()
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("block_index", "block", "source_block") and isinstance(value, int):
                    found.add(value)
                elif key in ("block_indices", "blocks", "forgotten") and isinstance(value, list):
                    found.update(v for v in value if isinstance(v, int))
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _names_user(data: Any, user: str) -> bool:
    """Whether an event's data holds, at any depth, the string `user` or its `<user:ID>` tag."""
    tag = f"<user:{user}>"
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and (item == user or tag in item):
            return True
    return False


def _parse(entry: tuple[str, dict[str, str]]) -> Event:
    stream_id, fields = entry
    body = json.loads(fields["e"])
    return Event(int(stream_id.split("-", 1)[0]), body["type"], float(body["time"]), body["data"])


class SharedEventLog:
    """Per-tenant event streams in Redis (module docstring)."""

    def __init__(self, connection: RedisConnection, buffer: int = 10_000, *,
                 sequences: EventSequenceStore | None = None) -> None:
        self.connection = connection
        self.buffer = max(1, buffer)
        self._errors = redis_errors()
        # The ids also kept in the deployment's store, RESERVE ahead of the last one handed out: if Redis
        # loses the counter (a restart without persistence) it starts again above every id it gave.
        self.sequences = sequences
        self._floors: dict[str, int] = {}

    def _floor(self, tenant: str) -> int:
        if self.sequences is None:
            return 0
        floor = self._floors.get(tenant)
        if floor is None:
            floor = self._floors[tenant] = self.sequences.next_seq(tenant)
        return floor

    def _stream(self, tenant: str) -> str:
        return self.connection.key("events", tenant)

    def _sync(self, work: Any) -> Any:
        try:
            return work(self.connection.client)
        except self._errors as exc:
            raise self.connection.unavailable(exc) from None

    def append(self, tenant: str, type: str, time: float, data: dict[str, Any]) -> int:
        redaction, data = redaction_of(type, data)
        if redaction is not None:  # the stream's copies of the erased data go first
            if redaction.marks is not None:
                self.redact_marked(tenant, redaction.marks, redaction.held)
            else:
                self.redact(tenant, redaction.held)
        body = json.dumps({"type": type, "time": time, "data": data}, ensure_ascii=False, default=str)
        keys = [self._stream(tenant), self.connection.key("events", tenant, "seq")]
        floor = self._floor(tenant)
        marks = marks_field(event_marks(type, data))
        seq = int(self._sync(lambda r: r.eval(_APPEND, 2, *keys, self.buffer, body, floor, marks)))
        if self.sequences is not None and seq >= floor:
            self._floors[tenant] = seq + RESERVE
            self.sequences.raise_to(tenant, seq + RESERVE)
        return seq

    def listener(self, tenant: str, clock: Callable[[], float] = time.time) -> Callable[[str, dict[str, Any]], None]:
        """What a memory calls (`Memory.listener`) to publish into the tenant's stream: a bot
        process without a server of its own still feeds every server's `/v1/events`."""
        def publish(type: str, data: dict[str, Any]) -> None:
            self.append(tenant, type, clock(), data)

        return publish

    def redact_marked(self, tenant: str, marks: frozenset[str], held: Callable[[Event], bool]) -> int:
        """Delete the events holding one of `marks` (`Redaction.marks`), found inside Redis by the marks
        each entry was appended with; entries appended before those were recorded are read here
        with `held`. Returns how many."""
        if not marks:
            return 0
        stream, start, gone, unread = self._stream(tenant), "-", 0, 0
        erased = sorted(marks)
        while True:
            deleted, unknown, last = self._sync(
                lambda r, start=start: r.eval(_REDACT_MARKED, 1, stream, start, _REDACT_CHUNK, *erased))
            gone, unread = gone + int(deleted), unread + int(unknown)
            last = last.decode() if isinstance(last, bytes) else str(last)
            if not last:
                break
            start = "(" + last  # exclusive: after the last entry read
        if unread:
            return gone + self.redact(tenant, held)
        return gone

    def redact(self, tenant: str, held: Callable[[Event], bool]) -> int:
        """Delete the held events that `held` says carry erased data (a Redis stream cannot change
        an entry: a reader resuming across them is told of a gap). Returns how many."""
        stream = self._stream(tenant)
        gone = [stream_id for stream_id, fields in self._sync(lambda r: r.xrange(stream, "-", "+"))
                if held(_parse((stream_id, fields)))]
        if gone:
            self._sync(lambda r: r.xdel(stream, *gone))
        return len(gone)

    def last_seq(self, tenant: str) -> int:
        value = self._sync(lambda r: r.get(self.connection.key("events", tenant, "seq")))
        return int(value) if value else max(0, self._floor(tenant) - 1)

    def oldest_seq(self, tenant: str) -> int | None:
        first = self._sync(lambda r: r.xrange(self._stream(tenant), "-", "+", count=1))
        return _parse(first[0]).seq if first else None

    def after(self, tenant: str, since: int, count: int | None = None) -> list[Event]:
        """The held events with a sequence above `since`, oldest first."""
        entries = self._sync(lambda r: r.xrange(self._stream(tenant), f"({since}-0" if since > 0 else "-", "+",
                                                count=count))
        return [_parse(entry) for entry in entries]

    def latest(self, tenant: str, n: int) -> list[Event]:
        """The last `n` held events, newest first."""
        return [_parse(entry) for entry in self._sync(lambda r: r.xrevrange(self._stream(tenant), count=n))]

    async def read_after(self, client: Any, tenant: str, since: int, block_ms: int,
                         count: int = 500) -> list[Event]:
        """Events after `since`, waiting up to `block_ms` for the first (on an asyncio client of
        the caller's loop: `connection.async_client`)."""
        try:
            reply = await client.xread({self._stream(tenant): f"{since}-0"}, count=count, block=block_ms)
        except self._errors as exc:
            raise self.connection.unavailable(exc) from None
        return [_parse(entry) for _, entries in reply or () for entry in entries]
