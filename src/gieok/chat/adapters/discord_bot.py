"""The Discord adapter: discord.py in, the transport-agnostic runtime (runtime/core.py) behind.

Only this module knows Discord. It turns each `discord.Message` into an `InboundMessage` whose
text keeps everything said: mentions as names with their ids, attachments, stickers, embeds and
forwards as bracketed lines (`[image: cat.png]`), so a message with no text is not lost. Edits and
deletions reach the memory through discord.py's raw events (messages out of its cache too). It
hands the runtime an `Outbox` that sends replies (as replies, chunked by the runtime, mentions
limited to users), edits and shows typing, and offers the commands an operator needs, as prefix
and slash commands: here / leave / status / timer / forgetme / summary, and for the owner sync
and lore. Owners and moderators' messages are marked privileged (the runtime's limits spare them).

Starting checks what Discord would otherwise refuse late, before the slow model warm-up: the
token (log-in), the Message Content intent (the application's flags) and the network, each a
one-line `GieokError`. Shutting down flushes everything (queued turns, background extraction,
pending L1).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import mimetypes
import os
import re
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import urlsplit

import aiohttp
import discord
from discord.ext import commands

from ...coordination import RedisConnection, SharedEventLog
from ...errors import ConfigError, GieokError
from ...memory import Memory
from ...types import DEFAULT_TENANT
from ..compose import Bot, build_bot
from ..conversation.recent import conversation_key, conversation_of
from ..llm import require_llm
from ..llm.tools import default_tools
from ..runtime.core import BotCore, ChannelRef, InboundMessage
from ..runtime.shared_channels import SharedChannels
from ..settings import ChatSettings

__all__ = ["GieokBot", "DiscordOutbox", "USERS_ONLY", "inbound_from", "message_text", "ref_of", "DiscordRun",
           "discord_token", "opened_discord_bot", "run_until_stopped", "run_discord_bot"]

log = logging.getLogger(__name__)

# Replies may mention users (and the person replied to), never @everyone or roles.
USERS_ONLY = discord.AllowedMentions(everyone=False, users=True, roles=False, replied_user=True)

LOGIN_TIMEOUT_S = 30.0  # the log-in's two requests; aiohttp alone would wait up to 5 minutes
CATCH_UP_CHANNELS = 50  # channels read back after a (re)connect: those with the newest stored messages
CATCH_UP_MESSAGES = 100  # of each channel's history (one request to Discord)
EMBED_CHARS = 300  # of an embed's text in the message (a link preview or a bot's card, not an article)
MEDIA_KINDS = ("image", "video", "audio")  # an attachment of another type is a [file: …]

BAD_TOKEN = ("Discord refused the token ({detail}): reset it in the developer portal, Bot → Reset Token, "
             "and set DISCORD_TOKEN")
UNREACHABLE = ("cannot reach Discord ({host}): check the network (DNS, proxy, firewall) and start again "
               "({detail})")
NO_MESSAGE_CONTENT = ("the Message Content intent is not enabled for this bot: developer portal → Bot → "
                      "Privileged Gateway Intents → Message Content Intent")
NETWORK_FAILURES = (aiohttp.ClientError, OSError, TimeoutError)  # aiohttp's connector errors are OSErrors too

_USER_MENTION = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION = re.compile(r"<@&(\d+)>")
_CHANNEL_MENTION = re.compile(r"<#(\d+)>")
_CUSTOM_EMOJI = re.compile(r"<a?:(\w+):\d+>")

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


def _name_of(user: discord.abc.User) -> str:
    return getattr(user, "display_name", None) or user.name


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _readable(content: str, message: discord.Message | None, bot_user: discord.abc.User | None) -> str:
    """Discord's markup as a person reads it: `<@123>` → `@민지 (<user:123>)` (the id is how the
    memory knows people; the bot is just `@name`), `<@&1>` → `@role`, `<#2>` → `#channel`,
    `<:cat:3>` → `:cat:`. What the message does not resolve stays as it was (a user: `<user:id>`)."""
    users = {u.id: u for u in message.mentions} if message is not None else {}
    roles = {r.id: r.name for r in message.role_mentions} if message is not None else {}
    channels = {c.id: c.name for c in message.channel_mentions} if message is not None else {}

    def user(match: re.Match[str]) -> str:
        uid = int(match[1])
        found = users.get(uid)
        if bot_user is not None and uid == bot_user.id:
            return f"@{_name_of(found or bot_user)}"
        return f"@{_name_of(found)} (<user:{uid}>)" if found is not None else f"<user:{uid}>"

    content = _USER_MENTION.sub(user, content)
    content = _ROLE_MENTION.sub(lambda m: f"@{roles[int(m[1])]}" if int(m[1]) in roles else m[0], content)
    content = _CHANNEL_MENTION.sub(lambda m: f"#{channels[int(m[1])]}" if int(m[1]) in channels else m[0], content)
    return _CUSTOM_EMOJI.sub(r":\1:", content)


def _attachment_line(attachment: discord.Attachment) -> str:
    content_type = attachment.content_type or mimetypes.guess_type(attachment.filename)[0] or ""
    kind = content_type.split("/", 1)[0]
    return f"[{kind if kind in MEDIA_KINDS else 'file'}: {attachment.filename}]"


def _embed_line(embed: discord.Embed) -> str | None:
    parts = [part for part in (embed.title, embed.description) if part]
    parts += [f"{field.name}: {field.value}" for field in embed.fields if field.name or field.value]
    if not parts and embed.author.name:
        parts.append(embed.author.name)
    return f"[embed: {_clip(' — '.join(parts), EMBED_CHARS)}]" if parts else None


def _lines(content: str, attachments: Sequence[discord.Attachment], stickers: Sequence[discord.StickerItem],
           embeds: Sequence[discord.Embed]) -> list[str]:
    lines = [content] if content.strip() else []
    lines += [_attachment_line(a) for a in attachments]
    lines += [f"[sticker: {s.name}]" for s in stickers]
    lines += [line for line in map(_embed_line, embeds) if line is not None]
    return lines


def message_text(message: discord.Message, bot_user: discord.abc.User | None, limit: int | None = None) -> str:
    """Everything the message says, as text: its words (mentions as names), then a line for each
    attachment, sticker and embed, a poll and a forwarded message. Data, not UI: the same bracket
    form whatever the bot's language. Empty only when the message said nothing at all.

    `limit` (the bot's `max_input_chars`, Discord's own 4,000 by default): what gieok adds to the
    author's words gives way when the whole would pass it — a 4,000-character message with a
    mention and a picture was refused whole — first the names it writes for mentions (the words
    then stay as Discord counted them: `<@123>`, `<@&1>`, `<#2>`), then the lines after the words
    (those that do not fit become one `[… N more]` line, when it fits). The words are never cut."""
    words = _readable(message.content, message, bot_user)
    added = _lines("", message.attachments, message.stickers, message.embeds)
    if message.poll is not None:
        answers = " / ".join(answer.text for answer in message.poll.answers)
        added.append(f"[poll: {_clip(message.poll.question, EMBED_CHARS)} — {_clip(answers, EMBED_CHARS)}]")
    for snapshot in message.message_snapshots:
        forwarded = _lines(_readable(snapshot.content, None, bot_user), snapshot.attachments, snapshot.stickers,
                           snapshot.embeds)
        if forwarded:
            added.append("[forwarded: " + "\n".join(forwarded) + "]")
    if limit is not None and len(words) > limit:
        words = message.content
    lines = [words] if words.strip() else []
    if limit is None:
        return "\n".join(lines + added)
    used = len(words)
    for number, line in enumerate(added):
        left = len(added) - number - 1
        room = limit - used - 1 - (len(f"\n[… {left} more]") if left else 0)
        if len(line) > room:
            marker = f"[… {len(added) - number} more]"
            if used + 1 + len(marker) <= limit:
                lines.append(marker)
            break
        lines.append(line)
        used += 1 + len(line)
    return "\n".join(lines)


def inbound_from(message: discord.Message, bot_user: discord.abc.User | None, *,
                 privileged: bool = False, limit: int | None = None) -> InboundMessage:
    reply_to_bot = False
    reference = message.reference
    if reference is not None and bot_user is not None:
        resolved = reference.resolved
        reply_to_bot = isinstance(resolved, discord.Message) and resolved.author.id == bot_user.id
    return InboundMessage(
        ref_of(message.channel), str(message.author.id), message_text(message, bot_user, limit),
        display_name=_name_of(message.author), message_id=str(message.id),
        mentions=tuple(str(u.id) for u in message.mentions), reply_to_bot=reply_to_bot,
        timestamp=message.created_at.timestamp(), privileged=privileged)


def _raw_ref(channel_id: int, guild_id: int | None) -> ChannelRef:
    return ChannelRef(str(channel_id), str(guild_id) if guild_id is not None else None)



def _network_failure(exc: BaseException | None) -> TypeGuard[BaseException]:
    return isinstance(exc, NETWORK_FAILURES)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


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
        self._catching_up: asyncio.Task[int] | None = None

    def attach(self, core: BotCore) -> None:
        self.core = core

    async def setup_hook(self) -> None:
        await self.add_cog(GieokCommands(self))

    async def login(self, token: str) -> None:
        """discord.py's log-in (the token: GET /users/@me, then the application), then what must
        hold before the gateway, cheapest first: the Message Content intent, then the models warm
        (seconds), then the core joins the other processes (Redis). Discord's refusals come as
        one-line `GieokError`s before anything slow — not as a traceback after the warm-up."""
        host = urlsplit(discord.http.Route.BASE).netloc
        try:
            await asyncio.wait_for(super().login(token), LOGIN_TIMEOUT_S)
        except discord.LoginFailure as exc:
            cause = exc.__cause__
            detail = cause.text if isinstance(cause, discord.HTTPException) and cause.text else str(exc)
            raise ConfigError(BAD_TOKEN.format(detail=detail)) from None
        except NETWORK_FAILURES as exc:
            raise GieokError(UNREACHABLE.format(host=host, detail=_one_line(exc))) from None
        except discord.HTTPException as exc:  # a 5xx, Cloudflare's 429: Discord is there but not answering
            raise GieokError(f"Discord ({host}) did not accept the log-in: {exc.status} {_one_line(exc)}; "
                             f"try again later") from None
        flags = self.application.flags if self.application is not None else None
        if self.intents.message_content and flags is not None and not (
                flags.gateway_message_content or flags.gateway_message_content_limited):
            raise ConfigError(NO_MESSAGE_CONTENT)  # else the gateway would close with 4014 after the warm-up
        if self.core is not None:
            await asyncio.to_thread(self.core.pipeline.warm)  # the first message is answered at warm speed
            await self.core.start()  # with Redis: join the other processes before the first message

    async def connect(self, *, reconnect: bool = True) -> None:
        try:
            await super().connect(reconnect=reconnect)
        except discord.PrivilegedIntentsRequired:  # close code 4014: the intent was switched off since
            raise ConfigError(NO_MESSAGE_CONTENT) from None
        except Exception as exc:
            # discord.py retries a connection it lost, but a first one that never opened (the
            # gateway unreachable) ends in its own AttributeError (2.7: `self.ws.sequence`).
            failure = exc if _network_failure(exc) else exc.__context__
            if self.ws is not None or not _network_failure(failure):
                raise
            host = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY.host
            raise GieokError(UNREACHABLE.format(host=host, detail=_one_line(failure))) from None

    async def on_ready(self) -> None:
        if self.user is not None and self.core is not None:
            self.core.set_bot_user(str(self.user.id))
        log.info("connected as %s", self.user)
        if self.core is not None and self.core.settings.catch_up_seconds > 0 and (
                self._catching_up is None or self._catching_up.done()):
            self._catching_up = asyncio.create_task(self.catch_up(), name="gieok-catch-up")

    async def catch_up(self) -> int:
        """What was said while no process of the bot was connected (the gateway does not replay
        it after a new session): the channels with the newest stored messages are read back from
        their history and the core takes in what nobody stored (`BotCore.catch_up`). Commands
        found there are not run again. Returns how many messages were taken in."""
        core = self.core
        assert core is not None
        since = time.time() - core.settings.catch_up_seconds
        after = datetime.datetime.fromtimestamp(since, datetime.UTC)
        taken = 0
        for scope, _, last in await asyncio.to_thread(core.pipeline.tables.l1_conversations, CATCH_UP_CHANNELS):
            channel = self.get_channel(int(scope.channel)) if scope.channel and scope.channel.isdigit() else None
            if last < since or channel is None or not isinstance(channel, discord.abc.Messageable):
                continue
            try:
                said = [m async for m in channel.history(limit=CATCH_UP_MESSAGES, after=after, oldest_first=True)]
                recent = [inbound_from(m, self.user, limit=core.settings.max_input_chars) for m in said
                          if not self._ignored(m.author) and not (await self.get_context(m)).valid]
                taken += len(await core.catch_up(ref_of(channel), recent))
            except (discord.HTTPException, *NETWORK_FAILURES) as exc:  # no access any more, Discord away
                log.warning("could not read back channel %s: %s", scope.channel, _one_line(exc))
            except GieokError as exc:
                log.warning("catching up channel %s stopped: %s", scope.channel, exc)
        return taken

    def _ignored(self, author: discord.abc.User) -> bool:
        return self.core is None or author.bot or (self.user is not None and author.id == self.user.id)

    async def privileged(self, author: discord.abc.User) -> bool:
        """An owner of the bot, or a moderator where they speak (in a DM only owners): the
        runtime's per-user and per-channel limits do not apply to them."""
        with contextlib.suppress(discord.HTTPException, *NETWORK_FAILURES):  # no owner_ids: asked once
            if await self.is_owner(author):
                return True
        permissions = getattr(author, "guild_permissions", None)  # a Member: the message is in a guild
        return permissions is not None and (permissions.administrator or permissions.manage_guild
                                            or permissions.manage_messages)

    async def on_message(self, message: discord.Message) -> None:
        if self._ignored(message.author):
            return
        context = await self.get_context(message)
        if context.valid:
            await self.invoke(context)
            return
        assert self.core is not None
        try:
            inbound = inbound_from(message, self.user, privileged=await self.privileged(message.author),
                                   limit=self.core.settings.max_input_chars)
            if not inbound.content.strip():
                return  # nothing said at all (a system message)
            await self.core.submit(inbound)
        except GieokError as exc:  # refused (too long, shutting down …): one line, the handler carries on
            log.warning("message %s not taken in: %s", message.id, exc)
        except Exception:
            log.exception("could not take message %s in", message.id)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        """An edit, cached or not. Only a change of what was said counts: Discord also sends an
        update when a link's preview unfurls or a message is pinned (no edit time, or the same text)."""
        message = payload.message
        if self._ignored(message.author) or not payload.data.get("edited_timestamp"):
            return
        assert self.core is not None
        limit = self.core.settings.max_input_chars
        text = message_text(message, self.user, limit)
        before = payload.cached_message
        if not text.strip() or (before is not None and message_text(before, self.user, limit) == text):
            return
        edited = InboundMessage(_raw_ref(payload.channel_id, payload.guild_id), str(message.author.id), text,
                                display_name=_name_of(message.author), message_id=str(message.id),
                                timestamp=message.created_at.timestamp())
        try:
            changed = await self.core.edit(edited)
        except GieokError as exc:
            log.warning("edit of message %s not applied: %s", message.id, exc)
            return
        log.info("message %s edited in channel %s: %s", message.id, payload.channel_id,
                 "stored text replaced" if changed else "nothing stored changed")

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        await self._erase(_raw_ref(payload.channel_id, payload.guild_id), [str(payload.message_id)])

    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        await self._erase(_raw_ref(payload.channel_id, payload.guild_id),
                          [str(i) for i in sorted(payload.message_ids)])

    async def _erase(self, ref: ChannelRef, message_ids: list[str]) -> None:
        """Deleted in Discord, erased here: what was said and what came from it."""
        if self.core is None:
            return
        try:
            erased = await self.core.delete(ref, message_ids)
        except GieokError as exc:
            log.warning("deletion of %d message(s) in channel %s not applied: %s", len(message_ids), ref.channel, exc)
            return
        log.info("%d message(s) deleted in channel %s: %d erased from memory", len(message_ids), ref.channel, erased)

    async def close(self) -> None:
        if self._catching_up is not None and not self._catching_up.done():
            self._catching_up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._catching_up
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
        per_reply = health["model_calls_per_reply"]
        lines = [f"uptime {health['uptime_s']:.0f}s · in {health['messages_in']} · out {health['replies_out']} · "
                 f"rate-limited {health['rate_limited']} · merged {health['merged']}",
                 f"calls limited {health['limited_calls']} · notices {health['notices']} · edited {health['edited']} · "
                 f"deleted {health['deleted']}",
                 "model calls " + (", ".join(f"{k} {v}" for k, v in sorted(health["model_calls"].items())) or "none")
                 + (f" · {per_reply} per reply" if per_reply is not None else "")]
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
        await ctx.defer()  # slash: answers Discord's 3-second deadline; the erasure takes longer
        if ctx.interaction is None:
            await ctx.typing()  # prefix: defer does nothing there; one typing indicator instead
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
    """Memory → pipeline (stage 2 on the configured model) → runtime → Discord client, the
    settings checked before anything opens; the memory and Redis close when the block ends. The
    models warm when the client starts (`GieokBot.login`), after Discord accepted the token.
    `publish_events`: with Redis, the memory's events go to the shared stream every server reads
    (a server running in this process takes them itself)."""
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
        client.attach(bot.core)
        yield DiscordRun(client, bot, token)
    finally:
        memory.close()
        if redis is not None:
            redis.close()


async def run_until_stopped(client: GieokBot, token: str) -> None:
    """`Client.run`'s life — log in, connect, close the client (and so the core) however it ends —
    with SIGTERM too: like Ctrl-C in `asyncio.run`, it cancels this task, and the close is graceful."""
    loop = asyncio.get_running_loop()
    this = asyncio.current_task()
    assert this is not None
    handled = False
    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread, Windows
        loop.add_signal_handler(signal.SIGTERM, this.cancel)
        handled = True
    try:
        async with client:
            await client.start(token)
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGTERM)


def run_discord_bot(settings: ChatSettings) -> None:
    """`gieok bot`: the Discord bot until Ctrl-C / SIGTERM (the client, and so the core, then close
    gracefully). Discord's refusals (token, intent, network) are one-line errors before the models
    load. With the server beside it: `gieok.server.beside.run_discord_bot_with_server`."""
    with opened_discord_bot(settings) as run:
        try:
            asyncio.run(run_until_stopped(run.client, run.token))
        except (KeyboardInterrupt, asyncio.CancelledError):
            return  # Ctrl-C or SIGTERM: everything was flushed on the way out
