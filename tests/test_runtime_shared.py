"""Two bot processes sharing one store and one Redis (`BotCore(shared=…)`): every message is
answered once, in its own channel, whichever process received it; batches gather messages
received by both; a replica's copy of a message is taken in once; a dead process's channel is
taken over; rate limits and active channels hold across processes; turn blocks are written
once. Each "process" is a Memory, pipeline and BotCore of its own on the same database (a SQLite
file, or PostgreSQL when the test server is installed) and a RedisConnection of its own (its own
lease identity) on a real redis-server. Real time, with short debounces."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gieok import Memory
from gieok.chat.agent.pipeline import ConversationPipeline
from gieok.chat.conversation.recent import conversation_key, conversation_of
from gieok.chat.runtime.core import BotCore, ChannelRef, InboundMessage
from gieok.chat.runtime.shared_channels import SharedChannels
from gieok.chat.settings import ChatSettings
from gieok.coordination import RedisConnection
from runtime_helpers import ChatModel, RecordingOutbox, until
from store_backends import BACKENDS

CAFE = ChannelRef("cafe", "g1")
LOUNGE = ChannelRef("lounge", "g1")
TAG = re.compile(r"\[t\d+\]")
FAST = {"debounce_seconds": 0.3, "debounce_finished_seconds": 0.2, "debounce_max_seconds": 2.0,
        "rate_limit_channel_seconds": 0.0, "rate_limit_global_seconds": 0.0, "analysis_every": 1}


@dataclass
class Process:
    memory: Memory
    core: BotCore
    outbox: RecordingOutbox
    model: ChatModel
    connection: RedisConnection


@pytest.fixture(params=BACKENDS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_server").new_database())
    return str(tmp_path / "shared.db")


@pytest.fixture
def spawn(location: str, redis_url: str, redis_namespace: str) -> Iterator[Any]:
    made: list[Process] = []

    def make(**overrides: Any) -> Process:
        memory = Memory(settings=ChatSettings(db=location, redis=redis_url, redis_namespace=redis_namespace,
                                             redis_lease_seconds=1.0))
        settings = memory.settings.with_overrides(**{**FAST, **overrides})
        model, outbox = ChatModel(), RecordingOutbox()
        connection = RedisConnection(redis_url, redis_namespace)
        pipeline = ConversationPipeline(memory, settings=settings, llm=model, recover=False)
        core = BotCore(pipeline, model, outbox=outbox, settings=settings, bot_user_id="999",
                       shared=SharedChannels(connection, lease_seconds=settings.redis_lease_seconds))
        process = Process(memory, core, outbox, model, connection)
        made.append(process)
        _SPAWNED.append(process)
        return process

    yield make
    _SPAWNED.clear()
    for process in made:
        process.connection.close()
        process.memory.close()


def msg(text: str, mid: str, user: str = "1", ref: ChannelRef = CAFE) -> InboundMessage:
    return InboundMessage(ref, user, text, display_name=f"user{user}", message_id=mid)


SCENARIO_SECONDS = 180  # each takes a few seconds; many times that on a loaded machine
_SPAWNED: list[Process] = []  # this test's processes: closed when its scenario fails


def run(coro: Any) -> Any:
    """The scenario, bounded in time (a wait that never ends fails with where it was stuck); when
    it fails, the processes' cores are closed before the loop ends (else their channel workers
    keep the loop's shutdown waiting, and a failed assertion is a hang)."""
    async def guarded() -> Any:
        try:
            return await asyncio.wait_for(coro, SCENARIO_SECONDS)
        except BaseException:
            for process in _SPAWNED:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(process.core.close(), 30)
            raise

    return asyncio.run(guarded())


def replies(*processes: Process) -> list[tuple[ChannelRef, str]]:
    return [(sent.ref, sent.text) for p in processes for sent in p.outbox.sent]


def tag_counts(*processes: Process) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, text in replies(*processes):
        for tag in TAG.findall(text):
            counts[tag] = counts.get(tag, 0) + 1
    return counts


async def settled(*processes: Process, replies_expected: int, timeout: float = 30.0) -> None:
    await until(lambda: len(replies(*processes)) >= replies_expected, timeout)
    await until(lambda: all(p.core.idle() for p in processes), timeout)


async def handed_back(*processes: Process, replies_expected: int, timeout: float = 30.0) -> None:
    """Every turn so far answered and every channel handed back (nobody holds a lease)."""
    await settled(*processes, replies_expected=replies_expected, timeout=timeout)
    await until(lambda: not any(p.core.held_channels for p in processes), timeout)


async def close_all(*processes: Process) -> None:
    for process in processes:
        await process.core.close()


def turn_blocks(memory: Memory) -> list[str]:
    return [block.text for block in memory.iter_blocks() if block.kind == "turn"]


@pytest.mark.slow
def test_each_message_is_answered_once_in_its_own_channel(spawn: Any) -> None:
    a, b = spawn(), spawn()

    async def scenario() -> None:
        sent: dict[str, ChannelRef] = {}
        for i in range(8):
            ref = CAFE if i % 2 == 0 else LOUNGE
            tag = f"[t{i}]"
            sent[tag] = ref
            target = a if (i // 2) % 2 == 0 else b  # both channels reach both processes
            await target.core.submit(msg(f"누리야 {tag} 오늘 뭐 해?", f"m{i}", user=str(10 + i), ref=ref))
            await handed_back(a, b, replies_expected=i + 1)  # each its own turn; any process may take the next
        await settled(a, b, replies_expected=8)
        counts = tag_counts(a, b)
        assert counts == {tag: 1 for tag in sent}, counts
        for ref, text in replies(a, b):
            assert all(sent[tag] == ref for tag in TAG.findall(text)), f"misrouted: {text!r} in {ref}"
        assert replies(a) and replies(b), "both processes answered some turns"
        await close_all(a, b)
        blocks = turn_blocks(a.memory)
        for tag in sent:
            assert sum(tag in text for text in blocks) == 2, f"{tag}: one user turn and one reply, written once"
        assert a.memory.verify().ok

    run(scenario())


def test_a_batch_gathers_one_users_messages_received_by_both_processes(spawn: Any) -> None:
    a, b = spawn(), spawn()

    async def scenario() -> None:
        await a.core.submit(msg("누리야 [t1] 안녕", "m1"))
        await b.core.submit(msg("[t2] 그리고 오늘 뭐해", "m2"))  # trails off: the full debounce after it
        await settled(a, b, replies_expected=1)
        await asyncio.sleep(0.5)
        assert len(replies(a, b)) == 1, replies(a, b)
        text = replies(a, b)[0][1]
        assert "[t1] 안녕" in text and "[t2] 그리고 오늘 뭐해" in text, text
        await close_all(a, b)

    run(scenario())


def test_a_replicas_copy_of_a_message_is_taken_in_once(spawn: Any) -> None:
    a, b = spawn(), spawn()

    async def scenario() -> None:
        first = await a.core.submit(msg("누리야 [t1] 점심 추천해줘", "same-id"))
        second = await b.core.submit(msg("누리야 [t1] 점심 추천해줘", "same-id"))
        assert first is not None and second is None
        assert b.core.health.duplicates == 1
        await settled(a, b, replies_expected=1)
        await asyncio.sleep(0.5)
        assert tag_counts(a, b) == {"[t1]": 1}
        rows = a.core.pipeline.l1.recent(conversation_of("g1", "cafe"))
        assert [r.content for r in rows if r.role == "user"] == ["누리야 [t1] 점심 추천해줘"]
        await close_all(a, b)

    run(scenario())


@pytest.fixture
def dead(redis_url: str, redis_namespace: str) -> Iterator[SharedChannels]:
    """The shared state of a process that takes something, then dies without a word (its lease
    and its presence lapse after 1 s)."""
    connection = RedisConnection(redis_url, redis_namespace)
    try:
        yield SharedChannels(connection, lease_seconds=1.0)
    finally:
        connection.close()


def test_a_message_whose_claimant_died_before_queueing_it_is_taken_in_by_the_other_replica(
        spawn: Any, dead: SharedChannels) -> None:
    """Found by `gieok bench chaos`: a bot killed between its claim of a message and queueing it
    lost the message; the other replica had dropped its copy on losing the claim."""
    b = spawn()

    async def scenario() -> None:
        key = conversation_key("g1", "cafe")
        assert await dead.claim_message(key, "m1") > 0, "a replica claims the message, then dies before queueing it"
        assert await b.core.submit(msg("누리야 [t1] 내 말 들려?", "m1")) is None, "the claim is the other's"
        await settled(b, replies_expected=1, timeout=20)
        assert tag_counts(b) == {"[t1]": 1}
        assert b.core.health.claims_taken_over == 1 and b.core.health.duplicates == 0
        rows = b.core.pipeline.l1.recent(conversation_of("g1", "cafe"))
        assert [r.content for r in rows if r.role == "user"] == ["누리야 [t1] 내 말 들려?"]
        await close_all(b)
        await dead.aclose()

    run(scenario())


def test_a_dead_processs_channel_is_taken_over_after_its_lease(spawn: Any, dead: SharedChannels) -> None:
    b = spawn()

    async def scenario() -> None:
        key = conversation_key("g1", "cafe")
        assert await dead.try_lease(key), "a process takes the channel, then dies without a word"
        await b.core.submit(msg("누리야 [t1] 거기 누구 있어?", "m1"))
        await asyncio.sleep(0.5)
        assert replies(b) == [], "the channel is someone else's for now"
        await settled(b, replies_expected=1, timeout=15)
        assert tag_counts(b) == {"[t1]": 1}
        assert await dead.renew([key]) == {key}, "the dead process's lease is gone"
        await close_all(b)
        await dead.aclose()

    run(scenario())


def test_rate_limits_hold_across_processes(spawn: Any) -> None:
    limits = {"rate_limit_channel_seconds": 60.0, "rate_limit_global_seconds": 0.0, "rate_bypass_confidence": 1.0}
    a, b = spawn(**limits), spawn(**limits)

    async def scenario() -> None:
        a.core.set_active(CAFE, True)
        await a.core.submit(msg("[t1] 오늘 날씨 진짜 좋다!", "m1"))  # not a call: an unsolicited reply
        await handed_back(a, b, replies_expected=1)
        await b.core.submit(msg("[t2] 주말에 어디 갈까?", "m2", user="2"))
        await until(lambda: a.core.health.rate_limited + b.core.health.rate_limited == 1, 15)
        assert tag_counts(a, b) == {"[t1]": 1}, "the second unsolicited reply waits out the shared window"
        await b.core.submit(msg("누리야 [t3] 대답해줘", "m3", user="2"))  # a call is never limited
        await settled(a, b, replies_expected=2)
        assert tag_counts(a, b) == {"[t1]": 1, "[t3]": 1}
        await close_all(a, b)

    run(scenario())


def test_active_channels_follow_a_change_made_in_another_process(spawn: Any) -> None:
    a, b = spawn(), spawn()

    async def scenario() -> None:
        await a.core.start()
        await b.core.start()
        assert not b.core.is_active(CAFE)
        a.core.set_active(CAFE, True)
        await until(lambda: b.core.is_active(CAFE), 5)
        b.core.set_active(CAFE, False)
        await until(lambda: not a.core.is_active(CAFE), 5)
        assert a.core.pipeline.tables.active_keys() == set(), "the store keeps the durable record"
        await close_all(a, b)

    run(scenario())


def test_the_next_owner_reads_the_working_memory_the_last_one_left(spawn: Any) -> None:
    a, b = spawn(), spawn()
    conversation = conversation_of("g1", "cafe")

    async def scenario() -> None:
        await a.core.submit(msg("누리야 [t1] 우리 고양이 이름은 보리야", "m1"))
        await settled(a, b, replies_expected=1)
        await handed_back(a, b, replies_expected=1)
        await a.core.pipeline.drain()  # the turn blocks are written behind the reply: wait for them
        await b.core.pipeline.drain()
        # whichever took the channel (the one it came to, or the other's sweep) ran the turn
        first, second = (a, b) if a.memory.working.slots(conversation) else (b, a)
        assert first.memory.working.slots(conversation), "the turn fed its process's working memory"
        assert not second.memory.working.slots(conversation), "the other has not run this channel yet"
        await first.core.close()  # the next turn can only run in the other process
        await second.core.submit(msg("누리야 [t2] 내 고양이 이름 기억나?", "m2"))
        await settled(second, replies_expected=1)
        seen = {slot.content for slot in second.memory.working.slots(conversation)}
        assert any("보리" in content for content in seen), seen
        await close_all(second)

    run(scenario())


@pytest.mark.slow
def test_messages_a_process_holds_when_its_lease_is_lost_are_handed_back(spawn: Any, redis_url: str,
                                                                         redis_namespace: str,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    # a hands back as soon as its lease upkeep (every third of the 1 s lease) finds the lease gone,
    # without waiting for its debounce to end: a debounce of a minute, which only the hand-back can
    # cut short within the 20 s the answer is waited for. (With a debounce of a few seconds, on a
    # loaded machine the debounce could end before the lease was even deleted, and a answered.)
    a = spawn(debounce_seconds=60.0, debounce_finished_seconds=60.0)
    b = spawn(debounce_seconds=2.0, debounce_finished_seconds=2.0)
    key = conversation_key("g1", "cafe")

    async def scenario() -> None:
        await b.core.start()
        await a.core.submit(msg("누리야 [t1] 잠깐만...", "m1"))
        inbox = f"{redis_namespace}:inbox:{key}"
        await until(lambda: key in a.core.held_channels and a.connection.client.llen(inbox) == 0, 5)
        await asyncio.sleep(0.2)  # a holds the message in its debounce
        # a stalls past its lease (as a process starved of CPU would): the lease is gone
        assert a.connection.client.delete(f"{redis_namespace}:lease:{key}") == 1
        await settled(a, b, replies_expected=1, timeout=20)
        await asyncio.sleep(0.5)
        assert tag_counts(a, b) == {"[t1]": 1}, "answered once, by whichever process took the channel next"
        assert "1 message(s) handed back" in caplog.text, "a found its lease gone and put the message back"
        await close_all(a, b)

    run(scenario())


def test_a_stalled_owners_late_turn_is_refused_by_the_fence(spawn: Any, redis_namespace: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """a drains a message and stalls while planning its turn, past its lease (its lease check
    before the turn had passed); b takes the channel — a newer fencing token, written to the
    store — and gets the message a had drained back from the channel's in-flight list. When a
    resumes, its claim on the message is refused in the store: the message is answered once, by
    b, and a writes nothing."""
    a = spawn(redis_lease_seconds=60.0)  # stalled: not even its lease upkeep runs until it resumes
    b = spawn()
    key = conversation_key("g1", "cafe")

    async def scenario() -> None:
        await b.core.start()
        a.core.set_active(CAFE, True)  # a message that does not call the bot gets a stage-2 decision here …
        a.model.hold = asyncio.Event()
        await a.core.submit(msg("[t1] 거기 있어?", "m1"))
        await until(lambda: len(a.model.decisions) == 1, 10)  # … so a's turn is under way, held in it
        assert a.connection.client.delete(f"{redis_namespace}:lease:{key}") == 1  # a's lease lapsed
        await b.core.submit(msg("누리야 [t2] 대답해줘", "m2"))
        await until(lambda: key in b.core.held_channels, 5)
        await settled(b, replies_expected=1, timeout=20)
        assert a.memory.store.conversation.fence_token(key) == b.core._fences[key] > a.core._fences[key]
        a.model.hold.set()  # a resumes
        await until(lambda: "another process runs this channel" in caplog.text, 10)
        await handed_back(a, b, replies_expected=1)
        assert tag_counts(a, b) == {"[t1]": 1, "[t2]": 1}
        assert a.outbox.sent == [], "a's late turn was refused before it answered"
        rows = b.memory.store.conversation.l1_recent(key, 10)
        assert [r.role for r in rows].count("assistant") == 1
        await close_all(a, b)

    run(scenario())


def test_close_ends_the_shared_services_even_when_a_cancellation_is_lost(spawn: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the parallel suite (a close that never ended, twice in ~10 runs): Python 3.11's
    asyncio.timeout, inside redis-py's reads, can turn a cancellation that lands as its timeout
    fires into TimeoutError — an OSError, so the lease upkeep took it for Redis being away and went
    on, and `close` waited for it forever. Here a renewal loses every cancellation that way: the
    upkeep and the wake-up listener still end once `close` has asked them to."""
    renew = SharedChannels.renew
    slow = asyncio.Event()

    async def renew_losing_the_cancellation(self: SharedChannels, channel_keys: Any) -> set[str]:
        try:
            if slow.is_set():
                await asyncio.sleep(5.0)  # a slow renewal: `close`'s cancellation lands in here
            return await renew(self, channel_keys)
        except asyncio.CancelledError:
            raise self.connection.unavailable(TimeoutError("a cancellation, as asyncio.timeout turns it")) from None

    monkeypatch.setattr(SharedChannels, "renew", renew_losing_the_cancellation)
    a = spawn()

    async def scenario() -> None:
        await a.core.start()
        await a.core.submit(msg("누리야 [t1] 안녕", "m1"))
        await settled(a, replies_expected=1)
        slow.set()
        await asyncio.sleep(0.5)  # the upkeep (every third of the 1-s lease) is inside a renewal now
        await asyncio.wait_for(a.core.close(), 10)  # it used to wait for the upkeep forever
        assert all(task.done() for task in a.core._services)

    run(scenario())


async def _deleted(other: Process) -> None:
    assert await other.core.delete(CAFE, ["m1"]) == 1  # the platform's deletion, received by the other replica


async def _author_erased(other: Process) -> None:
    erased = await asyncio.to_thread(other.core.pipeline.forget_user, "1")  # `forgetme`, handled by the other
    assert erased["l1_rows"] == 1, erased


@pytest.mark.slow
@pytest.mark.parametrize("withdraw", [_deleted, _author_erased], ids=["deleted", "author_erased"])
def test_a_message_withdrawn_by_another_replica_while_it_waits_for_its_turn_is_not_answered(
        spawn: Any, withdraw: Callable[[Process], Awaitable[None]]) -> None:
    """One replica took the message in (stored, queued in Redis, waiting out its debounce); the
    other received its deletion, or erased its author. The turn finds the message's stored row gone
    — it cannot claim it — so the message is neither answered nor written as a turn, and no model
    reads it."""
    a, b = spawn(debounce_seconds=1.5, debounce_finished_seconds=1.5), spawn()

    async def scenario() -> None:
        await a.core.submit(msg("누리야 내 사물함 비밀번호는 7788이야", "m1", user="1"))
        await withdraw(b)
        await a.core.submit(msg("누리야 오늘 점심 뭐 먹지", "m2", user="2"))
        await settled(a, b, replies_expected=1)
        await asyncio.sleep(2.0)  # a late turn of the withdrawn message would have come by now
        await until(lambda: all(p.core.idle() for p in (a, b)))
        await close_all(a, b)

    run(scenario())
    said = replies(a, b)
    assert len(said) == 1 and "7788" not in said[0][1], said
    assert not any("7788" in text for p in (a, b) for text in [*p.model.streams, *p.model.decisions]), \
        "a model read it"
    assert not any("7788" in text for text in turn_blocks(a.memory)), turn_blocks(a.memory)
