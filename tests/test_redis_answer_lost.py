"""No message lost when Redis carries a command out and its answer is lost (issue 43): two bot
replicas talk to the suite's real redis-server through the chaos harness's fault proxy
(bench/fault_proxy.py), and while messages arrive the proxy keeps dropping connections half-way
through an answer (`drop_midway`, over and over) — the claim, the enqueue, the drain, the lease,
the release, each may have run in Redis and look failed to the process. Every call on the way from
"received" to "answered" is safe to repeat and repeated: every message is answered once, in its
channel's order.

Each replica is a Memory, pipeline and BotCore of its own on one SQLite file, with its own Redis
connection (its own identity in claims and leases). Real time, short debounces and leases."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks.fault_proxy import FaultProxies, FaultProxy, proxied_url, upstream_of

from gieok import Memory
from gieok.chat.agent.pipeline import ConversationPipeline
from gieok.chat.runtime.core import BotCore, ChannelRef, InboundMessage
from gieok.chat.runtime.shared_channels import SharedChannels
from gieok.chat.settings import ChatSettings
from gieok.coordination import RedisConnection
from gieok.types import Scope, scope_key
from runtime_helpers import ChatModel, RecordingOutbox, Sent, tally_tags, until

LEASE_S = 2.0  # short, yet longer than a stall of the suite's busiest minutes (1 s expired under load there)
CHANNELS = 3
MESSAGES = 12  # per channel
GAP_S = 0.12  # between two messages of a channel
DROP_WINDOW_S = 0.25  # each drop: the connections that answer within this long are cut half-way
FAST = {"debounce_seconds": 0.1, "debounce_finished_seconds": 0.05, "debounce_max_seconds": 1.0,
        "rate_limit_channel_seconds": 0.0, "rate_limit_global_seconds": 0.0, "redis_lease_seconds": LEASE_S}
TAG = re.compile(r"\[c\d-m\d\d\]")


class TimedOutbox(RecordingOutbox):
    """A replica's outbox that also puts each reply on the list of both replicas' replies, in the
    order they went out (a channel is answered by one replica, then maybe the other)."""

    def __init__(self, everyone: list[Sent]) -> None:
        super().__init__()
        self.everyone = everyone

    async def send(self, ref: ChannelRef, text: str, *, reply_to: str | None = None) -> str:
        message_id = await super().send(ref, text, reply_to=reply_to)
        self.everyone.append(self.sent[-1])  # its text as edited later (streamed) is the same object's
        return message_id


@pytest.fixture(scope="module")
def redis_proxy(redis_server_url: str) -> Iterator[tuple[FaultProxy, str]]:
    with FaultProxies() as proxies:
        proxy = proxies.add("redis", upstream_of(redis_server_url))
        yield proxy, proxied_url(redis_server_url, proxy.port)


def _replica(location: str, redis_url: str, namespace: str,
             everyone: list[Sent]) -> tuple[BotCore, RecordingOutbox, Memory, RedisConnection]:
    memory = Memory(settings=ChatSettings(db=location, redis=redis_url, redis_namespace=namespace))
    settings = memory.settings.with_overrides(**FAST)
    model, outbox = ChatModel(), TimedOutbox(everyone)
    connection = RedisConnection(redis_url, namespace)
    pipeline = ConversationPipeline(memory, settings=settings, llm=model, recover=False)
    pipeline.warm()  # as the adapter does before it says it is ready: no model load stalls a lease's upkeep
    core = BotCore(pipeline, model, outbox=outbox, settings=settings, bot_user_id="999",
                   shared=SharedChannels(connection, lease_seconds=LEASE_S, watch_seconds=0.5))
    return core, outbox, memory, connection


def test_answers_lost_midway_lose_no_message_and_answer_none_twice(
        tmp_path: Path, redis_proxy: tuple[FaultProxy, str], redis_namespace: str) -> None:
    proxy, url = redis_proxy
    location = str(tmp_path / "answer-lost.db")
    replies: list[Sent] = []  # both replicas', in the order they went out
    replicas = [_replica(location, url, redis_namespace, replies) for _ in range(2)]
    cores = [r[0] for r in replicas]
    sent: dict[str, list[str]] = {}  # channel → tags in the order the channel saw them
    sending = threading.Event()
    drops: list[int] = []

    def keep_dropping() -> None:
        """Arm a drop again and again while messages arrive: many answers lost half-way."""
        while sending.is_set():
            drops.append(proxy.drop_midway(DROP_WINDOW_S))
            time.sleep(0.03)

    async def channel(c: int) -> None:
        ref = ChannelRef(f"room{c}", "g1")
        tags = sent.setdefault(ref.channel, [])
        for n in range(MESSAGES):
            tag = f"[c{c}-m{n:02d}]"
            text = f"누리야 {tag} 오늘 뭐 먹을까?" if n % 2 else f"누리야 {tag} what should I read next?"
            message = InboundMessage(ref, f"u{c}{n}", text, display_name=f"user{c}{n}", message_id=f"c{c}-m{n:02d}",
                                     timestamp=time.time())
            tags.append(tag)
            taken = await asyncio.gather(*(core.submit(message) for core in cores))  # every replica gets it
            assert sum(t is not None for t in taken) <= 1, f"{tag} taken in twice"
            await asyncio.sleep(GAP_S)

    def answered() -> int:
        return sum(len(TAG.findall(s.text)) for s in replies)

    async def scenario() -> None:
        for core in cores:  # as the adapter does when it connects
            await core.start()
        sending.set()
        dropper = threading.Thread(target=keep_dropping, name="drop-midway")
        dropper.start()
        try:
            await asyncio.gather(*(channel(c) for c in range(CHANNELS)))
        finally:
            sending.clear()
            await asyncio.to_thread(dropper.join)
        with contextlib.suppress(AssertionError):  # what is missing is reported below
            await until(lambda: answered() >= CHANNELS * MESSAGES and all(core.idle() for core in cores), 12)
        await asyncio.sleep(0.5)  # a second answer, had there been one, would be out by now
        for core in cores:
            await core.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
        lost, twice = tally_tags(replies, sent, TAG)
        messages = sum(len(tags) for tags in sent.values())
        print(f"\nanswers lost mid-way: {sum(drops)} connections dropped half-way through an answer in "
              f"{len(drops)} drops; {messages} messages, {len(lost)} lost, {len(twice)} answered twice")
        assert sum(drops) >= 10, f"the fault hit too rarely to test anything: {drops}"
        assert not lost and not twice, f"lost {lost}, answered twice {twice}"
        for room, tags in sent.items():  # one process answers a channel at a time: its replies are in order
            said = [tag for reply in replies if reply.ref.channel == room for tag in TAG.findall(reply.text)]
            assert said == tags, f"{room}: answered out of order or misrouted: {said}"
    finally:
        for _, _, memory, connection in replicas:
            connection.close()
            memory.close()


def test_each_call_on_a_messages_way_repeated_gives_the_same_result(redis_server_url: str,
                                                                     redis_namespace: str) -> None:
    """What the runtime relies on when it repeats a call whose answer was lost: the claim, the
    enqueue, the drain (same attempt id), the lease and the reply window, each asked twice, answer
    as the first time did and change nothing more."""
    connection = RedisConnection(redis_server_url, redis_namespace)
    other = RedisConnection(redis_server_url, redis_namespace)
    shared = SharedChannels(connection, lease_seconds=2.0)
    rival = SharedChannels(other, lease_seconds=2.0)
    key = "room-idempotent"

    async def scenario() -> None:
        first = await shared.claim_message(key, "m1")
        assert first > 0 and await shared.claim_message(key, "m1") == first  # "yours already"
        assert await rival.claim_message(key, "m1") == -1  # its claimant lives: watched
        payload = {"text": "안녕 hello", "order": first}
        assert await shared.enqueue(key, payload, "m1") is True
        assert await shared.enqueue(key, payload, "m1") is True  # refused as a duplicate, reported done
        assert await shared.queued(key) == 1
        assert await rival.claim_message(key, "m1") == 0  # queued: nobody takes it over

        token = await shared.try_lease(key)
        assert token > 0 and await shared.try_lease(key) > token  # ours again, with a newer token
        assert await rival.try_lease(key) == 0
        drained = await shared.drain(key, "attempt-1")
        assert drained == [payload]
        assert await shared.drain(key, "attempt-1") == [payload]  # its answer lost: the same again
        assert await shared.drain(key, "attempt-2") == []  # a new drain: nothing new
        assert await rival.drain(key, "attempt-1") is None  # not the lease holder: nothing

        assert await shared.reserve_reply(key, 5.0, 1.0, "r1") is True
        assert await shared.reserve_reply(key, 5.0, 1.0, "r1") is True  # its own window
        assert await shared.reserve_reply(key, 5.0, 1.0, "r2") is False
        assert await rival.reserve_reply(key, 5.0, 1.0) is False
        await shared.aclose()
        await rival.aclose()

    try:
        asyncio.run(scenario())
    finally:
        connection.close()
        other.close()


def test_a_replica_starting_while_answers_are_lost_recovers_what_a_crash_left(
        tmp_path: Path, redis_proxy: tuple[FaultProxy, str], redis_namespace: str) -> None:
    """At start a replica commits the messages a crash left only in L1 (lease, commit, release per
    channel); answers lost half-way through those calls are asked again, not a reason to exit."""
    proxy, url = redis_proxy
    core, _, memory, connection = _replica(str(tmp_path / "recover.db"), url, redis_namespace, [])
    tables = core.pipeline.tables
    keys = [scope_key(Scope("g1", f"room{c}")) for c in range(CHANNELS)]
    for c, key in enumerate(keys):  # what the crashed process had taken in, never written as turns
        for n in range(3):
            text = f"{n}번째: 내일 도서관 갈래?" if n % 2 else f"message {n} of room {c}: see you at the library"
            tables.l1_append(key, "user", text, f"u{n}", f"user{n}", time.time() - 60 + n, False, False,
                             f"crash-{c}-{n}", keep=50)
    assert {row.scope_key for row in tables.l1_pending(None)} == set(keys)
    dropping = threading.Event()
    drops: list[int] = []

    def keep_dropping() -> None:  # until a few answers of the start-up were lost
        while sum(drops) < 4 and (dropping.is_set() or not drops):
            drops.append(proxy.drop_midway(DROP_WINDOW_S))
            time.sleep(0.01)

    async def scenario() -> None:
        assert core.shared is not None
        await core.shared.waiting()  # its connection open, so the first drop has one to arm
        dropping.set()
        dropper = threading.Thread(target=keep_dropping, name="drop-at-start")
        dropper.start()
        await asyncio.sleep(0.05)  # armed before the start-up's first answer
        try:
            await core.start()
        finally:
            dropping.clear()
            await asyncio.to_thread(dropper.join)
        await core.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 40))
        assert sum(drops) >= 1, f"no answer was lost: nothing tested ({drops})"
        assert tables.l1_pending(None) == []  # every message the crash left is a turn block now
    finally:
        connection.close()
        memory.close()
