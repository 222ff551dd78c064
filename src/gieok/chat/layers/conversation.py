"""The conversation memory of one `Memory`: L1 recent messages, L2 rolling summaries and L3
facts, with the views every front-end shows (the terminal chat, the Discord bot, the CLI, the
server). The pipeline judges and writes through it; a reader needs no model, no classifier and
no pipeline to open it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

from ...config import read_text_file
from ...errors import InvalidInputError, InvalidTypeError
from ...memory import Memory
from ...store.conversation import ConversationStore
from ...types import Scope
from ..settings import ChatSettings, chat_settings
from .facts import FactStore, PairJudge
from .recent import RecentMessages
from .summary import SummaryStore

__all__ = ["ConversationMemory", "check_id", "MAX_ID_CHARS"]

MAX_ID_CHARS = 100
_ID = re.compile(r"^[\w.:@#-]{1,100}$")


def check_id(value: Any, what: str, *, optional: bool = False) -> str | None:
    """A user, channel or guild id as transports give them: 1–100 letters, digits or . : @ # - _
    (an int is taken as its digits). Ids starting with 'gieok:' are gieok's own (lore)."""
    if value is None and optional:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InvalidTypeError(f"{what} must be a string, not {type(value).__name__}")
    if not _ID.match(value):
        raise InvalidInputError(f"{what} must be 1–{MAX_ID_CHARS} letters, digits or . : @ # - _ (got {value[:40]!r})")
    if value.startswith("gieok:"):
        raise InvalidInputError(f"{what} values starting with 'gieok:' are reserved")
    return value


class ConversationMemory:
    """L1, L2 and L3 over one memory. `commit_lock` serialises whoever turns L1 rows into turn
    blocks with whoever erases a user: share one instance between a bot and a server that
    watch the same memory."""

    def __init__(self, memory: Memory, settings: ChatSettings | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        s = chat_settings(settings if settings is not None else memory.settings)
        self.memory = memory
        self.settings = s
        self.clock = clock
        self.tables: ConversationStore = memory.store.conversation
        self.l1 = RecentMessages(self.tables, capacity=s.l1_size, clock=clock)
        core = tuple(line.strip() for line in read_text_file(s.core_file, "core").splitlines()
                     if line.strip() and not line.startswith("#")) if s.core_file else ()
        self.summaries = SummaryStore(self.tables, s.summary_max_topics, s.summary_max_points, core, clock)
        self.facts = FactStore(memory, self.tables, judge=PairJudge(s.fact_duplicate_threshold,
                                                                    s.fact_conflict_threshold,
                                                                    s.fact_span_threshold),
                               global_user_facts=s.global_user_facts, clock=clock)
        self.commit_lock = threading.Lock()

    # -- views ------------------------------------------------------------------------------------
    def summary_view(self, conversation: Scope) -> dict[str, Any]:
        """The conversation's L2 summary as every front-end shows it: the summary's fields, the
        permanent core that applies to every conversation, display names and a markdown form."""
        summary = self.summaries.get(conversation)
        names = self.l1.display_names(conversation)
        global_core = self.summaries.global_core
        return {**summary.as_dict(), "global_core": list(global_core), "names": names,
                "markdown": summary.to_markdown(global_core, names)}

    def summary_markdown(self, conversation: Scope) -> str:
        return str(self.summary_view(conversation)["markdown"])

    def channels(self, limit: int = 1000) -> list[dict[str, Any]]:
        """Conversations with L1 messages, most recently active first."""
        return [{"conversation": conversation.as_dict(), "messages": count, "last_message_at": last}
                for conversation, count, last in self.tables.l1_conversations(limit)]

    def recent_messages(self, conversation: Scope, limit: int | None = None) -> list[dict[str, Any]]:
        return [row.as_dict() for row in self.l1.recent(conversation, limit)]

    # -- forgetting a person ----------------------------------------------------------------------
    def forget_user(self, user_id: str) -> dict[str, int]:
        """Erase a user's facts and messages everywhere ("forget me"), and scrub them from the
        rolling summaries. A user's blocks are every block, of any kind, whose scope user or speaker
        is their id (`blocks`; `messages` counts the same, by its older name). Someone with
        background extraction running (it could write a fact back) waits for it first, as the chat
        front-ends do."""
        check_id(user_id, "user_id")
        with self.commit_lock:  # no commit may write this user's L1 rows while they are erased
            facts = self.facts.forget_user(user_id)
            # a user's blocks: every kind (turns, notes, facts …) whose scope user or speaker is them
            blocks = {*self.tables.l1_user_blocks(user_id), *self.memory.store.live_blocks_of_user(user_id)}
            erased = self.memory.forget(sorted(blocks)) if blocks else []
            removed = self.tables.l1_delete_user(user_id)
            summary_items = self.summaries.forget_user(user_id)
        return {"facts": len(facts), "messages": len(erased), "blocks": len(erased), "l1_rows": removed,
                "summary_items": summary_items}
