"""The router: several keys per provider, retries, a fallback chain, and streams that survive failover.

It is itself an `LLM`, so the agent never knows how many providers stand behind it.

Policy, per call (`chat` and `stream` share one code path, `_run`):
- The chain is tried in order (e.g. `gemini:gemini-2.5-flash` → `openai:qwen2.5:7b`). Each
  entry is a `Route`: one provider + model with one client per API key.
- Keys rotate round-robin over the keys that are not cooling down, so load spreads and a
  rested key is used again. A 429 / quota error cools that key for the provider's
  Retry-After (the header, or Gemini's `retryDelay`), else `cooldown_seconds`, and the next key
  is tried at once: retrying a rate-limited key immediately only spends more quota. A refused
  key (401/403, invalid key) cools for `auth_cooldown_seconds`.
- A transient error (5xx, dropped or refused connection, stream cut short) is retried on the
  same route, next key first, with exponential backoff and jitter (tenacity), `max_retries` times
  (with the defaults, 2 retries waiting at most 2.5 s in all). It is the provider's trouble, not
  the key's, so after that the chain moves on.
- A timeout (`LLMTimeoutError`: no connection within the connect timeout, no first token within
  the first-token timeout, or an answer that went silent) moves on to the next provider at once:
  no other key and no backoff retry, since a provider that is not answering rarely starts within
  the seconds a chat user waits. The clients enforce the limits; the router marks the last
  provider it can still try as `last_resort`, which waits the whole-answer timeout for the first
  token instead, because there is nothing left to fall back to. So with the defaults (connect 5 s,
  first token 10 s, counted from the start of the request) a provider that accepts and never
  answers costs 10 s before the next one is asked, an unreachable one 5 s, a refused connection
  only the short retries above. `health` counts timeouts per provider.
- Any other error (a malformed request, an unknown model, a blocked prompt) would fail again
  on every key, so the chain moves on at once.
- When nothing answers, one `LLMUnavailableError` (an `LLMError`) says so in one sentence the bot
  can show; what each provider said is in its `failures`, and `health` counts it all.

Streams: text already handed to the caller is never sent twice. When a stream fails midway,
the next attempt (next key, retry, or next provider) is asked to continue: the conversation
gets the partial answer as an assistant turn plus a short user instruction to continue without
repeating. Models do not always obey, so the new stream passes through `ResumeFilter` first:
if it starts over, the already-delivered prefix is dropped; if it repeats the tail of what was
delivered (an overlap of at least `min_overlap` characters), that overlap is dropped; otherwise
it is a true continuation and passes unchanged. The caller sees one uninterrupted answer.

Time is injectable (`clock` for cooldowns, `wall_clock` for health timestamps, `sleep` for
backoff) so tests run on a virtual clock and never really wait for those; the clients' time
limits are real time (tests set them to fractions of a second).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import tenacity

from ...errors import (
    LLMAuthError,
    LLMError,
    LLMRateLimitError,
    LLMTransientError,
    LLMUnavailableError,
)
from .base import LLM, ChatMessage, ChatResponse, ToolSpec
from .failures import LLMTimeoutError, last_resort

__all__ = [
    "LLMRouter",
    "Route",
    "KeySlot",
    "LLMHealth",
    "ProviderHealth",
    "ResumeFilter",
    "continuation_messages",
    "CONTINUE_INSTRUCTION",
]

log = logging.getLogger("gieok.chat.llm")

T = TypeVar("T")
CONTINUE_INSTRUCTION = ("Your previous reply was cut off. Continue it from exactly where it stopped, "
                        "without repeating anything already written and without any preamble.")
_MIN_COOLDOWN = 1.0  # a "Retry-After: 0" must not make a key be hit again in the same breath


# -- health ------------------------------------------------------------------------------------

@dataclass
class ProviderHealth:
    """Counters for one chain entry; timestamps are wall-clock seconds (epoch)."""

    successes: int = 0
    failures: int = 0  # calls this provider was asked and could not answer (after its retries)
    skipped: int = 0  # calls that found every key cooling down, so nothing was sent
    rate_limited: int = 0  # 429 / quota answers (each cools one key)
    retries: int = 0  # backoff retries after transient errors
    timeouts: int = 0  # calls it failed by timing out (connect, first token, a stalled answer): moved on at once
    last_success_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None


@dataclass
class LLMHealth:
    """What a dashboard or `/health` shows: per provider, and for the chain as a whole."""

    providers: dict[str, ProviderHealth] = field(default_factory=dict)
    calls: int = 0
    exhausted: int = 0  # calls on which every provider failed
    last_error: str | None = None
    last_error_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- keys and routes ---------------------------------------------------------------------------

@dataclass
class KeySlot:
    llm: LLM
    label: str
    cooldown_until: float = 0.0
    cooldown_reason: str = ""

    def ready(self, now: float) -> bool:
        return self.cooldown_until <= now


class Route:
    """One chain entry: a provider and model, with one client per API key, rotated round-robin."""

    def __init__(self, label: str, clients: Sequence[LLM], key_labels: Sequence[str] | None = None) -> None:
        if not clients:
            raise ValueError(f"route {label!r} needs at least one client")
        labels = list(key_labels) if key_labels is not None else [f"key {i + 1}" for i in range(len(clients))]
        if len(labels) != len(clients):
            raise ValueError("one key label per client")
        self.label = label
        self.keys = [KeySlot(llm, key) for llm, key in zip(clients, labels)]
        self._next = 0

    def next_key(self, now: float, exclude: set[int] | frozenset[int] = frozenset()) -> tuple[int, KeySlot] | None:
        """The next ready key after the last one handed out, skipping `exclude` (indices)."""
        count = len(self.keys)
        for step in range(count):
            index = (self._next + step) % count
            slot = self.keys[index]
            if index not in exclude and slot.ready(now):
                self._next = (index + 1) % count
                return index, slot
        return None

    def any_ready(self, now: float) -> bool:
        return any(slot.ready(now) for slot in self.keys)

    def ready_in(self, now: float) -> float:
        return max(0.0, min(slot.cooldown_until for slot in self.keys) - now)


class _NoKeyReady(LLMError):
    """Every key of a route is cooling down (not transient: backing off on it would not help)."""


def _worth_retrying(error: BaseException) -> bool:
    """A transient error is retried on the same route; a timeout is not (the next provider is asked)."""
    return isinstance(error, LLMTransientError) and not isinstance(error, LLMTimeoutError)


# -- streaming resume --------------------------------------------------------------------------

def continuation_messages(messages: Sequence[ChatMessage], delivered: str,
                          instruction: str = CONTINUE_INSTRUCTION) -> list[ChatMessage]:
    """The conversation to send when `delivered` is what the user has already seen."""
    if not delivered:
        return list(messages)
    return [*messages, ChatMessage("assistant", delivered), ChatMessage("user", instruction)]


class ResumeFilter:
    """Drops what a resumed stream repeats of `delivered`; see the module docstring.

    Text is held back only while it could still be a repetition: while it matches the start
    of `delivered` (the model may be starting over), and for its first `window` characters
    (to judge an overlap with the tail). After that everything passes straight through.
    """

    def __init__(self, delivered: str, *, window: int = 48, min_overlap: int = 8) -> None:
        self.delivered = delivered
        self.window = window
        self.min_overlap = min_overlap
        self._held = ""
        self._open = not delivered

    def feed(self, piece: str) -> str:
        if self._open:
            return piece
        self._held += piece
        return self._decide(final=False)

    def finish(self) -> str:
        """What is still held when the stream ends."""
        return "" if self._open else self._decide(final=True)

    def _decide(self, *, final: bool) -> str:
        held, delivered = self._held, self.delivered
        # a restart may open with whitespace the first attempt did not have
        restart = held if delivered[:1].isspace() else held.lstrip()
        if restart.startswith(delivered):  # started over and is now past what was delivered
            return self._release(restart[len(delivered):])
        if delivered.startswith(restart):  # still (possibly) replaying the beginning
            return self._release("") if final else ""
        if len(held) < self.window and not final:
            return ""
        overlap = 0
        for size in range(min(len(held), len(delivered)), self.min_overlap - 1, -1):
            if delivered.endswith(held[:size]):
                overlap = size
                break
        return self._release(held[overlap:])

    def _release(self, text: str) -> str:
        self._open, self._held = True, ""
        return text


# -- the router --------------------------------------------------------------------------------

_END = object()


class LLMRouter:
    """An `LLM` over a chain of `Route`s; see the module docstring for the policy."""

    def __init__(self, routes: Sequence[Route], *, max_retries: int = 2, backoff_seconds: float = 0.5,
                 backoff_max_seconds: float = 8.0, cooldown_seconds: float = 60.0,
                 auth_cooldown_seconds: float = 3600.0, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 continue_instruction: str = CONTINUE_INSTRUCTION) -> None:
        if not routes:
            raise ValueError("LLMRouter needs at least one route")
        labels = [route.label for route in routes]
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate chain entries: {labels}")
        if max_retries < 0 or backoff_seconds < 0 or cooldown_seconds < 0 or auth_cooldown_seconds < 0:
            raise ValueError("retries, backoff and cooldowns must not be negative")
        self.routes = list(routes)
        self.name = "router(" + " > ".join(labels) + ")"
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.backoff_max_seconds = max(backoff_max_seconds, backoff_seconds)
        self.cooldown_seconds = cooldown_seconds
        self.auth_cooldown_seconds = auth_cooldown_seconds
        self.continue_instruction = continue_instruction
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self.health = LLMHealth(providers={label: ProviderHealth() for label in labels})

    # -- the protocol --------------------------------------------------------------------------

    async def chat(self, messages: Sequence[ChatMessage], *, json_schema: dict[str, Any] | None = None,
                   tools: Sequence[ToolSpec] | None = None, temperature: float | None = None,
                   max_tokens: int | None = None) -> ChatResponse:
        async def attempt(llm: LLM) -> ChatResponse:
            return await llm.chat(messages, json_schema=json_schema, tools=tools, temperature=temperature,
                                  max_tokens=max_tokens)

        return await self._run(attempt)

    async def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[str]:
        # The failover loop runs in a task that hands text over through a one-slot queue, so the
        # same `_run` (tenacity retries, key rotation, chain) drives streams and plain calls alike.
        # Whatever is put in the queue reaches the caller, so `delivered` is exactly what they saw.
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
        delivered: list[str] = []

        async def attempt(llm: LLM) -> None:
            so_far = "".join(delivered)
            resume = ResumeFilter(so_far)
            pieces = llm.stream(continuation_messages(messages, so_far, self.continue_instruction),
                                temperature=temperature, max_tokens=max_tokens)
            try:
                async for piece in pieces:
                    text = resume.feed(piece)
                    if text:
                        delivered.append(text)
                        await queue.put(text)
            finally:
                closer = getattr(pieces, "aclose", None)
                if closer is not None:
                    await closer()
            tail = resume.finish()
            if tail:
                delivered.append(tail)
                await queue.put(tail)

        async def produce() -> None:
            try:
                await self._run(attempt)
            except Exception as exc:  # handed to the caller, who is waiting on the queue
                await queue.put(exc)
            else:
                await queue.put(_END)

        producer = asyncio.create_task(produce())
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield str(item)
        finally:
            if not producer.done():
                producer.cancel()
            await asyncio.wait({producer})
            if not producer.cancelled():
                producer.exception()  # retrieved, so asyncio does not log it as forgotten

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self, attempt: Callable[[LLM], Awaitable[T]]) -> T:
        self.health.calls += 1
        failures: dict[str, str] = {}
        last: LLMError | None = None
        for position, route in enumerate(self.routes):
            health = self.health.providers[route.label]
            if not route.any_ready(self._clock()):
                health.skipped += 1
                failures[route.label] = (f"every key is cooling down after rate limits "
                                         f"(next ready in {route.ready_in(self._clock()):.0f} s)")
                continue
            retrying = tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(self.max_retries + 1),
                wait=tenacity.wait_exponential_jitter(initial=self.backoff_seconds, max=self.backoff_max_seconds,
                                                      jitter=self.backoff_seconds),
                retry=tenacity.retry_if_exception(_worth_retrying),
                sleep=self._sleep,
                before_sleep=self._note_retry(route, health),
                reraise=True,
            )
            # the last provider that can still be tried gets the patient first-token wait
            fallback = any(later.any_ready(self._clock()) for later in self.routes[position + 1:])
            try:
                with last_resort(not fallback):
                    result: T = await retrying(self._try_keys, route, health, attempt)
            except LLMError as exc:
                last = exc
                failures[route.label] = str(exc)
                health.failures += 1
                if isinstance(exc, LLMTimeoutError):
                    health.timeouts += 1
                health.last_error, health.last_error_at = f"{type(exc).__name__}: {exc}", self._wall_clock()
                log.warning("LLM provider %s failed, %s: %s", route.label,
                            "trying the next" if route is not self.routes[-1] else "none left", exc)
                continue
            health.successes += 1
            health.last_success_at = self._wall_clock()
            return result
        self.health.exhausted += 1
        self.health.last_error, self.health.last_error_at = "; ".join(
            f"{label}: {why}" for label, why in failures.items()), self._wall_clock()
        count = len(self.routes)
        who = "the provider in the chain failed or is" if count == 1 else \
            f"all {count} providers in the chain failed or are"
        raise LLMUnavailableError(f"No language model could answer: {who} rate-limited right now.", failures) from last

    def _note_retry(self, route: Route, health: ProviderHealth) -> Callable[[tenacity.RetryCallState], None]:
        def before_sleep(state: tenacity.RetryCallState) -> None:
            health.retries += 1
            error = state.outcome.exception() if state.outcome is not None else None
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            log.info("LLM provider %s: %s; retry %d in %.2f s", route.label, error, state.attempt_number, wait)

        return before_sleep

    async def _try_keys(self, route: Route, health: ProviderHealth, attempt: Callable[[LLM], Awaitable[T]]) -> T:
        """One attempt on a route: the next ready key, and on a rate limit or refusal the one after."""
        tried: set[int] = set()
        last: LLMError | None = None
        while True:
            picked = route.next_key(self._clock(), tried)
            if picked is None:
                reason = f"{route.label}: every key is cooling down"
                raise _NoKeyReady(f"{reason} ({last})" if last else reason) from last
            index, slot = picked
            tried.add(index)
            try:
                return await attempt(slot.llm)
            except LLMRateLimitError as exc:
                wait = self.cooldown_seconds if exc.retry_after is None else exc.retry_after
                self._cool(route, slot, max(_MIN_COOLDOWN, wait), "rate limited")
                health.rate_limited += 1
                last = exc
            except LLMAuthError as exc:
                self._cool(route, slot, max(_MIN_COOLDOWN, self.auth_cooldown_seconds), "key refused")
                last = exc

    def _cool(self, route: Route, slot: KeySlot, seconds: float, reason: str) -> None:
        slot.cooldown_until = self._clock() + seconds
        slot.cooldown_reason = reason
        log.warning("LLM provider %s: %s %s, cooling down for %.0f s", route.label, slot.label, reason, seconds)

    # -- inspection and cleanup ----------------------------------------------------------------

    def key_status(self) -> list[dict[str, Any]]:
        """Each key's state, for a dashboard: which provider, which key, ready or for how long not."""
        now = self._clock()
        return [{"provider": route.label, "key": slot.label, "ready": slot.ready(now),
                 "ready_in_seconds": round(max(0.0, slot.cooldown_until - now), 3),
                 "reason": "" if slot.ready(now) else slot.cooldown_reason}
                for route in self.routes for slot in route.keys]

    async def aclose(self) -> None:
        for route in self.routes:
            for slot in route.keys:
                closer = getattr(slot.llm, "aclose", None)
                if closer is not None:
                    await closer()
