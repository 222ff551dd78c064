"""The bot in a community, on virtual time: what a call costs (model calls per reply), call limits
per user and per channel with one notice per window, a guild's daily model budget, the typing
indicator kept alive, extraction batched and run when a conversation goes quiet, long messages
kept whole, and edits and deletions where they were said. Real SQLite, the real embedder and
pipeline; the model is an in-process implementation of the `LLM` protocol."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from gieok import Memory
from gieok.chat.agent.pipeline import ConversationPipeline, IncomingMessage
from gieok.chat.conversation.recent import conversation_of
from gieok.chat.llm.base import ChatMessage
from gieok.chat.runtime.core import BUDGET_MESSAGES, LIMIT_MESSAGES, TYPING_SECONDS, BotCore, ChannelRef, InboundMessage
from gieok.chat.runtime.ratelimit import CallLimits, TokenBuckets
from gieok.chat.settings import ChatSettings
from runtime_helpers import ChatModel, RecordingOutbox, VirtualTime, until

CAFE = ChannelRef("cafe", "g1")
LOUNGE = ChannelRef("lounge", "g1")
ONE_BY_ONE = {"debounce_seconds": 0.5, "debounce_finished_seconds": 0.5, "max_batch": 1}
LIMIT_KO = LIMIT_MESSAGES["ko"].split("{", 1)[0]
LIMIT_EN = LIMIT_MESSAGES["en"].split("{", 1)[0]


def make_core(memory: Memory, model: Any, vt: VirtualTime, outbox: RecordingOutbox, **overrides: Any) -> BotCore:
    settings = ChatSettings.over(memory.settings, **{"rate_limit_channel_seconds": 0.0,
                                                     "rate_limit_global_seconds": 0.0, **overrides})
    pipeline = ConversationPipeline(memory, settings=settings, llm=model)
    return BotCore(pipeline, model, outbox=outbox, settings=settings, clock=vt.clock, sleep=vt.sleep,
                   bot_user_id="999")


def call(text: str, user: str = "1", ref: ChannelRef = CAFE, mid: str | None = None, **kw: Any) -> InboundMessage:
    return InboundMessage(ref, user, text, display_name=f"user{user}", message_id=mid, **kw)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def send_over(core: BotCore, vt: VirtualTime, messages: Sequence[InboundMessage], seconds: float) -> None:
    """Submit `messages` evenly over `seconds` of virtual time (each turn done before the clock
    moves on: the bot is fast, the people are not), then let the last debounce pass."""
    gap = seconds / len(messages)
    for message in messages:
        await core.submit(message)
        await vt.advance(gap)
        await until(core.idle)
    await vt.advance(1.0)
    await until(core.idle)


def test_a_call_costs_one_model_call_and_extraction_is_batched(memory: Memory) -> None:
    """No stage-2 decision before a call's reply; extraction every analysis_every messages of the
    conversation, not once per reply: 10 calls cost 10 replies and 2 extractions (the first
    message, then the fifth after it), 1.2 model calls per reply — reported in `health`."""
    async def scenario() -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), ChatModel()
        core = make_core(memory, model, vt, outbox, **ONE_BY_ONE, analysis_every=5, user_limit_calls=0)
        await send_over(core, vt, [call(f"누리야 질문 {n}번", mid=f"q{n}") for n in range(10)], 20.0)
        await core.close()
        assert len(outbox.sent) == 10 and model.decisions == [], "every call answered, none decided first"
        health = core.health.as_dict()
        assert health["model_calls"] == {"reply": 10, "extract": 2}, health["model_calls"]
        assert health["model_calls_per_reply"] == 1.2

    run(scenario())


def test_twenty_calls_in_ten_seconds_get_the_limit_and_one_notice(memory: Memory) -> None:
    async def scenario() -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), ChatModel()
        core = make_core(memory, model, vt, outbox, **ONE_BY_ONE, user_limit_calls=3, user_limit_seconds=60.0)
        await send_over(core, vt, [call(f"누리야 {n}번째 부름", mid=f"m{n}") for n in range(20)], 10.0)
        replies = [t for t in outbox.texts() if t.startswith("답장")]
        notices = [t for t in outbox.texts() if t.startswith(LIMIT_KO)]
        assert len(replies) == 3 and len(notices) == 1, outbox.texts()
        assert "초 뒤에" in notices[0]
        assert core.health.limited_calls == 17 and core.health.notices == 1
        # nothing said is lost: every call is in L1 and memory
        rows = core.pipeline.l1.recent(conversation_of("g1", "cafe"), 50)
        assert sum(1 for r in rows if r.role == "user") == 20
        # the bucket refills: a minute later the same user is answered again (20 s per call)
        await vt.advance(25.0)
        await send_over(core, vt, [call("누리야 이제 돼?", mid="later")], 1.0)
        assert outbox.texts()[-1].startswith("답장: 누리야 이제 돼?")
        await core.close()

    run(scenario())


def test_owners_and_moderators_are_not_limited_and_english_gets_an_english_notice(memory: Memory) -> None:
    async def scenario() -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), ChatModel()
        core = make_core(memory, model, vt, outbox, **ONE_BY_ONE, user_limit_calls=2, channel_limit_calls=100)
        await send_over(core, vt, [call(f"Nuri, question {n}?", user="owner", mid=f"o{n}", privileged=True)
                                   for n in range(8)], 8.0)
        assert len(outbox.sent) == 8 and core.health.limited_calls == 0
        await send_over(core, vt, [call(f"Nuri, question {n}?", user="member", ref=LOUNGE, mid=f"u{n}")
                                   for n in range(4)], 4.0)
        lounge = outbox.texts("lounge")
        assert [t.startswith(LIMIT_EN) for t in lounge] == [False, False, True], lounge
        await core.close()

    run(scenario())


def test_a_channel_limit_holds_across_users() -> None:
    now = [0.0]
    limits = CallLimits.of(10, 60.0, 3, 30.0, clock=lambda: now[0])
    answered = [limits.admit(f"user{n}", "g1:cafe") is None for n in range(5)]
    assert answered == [True, True, True, False, False]
    assert limits.admit("user9", "g1:lounge") is None, "another channel has its own bucket"
    wait = limits.admit("user5", "g1:cafe")
    assert wait is not None and 9.0 < wait <= 10.0, wait  # one call every 10 s refills
    now[0] += wait
    assert limits.admit("user5", "g1:cafe") is None
    unlimited = TokenBuckets(0, 60.0, lambda: now[0])
    assert unlimited.ready("x") and unlimited.wait("x") == 0.0


def test_a_guilds_daily_budget_is_kept_in_the_store_and_said_when_spent(db_path: Path) -> None:
    """Estimated tokens per guild per day: once spent, calls get one notice (per caller and hour)
    and no model call; the sum survives a restart (the store) and another guild is unaffected."""
    async def first_day(memory: Memory) -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), ChatModel()
        core = make_core(memory, model, vt, outbox, **ONE_BY_ONE, guild_daily_tokens=1500, user_limit_calls=0)
        # the first call's prompt and reply alone spend the budget (about 1,840 estimated tokens of
        # 1,500); 150 "길게" made it 2,650, and the real embedder paid for every character
        await send_over(core, vt, [call(f"누리야 오늘 {n}번째 이야기를 해볼게 " + "길게 " * 60, mid=f"b{n}")
                                   for n in range(6)], 6.0)
        texts = outbox.texts()
        budget = [t for t in texts if t == BUDGET_MESSAGES["ko"]]
        assert len(budget) == 1 and len(model.streams) < 6, texts
        assert core.usage.used_today("g1") >= 1500 and core.usage.spent("g1")
        await send_over(core, vt, [call("누리야 다른 서버야", ref=ChannelRef("c", "g2"), mid="other")], 1.0)
        assert outbox.texts()[-1].startswith("답장: 누리야 다른 서버야"), "another guild's budget is its own"
        await core.close()

    with Memory(db_path) as memory:
        run(first_day(memory))
    with Memory(db_path) as memory:
        settings = ChatSettings.over(memory.settings, guild_daily_tokens=1500)
        pipeline = ConversationPipeline(memory, settings=settings, llm=ChatModel())
        assert pipeline.usage.spent("g1") and not pipeline.usage.spent("g2"), "kept across a restart"


class SlowStream(ChatModel):
    """Its stream waits for `go` before the first token (a slow provider, a fallback)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[str]:
        await self.go.wait()
        async for piece in super().stream(messages):
            yield piece


def test_the_typing_indicator_is_kept_alive_until_the_reply_is_out(memory: Memory) -> None:
    async def scenario() -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), SlowStream()
        core = make_core(memory, model, vt, outbox, **ONE_BY_ONE)
        await core.submit(call("누리야 천천히 생각해봐", mid="slow"))
        await vt.advance(1.0)
        await until(lambda: outbox.typing_calls == 1)
        for expected in (2, 3, 4):  # a provider that takes 25 s: the indicator is renewed every 8 s
            # the renewing task sleeps first (it starts after the first indicator: a loaded machine
            # may run the test on before it does)
            await until(lambda: vt.has_sleeper_until(vt.now + TYPING_SECONDS))
            await vt.advance(TYPING_SECONDS)
            await until(lambda n=expected: outbox.typing_calls == n)
        model.go.set()
        await until(lambda: len(outbox.sent) == 1)
        await vt.advance(TYPING_SECONDS * 3)
        await asyncio.sleep(0.05)
        assert outbox.typing_calls == 4, "no indicator once the reply is on screen"
        await core.close()

    run(scenario())


def test_a_quiet_conversation_is_extracted_without_waiting_for_analysis_every(memory: Memory) -> None:
    async def scenario() -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), ChatModel()
        core = make_core(memory, model, vt, outbox, **ONE_BY_ONE, analysis_every=50, extraction_idle_seconds=0.2)
        await send_over(core, vt, [call("누리야 나 다음 주에 이사 가", mid="a1")], 1.0)
        await send_over(core, vt, [call("누리야 짐 싸는 거 도와줘", mid="a2")], 1.0)
        assert core.usage.calls["extract"] == 1, "the conversation's first message only"
        time.sleep(0.3)  # the pipeline's clock is the wall clock: quiet for extraction_idle_seconds
        await vt.advance(5.0)  # the idle loop looks every max(5 s, half the idle time)
        await until(lambda: core.usage.calls["extract"] == 2)
        await core.close()

    run(scenario())


def test_a_batch_of_long_messages_is_kept_whole_and_shortened_only_in_the_prompt(memory: Memory) -> None:
    async def scenario() -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), ChatModel()
        # Each message within max_input_chars, the two together over it, each over the prompt's
        # budget_input: the limits scaled down from 4,000 characters and 2,000 tokens, so that the
        # real embedder reads two hundred characters a message, not four thousand (its cost grows
        # faster than the text: 3,500 characters took ten seconds).
        core = make_core(memory, model, vt, outbox, max_batch=4, max_input_chars=200, budget_input=100)
        first, second = "누리야 " + "가" * 190, "나" * 190 + " 끝"
        assert max(len(first), len(second)) <= 200 < len(first) + len(second)
        await core.submit(call(first, mid="long1"))
        await core.submit(call(second, mid="long2"))
        await vt.advance(20.0)
        await until(lambda: len(outbox.sent) >= 1)
        await until(core.idle)
        (plan,) = core.last_plans.values()
        assert plan.message.content == f"{first}\n{second}", "the batch is not cut"
        assert plan.prompt is not None and "자 생략]" in plan.prompt.messages[-1].content
        await core.close()
        stored = [b.text for b in memory.iter_blocks() if b.kind == "turn" and b.speaker == "1"]
        assert stored == [first, second]

    run(scenario())


def test_deleting_any_part_of_a_reply_sent_in_parts_erases_the_reply(memory: Memory) -> None:
    """A reply longer than a Discord message is sent in parts and stored as one turn under its
    first part's id: deleting a later part erased nothing."""
    async def scenario() -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), ChatModel()
        # the smallest parts the settings allow (the splitting is the same at 2,000 characters, and
        # embedding a 3,900-character message takes seconds that say nothing about the deletion)
        core = make_core(memory, model, vt, outbox, reply_max_chars=100, **ONE_BY_ONE)
        long = "누리야 이 긴 이야기 좀 들어봐 " + "ZZCHUNK 오늘 있었던 일인데 정말 길어 " * 8
        await send_over(core, vt, [call(long, mid="long")], 2.0)
        await core.pipeline.settle(conversation_of("g1", "cafe"))
        parts = [s.message_id for s in outbox.sent]
        assert len(parts) >= 2, "the echo is sent in parts"
        assert await core.delete(CAFE, [parts[-1]]) == 1
        assert [b.text for b in memory.iter_blocks() if b.kind == "turn" and "답장" in b.text] == []
        assert any(b.text.startswith("누리야 이 긴") for b in memory.iter_blocks() if b.kind == "turn")
        await core.close()

    run(scenario())


def test_edits_and_deletions_follow_the_message_where_it_was_said(memory: Memory) -> None:
    async def scenario() -> None:
        vt, outbox, model = VirtualTime(), RecordingOutbox(), ChatModel()
        core = make_core(memory, model, vt, outbox, **ONE_BY_ONE)
        await send_over(core, vt, [call("누리야 내 비밀번호는 hunter2야", mid="secret"),
                                   call("누리야 점심은 김밥 먹었어", mid="lunch")], 2.0)
        await core.pipeline.settle(conversation_of("g1", "cafe"))  # the turn blocks are written
        assert await core.edit(call("누리야 점심은 라면 먹었어", mid="lunch"))
        assert not await core.edit(call("누리야 점심은 라면 먹었어", mid="lunch")), "the same text: no change"
        assert not await core.edit(call("누리야 모르는 메시지", mid="never-seen"))
        # the message and the bot's reply to it (which repeats it); an id never seen is passed over
        assert await core.delete(CAFE, ["secret", "never-seen"]) == 2
        assert core.health.edited == 1 and core.health.deleted == 2
        texts = [b.text for b in memory.iter_blocks() if b.kind == "turn"]
        assert "누리야 점심은 라면 먹었어" in texts and "누리야 점심은 김밥 먹었어" not in texts
        assert not any("hunter2" in t for t in texts)
        assert not any("김밥" in t for t in texts), "the reply that repeated the edited words went with them"
        hits = memory.search("비밀번호 hunter2", k=10)
        assert not any("hunter2" in h.block.text for h in hits)
        plan = await core.pipeline.preview(IncomingMessage("누리야 내 비밀번호 뭐였지?", user_id="1", channel="cafe",
                                                           guild="g1", explicit=True))
        assert plan.prompt is not None and "hunter2" not in plan.prompt.render()
        await core.close()

    run(scenario())
