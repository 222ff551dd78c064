"""What the language models cost: calls by purpose, and estimated tokens per guild and day.

Every model call a conversation makes — a reply, a stage-2 decision, an extraction — is noted
here: `calls` counts them by purpose in this process (`/status`, `gieok bench runtime` report
calls per reply from it). Tokens are estimated from the text sent and received (the same
estimate the prompt budgets use; streams report no usage), summed per guild per day in the
bot's time zone. With a daily budget (`guild_daily_tokens`) the sums are kept in the store, so
the budget holds across restarts and is shared by every process of a deployment; without one
they stay in this process (nothing to enforce, no write per call).

A guild's total is not anyone's personal data: direct messages share one scope, "direct".
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
from collections import Counter
from collections.abc import Callable, Sequence
from zoneinfo import ZoneInfo

from ...store.conversation import ConversationStore
from ..llm.base import ChatMessage
from .context import estimate_tokens

__all__ = ["ModelUsage", "DIRECT_SCOPE", "PURPOSES", "message_tokens"]

DIRECT_SCOPE = "direct"  # every direct message conversation's usage, together
PURPOSES = ("reply", "decide", "extract")


def message_tokens(messages: Sequence[ChatMessage]) -> int:
    return sum(estimate_tokens(m.content) + 4 for m in messages)  # +4: the role and separators


class ModelUsage:
    def __init__(self, tables: ConversationStore, *, zone: ZoneInfo, daily_tokens: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.tables = tables
        self.zone = zone
        self.daily_tokens = daily_tokens
        self.clock = clock
        self.calls: Counter[str] = Counter()
        self._local: Counter[tuple[str, str]] = Counter()  # (scope, day) → tokens, without a budget

    def day(self) -> str:
        return _dt.datetime.fromtimestamp(self.clock(), self.zone).strftime("%Y-%m-%d")

    @staticmethod
    def scope(guild: str | None) -> str:
        return guild if guild is not None else DIRECT_SCOPE

    async def note(self, purpose: str, guild: str | None, tokens: int, *, calls: int = 1) -> None:
        """`calls` model calls made for `guild` (None: a direct message), `tokens` in and out."""
        self.calls[purpose] += calls
        if self.daily_tokens > 0:
            await asyncio.to_thread(self.tables.usage_add, self.scope(guild), self.day(), max(0, tokens), calls)
        else:
            self._local[(self.scope(guild), self.day())] += max(0, tokens)

    def used_today(self, guild: str | None) -> int:
        """Estimated tokens this guild's conversations spent today (a blocking read with a budget)."""
        if self.daily_tokens > 0:
            return self.tables.usage_of(self.scope(guild), self.day())
        return self._local[(self.scope(guild), self.day())]

    def spent(self, guild: str | None) -> bool:
        """The guild's daily budget is used up (never, without a budget)."""
        return self.daily_tokens > 0 and self.used_today(guild) >= self.daily_tokens

    async def aspent(self, guild: str | None) -> bool:
        if self.daily_tokens <= 0:
            return False
        return await asyncio.to_thread(self.spent, guild)
