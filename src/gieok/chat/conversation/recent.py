"""L1: the recent messages of each conversation (guild, channel), newest last.

Every channel message enters L1, not only exchanges with the bot, so the bot can follow a
conversation it was not part of. Rows are written before anything else happens to a
message (one INSERT), so a crash loses nothing; a row is trimmed from L1 only once its turn
block is in long-term memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...errors import InvalidInputError
from ...store.conversation import ConversationStore, L1Row
from ...types import Scope, scope_key

__all__ = ["RecentMessages", "conversation_of", "conversation_key", "ROLES"]

ROLES = ("user", "assistant")


def conversation_of(guild: str | None, channel: str) -> Scope:
    """The scope a conversation is keyed by: its guild (None in DMs) and channel."""
    return Scope(guild, channel, None)


def conversation_key(guild: str | None, channel: str) -> str:
    """The conversation's key in the tables (L1, summaries, active channels) and runtime maps."""
    return scope_key(conversation_of(guild, channel))


class RecentMessages:
    """L1: append, read and flag the recent messages of each conversation."""

    def __init__(self, tables: ConversationStore, *, capacity: int = 50,
                 clock: Callable[[], float] = time.time) -> None:
        if capacity < 1:
            raise InvalidInputError("L1 capacity must be at least 1")
        self.tables = tables
        self.capacity = capacity
        self.clock = clock

    def append(self, conversation: Scope, *, role: str, content: str, user_id: str | None,
               display_name: str | None = None, addressed: bool = False, flagged: bool = False,
               external_id: str | None = None, when: float | None = None, fence: int | None = None) -> L1Row:
        if role not in ROLES:
            raise InvalidInputError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        return self.tables.l1_append(scope_key(conversation), role, content, user_id, display_name,
                                     self.clock() if when is None else when, addressed, flagged, external_id,
                                     self.capacity, fence=fence)

    def recent(self, conversation: Scope, n: int | None = None) -> list[L1Row]:
        """The last `n` messages that came in, in the order they were said (their times; arrival
        breaks ties): history sent late or out of order (an agent's backfill, a message the
        transport delivered late) reads in the conversation's order, not the order it arrived in."""
        rows = self.tables.l1_recent(scope_key(conversation), self.capacity if n is None else n)
        return sorted(rows, key=lambda row: (row.created_at, row.message_id))

    def since(self, conversation: Scope, after_message_id: int, limit: int = 200) -> list[L1Row]:
        return self.tables.l1_since(scope_key(conversation), after_message_id, limit)

    def flag(self, row: L1Row) -> None:
        self.tables.l1_flag(row.message_id)

    def display_names(self, conversation: Scope) -> dict[str, str]:
        """user id → the name they last used here (names live only in L1)."""
        names: dict[str, str] = {}
        for row in self.recent(conversation):
            if row.user_id and row.display_name:
                names[row.user_id] = row.display_name
        return names
