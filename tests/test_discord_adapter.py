"""The Discord adapter with discord.py's own objects: gateway events go in through discord.py's
parser (MESSAGE_CREATE / UPDATE / DELETE / DELETE_BULK, READY, GUILD_CREATE payloads) and replies
come out through its HTTP client, faked only at `HTTPClient.request` — the boundary where bytes
would leave for Discord. Start-up talks to a loopback server that speaks Discord's REST API."""

from __future__ import annotations

import asyncio
import datetime
import http.server
import itertools
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import discord
import discord.http
import pytest

from gieok import Memory
from gieok.chat.adapters.discord_bot import NO_MESSAGE_CONTENT, GieokBot, GieokCommands, run_until_stopped
from gieok.chat.agent.pipeline import ConversationPipeline, IncomingMessage
from gieok.chat.conversation.recent import conversation_key
from gieok.chat.runtime.core import LIMIT_MESSAGES, BotCore, ChannelRef, InboundMessage
from gieok.chat.settings import ChatSettings
from gieok.errors import ConfigError, GieokError
from runtime_helpers import ChatModel, VirtualTime, until
from test_erasure import _scan

BOT_ID, GUILD, CHANNEL, ALICE, OWNER, MOD, MINJI = 999, 111, 222, 333, 444, 555, 666
MOD_ROLE = 777
KEY = conversation_key(str(GUILD), str(CHANNEL))


def user(uid: int, name: str, bot: bool = False) -> dict[str, Any]:
    return {"id": str(uid), "username": name, "discriminator": "0", "global_name": name, "avatar": None, "bot": bot}


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


class DiscordHTTP:
    """What Discord's REST API would have received, and plausible answers."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any] | None, dict[str, Any]]] = []
        self._ids = itertools.count(5000)
        self.history: list[dict[str, Any]] = []  # the channel's messages, oldest first (GET …/messages)

    async def request(self, route: Any, **kwargs: Any) -> Any:
        self.calls.append((route.method, route.path, kwargs.get("json"), dict(route.__dict__)))
        if route.method == "POST" and route.path.endswith("/messages"):
            body = kwargs["json"]
            return {"id": str(next(self._ids)), "channel_id": str(CHANNEL), "author": user(BOT_ID, "Nuri", True),
                    "content": body.get("content", ""), "timestamp": now_iso(), "edited_timestamp": None,
                    "tts": False, "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
                    "embeds": [], "pinned": False, "type": 0}
        if route.method == "GET" and route.path.endswith("/messages"):
            return list(reversed(self.history))  # Discord answers newest first
        if route.method == "PATCH":
            return {"id": "1", "channel_id": str(CHANNEL), "author": user(BOT_ID, "Nuri", True),
                    "content": kwargs["json"].get("content", ""), "timestamp": now_iso(), "edited_timestamp": now_iso(),
                    "tts": False, "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
                    "embeds": [], "pinned": False, "type": 0}
        return None

    def messages(self) -> list[dict[str, Any]]:
        """Every message the bot posted, as it finally reads after its streaming edits."""
        posted: list[dict[str, Any]] = []
        by_id: dict[str, dict[str, Any]] = {}
        for method, path, body, route in self.calls:
            if method == "POST" and path.endswith("/messages"):
                posted.append(dict(body))
                by_id[str(5000 + len(posted) - 1)] = posted[-1]
            elif method == "PATCH" and "/messages/" in path:
                target = by_id.get(route["url"].rsplit("/", 1)[-1])
                if target is not None:
                    target["content"] = body["content"]
        return posted

    def edits(self) -> int:
        return sum(1 for method, _, _, _ in self.calls if method == "PATCH")

    def typing(self) -> int:
        return sum(1 for method, path, _, _ in self.calls if path.endswith("/typing"))


class Harness:
    def __init__(self, memory: Memory, **overrides: Any) -> None:
        self.vt = VirtualTime()
        self.model = ChatModel()
        self.bot = GieokBot(prefix="!", owner_ids={OWNER})
        self.http = DiscordHTTP()
        self.bot.http.request = self.http.request  # type: ignore[method-assign]
        settings = ChatSettings.over(memory.settings, analysis_every=1, **overrides)
        pipeline = ConversationPipeline(memory, settings=settings, llm=self.model, classifier=None)
        self.core = BotCore(pipeline, self.model, outbox=self.bot.outbox, settings=settings, clock=self.vt.clock,
                            sleep=self.vt.sleep)
        self.bot.attach(self.core)
        self._ids = itertools.count(100)
        self.conversational = 0  # messages said that the core must take in (not the bot's, not commands)

    async def connect(self) -> None:
        await self.bot._async_setup_hook()  # what login() does first: binds the client to this loop
        await self.bot.setup_hook()
        state = self.bot._connection
        state.parse_ready({"user": user(BOT_ID, "Nuri", True), "guilds": [], "session_id": "s",
                           "application": {"id": str(BOT_ID), "flags": 0}, "resume_gateway_url": "wss://gateway"})
        state.parse_guild_create({
            "id": str(GUILD), "name": "cafe", "owner_id": str(OWNER), "features": [], "emojis": [], "stickers": [],
            "roles": [{"id": str(GUILD), "name": "@everyone", "permissions": "0", "position": 0, "color": 0,
                       "hoist": False, "managed": False, "mentionable": False},
                      {"id": str(MOD_ROLE), "name": "mods", "permissions": str(1 << 13), "position": 1,  # manage
                       "color": 0, "hoist": False, "managed": False, "mentionable": True}],  # messages
            "channels": [{"id": str(CHANNEL), "type": 0, "name": "general", "position": 0,
                          "permission_overwrites": []}],
            "members": [], "member_count": 3, "unavailable": False, "large": False})
        await self.bot.on_ready()

    def payload(self, content: str, author: int = ALICE, name: str = "alice", mentions: list[int] | None = None,
                roles: list[int] | None = None, message_id: str | None = None, **fields: Any) -> dict[str, Any]:
        """A MESSAGE_CREATE payload (and, with `edited_timestamp`, a MESSAGE_UPDATE one)."""
        return {"id": message_id or str(next(self._ids)), "channel_id": str(CHANNEL), "guild_id": str(GUILD),
                "author": user(author, name), "member": {"roles": [str(r) for r in roles or []],
                                                        "joined_at": now_iso(), "deaf": False, "mute": False,
                                                        "flags": 0},
                "content": content, "timestamp": now_iso(), "edited_timestamp": None, "tts": False,
                "mention_everyone": False,
                "mentions": [user(m, NAMES.get(m, f"u{m}"), m == BOT_ID) for m in (mentions or [])],
                "mention_roles": [], "attachments": [], "embeds": [], "pinned": False, "type": 0, **fields}

    def say(self, content: str, author: int = ALICE, name: str = "alice", mentions: list[int] | None = None,
            reply_to: dict[str, Any] | None = None, **fields: Any) -> str:
        payload = self.payload(content, author, name, mentions, **fields)
        if reply_to is not None:
            payload["message_reference"] = {"message_id": reply_to["id"], "channel_id": str(CHANNEL)}
            payload["referenced_message"] = reply_to
            payload["type"] = 19
        self.bot._connection.parse_message_create(payload)
        if author != BOT_ID and not content.startswith(self.bot.prefix):
            self.conversational += 1
        return str(payload["id"])

    def stored(self, message_id: str) -> str | None:
        """The message's text in L1 (the recent messages), None when it is not there."""
        row = self.core.pipeline.tables.l1_by_external_id(KEY, message_id)
        return None if row is None else row.content

    async def observed(self) -> None:
        """discord.py dispatches on_message in a task of its own, and the core observes in a
        worker thread: wait until every message said has been taken in. Moving the virtual clock
        before that would start the debounce at the advanced time, and it would never end."""
        await until(lambda: self.core.health.messages_in >= self.conversational)

    async def turn(self, expected_messages: int) -> None:
        await self.observed()
        await self.vt.advance(3.0)
        await until(lambda: len(self.http.messages()) >= expected_messages)
        await until(self.core.idle)


def run(coro):
    return asyncio.run(coro)


NAMES = {MINJI: "민지"}


def attachment(name: str, content_type: str | None, aid: int = 1) -> dict[str, Any]:
    found = {"id": str(aid), "filename": name, "size": 1000, "url": f"https://cdn.example/{name}",
             "proxy_url": f"https://media.example/{name}"}
    if content_type is not None:
        found["content_type"] = content_type
    return found


def test_a_call_is_answered_as_a_reply_with_user_mentions_only(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        incoming = h.say("누리야 <user:333> 한테 인사해줘")
        await h.turn(1)
        reply = h.http.messages()[0]
        assert reply["content"].startswith("답장:") and "<@333>" in reply["content"], reply["content"]
        assert reply["message_reference"]["message_id"] == int(incoming)
        assert reply["allowed_mentions"] == {"parse": ["users"], "replied_user": True}
        # The core shows typing as a reply starts (and renews it while it is made); each call is one
        # indicator: the adapter never loops.
        shown = h.http.typing()
        assert shown == 1
        await h.bot.outbox.typing(ChannelRef(str(CHANNEL), str(GUILD)))
        assert h.http.typing() == shown + 1
        await h.bot.close()

    run(scenario())


def test_mentions_and_replies_to_the_bot_are_calls_chatter_is_not(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        h.say("오늘 점심 뭐 먹지")  # the channel is not active: no reply
        await h.turn(0)
        await until(h.core.idle)
        assert h.http.messages() == []
        h.say(f"<@{BOT_ID}> 점심 추천해줘", mentions=[BOT_ID])
        await h.turn(1)
        bot_message = {"id": "5000", "channel_id": str(CHANNEL), "author": user(BOT_ID, "Nuri", True),
                       "content": "김치찌개 어때?", "timestamp": now_iso(), "edited_timestamp": None, "tts": False,
                       "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
                       "embeds": [], "pinned": False, "type": 0}
        h.say("오 좋다 다른 건?", reply_to=bot_message)
        await h.turn(2)
        assert len(h.http.messages()) == 2
        await h.bot.close()

    run(scenario())


@pytest.mark.slow
def test_long_replies_are_chunked(memory: Memory) -> None:
    async def scenario() -> None:
        # The smallest chunk size the settings allow and a message of ~4.5 chunks (the splitting is
        # the same at 500 or 2000 characters; embedding a 2,000-character message takes seconds).
        h = Harness(memory, reply_max_chars=100)
        await h.connect()
        h.say("누리야 " + " ".join(f"문장{i}이야." for i in range(320))[:450])
        await h.turn(2)
        await until(h.core.idle)
        bodies = h.http.messages()
        assert len(bodies) >= 4 and all(len(b["content"]) <= 100 for b in bodies)
        assert "message_reference" in bodies[0] and all("message_reference" not in b for b in bodies[1:])
        await h.bot.close()

    run(scenario())


def test_commands(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        h.say("!here")
        await until(lambda: len(h.http.messages()) == 1)
        assert "이 채널" in h.http.messages()[-1]["content"]
        assert h.core.is_active(ChannelRef(str(CHANNEL), str(GUILD)))
        h.say("그냥 하는 말인데 오늘 날씨 좋다")  # active now: the model decides to answer
        await h.turn(2)
        h.say("!timer")
        await until(lambda: len(h.http.messages()) == 3)
        assert "overhead_ms" in h.http.messages()[-1]["content"]
        h.say("!status")
        await until(lambda: len(h.http.messages()) == 4)
        assert "generation: ok" in h.http.messages()[-1]["content"]
        h.say("!summary")
        await until(lambda: len(h.http.messages()) == 5)
        assert "Stage" in h.http.messages()[-1]["content"]
        h.say("!forgetme")
        await until(lambda: len(h.http.messages()) == 6)
        assert "confirm" in h.http.messages()[-1]["content"]
        h.say("!forgetme confirm")
        await until(lambda: len(h.http.messages()) == 7)
        assert "지웠어" in h.http.messages()[-1]["content"]
        assert all(b.scope.user != str(ALICE) or b.forgotten for b in memory.iter_blocks() if b.kind == "turn")
        h.say("!sync")  # owner only
        await until(lambda: len(h.http.messages()) == 8)
        assert "do not own" in h.http.messages()[-1]["content"]
        h.say("!leave")
        await until(lambda: len(h.http.messages()) == 9)
        assert not h.core.is_active(ChannelRef(str(CHANNEL), str(GUILD)))
        await h.bot.close()

    run(scenario())


def test_own_messages_are_ignored_and_close_flushes(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        h.say("I am the bot talking", author=BOT_ID, name="Nuri")
        h.say("누리야 마지막 메시지")
        await h.observed()
        await h.bot.close()  # shutdown before the debounce ends: the queued call is still answered
        assert len(h.http.messages()) == 1
        texts = [b.text for b in memory.iter_blocks() if b.kind == "turn"]
        assert "누리야 마지막 메시지" in texts and "I am the bot talking" not in texts

    run(scenario())


def test_gieok_bot_says_what_is_missing(tmp_path) -> None:
    from cli_runner import gieok

    db = tmp_path / "bot.db"
    no_token = gieok("bot", "--db", str(db), env={"DISCORD_TOKEN": None})
    assert no_token.returncode == 1 and "DISCORD_TOKEN" in no_token.stderr
    no_model = gieok("bot", "--db", str(db), env={"DISCORD_TOKEN": "x"})
    assert no_model.returncode == 1 and "GIEOK_GEMINI_API_KEY" in no_model.stderr
    assert no_model.stderr.count("\n") == 1 and not db.exists(), "nothing opened before the check"


def test_nothing_said_is_lost(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        photo = h.say("", attachments=[attachment("cat.png", "image/png")])
        both = h.say("이거 봐", attachments=[attachment("clip.mp4", "video/mp4", 2),
                                            attachment("report.pdf", None, 3)])  # typed by its name
        mention = h.say(f"<@{MINJI}> 내일 와? <:blobcat:123456789012345678>", mentions=[MINJI])
        sticker = h.say("", sticker_items=[{"id": "9", "name": "하트", "format_type": 1}])
        embed = h.say("", embeds=[{"type": "rich", "title": "공지", "description": "내일 " + "점검 " * 200,
                                   "fields": [{"name": "시간", "value": "10시"}]}])
        h.say("")  # nothing at all (a system message): skipped quietly
        h.conversational -= 1
        await h.observed()
        assert h.stored(photo) == "[image: cat.png]"
        assert h.stored(both) == "이거 봐\n[video: clip.mp4]\n[file: report.pdf]"
        assert h.stored(mention) == f"@민지 (<user:{MINJI}>) 내일 와? :blobcat:"
        assert h.stored(sticker) == "[sticker: 하트]"
        stored_embed = h.stored(embed)
        assert stored_embed is not None and stored_embed.startswith("[embed: 공지 — 내일 점검")
        assert len(stored_embed) <= 320 and stored_embed.endswith("…]")
        assert h.core.health.messages_in == h.conversational
        await h.bot.close()

    run(scenario())


def test_a_long_message_is_taken_in_whole(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        long = "가나다라마바사아자 " * 350  # 3,500 characters: under Nitro's 4,000
        whole = h.say(long)
        await h.observed()
        assert h.stored(whole) == long and len(long) == 3500
        # Not closed: closing writes it as a turn block, and embedding 3,500 characters takes
        # seconds that say nothing about the adapter.

    run(scenario())


def test_a_message_at_discords_limit_with_a_mention_and_pictures_is_taken_in(memory: Memory) -> None:
    """Discord's 4,000 characters, one mention and three pictures came to 4,027+ characters of
    text, over `max_input_chars`: the message was refused whole ("not taken in"). What gieok writes
    beside the words gives way now: the mention's name, then the lines that do not fit."""
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        words = f"<@{MINJI}> " + "오늘 있었던 일 말해줄게 " * 400
        words = words[:4_000]
        pictures = [attachment(f"photo{i}.png", "image/png", i) for i in range(1, 4)]
        full = h.say(words, mentions=[MINJI], attachments=pictures)
        short = h.say("사진 봐 " + "ㅋ" * 3_970, attachments=pictures)
        await h.observed()
        assert h.stored(full) == words, "taken in whole, as Discord counted it"
        kept = h.stored(short)
        assert kept is not None and len(kept) <= 4_000 and kept.startswith("사진 봐 " + "ㅋ" * 3_970)
        assert kept.endswith("ㅋ\n[… 3 more]"), kept[-60:]  # no room for a line and the count of the rest
        named = h.say(f"<@{MINJI}> 이거 봐", mentions=[MINJI], attachments=pictures)
        await h.observed()
        assert h.stored(named) == f"@민지 (<user:{MINJI}>) 이거 봐\n" + "\n".join(
            f"[image: photo{i}.png]" for i in range(1, 4)), "under the limit, as before"
        assert h.core.health.messages_in == h.conversational

    run(scenario())


def test_refused_messages_are_one_log_line(memory: Memory, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        message = discord.Message(state=h.bot._connection, channel=h.bot.get_channel(CHANNEL),  # type: ignore[arg-type]
                                  data=h.payload("가" * 4001))  # type: ignore[arg-type]
        await h.bot.on_message(message)  # too long for the core: refused, the handler carries on
        assert h.stored(str(message.id)) is None
        refused = [r for r in caplog.records if r.name.endswith("discord_bot")]
        assert len(refused) == 1 and refused[0].exc_info is None and "not taken in" in refused[0].getMessage()
        await h.bot.close()

    run(scenario())


def test_owners_and_moderators_are_privileged(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        taken: list[InboundMessage] = []
        submit = h.core.submit

        async def spy(message: InboundMessage) -> Any:
            taken.append(message)
            return await submit(message)

        h.core.submit = spy  # type: ignore[method-assign]
        h.say("저 모더예요", author=MOD, name="mod", roles=[MOD_ROLE])
        h.say("저는 그냥 멤버", author=ALICE)
        h.say("나는 봇 주인", author=OWNER, name="owner")
        await h.observed()
        assert {m.user_id: m.privileged for m in taken} == {str(MOD): True, str(ALICE): False, str(OWNER): True}
        await h.bot.close()

    run(scenario())


def test_twenty_calls_in_ten_seconds_get_the_limit_and_one_notice_an_owner_is_not_limited(memory: Memory) -> None:
    """Through discord.py's own objects: a member calling 20 times in 10 s is answered
    `user_limit_calls` times and told once; the owner, calling as often, is answered every time."""
    async def scenario() -> None:
        h = Harness(memory, max_batch=1, debounce_seconds=0.5, debounce_finished_seconds=0.5, user_limit_calls=3,
                    channel_limit_calls=100)
        await h.connect()

        async def calls(author: int, name: str) -> None:
            for n in range(20):  # one call every 0.5 s
                h.say(f"누리야 {name} {n}번째 질문", author=author, name=name)
                await h.observed()
                await h.vt.advance(0.5)
                await until(h.core.idle)
            await h.vt.advance(1.0)
            await until(h.core.idle)

        await calls(ALICE, "alice")
        posted = [m["content"] for m in h.http.messages()]
        assert sum(c.startswith("답장:") for c in posted) == 3, posted
        notices = [c for c in posted if c.startswith(LIMIT_MESSAGES["ko"].split("{")[0])]
        assert len(notices) == 1 and len(posted) == 4, posted
        await calls(OWNER, "owner")
        posted = [m["content"] for m in h.http.messages()][4:]
        assert len(posted) == 20 and all(c.startswith("답장:") for c in posted), posted
        assert h.core.health.limited_calls == 17 and h.core.health.messages_in == 40, "nothing said is lost"
        await h.bot.close()

    run(scenario())


def test_what_was_said_while_the_bot_was_away_is_caught_up_after_it_connects(memory: Memory) -> None:
    """A restart (or every replica dead at once): the gateway does not replay what was said in
    between, so after connecting the bot reads back the channels it has stored messages of and
    takes in what nobody stored — a call among them is answered; a message stored before, the
    bot's own, and a command are not taken in (again)."""
    async def scenario() -> None:
        # ids are snowflakes of now: a message's time is its id's (ids of the harness's own counter date from 2015)
        ids = itertools.count(discord.utils.time_snowflake(datetime.datetime.now(datetime.UTC)))
        before = Harness(memory)
        await before.connect()
        stored = before.payload("어제 만든 김치찌개 진짜 맛있었어", message_id=str(next(ids)))
        before.bot._connection.parse_message_create(stored)
        before.conversational += 1
        await before.observed()
        await before.bot.close()

        h = Harness(memory)
        missed = h.payload("I moved to Busan last week, by the way", message_id=str(next(ids)))
        command = h.payload("!status", message_id=str(next(ids)))
        own = h.payload("previous answer", author=BOT_ID, name="Nuri", message_id=str(next(ids)))
        call = h.payload(f"<@{BOT_ID}> 내가 어디로 이사했다고 했지?", mentions=[BOT_ID], message_id=str(next(ids)))
        h.http.history = [stored, missed, command, own, call]
        await h.connect()  # on_ready reads the channel back
        await until(lambda: h.core.health.caught_up == 2)
        assert h.stored(missed["id"]) == "I moved to Busan last week, by the way"
        assert h.stored(call["id"]) is not None
        assert h.core.health.messages_in == 2  # the stored one, the command, the bot's own: not taken in
        reads = [path for method, path, _, _ in h.http.calls if method == "GET" and path.endswith("/messages")]
        assert reads == ["/channels/{channel_id}/messages"]
        assert not any(path.endswith("/messages") and method == "POST" and "status" in str(body).lower()
                       for method, path, body, _ in h.http.calls)  # the command was not run again
        await h.vt.advance(3.0)
        await until(lambda: len(h.http.messages()) >= 1)  # the call is answered as if it had just come
        assert str(h.http.messages()[0]["message_reference"]["message_id"]) == call["id"]
        assert await h.bot.catch_up() == 0  # a second read-back takes nothing in twice
        await h.bot.close()

    run(scenario())


def test_an_edit_replaces_the_stored_text(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        said = h.payload("나 고양이 두 마리 키워")
        h.bot._connection.parse_message_create(said)
        h.conversational += 1
        await h.turn(0)
        await h.core.pipeline.drain()
        assert [b.text for b in memory.iter_blocks() if b.kind == "turn"] == ["나 고양이 두 마리 키워"]
        edits: list[InboundMessage] = []
        edit = h.core.edit

        async def spy(message: InboundMessage) -> bool:
            edits.append(message)
            return await edit(message)

        h.core.edit = spy  # type: ignore[method-assign]
        unfurled = {**said, "embeds": [{"type": "link", "title": "고양이", "url": "https://cats.example"}]}
        h.bot._connection.parse_message_update(unfurled)  # no edit time: a preview came, nothing was said
        h.bot._connection.parse_message_update({**said, "content": "나 고양이 세 마리 키워",
                                                "edited_timestamp": now_iso()})
        await until(lambda: h.core.health.edited == 1)
        assert [m.content for m in edits] == ["나 고양이 세 마리 키워"]
        assert h.stored(said["id"]) == "나 고양이 세 마리 키워"
        await h.core.pipeline.drain()
        assert [b.text for b in memory.iter_blocks() if b.kind == "turn" and not b.forgotten] == \
            ["나 고양이 세 마리 키워"]
        await h.bot.close()

    run(scenario())


def test_deleted_messages_leave_no_trace(memory: Memory, db_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        secret = h.say("나는 매일 아침 라벤더차를 마셔")
        bulk = [h.say("쿼카빌 여행 계획 세웠어"), h.say("초코칩쿠키 구웠어")]
        kept = h.say("오늘 날씨 좋다", author=MINJI, name="민지")
        await h.turn(0)
        await h.core.pipeline.drain()
        assert any("라벤더차" in hit.block.text for hit in memory.search("라벤더차", k=5).hits)
        h.bot._connection._messages.clear()  # out of discord.py's cache: the raw events still come
        h.bot._connection.parse_message_delete({"id": secret, "channel_id": str(CHANNEL), "guild_id": str(GUILD)})
        await until(lambda: h.core.health.deleted == 1)
        h.bot._connection.parse_message_delete_bulk({"ids": bulk, "channel_id": str(CHANNEL),
                                                     "guild_id": str(GUILD)})
        await until(lambda: h.core.health.deleted == 3)
        needles = ["라벤더차", "쿼카빌", "초코칩쿠키"]
        assert [h.stored(m) for m in (secret, *bulk)] == [None, None, None] and h.stored(kept) == "오늘 날씨 좋다"
        for needle in needles:
            assert not any(needle in hit.block.text for hit in memory.search(needle, k=10).hits), needle
        plan = await h.core.pipeline.preview(IncomingMessage("누리야 내가 아침에 뭐 마신다고 했지?",
                                                             user_id=str(ALICE), channel=str(CHANNEL),
                                                             guild=str(GUILD), display_name="alice",
                                                             explicit=True))
        assert plan.prompt is not None
        prompt = plan.prompt.render()
        assert "오늘 날씨 좋다" in prompt and not any(n in prompt for n in needles), prompt
        await h.bot.close()
        assert _scan(str(db_path), "sqlite", needles) == []  # every table of the store

    run(scenario())


class FakeContext:
    """What a command sees of a slash invocation, recording the order of what it is asked."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.interaction = object()
        self.author = discord.Object(ALICE)

    async def defer(self) -> None:
        self.calls.append("defer")

    async def typing(self) -> None:
        self.calls.append("typing")

    async def reply(self, text: str, **_: Any) -> None:
        self.calls.append(f"reply: {text}")


def test_forgetme_answers_at_once_then_erases(memory: Memory) -> None:
    async def scenario() -> None:
        h = Harness(memory)
        await h.connect()
        h.say("나는 매일 아침 라벤더차를 마셔")
        await h.turn(0)
        order: list[str] = []
        forget = h.core.pipeline.forget_user

        def erase(user_id: str) -> dict[str, int]:
            order.append("erase")
            return forget(user_id)

        h.core.pipeline.forget_user = erase  # type: ignore[method-assign]
        cog = h.bot.get_cog("GieokCommands")
        assert isinstance(cog, GieokCommands)
        await cog.forgetme.callback(cog, FakeContext(order), "confirm")  # type: ignore[arg-type]  # the slash form
        assert order[:2] == ["defer", "erase"] and order[2].startswith("reply: 지웠어: 사실 0개, 메시지 1개")
        # the prefix form: defer does nothing there, so one typing indicator goes out before the erasure

        def erase_between_requests(user_id: str) -> dict[str, int]:
            h.http.calls.append(("ERASE", "", None, {}))  # where it happened among the requests to Discord
            return forget(user_id)

        h.core.pipeline.forget_user = erase_between_requests  # type: ignore[method-assign]
        h.say("!forgetme confirm")
        await until(lambda: len(h.http.messages()) == 1)
        sequence = [("typing" if path.endswith("/typing") else method) for method, path, _, _ in h.http.calls]
        assert sequence[-3:] == ["typing", "ERASE", "POST"], sequence
        await h.bot.close()

    run(scenario())


def gateway_unreachable() -> None:
    """What discord.py 2.7 raises when its first gateway connection never opened: it retries,
    then trips over the websocket it never had."""
    try:
        raise socket.gaierror(-2, "Name or service not known")  # under aiohttp's ClientConnectorDNSError
    except OSError:
        raise AttributeError("'NoneType' object has no attribute 'sequence'") from None


@pytest.mark.parametrize(("failure", "expected", "line"), [
    (lambda: (_ for _ in ()).throw(discord.PrivilegedIntentsRequired(None)), ConfigError,
     "the Message Content intent is not enabled"),
    (gateway_unreachable, GieokError, "cannot reach Discord (gateway.discord.gg): check the network"),
])
def test_the_gateway_refusing_at_connect_is_one_line(monkeypatch: pytest.MonkeyPatch, failure: Any,
                                                     expected: type[Exception], line: str) -> None:
    async def refused(self: discord.Client, *, reconnect: bool = True) -> None:
        failure()

    monkeypatch.setattr(discord.Client, "connect", refused)

    async def scenario() -> None:
        with pytest.raises(expected) as raised:
            await GieokBot().connect()
        assert str(raised.value).startswith(line) and "\n" not in str(raised.value)

    run(scenario())


def test_sigterm_closes_the_bot_and_its_core(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    async def logged_in(self: discord.Client, token: str) -> None:
        pass

    async def connected(self: discord.Client, *, reconnect: bool = True) -> None:
        await asyncio.Event().wait()  # the gateway's events, until the process is stopped

    monkeypatch.setattr(discord.Client, "login", logged_in)
    monkeypatch.setattr(discord.Client, "connect", connected)
    h = Harness(memory)
    closed: list[str] = []
    close = h.core.close

    async def closing() -> None:
        closed.append("core")
        await close()

    h.core.close = closing  # type: ignore[method-assign]
    before = signal.getsignal(signal.SIGTERM)

    async def scenario() -> None:
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
        await run_until_stopped(h.bot, "t0ken")

    with pytest.raises(asyncio.CancelledError):  # what `run_discord_bot` takes as a clean stop
        asyncio.run(scenario())
    assert closed == ["core"] and h.bot.is_closed()
    assert signal.getsignal(signal.SIGTERM) == before, "the handler is gone with the loop"


# -- start-up against a loopback Discord ----------------------------------------------------------------


class FakeDiscord(http.server.BaseHTTPRequestHandler):
    """Discord's REST API as the log-in sees it: GET /users/@me answers the token, GET
    /oauth2/applications/@me the application (its flags say which intents are enabled)."""

    answers: ClassVar[dict[str, tuple[int, dict[str, Any]]]] = {}
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        status, body = self.answers.get(self.path.removeprefix("/api/v10"), (404, {"message": "404: Not Found",
                                                                                   "code": 0}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def application(flags: int) -> dict[str, Any]:
    return {"id": str(BOT_ID), "name": "Nuri", "description": "", "icon": None, "bot_public": True,
            "bot_require_code_grant": False, "owner": user(OWNER, "owner"), "verify_key": "k", "flags": flags,
            "team": None}


@pytest.fixture
def fake_discord(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeDiscord]]:
    handler = type("Answers", (FakeDiscord,), {"answers": {}, "asked": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setattr(discord.http.Route, "BASE", f"http://127.0.0.1:{server.server_address[1]}/api/v10")
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def warmed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the models' warm-up, and stops the start there (no gateway to connect to)."""
    calls: list[str] = []

    def warm(self: ConversationPipeline) -> None:
        calls.append("warm")
        raise ConfigError("stopped at the warm-up")

    monkeypatch.setattr(ConversationPipeline, "warm", warm)
    return calls


def bot_cli(tmp_path: Any) -> Any:
    from cli_runner import gieok

    return gieok("bot", "--db", str(tmp_path / "bot.db"),
                 env={"DISCORD_TOKEN": "t0ken", "GIEOK_LLM_CHAIN": "openai:m@http://127.0.0.1:1/v1"})


def one_error_line(ran: Any) -> str:
    lines = (ran.stdout + ran.stderr).splitlines()
    assert ran.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), (ran.stdout, ran.stderr)
    return lines[0]


def test_a_refused_token_is_one_line_before_the_models_load(tmp_path, fake_discord, warmed) -> None:
    fake_discord.answers["/users/@me"] = (401, {"message": "401: Unauthorized", "code": 0})
    line = one_error_line(bot_cli(tmp_path))
    assert line == ("error: Discord refused the token (401: Unauthorized): reset it in the developer portal, "
                    "Bot → Reset Token, and set DISCORD_TOKEN")
    assert warmed == [] and fake_discord.asked == ["/api/v10/users/@me"]


def test_a_missing_message_content_intent_is_one_line_before_the_models_load(tmp_path, fake_discord,
                                                                            warmed) -> None:
    fake_discord.answers["/users/@me"] = (200, user(BOT_ID, "Nuri", True))
    fake_discord.answers["/oauth2/applications/@me"] = (200, application(1 << 23))  # other flags only
    assert one_error_line(bot_cli(tmp_path)) == f"error: {NO_MESSAGE_CONTENT}"
    assert warmed == []
    fake_discord.answers["/oauth2/applications/@me"] = (200, application(1 << 19))  # enabled (unverified bot)
    assert one_error_line(bot_cli(tmp_path)) == "error: stopped at the warm-up"
    assert warmed == ["warm"], "checked, then warmed"


def test_no_network_is_one_line_before_the_models_load(tmp_path, monkeypatch, warmed) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(discord.http.Route, "BASE", f"http://127.0.0.1:{port}/api/v10")
    line = one_error_line(bot_cli(tmp_path))
    assert line.startswith(f"error: cannot reach Discord (127.0.0.1:{port}): check the network"), line
    assert warmed == []
