"""The load of `gieok bench chaos` and what it records: the history the checks are made from.

- **Writers** (threads): `gieok.client.Client` against the serve workers, alternately adding a
  note (`POST /v1/memories`) and a conversation message (`POST /v1/conversations/messages`), each
  text carrying a tag of its own ("[w1-00042]"). The client retries connection failures and 503s
  with one Idempotency-Key per call; every acknowledged write is recorded with what the server
  said it stored. Under the client, `RecordingTransport` records every single HTTP attempt: its
  status, whether an error had a JSON body and a Retry-After, or the connection failure or
  timeout — what clients saw during each fault.
- **The chat driver** (a thread): messages to `channels` channels at `rate` messages per second
  each, at seeded random times, every one an explicit call with a tag ("누리야 [c07-m012] …")
  delivered to every live bot process, as a gateway delivers a shard's messages to its replicas.
- **History**: every event of the run with its time (`time.time()`, which the bot processes
  use too), appended from any thread.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.runtime import QUESTIONS

__all__ = ["History", "Attempt", "Write", "Sent", "RecordingTransport", "Writer", "ChatDriver", "chat_tag",
           "NOTES"]

NOTES = ("민지는 고양이를 키워", "오늘 회의는 세 시에 시작해", "the build is green again", "누리는 떡볶이를 좋아해",
         "we moved the standup to Tuesday", "다음 주에 부산으로 출장 가")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP attempt as the client's transport saw it."""

    t0: float
    t1: float
    path: str
    status: int | None  # None: no answer (error says why)
    error: str | None = None  # "timeout" | "connection"
    json_body: bool = True  # an error status with a JSON body
    retry_after: bool = False  # a 503 with a Retry-After header


@dataclass(frozen=True, slots=True)
class Write:
    """One logical write of a writer (after the client's retries)."""

    tag: str
    kind: str  # "memory" | "message"
    t0: float
    t1: float
    acked: bool
    block_index: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Sent:
    """One chat message the driver sent: its tag, channel, number in the channel and time."""

    tag: str
    channel: str
    number: int
    t: float
    delivered: int  # to how many live bot processes


@dataclass
class History:
    """Everything the run recorded (module docstring), thread-safe."""

    attempts: list[Attempt] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    said: list[dict[str, Any]] = field(default_factory=list)  # each chat message as delivered, with its time "t"
    bot_events: list[dict[str, Any]] = field(default_factory=list)  # the bots' JSON lines, with "proc"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str, item: Any) -> None:
        with self._lock:
            getattr(self, kind).append(item)

    def snapshot(self, kind: str) -> list[Any]:
        with self._lock:
            return list(getattr(self, kind))

    def last_success_after(self, t: float) -> float | None:
        """The end of the first 2xx HTTP attempt that started after `t`."""
        with self._lock:
            ends = [a.t1 for a in self.attempts if a.t0 >= t and a.status is not None and 200 <= a.status < 300]
        return min(ends) if ends else None

    def first_reply_after(self, t: float) -> float | None:
        """When the first reply to a chat message sent after `t` went out."""
        with self._lock:
            later = {s.tag for s in self.sent if s.t >= t}
            times = [e["t"] for e in self.bot_events if e["ev"] in ("send", "edit") and e["t"] >= t
                     and any(tag in later for tag in _tags(e.get("text", "")))]
        return min(times) if times else None


def _tags(text: str) -> list[str]:
    from benchmarks.loopback_llm import TAG

    return TAG.findall(text)


def chat_tag(channel: int, number: int) -> str:
    return f"[c{channel:02d}-m{number:03d}]"


class RecordingTransport(httpx.BaseTransport):
    """httpx's own transport, recording every attempt in the history (module docstring)."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        t0 = time.time()
        path = request.url.path
        try:
            response = self.inner.handle_request(request)
            response.read()
        except httpx.TimeoutException:
            self.history.add("attempts", Attempt(t0, time.time(), path, None, "timeout"))
            raise
        except httpx.RequestError:
            self.history.add("attempts", Attempt(t0, time.time(), path, None, "connection"))
            raise
        json_body = True
        if response.status_code >= 400:
            try:
                body = json.loads(response.content)
                json_body = isinstance(body, dict) and isinstance(body.get("error"), dict)
            except ValueError:
                json_body = False
        self.history.add("attempts", Attempt(t0, time.time(), path, response.status_code, None, json_body,
                                             "retry-after" in response.headers))
        return response

    def close(self) -> None:
        self.inner.close()


class Writer(threading.Thread):
    """One writer (module docstring): until `stop` is set, a write every `interval` seconds."""

    def __init__(self, number: int, url: str, key: str, history: History, stop: threading.Event, *,
                 interval: float, seed: int, timeout: float, retries: int) -> None:
        super().__init__(name=f"chaos-writer-{number}", daemon=True)
        self.number = number
        self.url, self.key = url, key
        self.history = history
        self.stop = stop
        self.interval = interval
        self.rng = random.Random(seed)
        self.timeout, self.retries = timeout, retries

    def run(self) -> None:
        from gieok.client import Client

        transport = RecordingTransport(self.history)
        with Client(self.url, self.key, timeout=self.timeout, retries=self.retries, backoff=0.25,
                    transport=transport) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                tag = f"[w{self.number}-{n:05d}]"
                note = self.rng.choice(NOTES)
                kind = "memory" if n % 2 else "message"
                t0 = time.time()
                try:
                    if kind == "memory":
                        block = client.add(f"{note} {tag}", kind="note", scope={"channel": f"chaos-w{self.number}"})
                        done = Write(tag, kind, t0, time.time(), True, block.block_index)
                    else:
                        result = client.add_messages(f"chaos-conv-{self.number}", [
                            {"id": tag, "role": "user", "user": f"writer{self.number}", "text": f"{note} {tag}"}])
                        stored = result.stored[0].block_index if result.stored else None
                        done = Write(tag, kind, t0, time.time(), True, stored)
                except Exception as exc:  # an unacknowledged write: it may or may not be stored, never twice
                    done = Write(tag, kind, t0, time.time(), False, None, f"{type(exc).__name__}: {exc}"[:300])
                self.history.add("writes", done)
                self.stop.wait(self.interval * self.rng.uniform(0.5, 1.5))


class ChatDriver(threading.Thread):
    """The chat load (module docstring). `deliver(item)` hands a message to every live bot
    process and says to how many."""

    def __init__(self, history: History, stop: threading.Event, deliver: Callable[[dict[str, Any]], int], *,
                 channels: int, rate: float, seed: int) -> None:
        super().__init__(name="chaos-chat", daemon=True)
        self.history = history
        self.stop = stop
        self.deliver = deliver
        self.channels = channels
        self.rate = rate
        self.rng = random.Random(seed)

    def schedule(self, seconds: float) -> list[tuple[float, int]]:
        """(seconds from the start, channel) of every message: each channel's gaps exponential
        around 1 / rate, so messages of a channel sometimes bunch up (batches, merges)."""
        out: list[tuple[float, int]] = []
        for c in range(self.channels):
            at = self.rng.uniform(0, 1 / self.rate)
            while at < seconds:
                out.append((at, c))
                at += self.rng.expovariate(self.rate)
        return sorted(out)

    def run(self) -> None:
        started = time.monotonic()
        numbers = [0] * self.channels
        for at, c in self.schedule(10 * 24 * 3600):
            delay = started + at - time.monotonic()
            if self.stop.wait(max(0.0, delay)):
                return
            numbers[c] += 1
            tag = chat_tag(c, numbers[c])
            channel = f"chaos-{c:02d}"
            question = QUESTIONS[(c + numbers[c]) % len(QUESTIONS)]
            now = time.time()
            item: dict[str, Any] = {"channel": channel, "guild": "chaos-guild", "user": f"u{c:02d}",
                                    "text": f"누리야 {tag} {question}", "id": f"c{c:02d}-m{numbers[c]:03d}", "t": now}
            delivered = self.deliver(item)
            self.history.add("said", item)
            self.history.add("sent", Sent(tag, channel, numbers[c], now, delivered))


def tags_in(texts: Sequence[str]) -> list[str]:
    return [tag for text in texts for tag in _tags(text)]
