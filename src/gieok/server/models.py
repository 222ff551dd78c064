"""Request bodies of the REST API. Unknown fields and wrong types are refused (422) before any
handler runs; the engine's own checks (text length, NUL bytes, ids …) refuse the rest (400).
Responses are the engine's own serialisations (`Block.as_dict`, `SearchResult.as_dict` …)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ScopeIn", "MemoryIn", "BatchIn", "SearchIn", "CoreIn", "KeyIn", "MessageIn", "MessagesIn", "ContextIn",
           "FactIn", "FactCorrectionIn", "MAX_BATCH", "MAX_K", "MAX_ID"]

MAX_BATCH = 256  # one batch is one transaction (the engine commits 256 blocks at a time)
MAX_K = 100
MAX_ID = 200
Kind = Literal["turn", "fact", "note", "summary"]
When = float | str  # epoch seconds or ISO 8601


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # NaN, Infinity: 422 by name


class ScopeIn(_Strict):
    guild: str | None = Field(None, max_length=MAX_ID)
    channel: str | None = Field(None, max_length=MAX_ID)
    user: str | None = Field(None, max_length=MAX_ID)

    def as_mapping(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class MemoryIn(_Strict):
    """One block to remember."""

    text: str
    kind: Kind = "turn"
    scope: ScopeIn | None = None
    speaker: str | None = Field(None, max_length=MAX_ID)
    importance: float = Field(0.5, ge=0.0, le=1.0)
    event_time: When | None = None
    tags: list[str] | None = Field(None, max_length=64)
    keywords: list[str] | None = Field(None, max_length=64)
    metadata: dict[str, Any] | None = None

    def as_item(self) -> dict[str, Any]:
        item = self.model_dump(exclude_none=True)
        item["scope"] = self.scope.as_mapping() if self.scope else None
        return item


class BatchIn(_Strict):
    items: list[MemoryIn] = Field(min_length=1, max_length=MAX_BATCH)


class SearchIn(_Strict):
    query: str
    k: int = Field(10, ge=1, le=MAX_K)
    scope: ScopeIn | None = None
    kinds: list[Kind] | None = None
    since: When | None = None
    until: When | None = None
    mode: Literal["hybrid", "bm25", "vector"] = "hybrid"
    neighbours: bool = True


class CoreIn(_Strict):
    """A conversation's permanent core (operator-set lines every summary keeps)."""

    channel: str = Field(max_length=MAX_ID)
    guild: str | None = Field(None, max_length=MAX_ID)
    core: list[str] = Field(max_length=20)


class KeyIn(_Strict):
    role: Literal["read", "write", "admin"]
    name: str = Field("", max_length=100)


class MessageIn(_Strict):
    """One message of an agent's conversation (`chat/agent/agents.py` checks the rest)."""

    id: str = Field(min_length=1, max_length=MAX_ID, description="The sender's id for it: a retry is stored once")
    role: Literal["user", "assistant"]
    text: str
    user: str | None = Field(None, max_length=MAX_ID, description="Who wrote it (required for role user)")
    name: str | None = Field(None, max_length=100, description="Their display name (kept in L1 only)")
    time: float | int | str | None = Field(None, description=(
        "When it was said: epoch seconds or ISO 8601 (without a zone: the server's timezone); default now. "
        "Refused: epoch milliseconds, 0 or negative, before 1970, more than a day ahead"))


class MessagesIn(_Strict):
    channel: str = Field(max_length=MAX_ID)
    guild: str | None = Field(None, max_length=MAX_ID)
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_BATCH)
    index: Literal["now", "behind"] = Field("now", description=(
        "now: the turn blocks are written before the answer (each stored message's block_index in it; search "
        "finds them at once). behind: the answer comes once the messages are stored as recent messages (durable, "
        "in the next context); their turn blocks are written in the background (block_index null; search finds "
        "them a moment later)"))


class ContextIn(_Strict):
    channel: str = Field(max_length=MAX_ID)
    guild: str | None = Field(None, max_length=MAX_ID)
    user: str | None = Field(None, max_length=MAX_ID, description="Whose facts (the isolation rules apply)")
    query: str | None = Field(None, description="What the next reply is about; default: the last user message")
    budget_tokens: int = Field(2000, ge=100, le=32_000)
    include: list[Literal["facts", "summary", "recalled", "recent"]] | None = Field(None, min_length=1)


class FactIn(_Strict):
    """A fact an operator or agent states: about a user (in a guild, or everywhere their DMs reach)
    or about a guild."""

    text: str = Field(description="One sentence naming people as <user:ID>")
    user: str | None = Field(None, max_length=MAX_ID, description="Whom it is about")
    guild: str | None = Field(None, max_length=MAX_ID, description="Where it holds (a guild fact: required)")
    topic: str = Field("", max_length=80)
    valid_from: When | None = Field(None, description="Since when it is true (default now)")


class FactCorrectionIn(_Strict):
    text: str = Field(description="What the fact should have said")
    valid_from: When | None = Field(None, description="Since when (default: when the wrong one began)")
