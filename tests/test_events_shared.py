"""The live event stream shared through Redis: events published by one process (a server
worker, a bot) reach the feeds of every other, with one sequence per tenant, resume and gaps as
in one process, and no tenant ever sees another's. In-process buses stand for processes; the last
test runs a real `gieok serve --workers 2 --redis …`."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gieok import Memory
from gieok.coordination import RedisConnection, SharedEventLog
from gieok.server.events import EventBus
from live_server import LiveServer as Server
from live_server import create_key
from test_server_process import sse_events


@pytest.fixture
def buses(redis_url: str, redis_namespace: str) -> Iterator[tuple[EventBus, EventBus]]:
    one, two = RedisConnection(redis_url, redis_namespace), RedisConnection(redis_url, redis_namespace)
    try:
        yield (EventBus(100, shared=SharedEventLog(one, 100)), EventBus(100, shared=SharedEventLog(two, 100)))
    finally:
        one.close()
        two.close()


def run(coro):
    return asyncio.run(coro)


async def take(feed, n: int, timeout: float = 10.0) -> list:
    return [await asyncio.wait_for(feed.next(), timeout) for _ in range(n)]


def test_a_feed_gets_what_every_process_publishes_in_one_sequence(buses: tuple[EventBus, EventBus]) -> None:
    a, b = buses

    async def scenario() -> None:
        feed = b.feed("acme")  # new events only
        assert b.subscribers("acme") == 1 and a.subscribers("acme") == 0, "feeds are counted where they are open"
        a.publish("acme", "memory.added", {"text": "민지는 고양이를 키워"})
        b.publish("acme", "search.answered", {"ms": 1.5})
        a.publish("globex", "memory.added", {"text": "someone else's"})
        got = await take(feed, 2)
        assert [(e.seq, e.type) for e in got] == [(1, "memory.added"), (2, "search.answered")]
        assert got[0].data == {"text": "민지는 고양이를 키워"}
        feed.close()
        assert b.subscribers("acme") == 0
        assert a.last_seq("acme") == b.last_seq("acme") == 2 and a.last_seq("globex") == 1

    run(scenario())


def test_resume_replays_what_was_missed_and_no_other_tenants_events(buses: tuple[EventBus, EventBus]) -> None:
    a, b = buses

    async def scenario() -> None:
        for i in range(5):
            a.publish("acme", "memory.added", {"i": i})
            b.publish("globex", "memory.added", {"secret": i})
        feed = b.feed("acme", since=2)
        got = await take(feed, 3)
        assert [e.seq for e in got] == [3, 4, 5] and all("secret" not in e.data for e in got)
        a.publish("acme", "fact.added", {"fact": "보리"})
        [live] = await take(feed, 1)
        assert (live.seq, live.type) == (6, "fact.added")
        feed.close()
        assert [e.data["i"] for e in b.recent("acme", "memory.added", 2)] == [3, 4], "oldest first"

    run(scenario())


def test_a_forgotten_blocks_events_leave_the_shared_stream(buses: tuple[EventBus, EventBus]) -> None:
    """A block forgotten in one process (a deleted message's turn): the events of the Redis stream
    that carried it are deleted before `memory.forgotten` is appended, so no process's feed replays
    its text; the events of other blocks and other tenants stay."""
    a, b = buses
    shared = a.shared
    assert shared is not None  # an entry as a version before the blocks were recorded wrote it: read here
    older = json.dumps({"type": "search.answered", "time": 0.0, "data": {"hits": [{"block_index": 1, "text": "7788"}]}})
    shared.connection.client.xadd(shared.connection.key("events", "acme"), {"e": older}, id="1-0")
    shared.connection.client.set(shared.connection.key("events", "acme", "seq"), 1)
    a.publish("acme", "memory.added", {"blocks": [{"block_index": 1, "text": "민지: 사물함 비밀번호 7788"}]})
    a.publish("acme", "memory.added", {"blocks": [{"block_index": 2, "text": "준호: 점심 뭐 먹지"}]})
    a.publish("acme", "search.answered", {"query": "사물함", "hits": [{"block_index": 1, "text": "7788"}]})
    b.publish("globex", "memory.added", {"blocks": [{"block_index": 1, "text": "globex's own block 1"}]})
    b.publish("acme", "memory.forgotten", {"block_indices": [1]})
    kept = b.recent("acme", n=10)
    assert [e.type for e in kept] == ["memory.added", "memory.forgotten"]
    assert "7788" not in json.dumps([e.data for e in kept], ensure_ascii=False)
    assert [e.data for e in a.recent("globex", n=10)] == [{"blocks": [{"block_index": 1,
                                                                        "text": "globex's own block 1"}]}]
    # what the model made of a message, and a summary it showed, leave with the message's deletion
    a.publish("acme", "pipeline.fact_rejected", {"fact": "사물함 비밀번호는 7788", "source": "m1"})
    a.publish("acme", "summary.updated", {"conversation": {"guild": "g", "channel": "c"}, "summary": {"x": "7788"}})
    a.publish("acme", "summary.updated", {"conversation": {"guild": "g", "channel": "other"}, "summary": {"x": "keep"}})
    b.publish("acme", "pipeline.message_deleted", {"channel": "c", "message_id": "m1"})
    b.publish("acme", "summary.withdrawn", {"conversation": {"guild": "g", "channel": "c", "user": None}, "items": 1})
    shown = json.dumps([e.data for e in b.recent("acme", n=20)], ensure_ascii=False)
    assert "7788" not in shown and "keep" in shown, shown


def test_a_feed_behind_the_trimmed_stream_is_told_of_the_gap(buses: tuple[EventBus, EventBus]) -> None:
    a, b = buses  # streams of about 100 events

    async def scenario() -> None:
        for i in range(400):
            a.publish("acme", "memory.added", {"i": i})
        feed = b.feed("acme", since=0)
        gap, first = await take(feed, 2)
        assert gap.type == "stream.gap" and gap.seq == 0
        assert gap.data["requested_since"] == 0 and gap.data["oldest_available"] == first.seq
        assert gap.data["missed"] == first.seq - 1 > 0
        feed.close()

    run(scenario())


def test_a_bot_process_memory_publishes_into_the_servers_stream(buses: tuple[EventBus, EventBus], tmp_path: Path,
                                                                redis_url: str, redis_namespace: str) -> None:
    _, server_bus = buses
    connection = RedisConnection(redis_url, redis_namespace)

    async def scenario() -> None:
        feed = server_bus.feed("default")
        with Memory(tmp_path / "bot.db") as memory:  # the bot's own process, no server in it
            memory.listener = SharedEventLog(connection).listener("default")
            await asyncio.to_thread(memory.add, "누리: 오늘 점심은 비빔밥 어때?", scope={"channel": "cafe"})
        [event] = await take(feed, 1)
        assert event.type == "memory.added"
        assert event.data["blocks"][0]["text"] == "누리: 오늘 점심은 비빔밥 어때?"
        feed.close()

    try:
        run(scenario())
    finally:
        connection.close()


@pytest.mark.slow
def test_two_server_workers_stream_each_others_events(tmp_path: Path, redis_url: str, redis_namespace: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIEOK_REDIS_NAMESPACE", redis_namespace)
    db = tmp_path / "home.db"
    headers = {"Authorization": f"Bearer {create_key(db)}"}
    other = {"Authorization": f"Bearer {create_key(db, tenant='globex')}"}
    srv = Server(db, "--workers", "2", "--redis", redis_url)
    try:
        with httpx.Client(base_url=srv.url, headers=headers, timeout=60) as client:
            with client.stream("GET", "/v1/events") as stream:
                for i in range(6):  # spread over both workers by the kernel
                    client.post("/v1/memories", json={"text": f"worker message {i} 워커", "scope": {"channel": "c"}})
                httpx.post(f"{srv.url}/v1/memories", json={"text": "globex only"}, headers=other, timeout=60)
                got = sse_events(stream, 6)
            texts = [json.loads(e["data"])["data"]["blocks"][0]["text"] for e in got]
            assert sorted(texts) == sorted(f"worker message {i} 워커" for i in range(6)), texts
            seqs = [int(e["id"]) for e in got]
            assert seqs == sorted(seqs) and len(set(seqs)) == 6, "one sequence across the workers"
            with client.stream("GET", f"/v1/events?since={seqs[-1]}") as stream:
                client.post("/v1/search", json={"query": "워커"})
                [after] = sse_events(stream, 1)
            assert after["event"] == "search.answered" and "globex" not in after["data"]
    finally:
        assert srv.stop() in (0, -signal.SIGTERM)
