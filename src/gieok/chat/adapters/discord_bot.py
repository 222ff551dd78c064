"""The Discord adapter: discord.py in, the transport-agnostic runtime (runtime/core.py) behind.

Only this module knows Discord. It turns each `discord.Message` into an `InboundMessage`, hands
the runtime an `Outbox` that sends replies (as replies, chunked by the runtime, mentions limited
to users), edits and shows typing, and offers the commands an operator needs, as prefix and
slash commands: here / leave / status / timer / forgetme / summary, and for the owner sync and
lore. Shutting down flushes everything (queued turns, background extraction, pending L1).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import discord
from discord.ext import commands

from ...coordination import RedisConnection, SharedEventLog
from ...errors import ConfigError
from ...memory import Memory
from ...types import DEFAULT_TENANT
from ..compose import Bot, build_bot
from ..conversation.recent import conversation_key, conversation_of
from ..llm import require_llm
from ..llm.tools import default_tools
from ..runtime.core import BotCore, ChannelRef, InboundMessage
from ..runtime.shared_channels import SharedChannels
from ..settings import ChatSettings

__all__ = ["GieokBot", "DiscordOutbox", "USERS_ONLY", "inbound_from", "ref_of", "DiscordRun", "discord_token",
           "opened_discord_bot", "run_discord_bot"]

log = logging.getLogger(__name__)

# Replies may mention users (and the person replied to), never @everyone or roles.
USERS_ONLY = discord.AllowedMentions(everyone=False, users=True, roles=False, replied_user=True)

TEXTS = {
    "ko": {
        "here": "좋아, 이제 이 채널 대화에도 끼어들게!", "leave": "알겠어, 이 채널에선 불러줄 때만 말할게.",
        "forget_ask": "정말 너에 대한 기억(사실과 메시지)을 전부 지울까? 확인하려면 `{prefix}forgetme confirm`",
        "forget_done": "지웠어: 사실 {facts}개, 메시지 {messages}개, 요약 항목 {summary_items}개.",
        "no_timer": "아직 이 채널에서 답한 적이 없어.",
        "no_lore": "lore_file이 설정되지 않았어.", "lore_done": "설정에서 새 lore {added}개를 읽었어.",
        "synced": "슬래시 명령 {count}개를 동기화했어.",
    },
    "en": {
        "here": "Okay, I'll join conversations in this channel!", "leave": "Got it, here I'll only speak when called.",
        "forget_ask": "Really erase everything I remember about you (facts and messages)? Confirm with "
                      "`{prefix}forgetme confirm`",
        "forget_done": "Erased {facts} fact(s), {messages} message(s) and {summary_items} summary item(s).",
        "no_timer": "I haven't replied here yet.",
        "no_lore": "No lore_file is configured.", "lore_done": "Seeded {added} new lore fact(s).",
        "synced": "Synced {count} slash command(s).",
    },
}


def ref_of(channel: Any) -> ChannelRef:
    guild = getattr(channel, "guild", None)
    return ChannelRef(str(channel.id), str(guild.id) if guild is not None else None)


def inbound_from(message: discord.Message, bot_user: discord.abc.User | None) -> InboundMessage:
    reply_to_bot = False
    reference = message.reference
    if reference is not None and bot_user is not None:
        resolved = reference.resolved
        reply_to_bot = isinstance(resolved, discord.Message) and resolved.author.id == bot_user.id
    return InboundMessage(
        ref_of(message.channel), str(message.author.id), message.content,
        display_name=getattr(message.author, "display_name", None) or message.author.name,
        message_id=str(message.id), mentions=tuple(str(u.id) for u in message.mentions),
        reply_to_bot=reply_to_bot, timestamp=message.created_at.timestamp())


class DiscordOutbox:
    def __init__(self, client: discord.Client) -> None:
        self.client = client

    async def _channel(self, ref: ChannelRef) -> Any:
        channel = self.client.get_channel(int(ref.channel))
        if channel is None:
            channel = await self.client.fetch_channel(int(ref.channel))
        return channel

    async def send(self, ref: ChannelRef, text: str, *, reply_to: str | None = None) -> str:
        channel = await self._channel(ref)
        reference = None
        if reply_to is not None and reply_to.isdigit():
            reference = discord.MessageReference(message_id=int(reply_to), channel_id=int(ref.channel),
                                                 fail_if_not_exists=False)
        sent = await channel.send(text, reference=reference, allowed_mentions=USERS_ONLY)
        return str(sent.id)

    async def edit(self, ref: ChannelRef, message_id: str, text: str) -> None:
        channel = await self._channel(ref)
        await channel.get_partial_message(int(message_id)).edit(content=text, allowed_mentions=USERS_ONLY)

    async def typing(self, ref: ChannelRef) -> None:
        channel = await self._channel(ref)
        await channel.typing()  # awaited once: one typing indicator, no background loop


class GieokBot(commands.Bot):
    """A discord.py bot whose conversation is the gieok runtime. `core` is built by the caller
    with this bot's `DiscordOutbox` (see `create_core` in `gieok bot`)."""

    def __init__(self, *, prefix: str = "!", owner_ids: set[int] | None = None, language: str = "ko",
                 shard_id: int | None = None, shard_count: int | None = None) -> None:
        intents = discord.Intents.default()
        intents.message_content = True  # a conversation bot must read messages
        sharding: dict[str, Any] = {}
        if shard_count is not None and shard_count > 1:  # this process is one shard of several
            sharding = {"shard_id": shard_id or 0, "shard_count": shard_count}
        super().__init__(command_prefix=commands.when_mentioned_or(prefix), intents=intents,
                         allowed_mentions=USERS_ONLY, owner_ids=owner_ids or None, help_command=None, **sharding)
        self.prefix = prefix
        self.texts = TEXTS[language]
        self.core: BotCore | None = None
        self.outbox = DiscordOutbox(self)
        self._closed_core = False

    def attach(self, core: BotCore) -> None:
        self.core = core

    async def setup_hook(self) -> None:
        await self.add_cog(GieokCommands(self))
        if self.core is not None:
            await self.core.start()  # with Redis: join the other processes before the first message

    async def on_ready(self) -> None:
        if self.user is not None and self.core is not None:
            self.core.set_bot_user(str(self.user.id))
        log.info("connected as %s", self.user)

    async def on_message(self, message: discord.Message) -> None:
        if self.core is None or message.author.bot or (self.user is not None and message.author.id == self.user.id):
            return
        context = await self.get_context(message)
        if context.valid:
            await self.invoke(context)
            return
        if not message.content.strip():
            return  # attachments only: nothing to converse about
        try:
            await self.core.submit(inbound_from(message, self.user))
        except Exception:
            log.exception("could not take message %s in", message.id)

    async def close(self) -> None:
        if self.core is not None and not self._closed_core:
            self._closed_core = True
            await self.core.close()
        await super().close()


# mypy cannot solve the Concatenate unions in discord.py's hybrid_command and Group.command
# signatures (every method is rejected), hence the arg-type ignores on those decorators.
class GieokCommands(commands.Cog):
    def __init__(self, bot: GieokBot) -> None:
        self.bot = bot

    @property
    def core(self) -> BotCore:
        assert self.bot.core is not None
        return self.bot.core

    @commands.hybrid_command(name="here", description="Join conversations in this channel")  # type: ignore[arg-type]
    @commands.guild_only()
    async def here(self, ctx: commands.Context) -> None:
        self.core.set_active(ref_of(ctx.channel), True, by=str(ctx.author.id))
        await ctx.reply(self.bot.texts["here"], allowed_mentions=USERS_ONLY)

    @commands.hybrid_command(name="leave", description="Only speak in this channel when called")  # type: ignore[arg-type]
    @commands.guild_only()
    async def leave(self, ctx: commands.Context) -> None:
        self.core.set_active(ref_of(ctx.channel), False, by=str(ctx.author.id))
        await ctx.reply(self.bot.texts["leave"], allowed_mentions=USERS_ONLY)

    @commands.hybrid_command(name="status", description="Health of the bot")  # type: ignore[arg-type]
    async def status(self, ctx: commands.Context) -> None:
        health = self.core.health.as_dict()
        lines = [f"uptime {health['uptime_s']:.0f}s · in {health['messages_in']} · out {health['replies_out']} · "
                 f"rate-limited {health['rate_limited']} · merged {health['merged']}"]
        for name, stage in health["stages"].items():
            lines.append(f"{name}: ok {stage['successes']} / failed {stage['failures']}"
                         + (f" — last error: {stage['last_error']}" if stage["last_error"] else ""))
        llm_health = getattr(self.core.llm, "health", None)
        if llm_health is not None and hasattr(llm_health, "as_dict"):
            lines.append("llm: " + json.dumps(llm_health.as_dict(), ensure_ascii=False)[:900])
        await ctx.reply("```\n" + "\n".join(lines)[:1900] + "\n```", allowed_mentions=USERS_ONLY)

    @commands.hybrid_command(name="timer", description="Stage timings of this channel's last turn")  # type: ignore[arg-type]
    async def timer(self, ctx: commands.Context) -> None:
        ref = ref_of(ctx.channel)
        timings = self.core.last_timings.get(conversation_key(ref.guild, ref.channel))
        if timings is None:
            await ctx.reply(self.bot.texts["no_timer"], allowed_mentions=USERS_ONLY)
            return
        body = "\n".join(f"{k}: {v}" for k, v in timings.as_dict().items())
        await ctx.reply(f"```\n{body}\n```", allowed_mentions=USERS_ONLY)

    @commands.hybrid_command(name="forgetme", description="Erase everything the bot remembers about you")  # type: ignore[arg-type]
    async def forgetme(self, ctx: commands.Context, confirm: str = "") -> None:
        if confirm.strip().lower() not in {"confirm", "yes", "확인"}:
            await ctx.reply(self.bot.texts["forget_ask"].format(prefix=self.bot.prefix), allowed_mentions=USERS_ONLY)
            return
        await self.core.pipeline.drain()  # an extraction still running would write facts back
        result = await asyncio.to_thread(self.core.pipeline.forget_user, str(ctx.author.id))
        await ctx.reply(self.bot.texts["forget_done"].format(**result), allowed_mentions=USERS_ONLY)

    @commands.hybrid_command(name="summary", description="This channel's rolling summary")  # type: ignore[arg-type]
    async def summary(self, ctx: commands.Context) -> None:
        ref = ref_of(ctx.channel)
        text = self.core.pipeline.conversation.summary_markdown(conversation_of(ref.guild, ref.channel))
        await ctx.reply(text[:1990], allowed_mentions=USERS_ONLY)

    @commands.command(name="sync")
    @commands.is_owner()
    async def sync(self, ctx: commands.Context) -> None:
        synced = await self.bot.tree.sync()
        await ctx.reply(self.bot.texts["synced"].format(count=len(synced)), allowed_mentions=USERS_ONLY)

    @commands.group(name="lore", invoke_without_command=True)
    @commands.is_owner()
    async def lore(self, ctx: commands.Context) -> None:
        await ctx.reply(f"`{self.bot.prefix}lore reload`", allowed_mentions=USERS_ONLY)

    @lore.command(name="reload")  # type: ignore[arg-type]
    @commands.is_owner()
    async def lore_reload(self, ctx: commands.Context) -> None:
        lore_file = self.core.settings.lore_file
        if not lore_file:
            await ctx.reply(self.bot.texts["no_lore"], allowed_mentions=USERS_ONLY)
            return
        added = await asyncio.to_thread(self.core.pipeline.facts.seed_lore, lore_file)
        await ctx.reply(self.bot.texts["lore_done"].format(added=added), allowed_mentions=USERS_ONLY)

    async def cog_command_error(self, ctx: commands.Context, error: Exception) -> None:
        if isinstance(error, (commands.NotOwner, commands.NoPrivateMessage, commands.CheckFailure)):
            await ctx.reply(str(error) or "not allowed", allowed_mentions=USERS_ONLY)
        else:
            log.exception("command %s failed", ctx.command, exc_info=error)


def discord_token(settings: ChatSettings) -> str:
    token = os.environ.get("DISCORD_TOKEN", "").strip() or settings.discord_token.strip()
    if not token:
        raise ConfigError("no Discord token: set DISCORD_TOKEN (or GIEOK_DISCORD_TOKEN / discord_token in gieok.toml)")
    return token


@dataclass
class DiscordRun:
    """A Discord bot ready to start: the client, the bot behind it and the token to log in with."""

    client: GieokBot
    bot: Bot
    token: str


@contextmanager
def opened_discord_bot(settings: ChatSettings, *, publish_events: bool = True) -> Iterator[DiscordRun]:
    """Memory → pipeline (stage 2 on the configured model) → runtime → Discord client, checked
    before anything opens; the memory and Redis close when the block ends. `publish_events`: with
    Redis, the memory's events go to the shared stream every server reads (a server running in
    this process takes them itself)."""
    token = discord_token(settings)
    require_llm(settings)
    if settings.discord_shard_id >= settings.discord_shard_count:
        raise ConfigError(f"discord_shard_id must be below discord_shard_count ({settings.discord_shard_count}), "
                          f"got {settings.discord_shard_id}")
    redis = RedisConnection(settings.redis, settings.redis_namespace) if settings.redis else None
    memory = Memory(settings=settings)
    try:
        client = GieokBot(prefix=settings.discord_prefix, owner_ids=set(settings.discord_owner_ids),
                          language=settings.language, shard_id=settings.discord_shard_id,
                          shard_count=settings.discord_shard_count)
        shared = SharedChannels(redis, lease_seconds=settings.redis_lease_seconds) if redis is not None else None
        if redis is not None and publish_events:
            memory.listener = SharedEventLog(redis, settings.event_buffer,
                                             sequences=memory.store.event_sequences).listener(DEFAULT_TENANT)
        bot = build_bot(settings, memory, outbox=client.outbox, tools=default_tools(settings), shared=shared)
        bot.pipeline.warm()  # before logging in: the first message is answered at warm speed
        client.attach(bot.core)
        yield DiscordRun(client, bot, token)
    finally:
        memory.close()
        if redis is not None:
            redis.close()


def run_discord_bot(settings: ChatSettings) -> None:
    """`gieok bot`: the Discord bot until Ctrl-C / SIGTERM (discord.py then closes the client, and
    so the core, gracefully). With the server beside it: `gieok.server.beside.run_discord_bot_with_server`."""
    with opened_discord_bot(settings) as run:
        run.client.run(run.token, log_handler=None)
