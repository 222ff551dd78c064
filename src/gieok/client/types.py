"""What the client returns where the engine has no type of its own for it: the server's stats
(which drop the file path and add the layer counters, so `gieok.Stats` does not fit), facts, a page
of blocks, and the conversation calls' messages, results and context. Blocks, hits, search results
and verify reports come back as the engine's own dataclasses (`Block.from_dict` …).

Answers are read tolerantly: a field this client does not know is ignored and one it expects but
does not get takes its default, so a newer server does not break an older client."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal, TypeVar

from ..types import Block, Scope

__all__ = ["Message", "StoredMessage", "MessagesResult", "Context", "ContextParts", "ContextFact", "RecalledTurn",
           "RecentMessage", "Fact", "ServerStats", "BlockPage", "When"]

When = float | int | str | datetime | date  # epoch seconds, ISO 8601, or a datetime (sent as ISO 8601)

_T = TypeVar("_T")


def _known(cls: type[_T], data: Mapping[str, Any]) -> _T:
    """`cls` from the fields of `data` it declares; others are ignored (a newer server's)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{key: value for key, value in data.items() if key in names})


def wire_time(value: When | None) -> float | int | str | None:
    """A time as JSON carries it: a datetime (or date) as ISO 8601, the rest as given."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message for `add_messages`. `id` is the transport's message id: the server
    stores each id once, which is what makes sending the same message twice (a retry) harmless.
    `time` is when it was said: epoch seconds, ISO 8601, or a datetime."""

    id: str
    role: Literal["user", "assistant"]
    text: str
    user: str | None = None
    name: str | None = None
    time: When | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "role": self.role, "text": self.text, "user": self.user, "name": self.name,
                "time": wire_time(self.time)}


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message the server stored: its L1 row and, for a turn worth remembering, its block."""

    id: str
    role: str = "user"
    l1_id: int | None = None
    block_index: int | None = None
    flagged: bool = False


@dataclass(slots=True)
class MessagesResult:
    """What `add_messages` did: the messages stored, the ids it had already (not stored again),
    the ids the guard flagged, whether summaries and facts run ("on" or "off: why") and whether
    fact extraction started ("started", "not due", "off")."""

    conversation: Scope
    stored: list[StoredMessage] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)
    summaries_and_facts: str = ""
    extraction: str = ""
    edited: list[StoredMessage] = field(default_factory=list)  # ids sent again with another text: replaced
    timings_ms: dict[str, float] = field(default_factory=dict)  # the server's time per stage, and total_ms
    index: str = "now"  # "behind": the turn blocks (each stored message's block_index) are written after the answer

    @property
    def stored_count(self) -> int:
        return len(self.stored)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MessagesResult:
        return cls(conversation=Scope.of(data.get("conversation")),
                   stored=[_known(StoredMessage, item) for item in data.get("stored") or ()],
                   duplicates=[str(i) for i in data.get("duplicates") or ()],
                   flagged=[str(i) for i in data.get("flagged") or ()],
                   summaries_and_facts=str(data.get("summaries_and_facts") or ""),
                   extraction=str(data.get("extraction") or ""),
                   edited=[_known(StoredMessage, item) for item in data.get("edited") or ()],
                   timings_ms={str(k): float(v) for k, v in (data.get("timings_ms") or {}).items()},
                   index=str(data.get("index") or "now"))

    def merged(self, later: MessagesResult) -> MessagesResult:
        """This result followed by a later request's (a long list is sent in several): lists
        concatenate; the status is the later one's, and extraction counts as started if either
        request started it; the stages' times add up."""
        extraction = "started" if "started" in (self.extraction, later.extraction) else later.extraction
        return MessagesResult(conversation=self.conversation, stored=[*self.stored, *later.stored],
                              duplicates=[*self.duplicates, *later.duplicates],
                              flagged=[*self.flagged, *later.flagged],
                              summaries_and_facts=later.summaries_and_facts, extraction=extraction,
                              edited=[*self.edited, *later.edited],
                              timings_ms={k: self.timings_ms.get(k, 0.0) + later.timings_ms.get(k, 0.0)
                                          for k in {**self.timings_ms, **later.timings_ms}}, index=later.index)


@dataclass(frozen=True, slots=True)
class ContextFact:
    """An L3 fact chosen for the context, with its validity and how well it matched the query."""

    text: str
    type: str = ""
    user: str | None = None
    guild: str | None = None
    valid_from: float | str | None = None
    valid_to: float | str | None = None
    current: bool = True
    score: float | None = None


@dataclass(frozen=True, slots=True)
class RecalledTurn:
    """A long-term memory recalled for the query."""

    text: str
    speaker: str | None = None
    name: str | None = None
    time: float | str | None = None
    score: float | None = None
    block_index: int | None = None
    kind: str | None = None
    flagged: bool = False  # the guard flagged it when it was said
    superseded_by: dict[str, Any] | None = None  # a fact it stated changed since: {text, valid_from}


@dataclass(frozen=True, slots=True)
class RecentMessage:
    """One of the conversation's recent messages (L1), oldest first."""

    text: str
    role: str = "user"
    user: str | None = None
    name: str | None = None
    time: float | str | None = None
    flagged: bool = False


@dataclass(slots=True)
class ContextParts:
    """The context's parts; a part not asked for (`include`) is empty. `summary` is the L2
    summary as the server sends it (`text` and its other fields), or None."""

    facts: list[ContextFact] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    recalled: list[RecalledTurn] = field(default_factory=list)
    recent: list[RecentMessage] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContextParts:
        summary = data.get("summary")
        return cls(facts=[_known(ContextFact, item) for item in data.get("facts") or ()],
                   summary=dict(summary) if summary else None,
                   recalled=[_known(RecalledTurn, item) for item in data.get("recalled") or ()],
                   recent=[_known(RecentMessage, item) for item in data.get("recent") or ()])


@dataclass(slots=True)
class Context:
    """A conversation's memory fitted to a token budget. `text` is the ready-to-use block for a
    system prompt; `parts` what it was made of; `tokens` each part's count and the total."""

    conversation: Scope
    text: str
    parts: ContextParts = field(default_factory=ContextParts)
    query: str = ""
    language: str = ""
    tokens: dict[str, int] = field(default_factory=dict)
    budget_tokens: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # e.g. no such conversation (then `known` is False)
    known: bool = True  # False: the server has never seen this conversation

    def __str__(self) -> str:
        return self.text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Context:
        return cls(conversation=Scope.of(data.get("conversation")), text=str(data["text"]),
                   parts=ContextParts.from_dict(data.get("parts") or {}), query=str(data.get("query") or ""),
                   language=str(data.get("language") or ""),
                   tokens={str(k): int(v) for k, v in (data.get("tokens") or {}).items()},
                   budget_tokens=int(data.get("budget_tokens") or 0),
                   timings_ms={str(k): float(v) for k, v in (data.get("timings_ms") or {}).items()},
                   warnings=[str(w) for w in data.get("warnings") or ()], known=data.get("conversation") is not None)


@dataclass(frozen=True, slots=True)
class Fact:
    """An L3 fact as `GET /v1/facts` sends it (the chat's `Fact`, which the engine ring cannot
    import): current while `valid_to` is None; a superseded one names what replaced it."""

    block_index: int
    text: str
    fact_type: str = ""
    topic: str = ""
    keywords: tuple[str, ...] = ()
    guild: str | None = None
    user_id: str | None = None
    source_message: str | None = None
    valid_from: float = 0.0
    valid_to: float | None = None
    superseded_by: int | None = None
    recorded_at: float | None = None  # when gieok learned it
    expired_at: float | None = None  # when gieok learned it was over

    @property
    def current(self) -> bool:
        return self.valid_to is None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fact:
        fact = _known(cls, data)
        return dataclasses.replace(fact, keywords=tuple(fact.keywords or ()))


@dataclass(frozen=True, slots=True)
class ServerStats:
    """`GET /v1/stats`: the engine's `Stats` without the file's path (the server keeps that to
    itself) and with each layer's counters (attempts, answers, hit rate, mean time)."""

    blocks: int = 0
    live_blocks: int = 0
    forgotten_blocks: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    channels: int = 0
    embedder: str = ""
    dimension: int = 0
    vector_index: str = ""
    schema_version: int = 0
    file_bytes: int = 0
    passages: str = ""  # how the vectors held were made from turns; `passages_configured`: how new ones are
    passages_configured: str = ""
    layers: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerStats:
        return _known(cls, data)


@dataclass(slots=True)
class BlockPage:
    """One page of `list_blocks`, newest first; pass `next_cursor` as `cursor` for the next
    (None: this was the last page)."""

    items: list[Block]
    next_cursor: str | None = None

    def __iter__(self) -> Iterator[Block]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
