"""The chat runtime: transport-agnostic bot core.

An adapter (Discord, the terminal) hands every incoming message to `BotCore.submit` and
gives the core an `Outbox` to send and edit messages with. The core:
- observes each message at once (guard, L1, long-term memory follow): nothing is lost, even
  when the bot stays silent or is rate-limited;
- debounces per channel (`debounce_seconds` after the channel's last message), then answers
  the consecutive messages of one user together (at most `max_batch`); other users' messages
  wait their turn;
- interrupt-and-merge: when the user being answered writes again while the reply is being
  planned, planning is cancelled and redone with the merged messages;
- runs channels in parallel, each channel serially;
- applies the rate limits to unsolicited replies, streams the reply with throttled edits,
  post-processes it (mentions, self-reference, ≤ 2,000-character chunks) and records the turn.
Time is injectable (`clock`, `sleep`) so tests run on virtual time.

With `shared` (a `coordination.SharedChannels` on the deployment's Redis), several processes —
Discord shards or replicas — run one bot: a message is claimed by the first process that sees
it, observed there, and put in its channel's shared inbox (a replica that lost the claim keeps its
copy until then, and takes the claim over if the claimant dies first); whichever process holds the channel's
lease drains the inbox into its debounce and runs the channel's turns, one at a time; a lease is
renewed while held and released when the channel has nothing left to do, so the next message may
be answered by any process; a dead process's lease expires and the others take its channels.
Rate limits and active channels are shared too. Without `shared`, all of it is in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ...errors import (
    CoordinationUnavailableError,
    DatabaseUnavailableError,
    GieokError,
    LeaseLostError,
    LLMError,
    NotFoundError,
)
from ...types import scope_from_key
from ..agent.context import AssembledPrompt, estimate_tokens
from ..agent.pipeline import ConversationPipeline, IncomingMessage, Observation, Plan
from ..agent.usage import message_tokens
from ..conversation.recent import conversation_key, conversation_of
from ..llm.base import LLM
from ..llm.tool_loop import run_tool_loop, tool_loop_options
from ..llm.tools import ToolContext
from ..settings import ChatSettings
from .calls import CallDetector
from .health import Health, TurnTimings
from .pause import reads_finished
from .postprocess import EditThrottle, SelfCorrector, render_mentions, stream_view
from .ratelimit import CallLimits, RateLimiter
from .shared import from_payload, to_payload
from .shared_channels import WAKE_ACTIVE, WAKE_INBOX, SharedChannels

__all__ = ["BotCore", "InboundMessage", "Outbox", "ChannelRef", "Reply"]

log = logging.getLogger(__name__)

RETRY_SECONDS = 0.5  # a turn the database or Redis refused is tried again after this …
# … but a call whose connection dropped is first asked again after only this: its answer may have
# been lost after Redis carried it out, and the next call connects afresh (every Redis call on a
# message's way is safe to repeat: runtime/shared_channels.py)
QUICK_RETRY_SECONDS = 0.05
MAX_ATTEMPTS = 60  # … this many times before its messages are given up (logged)
TAKEN_REMEMBERED = 10_000  # message ids a process remembers having taken in (redeliveries)
SUBMIT_PATIENCE_S = 60.0  # how long a message is held while the database or Redis is away
T = TypeVar("T")

# During an outage of every provider a channel is told once a minute, not at every failed reply (12
# calls in 26 s posted 12 apologies); the messages are stored all the same, and the next reply answers.
FAILURE_NOTICE_SECONDS = 60.0
FAILURE_MESSAGES = {
    "ko": "앗, 지금은 대답을 만들 수가 없어. 잠시 후에 다시 불러줘!",
    "en": "Sorry, I can't come up with an answer right now. Please try again in a moment!",
}
# Told once per window to a caller over a limit (the conversation's language), then quiet.
LIMIT_MESSAGES = {
    "ko": "조금만 천천히 불러줘! {seconds}초 뒤에 다시 대답할게. (하는 말은 다 기억하고 있어)",
    "en": "Give me a moment! I can answer you again in {seconds} s. (I still remember everything you say.)",
}
BUDGET_MESSAGES = {
    "ko": "오늘 이 서버에서 쓸 수 있는 대화량을 다 썼어. 내일 다시 불러줘! (하는 말은 다 기억하고 있어)",
    "en": "This server has used up today's conversation budget. Call me again tomorrow! "
          "(I still remember everything you say.)",
}
BUDGET_NOTICE_SECONDS = 3600.0  # a caller hears that the guild's budget is spent at most this often
TYPING_SECONDS = 8.0  # Discord shows a typing indicator ~10 s: renewed this often until the reply is out
QUIET_EXTRACTION_MIN_SECONDS = 5.0  # the idle extraction looks this often at least (half extraction_idle_seconds)


@dataclass(frozen=True)
class ChannelRef:
    channel: str
    guild: str | None = None  # None: a direct message


@dataclass(frozen=True)
class InboundMessage:
    """A chat message as any transport sees it."""

    ref: ChannelRef
    user_id: str
    content: str
    display_name: str | None = None
    message_id: str | None = None
    mentions: tuple[str, ...] = ()  # user ids mentioned
    reply_to_bot: bool = False
    timestamp: float | None = None
    privileged: bool = False  # an owner or moderator: the per-user and per-channel limits do not apply


class Outbox(Protocol):
    async def send(self, ref: ChannelRef, text: str, *, reply_to: str | None = None) -> str: ...

    async def edit(self, ref: ChannelRef, message_id: str, text: str) -> None: ...

    async def typing(self, ref: ChannelRef) -> None: ...


@dataclass
class Reply:
    ref: ChannelRef
    text: str
    message_ids: list[str]
    answered: list[str]  # the message ids this reply answers


@dataclass
class _Pending:
    message: InboundMessage
    observation: Observation
    explicit: bool
    arrived: float
    payload: dict[str, Any] | None = None  # shared mode: as drained from the inbox (in flight until claimed)
    claimed: bool = False  # a turn of this process took it (its L1 row is marked handled)
    attempts: int = 0  # turns that failed before taking it (the database or Redis away)
    claim_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # this copy's claim on its L1 row


def _order(pending: _Pending) -> tuple[float, int]:
    """Where a message stands in its channel: when it was sent (the transport's timestamp), then
    its L1 row."""
    return (pending.message.timestamp or 0.0, pending.observation.row.message_id)


@dataclass
class _Channel:
    ref: ChannelRef
    key: str
    pending: list[_Pending] = field(default_factory=list)
    last_arrival: float = 0.0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    worker: asyncio.Task | None = None
    planning_user: str | None = None
    planning_size: int = 0  # messages in the batch being planned
    failure_told: float | None = None  # when the channel was last told no model could answer
    planning_task: asyncio.Task | None = None
    merge_requested: bool = False
    busy: bool = False
    drain_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # shared inbox drained in order
    # L1 rows of the messages drained lately: a send retried after a dropped connection may have
    # queued a message twice, and it must still be answered once
    drained: deque[int] = field(default_factory=lambda: deque(maxlen=1000))
    # the drain whose answer has not arrived (the connection dropped after Redis may have drained):
    # asked again with the same id, Redis gives the same messages back (`SharedChannels.drain`)
    drain_attempt: str | None = None


class BotCore:
    """The bot without a transport: `submit` every channel message, get replies through the
    `Outbox` (module docstring: debounce, batching, merge, rate limits, streaming)."""

    def __init__(self, pipeline: ConversationPipeline, llm: LLM | None, *, outbox: Outbox,
                 settings: ChatSettings | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, bot_user_id: str | None = None,
                 generate: Callable[[Plan], Awaitable[Any]] | None = None, tools: Sequence[Any] | None = None,
                 shared: SharedChannels | None = None) -> None:
        self.pipeline = pipeline
        self.llm = llm
        self.outbox = outbox
        self.settings = s = settings or pipeline.settings
        self.clock = clock
        self.sleep = sleep
        self.bot_user_id = bot_user_id
        self.calls = CallDetector(s.call_names, bot_user_id)
        self.corrector = SelfCorrector(dict(s.self_corrections))
        self.limiter = RateLimiter(s.rate_limit_channel_seconds, s.rate_limit_global_seconds, clock)
        self.limits = CallLimits.of(s.user_limit_calls, s.user_limit_seconds, s.channel_limit_calls,
                                    s.channel_limit_seconds, clock)
        self.usage = pipeline.usage
        self.health = Health(model_calls=pipeline.usage.calls)
        self.last_timings: dict[str, TurnTimings] = {}
        self.turn_log: list[TurnTimings] = []  # the latest turns, all channels (bounded)
        self.last_plans: dict[str, Plan] = {}  # per channel key: the last turn's plan (prompt inspection)
        self.replies: list[Reply] = []  # bounded log for inspection and tests
        self._channels: dict[str, _Channel] = {}
        self.shared = shared
        self._leases: set[str] = set()  # channel keys whose lease this process holds
        self._fences: dict[str, int] = {}  # channel key → the fencing token of this process's lease
        self._taking: set[str] = set()  # channels the lease upkeep is taking over now
        self._taken: set[tuple[str, str]] = set()  # (channel, message id) this process took in lately
        self._taken_order: deque[tuple[str, str]] = deque()
        self._services: list[asyncio.Task] = []  # shared mode: wake-ups, lease upkeep
        # Set by `close` beside cancelling them: a loop that missed its cancellation still ends
        # (Python 3.11's asyncio.timeout, inside redis-py's reads, can turn a cancellation that
        # lands as its timeout fires into TimeoutError, which a loop takes for Redis being away).
        self._services_stop = asyncio.Event()
        self._chores: set[asyncio.Task] = set()  # shared mode: inbox drains, active-set reloads
        self._quiet: asyncio.Task | None = None  # the extraction of conversations that went quiet
        self._started = False
        stored = pipeline.tables.active_keys()
        self._active = shared.seed_active(stored) if shared is not None else stored
        self._closing = False
        self._closing_event = asyncio.Event()
        self._executor: Any = None
        self._custom_generate = generate
        # With tools the first answer must be complete to see whether it calls one, so tool
        # turns are not streamed; `tool_rounds = 0` (or no tools) streams every reply.
        self.tools = list(tools or []) if s.tool_rounds > 0 else []

    def set_bot_user(self, user_id: str) -> None:
        """The transport learned the bot's own user id (mentions of it are calls)."""
        self.bot_user_id = user_id
        self.calls = CallDetector(self.settings.call_names, user_id)

    @property
    def held_channels(self) -> frozenset[str]:
        """Shared mode: the channels this process runs now (holds the lease of)."""
        return frozenset(self._leases)

    # -- active channels ------------------------------------------------------------------------
    def is_active(self, ref: ChannelRef) -> bool:
        return ref.guild is None or conversation_key(ref.guild, ref.channel) in self._active

    def set_active(self, ref: ChannelRef, active: bool, by: str | None = None) -> None:
        key = conversation_key(ref.guild, ref.channel)
        self.pipeline.tables.set_active(key, active, time.time(), by)  # the durable record
        if self.shared is not None:
            self.shared.set_active(key, active)  # every process, at once
        (self._active.add if active else self._active.discard)(key)

    # -- intake ---------------------------------------------------------------------------------
    def _state(self, ref: ChannelRef) -> _Channel:
        key = conversation_key(ref.guild, ref.channel)
        state = self._channels.get(key)
        if state is None:
            state = self._channels[key] = _Channel(ref, key)
        return state

    def _start_worker(self, state: _Channel) -> None:
        if state.worker is None or state.worker.done():
            state.worker = asyncio.create_task(self._run(state), name=f"gieok-channel-{state.key}")

    def _channel(self, ref: ChannelRef) -> _Channel:
        state = self._state(ref)
        self._start_worker(state)
        return state

    def explicit(self, message: InboundMessage) -> bool:
        return self.calls.detect(message.content, mentions=message.mentions,
                                 reply_to_bot=message.reply_to_bot) is not None

    async def submit(self, message: InboundMessage) -> Observation | None:
        """Take a message in now (observed, stored); the reply, if any, comes after the debounce.
        Shared mode: None when another process (a replica) already took this message in."""
        if self._closing:
            raise GieokError("the bot is shutting down")
        self._ensure_executor()
        await self.start()
        self._extract_when_quiet()
        explicit = self.explicit(message)
        incoming = IncomingMessage(message.content, user_id=message.user_id, channel=message.ref.channel,
                                   guild=message.ref.guild, display_name=message.display_name, explicit=explicit,
                                   active=self.is_active(message.ref), timestamp=message.timestamp,
                                   message_id=message.message_id)
        if self.shared is None:
            return await self._take_in(message, self._channel(message.ref), incoming, explicit, 0)
        shared = self.shared
        state = self._state(message.ref)
        message_id = message.message_id
        order = 0  # its place in the channel's order (claim_message): later messages wait for it
        if message_id and (state.key, message_id) not in self._taken:
            order = await self._patiently(lambda: self._shared_step(shared.claim_message(state.key, message_id)))
        if message_id and order <= 0:
            self.health.duplicates += 1
            if order < 0:  # claimed by a live process that has not queued it yet: it may die first
                self._chore(self._watch_claim(message, state, incoming, explicit))
            return None
        if message_id:
            self._remember_taken(state.key, message_id)
        return await self._take_in(message, state, incoming, explicit, order)

    async def catch_up(self, ref: ChannelRef, recent: Sequence[InboundMessage]) -> list[str]:
        """Messages of a channel's history (read back by the adapter after it connects) that were
        said while no process of the bot was connected: a gateway delivers nothing said then, and
        a message whose receivers all died before queueing it is in no inbox. Each one the store
        does not know is submitted, oldest first — through the usual claim, so a replica taking
        the same history in, or a claim left by a dead process, takes it in once. Returns the ids
        of those taken in here."""
        ids = [m.message_id for m in recent if m.message_id]
        if not ids:
            return []
        key = conversation_key(ref.guild, ref.channel)
        known = await self._patiently(lambda: asyncio.to_thread(self.pipeline.tables.message_ids_known, key, ids))
        taken: list[str] = []
        for message in sorted(recent, key=lambda m: (m.timestamp or 0.0, m.message_id or "")):
            if not message.message_id or message.message_id in known or not message.content.strip():
                continue
            if await self.submit(message) is not None:
                taken.append(message.message_id)
        self.health.caught_up += len(taken)
        if taken:
            log.info("caught up %d message(s) of %s said while no process was connected", len(taken), key)
        return taken

    async def edit(self, message: InboundMessage) -> bool:
        """A message was edited where it was said: a message still waiting for its turn takes the
        new text; a stored one is replaced through the pipeline's edit path (its turn, its facts),
        and the bot's reply to it — which answered, and may repeat, the words no longer said — is
        erased from memory as at a deletion (while this process remembers which reply that was).
        Returns whether anything changed."""
        if not message.message_id:
            return False
        state = self._channels.get(conversation_key(message.ref.guild, message.ref.channel))
        for pending in state.pending if state is not None else ():
            if pending.message.message_id == message.message_id:
                pending.message = dataclasses.replace(pending.message, content=message.content)
        edited = await self.pipeline.edit_message(message.ref.guild, message.ref.channel, message.message_id,
                                                  message.content, user=message.user_id, name=message.display_name)
        if edited is not None:
            self.health.edited += 1
            await self._erase_stored(message.ref, self._replies_answering(message.ref, {message.message_id}))
        return edited is not None

    async def delete(self, ref: ChannelRef, message_ids: Sequence[str]) -> int:
        """Messages were deleted where they were said: any still waiting for their turn are
        dropped, and each stored one is erased with what came from it (its turn, facts only it
        stated) — and so is the bot's reply to it (which may repeat it), while this process
        remembers which reply that was (its last 1,000); a deleted reply of the bot's is erased
        too. Returns how many messages were erased."""
        gone = set(message_ids)
        state = self._channels.get(conversation_key(ref.guild, ref.channel))
        if state is not None:
            state.pending[:] = [p for p in state.pending if p.message.message_id not in gone]
        # a later part of a reply sent in several messages is stored as the reply, under its first id
        stored = list(dict.fromkeys(self._stored_as(ref, message_id) for message_id in message_ids))
        erased = await self._erase_stored(ref, [*stored, *(r for r in self._replies_answering(ref, gone)
                                                           if r not in stored)])
        self.health.deleted += erased
        return erased

    def _stored_as(self, ref: ChannelRef, message_id: str) -> str:
        """The id a message of the bot's is stored under: a reply sent in parts is one turn, named
        by its first part's id (this process remembers its last 1,000 replies)."""
        return next((reply.message_ids[0] for reply in self.replies
                     if reply.ref == ref and message_id in reply.message_ids[1:]), message_id)

    def _replies_answering(self, ref: ChannelRef, message_ids: set[str]) -> list[str]:
        """The stored ids of the bot's replies (this process remembers its last 1,000) that answered
        one of these messages, but for the replies among them."""
        return [reply.message_ids[0] for reply in self.replies
                if reply.ref == ref and reply.message_ids and message_ids.intersection(reply.answered)
                and reply.message_ids[0] not in message_ids]

    async def _erase_stored(self, ref: ChannelRef, message_ids: Sequence[str]) -> int:
        """Each stored message erased with what came from it; returns how many were."""
        erased = 0
        for message_id in message_ids:
            try:
                receipt = await self.pipeline.delete_message(ref.guild, ref.channel, message_id)
            except NotFoundError:
                continue  # never stored here (the bot never saw it)
            erased += int(receipt["erased"]["messages"])
        return erased

    def _remember_taken(self, key: str, message_id: str) -> None:
        """A claim answers its claimant yes again: a redelivery to this process is caught here."""
        self._taken.add((key, message_id))
        self._taken_order.append((key, message_id))
        if len(self._taken_order) > TAKEN_REMEMBERED:
            self._taken.discard(self._taken_order.popleft())

    async def _watch_claim(self, message: InboundMessage, state: _Channel, incoming: IncomingMessage,
                           explicit: bool) -> None:
        """A message this replica lost the claim of, kept until its claimant has queued it: if the
        claimant dies first (killed between its claim and its `enqueue`, its presence lapsed),
        this process takes the claim over — in the same place of the channel's order — and the
        message in (stored once: the pipeline knows its id). Asks every `shared.watch_seconds`,
        so the takeover comes at most a lease (the presence) and a watch interval after the
        death. Gives up after the claimant's own patience (storing the message, then queueing
        it: `_take_in`) and a lease, or at shutdown."""
        assert self.shared is not None and message.message_id is not None
        shared, message_id = self.shared, message.message_id
        deadline = self.clock() + 2 * SUBMIT_PATIENCE_S + shared.lease_seconds
        pause = shared.watch_seconds
        while not self._closing and self.clock() < deadline:
            await self._sleep_unless_closing(pause)
            if self._closing:
                return
            try:
                order = await self._shared_step(shared.claim_message(state.key, message_id))
            except (DatabaseUnavailableError, CoordinationUnavailableError):
                # asked again soon (once; then at the usual interval): an ask that went unanswered
                # leaves the message unwatched, and the messages claimed after it are let go once
                # it is (`_DRAIN`)
                pause = QUICK_RETRY_SECONDS if pause > QUICK_RETRY_SECONDS else shared.watch_seconds
                continue
            pause = shared.watch_seconds
            if order == 0:
                return  # queued by its claimant
            if order > 0:
                self.health.duplicates -= 1
                self.health.claims_taken_over += 1
                self._remember_taken(state.key, message_id)
                log.warning("took over message %s of %s: the process that claimed it died before queueing it",
                            message_id, state.key)
                await self._take_in(message, state, incoming, explicit, order)
                return

    async def _take_in(self, message: InboundMessage, state: _Channel, incoming: IncomingMessage, explicit: bool,
                       order: int) -> Observation:
        """Observe and store a message this process has (claimed), and queue it for its turn."""
        async def observe() -> Observation:
            try:
                return await asyncio.to_thread(functools.partial(
                    self.pipeline.observe, incoming, needed_now=self._fills_batch(state, message.user_id)))
            except Exception as exc:
                self.health.failed("observe", exc)
                raise

        observation = await self._patiently(observe)
        self.health.ok("observe")
        self.health.messages_in += 1
        if self.shared is None:
            self._arrive(state, _Pending(message, observation, explicit, self.clock()))
        else:
            shared = self.shared
            payload = {**to_payload(message, observation, explicit), **({"order": order} if order else {})}
            if await self._patiently(lambda: self._shared_step(shared.enqueue(state.key, payload,
                                                                              message.message_id))):
                await self._patiently(lambda: self._take_or_wake(state))
            else:  # stopped past its presence, this process lost the claim: the one that took it over queues it
                log.warning("message %s of %s: its claim was taken over while this process was stopped",
                            message.message_id, state.key)
        return observation

    async def _patiently(self, step: Callable[[], Awaitable[T]]) -> T:
        """A step of taking a message in, tried again while the database or Redis is away (a
        restart): the message is held here meanwhile, and fails only after SUBMIT_PATIENCE_S.
        (A replica that lost the message's claim to this process has dropped it: giving up at
        the first error would lose it.)"""
        deadline = self.clock() + SUBMIT_PATIENCE_S
        pause = QUICK_RETRY_SECONDS
        while True:
            try:
                return await step()
            except (DatabaseUnavailableError, CoordinationUnavailableError):
                if self._closing or self.clock() >= deadline:
                    raise
                await self.sleep(pause)
                pause = RETRY_SECONDS

    def _arrive(self, state: _Channel, pending: _Pending) -> None:
        """A message joins the channel's debounce (in the process that runs the channel), in the
        order the channel saw the messages: one handed back by a process that lost the channel,
        or received by the other replica a moment later, may arrive after a newer one."""
        at = len(state.pending)
        if pending.message.timestamp is not None:
            key = _order(pending)
            while at > 0 and state.pending[at - 1].message.timestamp is not None \
                    and _order(state.pending[at - 1]) > key:
                at -= 1
        state.pending.insert(at, pending)
        state.last_arrival = self.clock()
        if self._merges_into_plan(state, pending.message.user_id):
            state.merge_requested = True
            assert state.planning_task is not None  # _merges_into_plan checked it
            state.planning_task.cancel()
        state.wake.set()

    # -- shared mode: inboxes, leases, wake-ups ------------------------------------------------
    async def _shared_step(self, step: Awaitable[Any]) -> Any:
        try:
            result = await step
        except Exception as exc:
            self.health.failed("shared", exc)
            raise
        self.health.ok("shared")
        return result

    async def _take_or_wake(self, state: _Channel) -> None:
        """After a message went into the channel's inbox: run the channel here if no process
        does, else tell the process that does (this one included) to drain its inbox."""
        assert self.shared is not None
        if state.key in self._leases:
            self._drain_soon(state)
        elif token := await self._shared_step(self.shared.try_lease(state.key)):
            await self._took(state, token)
        else:
            await self._shared_step(self.shared.notify(WAKE_INBOX, state.key))

    async def _took(self, state: _Channel, token: int) -> bool:
        """This process now runs the channel, under fencing `token`: the store's fence moves to
        it first (from then on a turn of the process that ran the channel before is refused),
        what another process changed in its working memory since is read again, then its inbox
        is drained into the debounce. When the store cannot be reached, the lease goes back (the
        inbox waits for the next sweep) and this returns False."""
        assert self.shared is not None
        try:
            await self._advance_fence(state.key, token)
            await asyncio.to_thread(self.pipeline.memory.reload_conversation,
                                    conversation_of(state.ref.guild, state.ref.channel))
        except Exception as exc:
            self.health.failed("shared", exc)
            log.warning("could not take over %s: %s", state.key, exc)
            with contextlib.suppress(Exception):
                await self.shared.release(state.key)
            return False
        self._leases.add(state.key)
        self._start_worker(state)
        self._drain_soon(state)
        return True

    async def _take_over(self, state: _Channel, token: int) -> None:
        try:
            await self._took(state, token)
        finally:
            self._taking.discard(state.key)

    async def _advance_fence(self, key: str, token: int) -> None:
        assert self.shared is not None
        try:
            await asyncio.to_thread(self.pipeline.tables.fence_advance, key, token)
        except LeaseLostError:  # the store has a newer token than Redis: Redis lost its counter
            stored = await asyncio.to_thread(self.pipeline.tables.fence_token, key)
            token = await self._shared_step(self.shared.fence_floor(key, stored or 0))
            await asyncio.to_thread(self.pipeline.tables.fence_advance, key, token)
        self._fences[key] = token

    def _drain_soon(self, state: _Channel) -> None:
        self._chore(self._drain(state))

    def _chore(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Task) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("shared runtime chore failed: %r", task.exception())

    async def _drain(self, state: _Channel) -> None:
        """Move the channel's inbox into its debounce, in order (while this process holds it)."""
        assert self.shared is not None
        async with state.drain_lock:
            if state.key not in self._leases:
                return
            state.drain_attempt = state.drain_attempt or uuid.uuid4().hex
            drained = await self._shared_step(self.shared.drain(state.key, state.drain_attempt))
            state.drain_attempt = None  # answered: the next drain is a new one
            if drained is None:  # the lease expired while this process stalled: another runs it now
                self._leases.discard(state.key)
                state.wake.set()
                return
            passed_over: list[dict[str, Any]] = []
            for payload in drained:
                try:
                    fields, observation, explicit = from_payload(payload)
                    message = InboundMessage(ChannelRef(fields.pop("channel"), fields.pop("guild")), **fields)
                except (ValueError, TypeError, KeyError) as exc:  # stored, but cannot be answered here
                    log.error("a queued message in %s could not be read: %s", state.key, exc)
                    self.health.failed("shared", exc)
                    passed_over.append(payload)
                    continue
                if observation.row.message_id in state.drained:
                    passed_over.append(payload)
                    continue
                state.drained.append(observation.row.message_id)
                self._arrive(state, _Pending(message, observation, explicit, self.clock(), payload))
            if passed_over:
                await self._settle_in_flight(state.key, passed_over)

    async def _settle_in_flight(self, key: str, payloads: list[dict[str, Any]]) -> None:
        """Best effort: a message left in flight is only looked at again (and passed over: its
        L1 row is claimed) by the next process to take the channel, and forgotten at release."""
        assert self.shared is not None
        try:
            await self.shared.done(key, payloads)
        except Exception as exc:
            log.warning("could not mark %d message(s) of %s done: %s", len(payloads), key, exc)

    async def _release_or_continue(self, state: _Channel) -> bool:
        """The channel has nothing pending here: hand it back, unless work arrived meanwhile.
        Why no message is stranded: a sender enqueues, then tries the lease, and wakes the holder
        if that fails; the holder, before releasing, lets its turn blocks finish (so the next
        holder never writes the same L1 rows), drains once more, releases, and then looks at the
        inbox again — a message enqueued before that look is seen by it, and one enqueued after
        it finds the lease free for its sender."""
        assert self.shared is not None
        conversation = conversation_of(state.ref.guild, state.ref.channel)
        await self.pipeline.settle(conversation)
        if state.key in self._leases:  # what a write behind could not write (the database was away)
            try:
                await asyncio.to_thread(functools.partial(self.pipeline.commit_pending, conversation,
                                                          fence=self._fences.get(state.key)))
            except LeaseLostError:
                self._leases.discard(state.key)
            except Exception as exc:  # still away: the next holder writes them
                log.warning("turn blocks of %s left in L1 for now: %s", state.key, exc)
        await self._drain(state)
        if state.pending:
            return True
        # Each step repeated until answered (an answer lost to a dropped connection: the release,
        # or the take, may have happened): a channel released without the look after it would
        # leave a message that arrived meanwhile to the next sweep.
        shared = self.shared
        await self._patiently(lambda: self._shared_step(shared.release(state.key)))
        self._leases.discard(state.key)
        if (not self._closing and await self._patiently(lambda: self._shared_step(shared.queued(state.key)))
                and (token := await self._patiently(lambda: self._shared_step(shared.try_lease(state.key))))):
            if not await self._took(state, token):
                return False
            await self._drain(state)
            return True
        return False

    async def _hand_back(self, state: _Channel) -> None:
        """The lease was lost (not renewed in time): what this process had not yet answered goes
        back to the head of the inbox for the process that holds the channel now."""
        assert self.shared is not None
        waiting, state.pending = state.pending, []
        try:
            await self._shared_step(self.shared.requeue_front(
                state.key, [to_payload(p.message, p.observation, p.explicit) for p in waiting]))
        except BaseException:
            # maybe not handed back (the answer lost): kept, and handed back again on the next try;
            # a copy queued twice is answered once (the store's claim of its L1 row)
            state.pending[:0] = waiting
            raise
        for pending in waiting:  # if this process takes the channel again, they are new to it
            with contextlib.suppress(ValueError):
                state.drained.remove(pending.observation.row.message_id)
        await self._shared_step(self.shared.notify(WAKE_INBOX, state.key))
        log.warning("lost the lease of %s; %d message(s) handed back", state.key, len(waiting))

    def _on_wake(self, kind: str, key: str) -> None:
        if kind == WAKE_INBOX and key in self._leases and key in self._channels:
            self._drain_soon(self._channels[key])
        elif kind == WAKE_ACTIVE:
            self._chore(self._reload_active())

    async def _reload_active(self) -> None:
        assert self.shared is not None
        self._active = await self._shared_step(self.shared.active_keys())

    async def start(self) -> None:
        """Shared mode: join the deployment — listen for wake-ups, keep leases alive, take over
        channels nobody runs (a process died), and write what a crash left only in L1, each
        channel under its lease. Called by the first `submit`, or by the adapter at start-up.
        Nothing to do in one process."""
        if self.shared is None or self._started or self._closing:
            return
        self._started = True
        ready = asyncio.Event()
        self._services.append(asyncio.create_task(self.shared.listen(self._on_wake, ready, self._services_stop.is_set),
                                                  name="gieok-wake"))
        await asyncio.wait_for(ready.wait(), timeout=self.shared.connection.timeout_seconds)
        # changed since this process read them, before it listened; asked again when the answer
        # was lost (a read): two bots of a 600 s chaos run exited here on one dropped connection
        await self._patiently(self._reload_active)
        await self._recover()
        self._services.append(asyncio.create_task(self._upkeep(), name="gieok-leases"))

    def _extract_when_quiet(self) -> None:
        """Extraction is batched per conversation (every analysis_every messages); what a
        conversation said after its last batch is extracted once it has been quiet for
        extraction_idle_seconds — looked at every half of that, under the store's lease (one
        process of a deployment at a time: `ConversationPipeline.extract_quiet`)."""
        if self._quiet is None and self.pipeline.extracting and not self._closing:
            self._quiet = asyncio.create_task(self._quiet_extraction(), name="gieok-quiet-extraction")

    async def _quiet_extraction(self) -> None:
        every = max(QUIET_EXTRACTION_MIN_SECONDS, self.settings.extraction_idle_seconds / 2)
        while not self._closing:
            await self._sleep_unless_closing(every)
            if self._closing:
                return
            try:
                extracted = await self.pipeline.extract_quiet()
                if extracted:
                    log.info("extracted %d conversation(s) that went quiet", extracted)
            except Exception as exc:  # the database away for a moment: the next round tries again
                log.warning("extraction of quiet conversations failed: %s", exc)

    async def _recover(self) -> None:
        """Messages a crash left only in L1, written as turn blocks by whoever holds the channel."""
        # Each step patiently: at start-up a lost Redis answer or a database restart must not end
        # the process (taking a lease again is ours to extend; releasing one twice is harmless).
        shared = self.shared
        assert shared is not None
        pending = await self._patiently(lambda: asyncio.to_thread(self.pipeline.tables.l1_pending, None))
        for key in sorted({row.scope_key for row in pending} - self._leases):
            if token := await self._patiently(lambda: self._shared_step(shared.try_lease(key))):  # noqa: B023
                try:
                    commit = functools.partial(self.pipeline.commit_pending, scope_from_key(key), fence=token)
                    await self._patiently(lambda: asyncio.to_thread(commit))  # noqa: B023
                except LeaseLostError as exc:
                    log.warning("%s", exc)
                finally:
                    await self._patiently(lambda: self._shared_step(shared.release(key)))  # noqa: B023

    async def _upkeep(self) -> None:
        """Every third of a lease: renew ours (a lost one makes its worker hand its messages
        back), take channels with waiting messages that nobody holds, reload active channels."""
        assert self.shared is not None
        interval = self.shared.lease_seconds / 3
        while not self._services_stop.is_set():
            await asyncio.sleep(interval)
            try:
                for key in await self._renew_leases(interval):
                    self._leases.discard(key)
                    if key in self._channels:
                        self._channels[key].wake.set()
                if self._closing:
                    continue
                for key in sorted(await self.shared.waiting() - self._leases - self._taking):
                    if token := await self.shared.try_lease(key):
                        where = scope_from_key(key)
                        assert where.channel is not None
                        # beside the upkeep: a take waits for the store (its fence), and the
                        # renewals of the leases held must not wait for it
                        self._taking.add(key)
                        self._chore(self._take_over(self._state(ChannelRef(where.channel, where.guild)), token))
                self._active = await self.shared.active_keys()
                self.health.ok("shared")
            except Exception as exc:  # Redis away for a moment: try again next round
                self.health.failed("shared", exc)
                log.warning("lease upkeep failed: %s", exc)

    async def _renew_leases(self, within: float) -> set[str]:
        """`SharedChannels.renew` of the leases held (and this process's presence), asked again at
        once when its answer was lost (a renewal is safe to repeat) — for up to `within`: a few
        lost answers in a row must not let the leases, or the presence that keeps this process's
        claims holding later messages back, lapse while it is alive. The channels lost."""
        assert self.shared is not None
        deadline = time.monotonic() + within
        while True:
            try:
                return await self.shared.renew(set(self._leases))
            except CoordinationUnavailableError:
                if time.monotonic() >= deadline or self._services_stop.is_set():
                    raise
                await asyncio.sleep(QUICK_RETRY_SECONDS)

    def _ensure_executor(self) -> None:
        """Blocking work (SQLite, embedding hand-off) runs in worker threads. asyncio's default
        pool has cpu + 4 threads; with dozens of channels, threads waiting for the embedder or
        the commit lock would starve quick reads, so the runtime gives the loop a larger pool."""
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="gieok-runtime")
            asyncio.get_running_loop().set_default_executor(self._executor)

    # -- the channel worker ----------------------------------------------------------------------
    async def _run(self, state: _Channel) -> None:
        """The channel's worker, kept alive through errors outside a turn (Redis or the database
        away while it drains, hands back or releases): a worker that died while its process
        still held the channel's lease would strand the channel's messages (the lease renewed,
        nobody answering)."""
        failures = 0
        while True:
            try:
                await self._run_channel(state)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                if self._closing and failures > MAX_ATTEMPTS:  # shutting down, Redis gone: the queue waits there
                    log.error("channel %s stopped: %s", state.key, exc)
                    state.worker = None
                    return
                log.warning("channel %s: %s (going on in %.1f s)", state.key, exc, RETRY_SECONDS)
                self.health.failed("shared" if self.shared is not None else "generation", exc)
                await self.sleep(RETRY_SECONDS)

    async def _run_channel(self, state: _Channel) -> None:
        while True:
            if self.shared is not None:
                if state.key not in self._leases:
                    await self._hand_back(state)
                    if state.key in self._leases:
                        continue  # this process took the channel again meanwhile: go on running it
                    state.busy = False
                    state.worker = None
                    return
                await self._drain(state)
            if not state.pending:
                state.busy = False
                if self.shared is not None:
                    if await self._release_or_continue(state) or state.key in self._leases:
                        continue  # more work, or this process took the channel again meanwhile
                    state.worker = None
                    return
                if self._closing:
                    return
                state.wake.clear()
                await state.wake.wait()
                continue
            state.busy = True
            lost = False
            while True:  # debounce: until the channel has been quiet for debounce_seconds …
                deadline = self._debounce_deadline(state)
                delay = deadline - self.clock()
                if delay <= 0 or self._closing or self._batch_full(state):
                    break
                if lost := self.shared is not None and state.key not in self._leases:
                    break  # lost while debouncing (the upkeep woke us): handed back now, not at the deadline
                state.wake.clear()
                await self._sleep_unless_closing(delay, state.wake)
            if lost:
                continue  # the top hands them back (or, taken again meanwhile, debounces them again)
            # The debounce ended at its deadline (a clock read a few loop turns later would
            # add scheduling noise to the measured wait).
            ready = min(self.clock(), self._debounce_deadline(state))
            if self.shared is not None and await self._shared_step(self.shared.renew([state.key])):
                self._leases.discard(state.key)  # lost while debouncing: the holder answers these
                continue
            try:
                await self._turn(state, ready)
            except asyncio.CancelledError:
                raise
            except (DatabaseUnavailableError, CoordinationUnavailableError) as exc:
                # the batch is back at the head of the channel (`_turn`): try again in a moment
                log.warning("turn postponed in %s: %s", state.key, exc)
                self.health.failed("record" if isinstance(exc, DatabaseUnavailableError) else "shared", exc)
                await self.sleep(RETRY_SECONDS)
            except Exception as exc:  # one bad turn must not stop the channel
                log.exception("turn failed in %s", state.key)
                self.health.failed("generation", exc)

    def _debounce_deadline(self, state: _Channel) -> float:
        """Quiet for `debounce_seconds` after the channel's last message, or only
        `debounce_finished_seconds` when that message reads as finished (runtime/pause.py) …
        but never longer than `debounce_max_seconds` after the oldest waiting message: someone
        who keeps typing still gets an answer."""
        pause = self.settings.debounce_seconds
        if state.pending and reads_finished(state.pending[-1].message.content):
            pause = min(pause, self.settings.debounce_finished_seconds)
        quiet = state.last_arrival + pause
        if not state.pending:
            return quiet
        return min(quiet, state.pending[0].arrived + max(self.settings.debounce_max_seconds,
                                                          self.settings.debounce_seconds))

    def _merges_into_plan(self, state: _Channel, user_id: str) -> bool:
        """A message from `user_id` interrupts the plan under way and is planned with it (a full
        batch cannot take it: it waits for the next turn)."""
        return (state.planning_task is not None and not state.planning_task.done()
                and state.planning_user == user_id and state.planning_size < self.settings.max_batch)

    def _fills_batch(self, state: _Channel, user_id: str) -> bool:
        """Whether a turn will answer a message from `user_id` at once rather than after a
        debounce: it merges into the plan under way, or makes the head run a full batch."""
        if not state.pending and self._merges_into_plan(state, user_id):
            return True
        run = 0
        for pending in state.pending:
            if pending.message.user_id != user_id:
                return False  # another user's run is ahead: this message waits its turn
            run += 1
        return run + 1 == self.settings.max_batch  # beyond it, the message starts the next batch

    def _batch_full(self, state: _Channel) -> bool:
        """The head user's run is already as long as one turn may answer: no reason to wait."""
        if not state.pending:
            return False
        user = state.pending[0].message.user_id
        run = 0
        for pending in state.pending:
            if pending.message.user_id != user:
                return True  # someone else spoke after: the head run is complete
            run += 1
        return run >= self.settings.max_batch

    async def _sleep_unless_closing(self, delay: float, arrival: asyncio.Event | None = None) -> None:
        """Shutdown must not wait out a debounce: queued messages are answered at once. A new
        message (`arrival`) ends the nap too, so the deadline is recomputed and a batch that just
        became full is answered without waiting out the debounce."""
        naps: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.sleep(delay)),
                                           asyncio.ensure_future(self._closing_event.wait())]
        if arrival is not None:
            naps.append(asyncio.ensure_future(arrival.wait()))
        try:
            await asyncio.wait(naps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in naps:
                if not task.done():
                    task.cancel()

    def _take_batch(self, state: _Channel, batch: list[_Pending]) -> list[_Pending]:
        """The head run of one user's consecutive messages (extending `batch`)."""
        user = batch[0].message.user_id if batch else state.pending[0].message.user_id
        while state.pending and state.pending[0].message.user_id == user and len(batch) < self.settings.max_batch:
            batch.append(state.pending.pop(0))
        return batch

    def _incoming(self, batch: list[_Pending]) -> IncomingMessage:
        last = batch[-1].message
        # Whole: each message was within max_input_chars; the prompt shortens a long batch, with a marker.
        return IncomingMessage("\n".join(p.message.content for p in batch),
                               user_id=last.user_id, channel=last.ref.channel, guild=last.ref.guild,
                               display_name=last.display_name, explicit=any(p.explicit for p in batch),
                               active=self.is_active(last.ref), timestamp=last.timestamp,
                               message_id=last.message_id)

    async def _turn(self, state: _Channel, ready: float) -> None:
        batch = self._take_batch(state, [])
        timings = TurnTimings(channel=state.ref.channel, messages=len(batch),
                              debounce_ms=(ready - batch[0].arrived) * 1000, ready_at=ready)
        try:
            planned = await self._plan_and_claim(state, batch, timings)
        except LeaseLostError as exc:  # another process runs the channel now: it answers these
            log.warning("%s", exc)
            state.pending[:0] = [p for p in batch if not p.claimed]
            self._leases.discard(state.key)
            return
        except (DatabaseUnavailableError, CoordinationUnavailableError):  # the batch waits for the next turn
            self._put_back(state, batch)
            raise
        if planned is None:
            return
        plan, batch = planned
        await self._answer(state, plan, batch, timings)

    def _put_back(self, state: _Channel, batch: list[_Pending]) -> None:
        back = []
        for pending in batch:
            if pending.claimed:
                continue
            pending.attempts += 1
            if pending.attempts > MAX_ATTEMPTS:
                log.error("gave up on message %s in %s after %d failed turns", pending.message.message_id,
                          state.key, pending.attempts)
                continue
            back.append(pending)
        state.pending[:0] = back

    async def _claim(self, state: _Channel, batch: list[_Pending]) -> list[_Pending]:
        """Mark the batch's L1 rows handled (under this process's fencing token in shared mode):
        the messages another turn took already are left out. LeaseLostError when this process
        no longer runs the channel."""
        fence = None
        if self.shared is not None:
            if state.key not in self._leases or state.key not in self._fences:
                raise LeaseLostError(f"{state.key}: this process no longer holds the channel's lease")
            fence = self._fences[state.key]
        todo = [p for p in batch if not p.claimed]
        if todo:
            claimed = await asyncio.to_thread(self.pipeline.tables.l1_claim, state.key,
                                              [(p.observation.row.message_id, p.claim_id) for p in todo],
                                              time.time(), fence)
            for pending in todo:
                pending.claimed = pending.observation.row.message_id in claimed
            taken = [p.message.message_id for p in todo if p.claimed]
            if taken:  # from here until the reply is out, a crash of this process misses these messages
                self.pipeline.memory.emit("turn.claimed", {"guild": state.ref.guild, "channel": state.ref.channel,
                                                           "messages": taken})
            if self.shared is not None:
                await self._settle_in_flight(state.key, [p.payload for p in todo if p.payload is not None])
        return [p for p in batch if p.claimed]

    async def _plan_and_claim(self, state: _Channel, batch: list[_Pending],
                              timings: TurnTimings) -> tuple[Plan, list[_Pending]] | None:
        """The turn's plan, for the messages it takes (`_claim`); None when every one of them was
        answered elsewhere already."""
        while True:
            plan = await self._plan(state, batch, timings)
            taken = await self._claim(state, batch)
            if len(taken) == len(batch):
                return plan, batch
            self.health.duplicates += len(batch) - len(taken)
            if not taken:
                return None
            batch[:] = taken  # plan again without the messages answered elsewhere

    async def _plan(self, state: _Channel, batch: list[_Pending], timings: TurnTimings) -> Plan:
        while True:  # plan; redo with merged messages if the same user writes meanwhile
            state.planning_user = batch[0].message.user_id
            state.planning_size = len(batch)
            state.merge_requested = False
            state.planning_task = asyncio.create_task(self.pipeline.plan(
                self._incoming(batch), observed=[p.observation for p in batch]))
            try:
                plan = await state.planning_task
                break
            except asyncio.CancelledError:
                if not state.merge_requested:
                    raise
                self.health.merged += 1
                batch = self._take_batch(state, batch)
                timings.messages = len(batch)
            except Exception as exc:
                self.health.failed("gatekeeper", exc)
                state.planning_task = None
                raise
            finally:
                state.planning_user = None
        state.planning_task = None
        return plan

    async def _answer(self, state: _Channel, plan: Plan, batch: list[_Pending], timings: TurnTimings) -> None:
        self.last_plans[state.key] = plan
        self.health.ok("gatekeeper")
        timings.stage1_ms = plan.timings_ms.get("stage1_ms", 0.0)
        timings.stage2_ms = plan.timings_ms.get("stage2_ms", 0.0)
        timings.recall_ms = plan.timings_ms.get("recall_ms", 0.0)
        timings.overhead_ms = plan.timings_ms.get("overhead_ms", 0.0)
        timings.reason = plan.reason
        respond = plan.respond
        if respond and plan.message.explicit:
            refused = await self._refuse_call(state, plan, batch)
            if refused is not None:
                respond = False
                timings.reason = refused
        elif respond:
            confident = plan.stage1 is not None and plan.stage1.probability >= self.settings.rate_bypass_confidence
            if await self.usage.aspent(plan.message.guild):
                respond = False
                timings.reason = "the guild's daily model budget is spent (the message is kept in memory)"
            elif not await self._reply_allowed(state.key, bypass=confident):
                respond = False
                timings.reason = "rate limited (the message is kept in memory)"
                self.health.rate_limited += 1
        reply_text = reply_id = None
        if respond and plan.prompt is not None:
            reply_text = await self._reply(state, plan, plan.prompt, batch, timings)
            if reply_text is not None and not plan.message.explicit:
                await self._note_reply(state.key)
            if reply_text is not None and self.replies[-1].message_ids:
                reply_id = self.replies[-1].message_ids[0]  # the reply as the transport knows it (deletions)
        timings.responded = reply_text is not None
        try:  # blocks are written behind
            await self.pipeline.record(plan, reply_text, wait=False, fence=self._fences.get(state.key)
                                       if self.shared is not None else None, reply_id=reply_id)
            self.health.ok("record")
        except LeaseLostError as exc:  # stalled past the lease: the reply went out, the turn is not recorded
            log.warning("%s", exc)
            self._leases.discard(state.key)
            return
        except Exception as exc:
            self.health.failed("record", exc)
            raise
        self.last_timings[state.key] = timings
        self.pipeline.memory.emit("turn.timings", {"guild": state.ref.guild, **timings.as_dict()})
        self.turn_log.append(timings)
        del self.turn_log[:-10_000]

    async def _refuse_call(self, state: _Channel, plan: Plan, batch: list[_Pending]) -> str | None:
        """Why a call goes unanswered — the guild's daily model budget is spent, or the caller's or
        the channel's call limit (runtime/ratelimit.py `CallLimits`) — after telling the caller,
        once per window; None: answer it. In a deployment of several processes each keeps its own
        buckets (a channel is run by one process at a time); the budget is shared (the store)."""
        message = plan.message
        language = self.pipeline.conversation_language([message.content])
        if await self.usage.aspent(message.guild):
            self.health.limited_calls += 1
            if self.limits.notice_due(f"budget:{message.guild}:{message.user_id}", BUDGET_NOTICE_SECONDS):
                await self._notice(state, batch, BUDGET_MESSAGES[language])
            return "the guild's daily model budget is spent (the message is kept in memory)"
        wait = self.limits.admit(message.user_id, state.key, privileged=any(p.message.privileged for p in batch))
        if wait is None:
            return None
        self.health.limited_calls += 1
        if self.limits.notice_due(message.user_id, wait):
            await self._notice(state, batch, LIMIT_MESSAGES[language].format(seconds=max(1, math.ceil(wait))))
        return f"call limit: answered again in {wait:.0f} s (the message is kept in memory)"

    async def _notice(self, state: _Channel, batch: list[_Pending], text: str) -> None:
        try:
            await self.outbox.send(state.ref, text, reply_to=batch[-1].message.message_id)
            self.health.notices += 1
            self.health.ok("send")
        except Exception as exc:  # a notice is a courtesy: the turn goes on
            self.health.failed("send", exc)

    async def _reply_allowed(self, key: str, *, bypass: bool) -> bool:
        """The rate limits (runtime/ratelimit.py): this process's, or the deployment's, where
        the window is reserved at once so two processes cannot both take it."""
        if bypass or self.shared is None:
            return self.limiter.allows(key, bypass=bypass)
        s, shared = self.settings, self.shared
        # one reservation, asked again under its id until answered: a window it took before its
        # answer was lost is still its own (a retry must not find the window "taken" and stay silent)
        reservation = f"{shared.owner}|{uuid.uuid4().hex}"
        return bool(await self._patiently(lambda: self._shared_step(shared.reserve_reply(
            key, s.rate_limit_channel_seconds, s.rate_limit_global_seconds, reservation))))

    async def _note_reply(self, key: str) -> None:
        if self.shared is None:
            self.limiter.note_reply(key)
        else:
            s, shared = self.settings, self.shared
            try:  # setting the windows again is harmless: repeated until answered
                await self._patiently(lambda: self._shared_step(shared.note_reply(
                    key, s.rate_limit_channel_seconds, s.rate_limit_global_seconds)))
            except CoordinationUnavailableError as exc:  # the reply is out: its turn is recorded all the same
                log.warning("the reply window of %s was not marked: %s", key, exc)

    # -- replying -----------------------------------------------------------------------------
    def _finish_text(self, text: str) -> str:
        return render_mentions(self.corrector.correct(text))

    async def _reply(self, state: _Channel, plan: Plan, prompt: AssembledPrompt, batch: list[_Pending],
                     timings: TurnTimings) -> str | None:
        started = self.clock()
        reply_to = batch[-1].message.message_id
        shown: list[str] = []
        ids: list[str] = []
        limit = self.settings.reply_max_chars
        send_ms = [0.0]

        async def show(view: Any) -> None:  # make the channel show `view`: send new messages, edit changed ones
            t0 = self.clock()
            typing.cancel()  # the reply itself is on screen from now on
            for op in view.operations(shown):
                if op.kind == "send":
                    ids.append(await self.outbox.send(state.ref, op.text,
                                                      reply_to=reply_to if op.index == 0 else None))
                    shown.append(op.text)
                elif op.kind == "edit":
                    await self.outbox.edit(state.ref, ids[op.index], op.text)
                    shown[op.index] = op.text
            send_ms[0] += (self.clock() - t0) * 1000

        with contextlib.suppress(Exception):  # a typing indicator is best-effort
            await self.outbox.typing(state.ref)
        typing = asyncio.ensure_future(self._keep_typing(state.ref))
        parts: list[str] = []
        first_token: float | None = None
        provider_wait = 0.0
        calls = 1
        try:
            if self._custom_generate is not None:
                parts.append(str(await self._custom_generate(plan)))
                first_token = self.clock()
            elif self.tools and self.llm is not None:
                answer, calls = await self._with_tools(plan, self.llm, prompt)
                parts.append(answer)
                first_token = self.clock()
            else:
                if self.llm is None:
                    raise LLMError("no language model configured")
                throttle = EditThrottle(self.settings.stream_edit_seconds, self.clock)
                request_started = self.clock()
                async for piece in self.llm.stream(prompt.messages):
                    if first_token is None:
                        first_token = self.clock()
                        provider_wait = first_token - request_started
                    parts.append(piece)
                    if throttle.should_edit():
                        throttle.mark()
                        await show(stream_view(self._finish_text("".join(parts)), limit=limit))
            self.health.ok("generation")
        except LLMError as exc:
            typing.cancel()
            if self._custom_generate is None:
                await self.usage.note("reply", plan.message.guild, message_tokens(prompt.messages))
            self.health.failed("generation", exc)
            failure = self.settings.failure_message or FAILURE_MESSAGES[self.settings.language]
            told = state.failure_told
            try:
                if shown:  # part of an answer is on screen: say that it broke off
                    await show(stream_view(self._finish_text("".join(parts)) + "\n\n" + failure, limit=limit,
                                           done=True))
                    state.failure_told = self.clock()
                elif told is None or self.clock() - told >= FAILURE_NOTICE_SECONDS:
                    await show(stream_view(failure, limit=limit, done=True))
                    state.failure_told = self.clock()
                self.health.ok("send")
            except Exception as send_error:
                self.health.failed("send", send_error)
            return None
        finally:
            typing.cancel()
        text = "".join(parts)
        if self._custom_generate is None:
            # a tool loop's rounds are calls too (their tokens estimated as the prompt each time)
            await self.usage.note("reply", plan.message.guild,
                                  calls * message_tokens(prompt.messages) + estimate_tokens(text), calls=calls)
        timings.generation_ms = (self.clock() - started) * 1000
        timings.first_token_ms = ((first_token or self.clock()) - started) * 1000
        timings.provider_first_token_ms = provider_wait * 1000
        if first_token is not None:
            timings.to_first_token_ms = (first_token - timings.ready_at) * 1000
            timings.turn_overhead_ms = timings.to_first_token_ms - timings.stage2_ms - timings.provider_first_token_ms
        final = self._finish_text(text)
        if not final.strip():
            return None
        try:
            await show(stream_view(final, limit=limit, done=True))
            self.health.ok("send")
        except Exception as exc:
            self.health.failed("send", exc)
            raise
        timings.send_ms = send_ms[0]
        self.replies.append(Reply(state.ref, final, ids, [p.message.message_id or "" for p in batch]))
        del self.replies[:-1000]
        self.health.replies_out += 1
        return text

    async def _keep_typing(self, ref: ChannelRef) -> None:
        """Show that a reply is being made until it is on screen (cancelled then): a chat's typing
        indicator lasts ~10 s, a slow provider or a fallback takes longer."""
        while True:
            await self.sleep(TYPING_SECONDS)
            with contextlib.suppress(Exception):  # best-effort
                await self.outbox.typing(ref)

    async def _with_tools(self, plan: Plan, llm: LLM, prompt: AssembledPrompt) -> tuple[str, int]:
        """The answer, and how many model calls it took."""
        message = plan.message
        context = ToolContext(channel=message.channel, guild=message.guild, user_id=message.user_id,
                              timezone=self.settings.timezone, memory=self.pipeline.memory,
                              facts=self.pipeline.facts)  # per call: parallel channels never share it
        result = await run_tool_loop(llm, prompt.messages, self.tools, context,
                                     **tool_loop_options(self.settings))
        return result.text, result.rounds + 1

    # -- lifecycle -----------------------------------------------------------------------------
    def idle(self) -> bool:
        """No channel has work queued or in progress (tests and shutdown wait for this)."""
        return all(not c.pending and not c.busy for c in self._channels.values())

    async def close(self) -> None:
        """Graceful shutdown: answer what is queued (no further debounce), record everything,
        finish background extraction, write anything still only in L1. Shared mode: the
        channels this process runs are answered and handed back; the L1 rows of channels other
        processes run are theirs to write."""
        self._closing = True
        self._closing_event.set()
        for state in self._channels.values():
            state.wake.set()
        workers = [c.worker for c in self._channels.values() if c.worker is not None]
        await asyncio.gather(*workers, return_exceptions=True)
        if self._quiet is not None:
            await asyncio.gather(self._quiet, return_exceptions=True)
        await self.pipeline.drain()
        if self.shared is None:
            await asyncio.to_thread(self.pipeline.commit_pending)
            return
        await asyncio.gather(*list(self._chores), return_exceptions=True)
        self._services_stop.set()
        for task in self._services:
            task.cancel()
        await asyncio.gather(*self._services, return_exceptions=True)
        await self.shared.aclose()
