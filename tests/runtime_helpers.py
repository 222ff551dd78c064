"""Virtual time and a recording outbox for runtime tests: no real sleeps, real everything else."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gieok.chat.llm.base import ChatMessage, ChatResponse, ToolSpec
from gieok.chat.runtime.core import ChannelRef
from gieok.errors import LLMError


class VirtualTime:
    """`clock()` and `sleep()` for the code under test; the test moves time with `advance()`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> asyncio.Future:
        # Registered at the call, not when a task wrapping it first runs: an `advance()` in
        # between would otherwise count the delay from the advanced time.
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(0.0, seconds), next(self._order), future))
        return future

    def has_sleeper_until(self, when: float) -> bool:
        """Whether something sleeps until `when` (a loop the test must not advance past before it
        sleeps: its delay would count from the advanced time)."""
        return any(abs(deadline - when) < 1e-9 and not future.done() for deadline, _, future in self._sleepers)

    async def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            when, _, future = heapq.heappop(self._sleepers)
            self.now = max(self.now, when)
            if not future.done():
                future.set_result(None)
            await asyncio.sleep(0)
        self.now = target
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait (in real time: threads do real work) until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


@dataclass
class Sent:
    ref: ChannelRef
    text: str
    reply_to: str | None
    message_id: str


@dataclass
class RecordingOutbox:
    sent: list[Sent] = field(default_factory=list)
    edits: list[tuple[ChannelRef, str, str]] = field(default_factory=list)
    typing_calls: int = 0
    fail_sends: bool = False
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    async def send(self, ref: ChannelRef, text: str, *, reply_to: str | None = None) -> str:
        if self.fail_sends:
            raise ConnectionError("transport down")
        message_id = f"bot-{next(self._ids)}"
        self.sent.append(Sent(ref, text, reply_to, message_id))
        return message_id

    async def edit(self, ref: ChannelRef, message_id: str, text: str) -> None:
        self.edits.append((ref, message_id, text))
        for item in self.sent:
            if item.message_id == message_id:
                item.text = text

    async def typing(self, ref: ChannelRef) -> None:
        self.typing_calls += 1

    def texts(self, channel: str | None = None) -> list[str]:
        return [s.text for s in self.sent if channel is None or s.ref.channel == channel]


def user_input(messages: Sequence[ChatMessage]) -> str:
    text = messages[-1].content
    for opening, closing in (("<<<사용자 입력>>>", "<<<입력 끝>>>"), ("<<<", ">>>")):
        if opening in text:
            return text.split(opening, 1)[1].split(closing, 1)[0].strip()
    return text


class ChatModel:
    """Decides to reply to everything (stage 2) and answers by echoing the input. Decisions can
    be held until released, to test what happens while a reply is being planned."""

    name = "test-model"

    def __init__(self, *, respond: bool = True, fail: bool = False) -> None:
        self.respond = respond
        self.fail = fail
        self.hold: asyncio.Event | None = None
        self.decisions: list[str] = []
        self.streams: list[str] = []

    async def chat(self, messages: Sequence[ChatMessage], *, json_schema: dict[str, Any] | None = None,
                   tools: Sequence[ToolSpec] | None = None, temperature: float | None = None,
                   max_tokens: int | None = None) -> ChatResponse:
        prompt = messages[0].content
        if "user_facts" in prompt:
            return ChatResponse('{"guild_facts": [], "user_facts": [], "summary_updates": {}}')
        message = prompt.split("<<<\n", 1)[1].split("\n>>>", 1)[0]
        self.decisions.append(message)
        if self.hold is not None:
            await self.hold.wait()
        return ChatResponse('{"response_needed": %s, "retrieval_needed": false, "search_query": ""}'
                            % ("true" if self.respond else "false"))

    async def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[str]:
        if self.fail:
            raise LLMError("all providers failed")
        text = user_input(messages)
        self.streams.append(text)
        for word in f"답장: {text}".split(" "):
            yield word + " "


def tally_tags(replies: Sequence[Any], sent: dict[str, list[str]], tag: re.Pattern[str]) -> tuple[list[str], list[str]]:
    """The tags of `sent` (channel -> its messages' tags) that no reply carries, and those more than one does."""
    counts: dict[str, int] = {}
    for reply in replies:
        for found in tag.findall(reply.text):
            counts[found] = counts.get(found, 0) + 1
    every = [t for tags in sent.values() for t in tags]
    return [t for t in every if t not in counts], [t for t in every if counts.get(t, 0) > 1]
