"""The Discord adapter with discord.py's own objects: gateway events go in through discord.py's
parser (MESSAGE_CREATE, READY, GUILD_CREATE payloads) and replies come out through its HTTP
client, faked only at `HTTPClient.request` — the boundary where bytes would leave for Discord."""

from __future__ import annotations

import asyncio
import datetime
import itertools
from typing import Any

import pytest

from gieok import Memory
from gieok.chat.adapters.discord_bot import GieokBot
from gieok.chat.agent.pipeline import ConversationPipeline
from gieok.chat.runtime.core import BotCore, ChannelRef
from gieok.chat.settings import ChatSettings
from runtime_helpers import ChatModel, VirtualTime, until

BOT_ID, GUILD, CHANNEL, ALICE, OWNER = 999, 111, 222, 333, 444


def user(uid: int, name: str, bot: bool = False) -> dict[str, Any]:
    return {"id": str(uid), "username": name, "discriminator": "0", "global_name": name, "avatar": None, "bot": bot}


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


class DiscordHTTP:
    """What Discord's REST API would have received, and plausible answers."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any] | None, dict[str, Any]]] = []
        self._ids = itertools.count(5000)

    async def request(self, route: Any, **kwargs: Any) -> Any:
        self.calls.append((route.method, route.path, kwargs.get("json"), dict(route.__dict__)))
        if route.method == "POST" and route.path.endswith("/messages"):
            body = kwargs["json"]
            return {"id": str(next(self._ids)), "channel_id": str(CHANNEL), "author": user(BOT_ID, "Nuri", True),
                    "content": body.get("content", ""), "timestamp": now_iso(), "edited_timestamp": None,
                    "tts": False, "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
                    "embeds": [], "pinned": False, "type": 0}
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
                       "hoist": False, "managed": False, "mentionable": False}],
            "channels": [{"id": str(CHANNEL), "type": 0, "name": "general", "position": 0,
                          "permission_overwrites": []}],
            "members": [], "member_count": 3, "unavailable": False, "large": False})
        await self.bot.on_ready()

    def say(self, content: str, author: int = ALICE, name: str = "alice", mentions: list[int] | None = None,
            reply_to: dict[str, Any] | None = None) -> str:
        message_id = str(next(self._ids))
        payload = {"id": message_id, "channel_id": str(CHANNEL), "guild_id": str(GUILD),
                   "author": user(author, name), "member": {"roles": [], "joined_at": now_iso(), "deaf": False,
                                                           "mute": False, "flags": 0},
                   "content": content, "timestamp": now_iso(), "edited_timestamp": None, "tts": False,
                   "mention_everyone": False, "mentions": [user(m, f"u{m}", m == BOT_ID) for m in (mentions or [])],
                   "mention_roles": [], "attachments": [], "embeds": [], "pinned": False, "type": 0}
        if reply_to is not None:
            payload["message_reference"] = {"message_id": reply_to["id"], "channel_id": str(CHANNEL)}
            payload["referenced_message"] = reply_to
            payload["type"] = 19
        self.bot._connection.parse_message_create(payload)
        if author != BOT_ID and not content.startswith(self.bot.prefix):
            self.conversational += 1
        return message_id

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
        assert h.http.typing() == 1
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
