"""The conversation tables (schemas v3 and v4): L1 messages, L2 summaries, L3 fact validity,
per-channel analysis state and the bot's active channels.

`ConversationStore` is the port the conversation layers (`conversation/recent.py`, `summary.py`,
`facts.py`, `conversation.py`) and the runtime are written against; `ConversationTables`
implements it once in portable SQL over any `SqlSession` (SQLite and PostgreSQL alike), sharing
the store's connection and transactions."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..errors import LeaseLostError, StoreError
from ..types import Block, Scope, scope_from_key
from .sql import SqlSession, SqlWriter

log = logging.getLogger(__name__)

AppendHook = Callable[[SqlWriter, Sequence[Block]], None]
FactSubject = tuple[str, str | None, str | None]  # (fact type, guild, user id): whose facts
"""Called inside a block append's transaction with the blocks as they are stored, to write rows
that must commit or roll back with them; raising refuses the whole append."""


class FactsMovedError(StoreError):
    """A subject's facts changed between a write's read and the write: another process wrote them
    meanwhile. Nothing of the write was stored; the writer reads again and decides again."""


class L1RowsTakenError(StoreError):
    """Turn blocks for L1 messages that another writer already wrote as blocks (nothing written)."""


class ErasureUnderWayError(StoreError):
    """A turn of a user whose erasure (`forget_user`) has begun, in this process or another:
    refused, nothing written — the erasure may have listed the user's blocks already."""

__all__ = ["ConversationStore", "ConversationTables", "L1Row", "FactRow", "FactSourceRow", "FactChanges",
           "KnownMessage", "UserRow", "AppendHook", "L1RowsTakenError", "ErasureUnderWayError", "check_fence"]


@dataclass(frozen=True, slots=True)
class L1Row:
    message_id: int
    scope_key: str
    role: str
    content: str
    user_id: str | None
    display_name: str | None
    created_at: float
    addressed: bool
    flagged: bool
    external_id: str | None
    block_index: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"message_id": self.message_id, "conversation": scope_from_key(self.scope_key).as_dict(),
                "role": self.role, "content": self.content, "user_id": self.user_id,
                "display_name": self.display_name, "created_at": self.created_at, "addressed": self.addressed,
                "flagged": self.flagged, "external_id": self.external_id, "block_index": self.block_index}


@dataclass(frozen=True, slots=True)
class FactRow:
    block_index: int
    fact_type: str
    topic: str
    guild: str | None
    user_id: str | None
    source_message: str | None
    valid_from: float
    valid_to: float | None
    superseded_by: int | None
    lore_key: str | None
    recorded_at: float | None = None  # when gieok learned it (None: before schema 14, see valid_from)
    expired_at: float | None = None  # when gieok learned it stopped being true (valid_to set)


@dataclass(frozen=True, slots=True)
class FactSourceRow:
    """One statement of a fact: the message that said it, and when (the conversation's clock)."""

    block_index: int
    said_at: float
    message_id: int | None = None  # its L1 message id
    scope_key: str | None = None  # its conversation
    external_id: str | None = None  # the sender's id for it
    user_id: str | None = None
    recorded_at: float = 0.0
    author: str | None = None  # stated through the API, not by a message: the key that wrote it

    @property
    def name(self) -> str | None:
        """How the message is named to a user: the sender's id, else the L1 id."""
        return self.external_id or (str(self.message_id) if self.message_id is not None else None)


@dataclass
class FactChanges:
    """What one write does to the facts tables, applied in one transaction (`facts_apply`), inside
    the new fact blocks' own append when there are any. New facts' block indices may be
    placeholders (-1, -2 …: the first, second … block of that append) until `resolved`."""

    inserts: list[FactRow] = field(default_factory=list)
    updates: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # block → columns to set
    sources: list[FactSourceRow] = field(default_factory=list)  # statements to add
    moves: list[tuple[int, int, float]] = field(default_factory=list)  # (from, to, said after): sources moved
    dropped_sources: list[tuple[int, int]] = field(default_factory=list)  # (block, L1 message id)
    deletes: list[int] = field(default_factory=list)  # fact rows (and their sources) removed
    # (subject, its `fact_subject_state` when the write read it): checked in the write's transaction,
    # FactsMovedError if another process changed the subject's facts since
    expect: list[tuple[FactSubject, tuple[Any, ...]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.inserts or self.updates or self.sources or self.moves or self.dropped_sources or self.deletes)

    def resolved(self, new_blocks: Sequence[int]) -> FactChanges:
        def real(index: int | None) -> int | None:
            return new_blocks[-index - 1] if index is not None and index < 0 else index

        def columns(values: dict[str, Any]) -> dict[str, Any]:
            return {k: real(v) if k == "superseded_by" else v for k, v in values.items()}

        return FactChanges(
            [replace(r, block_index=int(real(r.block_index) or 0), superseded_by=real(r.superseded_by))
             for r in self.inserts],
            [(int(real(b) or 0), columns(v)) for b, v in self.updates],
            [replace(r, block_index=int(real(r.block_index) or 0)) for r in self.sources],
            [(int(real(a) or 0), int(real(b) or 0), t) for a, b, t in self.moves],
            list(self.dropped_sources), list(self.deletes), list(self.expect))


@dataclass(frozen=True, slots=True)
class KnownMessage:
    """A client's message id as the conversation keeps it (schema 14): its L1 row (the row may be
    trimmed since), its turn block once written, and whether its sender deleted it."""

    external_id: str
    message_id: int
    block_index: int | None
    deleted: bool
    content: str | None  # its text while L1 holds the row


@dataclass(frozen=True, slots=True)
class UserRow:
    """A user as a tenant's memory knows them: the names their messages came with, their messages
    (turns kept, and recent ones not yet turns), the facts about them, their conversations, and
    when they were first and last seen."""

    user_id: str
    names: tuple[str, ...]
    messages: int
    facts: int
    conversations: int
    first_seen: float | None
    last_seen: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"user": self.user_id, "names": list(self.names), "messages": self.messages, "facts": self.facts,
                "conversations": self.conversations, "first_seen": self.first_seen, "last_seen": self.last_seen}


_L1_COLUMNS = ("message_id", "scope_key", "role", "content", "user_id", "display_name", "created_at", "addressed",
               "flagged", "external_id", "block_index")
_FACT_COLUMNS = ("block_index", "fact_type", "topic", "guild", "user_id", "source_message", "valid_from", "valid_to",
                 "superseded_by", "lore_key", "recorded_at", "expired_at")
_SOURCE_COLUMNS = ("block_index", "said_at", "message_id", "scope_key", "external_id", "user_id", "recorded_at",
                   "author")
_FACT_UPDATABLE = frozenset({"valid_from", "valid_to", "superseded_by", "expired_at", "source_message"})


def _l1(row: tuple[Any, ...]) -> L1Row:
    """A row of `_L1_COLUMNS`, in their order (positional: every context call reads 50 of them)."""
    (message_id, scope_key, role, content, user_id, display_name, created_at, addressed, flagged, external_id,
     block_index) = row
    return L1Row(message_id, scope_key, role, content, user_id, display_name, created_at, bool(addressed),
                 bool(flagged), external_id, block_index)


class ConversationStore(Protocol):
    """Persistence of the conversation layers. Each write is one transaction."""

    def l1_append(self, scope_key: str, role: str, content: str, user_id: str | None, display_name: str | None,
                  created_at: float, addressed: bool, flagged: bool, external_id: str | None, keep: int,
                  fence: int | None = None) -> L1Row: ...

    def l1_append_once(self, scope_key: str, role: str, content: str, user_id: str | None, display_name: str | None,
                       created_at: float, addressed: bool, flagged: bool, external_id: str,
                       keep: int) -> L1Row | None: ...

    def message_ids_known(self, scope_key: str, external_ids: Sequence[str]) -> set[str]: ...

    def messages_known(self, scope_key: str, external_ids: Sequence[str]) -> dict[str, KnownMessage]: ...

    def l1_edit(self, message_id: int, content: str, flagged: bool) -> None: ...

    def message_block_hook(self, scope_key: str, external_id: str, user_id: str | None = None) -> AppendHook: ...

    def message_delete(self, scope_key: str, external_id: str, message_id: int, when: float) -> None: ...

    def message_turn_done(self, scope_key: str, external_id: str, block_index: int) -> None: ...

    def edits_unfinished(self, limit: int = 1000) -> list[tuple[str, str, int, int]]: ...

    def deletions_unfinished(self, limit: int = 1000) -> list[tuple[str, str, int, int]]: ...

    def l1_blocks_of(self, message_ids: Sequence[int]) -> dict[int, int]: ...

    def l1_recent(self, scope_key: str, limit: int) -> list[L1Row]: ...

    def l1_by_external_id(self, scope_key: str, external_id: str) -> L1Row | None: ...

    def l1_since(self, scope_key: str, after_message_id: int, limit: int) -> list[L1Row]: ...

    def l1_pending(self, scope_key: str | None = None, limit: int = 100_000) -> list[L1Row]: ...

    def l1_set_blocks(self, pairs: Sequence[tuple[int, int]]) -> None: ...

    def fence_advance(self, scope_key: str, token: int) -> None: ...

    def fence_token(self, scope_key: str) -> int | None: ...

    def l1_claim(self, scope_key: str, claims: Sequence[tuple[int, str]], when: float,
                 fence: int | None = None) -> set[int]: ...

    def turn_blocks_hook(self, message_ids: Sequence[int], *, contents: Sequence[str] | None = None,
                         scope_key: str | None = None, fence: int | None = None) -> AppendHook: ...

    def l1_flag(self, message_id: int) -> None: ...

    def l1_delete_blocks(self, block_indices: Sequence[int]) -> None: ...

    def l1_delete_user(self, user_id: str) -> int: ...

    def l1_delete_messages(self, message_ids: Sequence[int]) -> int: ...

    def l1_user_blocks(self, user_id: str) -> list[int]: ...

    def l1_conversations(self, limit: int = 1000) -> list[tuple[Scope, int, float]]: ...

    def l1_count(self, scope_key: str | None = None) -> int: ...

    def conversations_of_channel(self, channel: str) -> list[Scope]: ...

    def users_page(self, after: str | None, limit: int) -> list[UserRow]: ...

    def user_l1_rows(self, user_id: str) -> list[L1Row]: ...

    def fact_sources_by_user(self, user_id: str) -> list[FactSourceRow]: ...

    def user_names_delete(self, user_id: str) -> int: ...

    def user_names_of(self, user_id: str) -> list[tuple[str, float, float]]: ...

    def notes_copying(self, user_id: str) -> list[int]: ...

    def user_blocks_page(self, user_id: str, after: int, limit: int) -> list[tuple[Any, ...]]: ...

    def erasure_begin(self, user_id: str, when: float, reason: str) -> None: ...

    def erasure_end(self, user_id: str) -> None: ...

    def erasures_pending(self) -> list[str]: ...

    def summary_load(self, scope_key: str) -> dict[str, Any] | None: ...

    def summary_change(self, scope_key: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None],
                       when: float) -> dict[str, Any] | None: ...

    def summary_keys(self) -> list[str]: ...

    def fact_insert(self, row: FactRow, *, supersede: int | None = None, when: float | None = None) -> None: ...

    def facts_get(self, block_indices: Sequence[int]) -> dict[int, FactRow]: ...

    def facts_current(self, fact_type: str, guild: str | None, user_id: str | None) -> list[FactRow]: ...

    def facts_where(self, *, user_id: str | None = None, guild: str | None = None, include_history: bool = False,
                    limit: int = 1000, as_of: float | None = None, known_at: float | None = None) -> list[FactRow]: ...

    def facts_exist(self, *, guild: str | None = None, user_id: str | None = None) -> bool: ...

    def lore_keys(self) -> set[str]: ...

    def facts_delete_blocks(self, block_indices: Sequence[int]) -> None: ...

    def facts_of_subject(self, fact_type: str, guild: str | None, user_id: str | None) -> list[FactRow]: ...

    def fact_subject_state(self, subject: FactSubject) -> tuple[Any, ...]: ...

    def fact_sources_of(self, block_indices: Sequence[int]) -> dict[int, list[FactSourceRow]]: ...

    def fact_sources_from(self, message_ids: Sequence[int]) -> list[FactSourceRow]: ...

    def facts_apply(self, changes: FactChanges) -> None: ...

    def facts_hook(self, changes: FactChanges) -> AppendHook: ...

    def channel_state(self, scope_key: str) -> tuple[int, int] | None: ...

    def channel_state_count(self, scope_key: str, messages: int, when: float) -> tuple[int, int, bool]: ...

    def channel_state_claim(self, scope_key: str, after: int, last: int, when: float) -> bool: ...

    def channel_states_pending(self, quiet_since: float) -> list[str]: ...

    def active_keys(self) -> set[str]: ...

    def set_active(self, scope_key: str, active: bool, when: float, by: str | None = None) -> None: ...

    def usage_add(self, scope: str, day: str, tokens: int, calls: int = 1) -> int: ...

    def usage_of(self, scope: str, day: str) -> int: ...


class ConversationTables:
    """`ConversationStore` in SQL that SQLite and PostgreSQL both speak. `ConversationTables(store)`
    works on any SQL store; code that holds a `Store` uses `store.conversation`."""

    def __init__(self, store: SqlSession, dialect: str = "sqlite") -> None:
        self.store = store
        self._dialect = dialect

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.store.fetch(sql, params)

    # -- L1 ---------------------------------------------------------------------------------
    def l1_append(self, scope_key: str, role: str, content: str, user_id: str | None, display_name: str | None,
                  created_at: float, addressed: bool, flagged: bool, external_id: str | None, keep: int,
                  fence: int | None = None) -> L1Row:
        """Insert a message and trim the conversation to its newest `keep` rows — but never
        drop a row whose turn block is not written yet (it would be lost). `fence`: the writer's
        fencing token for the conversation (`check_fence`), checked in the same transaction. An
        `external_id` not taken yet is taken for this row (`messages_known` finds it: a deletion
        where it was sent erases it)."""
        with self.store.transaction() as conn:
            if fence is not None:
                check_fence(conn, scope_key, fence)
            message_id = _l1_insert(conn, self._dialect, scope_key, role, content, user_id, display_name, created_at,
                                    addressed, flagged, external_id, keep)
            if external_id is not None:
                conn.execute("INSERT INTO message_ids(scope_key, external_id, message_id, created_at) "
                             "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", (scope_key, external_id, message_id,
                                                                            created_at))
        return L1Row(message_id, scope_key, role, content, user_id, display_name, created_at, addressed, flagged,
                     external_id, None)

    def l1_append_once(self, scope_key: str, role: str, content: str, user_id: str | None, display_name: str | None,
                       created_at: float, addressed: bool, flagged: bool, external_id: str, keep: int) -> L1Row | None:
        """`l1_append` for a message its sender names by id: None, and nothing written, when this
        conversation stored that id before (a retry). The id is claimed in the same transaction as
        the row is written, so two senders racing with one id store it once."""
        with self.store.transaction() as conn:
            claimed = conn.execute("INSERT INTO message_ids(scope_key, external_id, message_id, created_at) "
                                   "VALUES (?, ?, 0, ?) ON CONFLICT DO NOTHING", (scope_key, external_id, created_at))
            if claimed.rowcount == 0:
                return None
            message_id = _l1_insert(conn, self._dialect, scope_key, role, content, user_id, display_name, created_at,
                                    addressed, flagged, external_id, keep)
            conn.execute("UPDATE message_ids SET message_id = ? WHERE scope_key = ? AND external_id = ?",
                         (message_id, scope_key, external_id))
        return L1Row(message_id, scope_key, role, content, user_id, display_name, created_at, addressed, flagged,
                     external_id, None)

    def messages_known(self, scope_key: str, external_ids: Sequence[str]) -> dict[str, KnownMessage]:
        """The ids among `external_ids` this conversation has stored, with their L1 row, turn block,
        deletion and (while L1 holds it) text: what tells a resend from an edit."""
        out: dict[str, KnownMessage] = {}
        for start in range(0, len(external_ids), 500):
            chunk = list(external_ids[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            for external_id, message_id, block_index, deleted_at, content, l1_block in self._rows(
                    "SELECT m.external_id, m.message_id, m.block_index, m.deleted_at, l.content, l.block_index "
                    "FROM message_ids m LEFT JOIN l1_messages l ON l.message_id = m.message_id "
                    f"WHERE m.scope_key = ? AND m.external_id IN ({marks})", [scope_key, *chunk]):
                block = block_index if block_index is not None else l1_block
                out[external_id] = KnownMessage(external_id, int(message_id), None if block is None else int(block),
                                                deleted_at is not None, content)
        return out

    def l1_edit(self, message_id: int, content: str, flagged: bool) -> None:
        """A message's new text (its sender edited it): the L1 row, if L1 still holds it, takes the
        text and waits to become a turn block again (`l1_pending`). The id keeps naming its old turn
        until that is forgotten (`message_turn_done`): an edit a crash cut short is finished at
        the next start (`edits_unfinished`)."""
        with self.store.transaction() as conn:
            conn.execute("UPDATE l1_messages SET content = ?, flagged = ?, block_index = NULL WHERE message_id = ?",
                         (content, int(flagged), message_id))

    def message_turn_done(self, scope_key: str, external_id: str, block_index: int) -> None:
        """A deleted message's turn, or an edited one's old turn, is forgotten with what came from
        it: the message's id no longer names it."""
        with self.store.transaction() as conn:
            conn.execute("UPDATE message_ids SET block_index = NULL WHERE scope_key = ? AND external_id = ? "
                         "AND block_index = ?", (scope_key, external_id, block_index))

    def edits_unfinished(self, limit: int = 1000) -> list[tuple[str, str, int, int]]:
        """Edited messages whose old turn is still named (scope key, external id, L1 message id, old
        block): a line waiting for its new turn while its id names a block is one — a new message's
        id names no block until its turn is written, in the same transaction as its line."""
        rows = self._rows("SELECT m.scope_key, m.external_id, m.message_id, m.block_index FROM message_ids m "
                          "JOIN l1_messages l ON l.message_id = m.message_id WHERE l.block_index IS NULL AND "
                          "m.block_index IS NOT NULL AND m.deleted_at IS NULL ORDER BY m.message_id LIMIT ?",
                          (limit,))
        return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]

    def message_block_hook(self, scope_key: str, external_id: str, user_id: str | None = None) -> AppendHook:
        """For `Memory.add(within=…)`: the block appended is this message's turn now (an edit of a
        message L1 no longer holds), recorded in the block's own transaction — refused, and the
        block with it, once an erasure of `user_id` (its author) has begun (ErasureUnderWayError): it
        may have listed their blocks already (as `turn_blocks_hook` refuses a commit of their lines)."""
        def link(conn: SqlWriter, blocks: Sequence[Block]) -> None:
            if user_id is not None and conn.execute("SELECT 1 FROM erasures WHERE user_id = ?",
                                                    (user_id,)).fetchone() is not None:
                raise ErasureUnderWayError(f"user {user_id!r} is being erased: their message's new turn is not kept")
            conn.execute("UPDATE message_ids SET block_index = ? WHERE scope_key = ? AND external_id = ?",
                         (blocks[0].block_index, scope_key, external_id))

        return link

    def message_delete(self, scope_key: str, external_id: str, message_id: int, when: float) -> None:
        """A message its sender deleted: its L1 row goes; its id stays taken (a late retry of the
        request that sent it must not bring it back) and is marked deleted. Its turn block stays
        named until it is forgotten too (`message_turn_done`): a deletion a crash cut short
        after this is finished by a retry or at the next start (`deletions_unfinished`)."""
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM l1_messages WHERE message_id = ?", (message_id,))
            conn.execute("UPDATE message_ids SET deleted_at = ? WHERE scope_key = ? AND external_id = ?",
                         (when, scope_key, external_id))

    def deletions_unfinished(self, limit: int = 1000) -> list[tuple[str, str, int, int]]:
        """Deleted messages whose turn block is still named (scope key, external id, L1 message id,
        block): deletions a crash cut short."""
        rows = self._rows("SELECT scope_key, external_id, message_id, block_index FROM message_ids WHERE "
                          "deleted_at IS NOT NULL AND block_index IS NOT NULL ORDER BY deleted_at LIMIT ?", (limit,))
        return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]

    def l1_blocks_of(self, message_ids: Sequence[int]) -> dict[int, int]:
        """L1 message id → its turn block, for those written (and not trimmed) yet."""
        out: dict[int, int] = {}
        for start in range(0, len(message_ids), 500):
            chunk = list(message_ids[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            out.update((int(m), int(b)) for m, b in self._rows(
                f"SELECT message_id, block_index FROM l1_messages WHERE block_index IS NOT NULL "
                f"AND message_id IN ({marks})", chunk))
        return out

    def message_ids_known(self, scope_key: str, external_ids: Sequence[str]) -> set[str]:
        """Which of these message ids this conversation has stored already."""
        known: set[str] = set()
        for start in range(0, len(external_ids), 500):
            chunk = list(external_ids[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            known.update(row[0] for row in self._rows(
                f"SELECT external_id FROM message_ids WHERE scope_key = ? AND external_id IN ({marks})",
                (scope_key, *chunk)))
        return known

    def l1_by_external_id(self, scope_key: str, external_id: str) -> L1Row | None:
        """The L1 row of a message its sender named by id (`l1_append_once`), while L1 keeps it."""
        rows = self._rows(f"SELECT {', '.join('l.' + c for c in _L1_COLUMNS)} FROM message_ids m "
                          "JOIN l1_messages l ON l.message_id = m.message_id "
                          "WHERE m.scope_key = ? AND m.external_id = ?", (scope_key, external_id))
        return _l1(rows[0]) if rows else None

    def l1_recent(self, scope_key: str, limit: int) -> list[L1Row]:
        rows = self._rows(f"SELECT {', '.join(_L1_COLUMNS)} FROM l1_messages WHERE scope_key = ? "
                          "ORDER BY message_id DESC LIMIT ?", (scope_key, limit))
        return [_l1(r) for r in reversed(rows)]

    def l1_since(self, scope_key: str, after_message_id: int, limit: int) -> list[L1Row]:
        rows = self._rows(f"SELECT {', '.join(_L1_COLUMNS)} FROM l1_messages WHERE scope_key = ? AND message_id > ? "
                          "ORDER BY message_id LIMIT ?", (scope_key, after_message_id, limit))
        return [_l1(r) for r in rows]

    def l1_pending(self, scope_key: str | None = None, limit: int = 100_000) -> list[L1Row]:
        sql = f"SELECT {', '.join(_L1_COLUMNS)} FROM l1_messages WHERE block_index IS NULL"
        params: list[Any] = []
        if scope_key is not None:
            sql += " AND scope_key = ?"
            params.append(scope_key)
        return [_l1(r) for r in self._rows(sql + " ORDER BY message_id LIMIT ?", [*params, limit])]

    def l1_set_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        with self.store.transaction() as conn:
            conn.executemany("UPDATE l1_messages SET block_index = ? WHERE message_id = ?",
                             [(block, message) for message, block in pairs])

    # -- fencing (schema v9) ----------------------------------------------------------------
    def fence_advance(self, scope_key: str, token: int) -> None:
        """A process took the conversation's lease with `token`: from now on only writes under it
        (or a newer one) are accepted. LeaseLostError if a newer token is stored already."""
        with self.store.transaction() as conn:
            check_fence(conn, scope_key, token)

    def fence_token(self, scope_key: str) -> int | None:
        rows = self._rows("SELECT token FROM channel_fences WHERE scope_key = ?", (scope_key,))
        return int(rows[0][0]) if rows else None

    def l1_claim(self, scope_key: str, claims: Sequence[tuple[int, str]], when: float,
                 fence: int | None = None) -> set[int]:
        """A turn takes these user messages to answer, each (L1 message id, claim id): the ones no
        other claim took before are marked handled and returned (a message handed from process to
        process is answered once). A claim id names one attempt to answer one copy of a message:
        the same claim again — a retry after the commit's answer was lost — is granted again.
        Under `fence`, in the transaction that checks it: a process that lost the channel claims
        nothing (LeaseLostError)."""
        claimed: set[int] = set()
        with self.store.transaction() as conn:
            if fence is not None:
                check_fence(conn, scope_key, fence)
            for message_id, claim in claims:
                cursor = conn.execute("UPDATE l1_messages SET handled_at = ?, handled_by = ? WHERE message_id = ? "
                                      "AND scope_key = ? AND (handled_at IS NULL OR handled_by = ?)",
                                      (when, claim, message_id, scope_key, claim))
                if cursor.rowcount:
                    claimed.add(int(message_id))
        return claimed

    def turn_blocks_hook(self, message_ids: Sequence[int], *, contents: Sequence[str] | None = None,
                         scope_key: str | None = None, fence: int | None = None) -> AppendHook:
        """For `Store.append(within=…)`: link the L1 messages `message_ids` (in the order of the blocks
        appended) to their turn blocks in the append's own transaction — refused, and the blocks
        with it, when another writer linked one of them first, when a line's author is being erased
        (the erasure deletes the line), or, given `contents` (the texts the blocks were made from),
        when a line's text is no longer that (an edit stored meanwhile by another process: its new
        text is written by the next commit) (L1RowsTakenError), or when `fence` is stale for
        `scope_key` (LeaseLostError). So no L1 row ever becomes two turn blocks, nor a turn of a text
        its line no longer holds or of an author being erased."""
        ids = list(message_ids)
        texts = list(contents) if contents is not None else None
        if texts is not None and len(texts) != len(ids):
            raise StoreError("turn blocks: one text per L1 message is required")
        # not a line of a user whose erasure has begun (in any process): it may have listed their
        # blocks already, and deletes their lines after
        link_sql = ("UPDATE l1_messages SET block_index = ? WHERE message_id = ? AND block_index IS NULL "
                    "AND (user_id IS NULL OR user_id NOT IN (SELECT user_id FROM erasures))"
                    + (" AND content = ?" if texts is not None else ""))
        done = [0]  # an append in chunks calls this once per chunk, in order

        def link(conn: SqlWriter, blocks: Sequence[Block]) -> None:
            chunk = ids[done[0] : done[0] + len(blocks)]
            if len(chunk) != len(blocks):
                raise StoreError("turn blocks: one block per L1 message is required")
            if fence is not None and scope_key is not None:
                check_fence(conn, scope_key, fence)
            for position, (message_id, block) in enumerate(zip(chunk, blocks), start=done[0]):
                text = (texts[position],) if texts is not None else ()
                cursor = conn.execute(link_sql, (block.block_index, message_id, *text))
                if cursor.rowcount != 1:
                    raise L1RowsTakenError(f"L1 message {message_id} is a turn block already, its text changed "
                                           "or its author is being erased (another writer)")
                # not a deleted message's record: before L1 ids were never reused on SQLite, a deleted
                # message's id could be the new one's
                conn.execute("UPDATE message_ids SET block_index = ? WHERE message_id = ? AND deleted_at IS NULL",
                             (block.block_index, message_id))
            done[0] += len(blocks)

        return link

    def l1_flag(self, message_id: int) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE l1_messages SET flagged = 1 WHERE message_id = ?", (message_id,))

    def l1_delete_blocks(self, block_indices: Sequence[int]) -> None:
        with self.store.transaction() as conn:
            conn.executemany("DELETE FROM l1_messages WHERE block_index = ?", [(i,) for i in block_indices])

    def l1_delete_user(self, user_id: str) -> int:
        with self.store.transaction() as conn:
            return conn.execute("DELETE FROM l1_messages WHERE user_id = ?", (user_id,)).rowcount

    def l1_delete_messages(self, message_ids: Sequence[int]) -> int:
        with self.store.transaction() as conn:
            return sum(conn.execute("DELETE FROM l1_messages WHERE message_id = ?", (m,)).rowcount
                       for m in message_ids)

    def l1_user_blocks(self, user_id: str) -> list[int]:
        return [r[0] for r in self._rows("SELECT block_index FROM l1_messages WHERE user_id = ? AND block_index "
                                         "IS NOT NULL", (user_id,))]

    def l1_conversations(self, limit: int = 1000) -> list[tuple[Scope, int, float]]:
        """(conversation, messages held, time of the newest) for every conversation in L1, newest first."""
        rows = self._rows("SELECT scope_key, count(*), max(created_at) FROM l1_messages GROUP BY scope_key "
                          "ORDER BY max(created_at) DESC LIMIT ?", (limit,))
        return [(scope_from_key(key), int(count), float(last)) for key, count, last in rows]

    def conversations_of_channel(self, channel: str) -> list[Scope]:
        """Every conversation with this channel id that has messages here (in any guild, or none)."""
        found: set[str] = set()
        for table in ("l1_messages", "channel_state"):
            found.update(row[0] for row in self._rows(f"SELECT DISTINCT scope_key FROM {table} WHERE scope_key LIKE ?",
                                                       (f'%,{json.dumps(channel, ensure_ascii=False)},%',)))
        scopes = [scope_from_key(key) for key in found]
        return sorted((s for s in scopes if s.channel == channel), key=lambda s: (s.guild or "", s.user or ""))

    def users_page(self, after: str | None, limit: int) -> list[UserRow]:
        """A tenant's users in id order after `after` (a page): everyone with a turn, a recent
        message, a name or a fact about them here."""
        ids = [row[0] for row in self._rows(
            "SELECT user_id FROM (SELECT user_id FROM blocks WHERE user_id IS NOT NULL AND forgotten_at IS NULL "
            "UNION SELECT user_id FROM l1_messages WHERE user_id IS NOT NULL "
            "UNION SELECT user_id FROM facts WHERE user_id IS NOT NULL UNION SELECT user_id FROM user_names) u "
            "WHERE user_id > ? ORDER BY user_id LIMIT ?", (after or "", limit))]
        if not ids:
            return []
        marks = ", ".join("?" for _ in ids)
        turns = {r[0]: r[1:] for r in self._rows(
            "SELECT user_id, count(*), min(event_time), max(event_time), count(DISTINCT channel) FROM blocks "
            f"WHERE user_id IN ({marks}) AND kind = 'turn' AND forgotten_at IS NULL GROUP BY user_id", ids)}
        pending = {r[0]: r[1:] for r in self._rows(
            "SELECT user_id, count(*), min(created_at), max(created_at), count(DISTINCT scope_key) FROM l1_messages "
            f"WHERE user_id IN ({marks}) AND block_index IS NULL GROUP BY user_id", ids)}
        facts = dict(self._rows(f"SELECT user_id, count(*) FROM facts WHERE user_id IN ({marks}) "
                                "AND valid_to IS NULL GROUP BY user_id", ids))
        names: dict[str, list[str]] = {}
        for user_id, name in self._rows(f"SELECT user_id, name FROM user_names WHERE user_id IN ({marks}) "
                                        "ORDER BY last_seen DESC", ids):
            names.setdefault(user_id, []).append(name)
        out = []
        for user_id in ids:
            kept, waiting = turns.get(user_id), pending.get(user_id)
            times = [t for t in (*(kept[1:3] if kept else ()), *(waiting[1:3] if waiting else ())) if t is not None]
            out.append(UserRow(user_id, tuple(names.get(user_id, ())), int(kept[0] if kept else 0) +
                               int(waiting[0] if waiting else 0), int(facts.get(user_id, 0)),
                               int(kept[3] if kept else 0) or int(waiting[3] if waiting else 0),
                               min(times) if times else None, max(times) if times else None))
        return out

    def user_l1_rows(self, user_id: str) -> list[L1Row]:
        """A user's recent messages in every conversation, oldest first."""
        return [_l1(r) for r in self._rows(f"SELECT {', '.join(_L1_COLUMNS)} FROM l1_messages WHERE user_id = ? "
                                           "ORDER BY message_id", (user_id,))]

    def fact_sources_by_user(self, user_id: str) -> list[FactSourceRow]:
        """The statements of facts a user's messages made (about them or anyone)."""
        return [FactSourceRow(*row) for row in self._rows(
            f"SELECT {', '.join(_SOURCE_COLUMNS)} FROM fact_sources WHERE user_id = ? ORDER BY said_at", (user_id,))]

    def user_names_of(self, user_id: str) -> list[tuple[str, float, float]]:
        """(name, first seen, last seen) of each display name a user's messages came with, newest first."""
        return [(str(n), float(a), float(b)) for n, a, b in self._rows(
            "SELECT name, first_seen, last_seen FROM user_names WHERE user_id = ? ORDER BY last_seen DESC",
            (user_id,))]

    def notes_copying(self, user_id: str) -> list[int]:
        """Live notes that copy a user's words without naming them in their scope (promoted from
        working memory before notes carried their speaker), by the speaker in their metadata. (The
        notes promoted from a user's blocks go with those blocks: `WritePath.forget`.)"""
        found = []
        for index, metadata in self._rows("SELECT block_index, metadata FROM blocks WHERE kind = 'note' "
                                          "AND forgotten_at IS NULL AND user_id IS NULL"):
            try:
                data = json.loads(metadata)
            except (TypeError, ValueError):
                continue
            if isinstance(data, dict) and data.get("speaker") == user_id:
                found.append(int(index))
        return found

    def user_blocks_page(self, user_id: str, after: int, limit: int) -> list[tuple[Any, ...]]:
        """A user's live blocks after block `after`, in order: (block_index, kind, guild, channel,
        text, event_time, metadata JSON) — what an access request reads, a page at a time."""
        return self._rows("SELECT block_index, kind, guild, channel, text, event_time, metadata FROM blocks "
                          "WHERE (user_id = ? OR speaker = ?) AND forgotten_at IS NULL AND block_index > ? "
                          "ORDER BY block_index LIMIT ?", (user_id, user_id, after, limit))

    def user_names_delete(self, user_id: str) -> int:
        with self.store.transaction() as conn:
            return int(conn.execute("DELETE FROM user_names WHERE user_id = ?", (user_id,)).rowcount)

    def erasure_begin(self, user_id: str, when: float, reason: str) -> None:
        """An erasure starts: recorded first, so one a crash interrupts is finished on the next open."""
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO erasures(user_id, started_at, reason) VALUES (?, ?, ?) ON CONFLICT(user_id) "
                         "DO NOTHING", (user_id, when, reason))

    def erasure_end(self, user_id: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM erasures WHERE user_id = ?", (user_id,))

    def erasures_pending(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT user_id FROM erasures ORDER BY started_at")]

    def l1_count(self, scope_key: str | None = None) -> int:
        if scope_key is None:
            return int(self._rows("SELECT count(*) FROM l1_messages")[0][0])
        return int(self._rows("SELECT count(*) FROM l1_messages WHERE scope_key = ?", (scope_key,))[0][0])

    # -- L2 ---------------------------------------------------------------------------------
    def summary_load(self, scope_key: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT data FROM summaries WHERE scope_key = ?", (scope_key,))
        return _summary_of(scope_key, rows[0][0]) if rows else None

    def summary_change(self, scope_key: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None],
                       when: float) -> dict[str, Any] | None:
        """Read, change and write one conversation's summary in one transaction: `change` gets it as
        stored (None: none yet) and returns the new one, or None to leave it. Processes sharing the
        database take turns, so none writes back a copy it read before another's change (a stale
        copy written back undid an erasure). Returns the summary as stored after."""
        with self.store.transaction() as conn:
            # Written first, so the row (or the key of a new one) is this transaction's until it
            # ends: PostgreSQL makes a second writer's upsert wait here, and its read then sees this
            # one's commit; SQLite's BEGIN IMMEDIATE already lets one writer in at a time. A row of
            # JSON `null` stands for none and does not outlive the transaction.
            conn.execute("INSERT INTO summaries(scope_key, data, updated_at) VALUES (?, 'null', ?) "
                         "ON CONFLICT(scope_key) DO UPDATE SET updated_at = summaries.updated_at", (scope_key, when))
            stored = _summary_of(scope_key, conn.execute("SELECT data FROM summaries WHERE scope_key = ?",
                                                         (scope_key,)).fetchone()[0])
            changed = change(stored)
            if changed is not None:
                conn.execute("UPDATE summaries SET data = ?, updated_at = ? WHERE scope_key = ?",
                             (json.dumps(changed, ensure_ascii=False), when, scope_key))
                return changed
            if stored is None:
                conn.execute("DELETE FROM summaries WHERE scope_key = ?", (scope_key,))
            return stored

    def summary_keys(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT scope_key FROM summaries ORDER BY scope_key")]

    # -- L3 ---------------------------------------------------------------------------------
    def fact_insert(self, row: FactRow, *, supersede: int | None = None, when: float | None = None) -> None:
        """Record a fact and, in the same transaction, close the one it supersedes."""
        with self.store.transaction() as conn:
            conn.execute(f"INSERT INTO facts({', '.join(_FACT_COLUMNS)}) "
                         f"VALUES ({', '.join('?' * len(_FACT_COLUMNS))}) ON CONFLICT DO NOTHING",
                         [getattr(row, c) for c in _FACT_COLUMNS])
            if supersede is not None:
                conn.execute("UPDATE facts SET valid_to = ?, superseded_by = ?, expired_at = ? WHERE block_index = ? "
                             "AND valid_to IS NULL", (row.valid_from if when is None else when, row.block_index,
                                                      row.recorded_at if row.recorded_at is not None
                                                      else row.valid_from, supersede))

    def facts_get(self, block_indices: Sequence[int]) -> dict[int, FactRow]:
        if not block_indices:
            return {}
        marks = ", ".join("?" * len(block_indices))
        rows = self._rows(f"SELECT {', '.join(_FACT_COLUMNS)} FROM facts WHERE block_index IN ({marks})",
                          list(block_indices))
        return {r[0]: FactRow(*r) for r in rows}

    def facts_current(self, fact_type: str, guild: str | None, user_id: str | None) -> list[FactRow]:
        """Live facts about one subject (a user in a guild, a guild, or the lore)."""
        rows = self._rows(f"SELECT {', '.join(_FACT_COLUMNS)} FROM facts WHERE fact_type = ? "
                          "AND guild IS NOT DISTINCT FROM ? AND user_id IS NOT DISTINCT FROM ? AND valid_to IS NULL "
                          "ORDER BY block_index", (fact_type, guild, user_id))
        return [FactRow(*r) for r in rows]

    def facts_where(self, *, user_id: str | None = None, guild: str | None = None, include_history: bool = False,
                    limit: int = 1000, as_of: float | None = None, known_at: float | None = None) -> list[FactRow]:
        """Facts by user and guild: the current ones, or every version (`include_history`).
        `as_of`: the versions true at that moment of the conversation's clock. `known_at`: as gieok
        knew them then — only what it had learned by then, and a version it learned was over only
        later is still open (its valid_to and expired_at unset in the rows returned)."""
        sql = f"SELECT {', '.join(_FACT_COLUMNS)} FROM facts WHERE 1 = 1"
        params: list[Any] = []
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)
        if guild is not None:
            sql += " AND guild = ?"
            params.append(guild)
        if known_at is not None:
            sql += " AND coalesce(recorded_at, valid_from) <= ?"
            params.append(known_at)
        open_then = "valid_to IS NULL" if known_at is None else "(valid_to IS NULL OR coalesce(expired_at, 0) > ?)"
        if as_of is not None:
            sql += f" AND valid_from <= ? AND ({open_then} OR valid_to > ?)"
            params += [as_of, *([known_at] if known_at is not None else []), as_of]
        elif not include_history:
            sql += f" AND {open_then}"
            params += [known_at] if known_at is not None else []
        sql += " ORDER BY block_index LIMIT ?"
        params.append(limit)
        rows = [FactRow(*r) for r in self._rows(sql, params)]
        if known_at is not None:  # what was not known then is not shown
            rows = [replace(r, valid_to=None, superseded_by=None, expired_at=None)
                    if r.expired_at is not None and r.expired_at > known_at else r for r in rows]
        return rows

    def facts_of_subject(self, fact_type: str, guild: str | None, user_id: str | None) -> list[FactRow]:
        """Every version of the facts about one subject, current and superseded, oldest first."""
        rows = self._rows(f"SELECT {', '.join(_FACT_COLUMNS)} FROM facts WHERE fact_type = ? "
                          "AND guild IS NOT DISTINCT FROM ? AND user_id IS NOT DISTINCT FROM ? "
                          "ORDER BY valid_from, block_index", (fact_type, guild, user_id))
        return [FactRow(*r) for r in rows]

    def fact_sources_of(self, block_indices: Sequence[int]) -> dict[int, list[FactSourceRow]]:
        """Each fact's statements, earliest first."""
        out: dict[int, list[FactSourceRow]] = {}
        for start in range(0, len(block_indices), 500):
            chunk = list(block_indices[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            for row in self._rows(f"SELECT {', '.join(_SOURCE_COLUMNS)} FROM fact_sources "
                                  f"WHERE block_index IN ({marks}) ORDER BY said_at", chunk):
                out.setdefault(int(row[0]), []).append(FactSourceRow(*row))
        return out

    def fact_sources_from(self, message_ids: Sequence[int]) -> list[FactSourceRow]:
        """The statements of facts that these L1 messages made."""
        out: list[FactSourceRow] = []
        for start in range(0, len(message_ids), 500):
            chunk = list(message_ids[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            out += [FactSourceRow(*row) for row in self._rows(
                f"SELECT {', '.join(_SOURCE_COLUMNS)} FROM fact_sources WHERE message_id IN ({marks}) "
                "ORDER BY said_at", chunk)]
        return out

    def facts_apply(self, changes: FactChanges) -> None:
        """`changes` in one transaction (FactsMovedError, and nothing written, if a subject they
        expect moved)."""
        with self.store.transaction() as conn:
            self._check_expected(conn, changes)
            _apply_fact_changes(conn, changes)

    def facts_hook(self, changes: FactChanges) -> AppendHook:
        """For `Memory.add(within=…)`: `changes`, their placeholders resolved to the blocks appended,
        written in the append's own transaction — a fact block never stands without its row (and
        none is appended if a subject the changes expect moved: FactsMovedError)."""
        def write(conn: SqlWriter, blocks: Sequence[Block]) -> None:
            self._check_expected(conn, changes)
            _apply_fact_changes(conn, changes.resolved([b.block_index for b in blocks]))

        return write

    def fact_subject_state(self, subject: FactSubject) -> tuple[Any, ...]:
        """What a write about `subject` read, in a form to compare: each of its versions' interval
        and links, and how many statements each has. Taken before the write reads the subject's
        facts, and again in its transaction (`FactChanges.expect`)."""
        return _subject_state(self.store.fetch, subject)

    def _check_expected(self, conn: SqlWriter, changes: FactChanges) -> None:
        for subject, seen in sorted(changes.expect, key=lambda pair: tuple(str(part) for part in pair[0])):
            if self._dialect == "postgres":
                # Another process's write about the subject, in flight, commits before this one reads
                # it (SQLite's BEGIN IMMEDIATE already lets one writer in at a time). Taken in one order.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ?))",
                             (":facts:" + repr(subject),))
            if _subject_state(lambda sql, params: conn.execute(sql, params).fetchall(), subject) != seen:
                raise FactsMovedError(f"the facts about {subject[0]} {subject[1]!r} {subject[2]!r} changed "
                                      "while this write was decided (another process wrote them)")

    def facts_exist(self, *, guild: str | None = None, user_id: str | None = None) -> bool:
        if guild is not None:
            return bool(self._rows("SELECT 1 FROM facts WHERE guild = ? AND valid_to IS NULL LIMIT 1", (guild,)))
        return bool(self._rows("SELECT 1 FROM facts WHERE user_id = ? AND valid_to IS NULL LIMIT 1", (user_id,)))

    def lore_keys(self) -> set[str]:
        return {r[0] for r in self._rows("SELECT lore_key FROM facts WHERE lore_key IS NOT NULL")}

    def facts_delete_blocks(self, block_indices: Sequence[int]) -> None:
        with self.store.transaction() as conn:
            conn.executemany("DELETE FROM facts WHERE block_index = ?", [(i,) for i in block_indices])
            conn.executemany("DELETE FROM fact_sources WHERE block_index = ?", [(i,) for i in block_indices])

    # -- analysis schedule --------------------------------------------------------------------
    def channel_state(self, scope_key: str) -> tuple[int, int] | None:
        rows = self._rows("SELECT since_analysis, last_message_id FROM channel_state WHERE scope_key = ?", (scope_key,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def channel_states_pending(self, quiet_since: float) -> list[str]:
        """Conversations with messages the extraction has not seen, quiet since before `quiet_since`."""
        return [row[0] for row in self._rows("SELECT scope_key FROM channel_state WHERE since_analysis > 0 AND "
                                             "updated_at < ? ORDER BY updated_at", (quiet_since,))]

    def channel_state_count(self, scope_key: str, messages: int, when: float) -> tuple[int, int, bool]:
        """`messages` more toward the conversation's next extraction, counted in the database (two
        processes counting at once both count): (messages since the last extraction, the last
        message it read, whether the conversation had no state before)."""
        with self.store.transaction() as conn:
            new = conn.execute("SELECT 1 FROM channel_state WHERE scope_key = ?", (scope_key,)).fetchone() is None
            since, last = conn.execute(
                "INSERT INTO channel_state(scope_key, since_analysis, last_message_id, updated_at) VALUES (?, ?, 0, ?) "
                "ON CONFLICT(scope_key) DO UPDATE SET since_analysis = channel_state.since_analysis + "
                "excluded.since_analysis, updated_at = excluded.updated_at RETURNING since_analysis, last_message_id",
                (scope_key, messages, when)).fetchone()
        return int(since), int(last), new

    def channel_state_claim(self, scope_key: str, after: int, last: int, when: float) -> bool:
        """An extraction takes the conversation's messages after `after` up to `last`: only if no
        other process has taken them since it read `after` (then this one reads nothing again)."""
        with self.store.transaction() as conn:
            cursor = conn.execute("UPDATE channel_state SET since_analysis = 0, last_message_id = ?, updated_at = ? "
                                  "WHERE scope_key = ? AND last_message_id = ?", (last, when, scope_key, after))
            if cursor.rowcount == 0 and after == 0:  # no state yet
                cursor = conn.execute("INSERT INTO channel_state(scope_key, since_analysis, last_message_id, "
                                      "updated_at) VALUES (?, 0, ?, ?) ON CONFLICT(scope_key) DO NOTHING",
                                      (scope_key, last, when))
            return cursor.rowcount == 1

    # -- active channels ------------------------------------------------------------------------
    def active_keys(self) -> set[str]:
        return {r[0] for r in self._rows("SELECT scope_key FROM active_channels")}

    def set_active(self, scope_key: str, active: bool, when: float, by: str | None = None) -> None:
        with self.store.transaction() as conn:
            if active:
                conn.execute("INSERT INTO active_channels(scope_key, activated_at, activated_by) VALUES (?, ?, ?) "
                             "ON CONFLICT(scope_key) DO UPDATE SET activated_at = excluded.activated_at, "
                             "activated_by = excluded.activated_by", (scope_key, when, by))
            else:
                conn.execute("DELETE FROM active_channels WHERE scope_key = ?", (scope_key,))

    def usage_add(self, scope: str, day: str, tokens: int, calls: int = 1) -> int:
        """Add to a guild's model usage of a day (every process of a deployment adds to the same row);
        returns the day's tokens so far."""
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO model_usage(scope, day, tokens, calls) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT(scope, day) DO UPDATE SET tokens = model_usage.tokens + excluded.tokens, "
                         "calls = model_usage.calls + excluded.calls", (scope, day, tokens, calls))
        return self.usage_of(scope, day)

    def usage_of(self, scope: str, day: str) -> int:
        rows = self._rows("SELECT tokens FROM model_usage WHERE scope = ? AND day = ?", (scope, day))
        return int(rows[0][0]) if rows else 0


def _summary_of(scope_key: str, data: Any) -> dict[str, Any] | None:
    """A stored summary; None (no summary, logged) for one that is not a JSON object: a stored
    value must not make every read and every message of the conversation fail. The next change
    writes a whole one over it."""
    try:
        summary = json.loads(data)
    except (TypeError, ValueError):
        summary = "unreadable"
    if summary is None or isinstance(summary, dict):
        return summary
    log.error("the stored summary of %s is not a JSON object: read as none (the next update replaces it)", scope_key)
    return None


def _subject_state(fetch: Callable[[str, Sequence[Any]], list[Any]], subject: FactSubject) -> tuple[Any, ...]:
    rows = fetch("SELECT f.block_index, f.valid_from, f.valid_to, f.superseded_by, f.expired_at, "
                 "(SELECT count(*) FROM fact_sources s WHERE s.block_index = f.block_index) FROM facts f "
                 "WHERE f.fact_type = ? AND f.guild IS NOT DISTINCT FROM ? AND f.user_id IS NOT DISTINCT FROM ? "
                 "ORDER BY f.block_index", subject)
    return tuple(tuple(row) for row in rows)


def _apply_fact_changes(conn: SqlWriter, changes: FactChanges) -> None:
    for row in changes.inserts:
        conn.execute(f"INSERT INTO facts({', '.join(_FACT_COLUMNS)}) VALUES ({', '.join('?' * len(_FACT_COLUMNS))}) "
                     "ON CONFLICT DO NOTHING", [getattr(row, c) for c in _FACT_COLUMNS])
    for block_index, values in changes.updates:
        unknown = set(values) - _FACT_UPDATABLE
        if unknown:
            raise StoreError(f"facts: cannot set {sorted(unknown)}")
        if values:
            names = sorted(values)
            conn.execute(f"UPDATE facts SET {', '.join(f'{n} = ?' for n in names)} WHERE block_index = ?",
                         [*(values[n] for n in names), block_index])
    for source, target, after in changes.moves:
        conn.execute("UPDATE fact_sources SET block_index = ? WHERE block_index = ? AND said_at > ?",
                     (target, source, after))
    for block_index, message_id in changes.dropped_sources:
        conn.execute("DELETE FROM fact_sources WHERE block_index = ? AND message_id = ?", (block_index, message_id))
    for source_row in changes.sources:
        conn.execute(f"INSERT INTO fact_sources({', '.join(_SOURCE_COLUMNS)}) "
                     f"VALUES ({', '.join('?' * len(_SOURCE_COLUMNS))})",
                     [getattr(source_row, c) for c in _SOURCE_COLUMNS])
    for block_index in changes.deletes:
        conn.execute("DELETE FROM facts WHERE block_index = ?", (block_index,))
        conn.execute("DELETE FROM fact_sources WHERE block_index = ?", (block_index,))


def check_fence(conn: SqlWriter, scope_key: str, token: int) -> None:
    """Inside a transaction: go on only if no newer fencing token than `token` is stored for the
    conversation (and store `token` if it is newer). The statement locks the fence row until the
    transaction ends, so a process taking the lease (`fence_advance`) waits for a write under the
    old token to commit, and every write after it is refused."""
    cursor = conn.execute("INSERT INTO channel_fences(scope_key, token) VALUES (?, ?) ON CONFLICT(scope_key) "
                          "DO UPDATE SET token = excluded.token WHERE channel_fences.token <= excluded.token",
                          (scope_key, int(token)))
    if cursor.rowcount == 0:
        raise LeaseLostError(f"{scope_key}: another process runs this channel now (fencing token {token} is stale)")


_L1_LAST_ID = "l1_last_message_id"  # SQLite: the highest L1 message id ever given (`meta`)


def _next_l1_id(conn: Any) -> int:
    """SQLite's next L1 message id, never one given before. Its rowid would be the highest row's + 1,
    so the id of the newest message, deleted, went to the next one: the deleted message's id record
    then named the new one's turn, and the new message sat at or below the extraction's mark (the
    last message read) and was never read. A message id is also kept in fact statements and summary
    spans. PostgreSQL's sequence never gives one twice."""
    stored = conn.execute("SELECT value FROM meta WHERE key = ?", (_L1_LAST_ID,)).fetchone()
    if stored is not None:
        last = int(stored[0])
    else:  # the first since this was kept: the highest id anything names
        last = max(int(conn.execute(sql).fetchone()[0] or 0) for sql in (
            "SELECT max(message_id) FROM message_ids", "SELECT max(message_id) FROM fact_sources",
            "SELECT max(last_message_id) FROM channel_state"))
    highest = int(conn.execute("SELECT max(message_id) FROM l1_messages").fetchone()[0] or 0)
    given = max(last, highest) + 1
    conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                 (_L1_LAST_ID, str(given)))
    return given


def _l1_insert(conn: Any, dialect: str, scope_key: str, role: str, content: str, user_id: str | None,
               display_name: str | None, created_at: float, addressed: bool, flagged: bool, external_id: str | None,
               keep: int) -> int:
    """Insert one L1 row and trim its conversation to `keep` rows (never a row not yet a block)."""
    values = (scope_key, role, content, user_id, display_name, created_at, int(addressed), int(flagged), external_id)
    if dialect == "sqlite":
        message_id = _next_l1_id(conn)
        conn.execute("INSERT INTO l1_messages(message_id, scope_key, role, content, user_id, display_name, "
                     "created_at, addressed, flagged, external_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (message_id, *values))
    else:
        message_id = int(conn.execute(
            "INSERT INTO l1_messages(scope_key, role, content, user_id, display_name, created_at, addressed, "
            "flagged, external_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING message_id", values).fetchone()[0])
    if user_id is not None and display_name and role == "user":  # the names a user is known by (GET /v1/users)
        conn.execute("INSERT INTO user_names(user_id, name, first_seen, last_seen) VALUES (?, ?, ?, ?) "
                     "ON CONFLICT(user_id, name) DO UPDATE SET first_seen = CASE WHEN excluded.first_seen < "
                     "user_names.first_seen THEN excluded.first_seen ELSE user_names.first_seen END, last_seen = CASE "
                     "WHEN excluded.last_seen > user_names.last_seen THEN excluded.last_seen ELSE user_names.last_seen "
                     "END",
                     (user_id, display_name, created_at, created_at))
    conn.execute(
        "DELETE FROM l1_messages WHERE scope_key = ? AND block_index IS NOT NULL AND message_id <= "
        "(SELECT message_id FROM l1_messages WHERE scope_key = ? ORDER BY message_id DESC LIMIT 1 OFFSET ?)",
        (scope_key, scope_key, keep),
    )
    return message_id
