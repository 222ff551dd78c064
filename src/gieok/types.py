"""The vocabulary shared by every layer: scopes, blocks, hits and search results.

A **block** is one long-term record (a turn, a fact, a note, a summary snapshot).
A **scope** says where it belongs: (guild, channel, user), each optional.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from .errors import InvalidInputError, InvalidTypeError, UnknownScopeKeyError

__all__ = ["Kind", "Scope", "Block", "ScoreBreakdown", "Hit", "SearchResult", "Stats", "scope_key", "scope_from_key",
           "DEFAULT_TENANT"]

# The tenant of a deployment's home memory (`--db`): the one a bot runs on (server/tenants.py).
DEFAULT_TENANT = "default"


class Kind(str, Enum):  # noqa: UP042 - StrEnum would change str() and format() of the members
    TURN = "turn"
    FACT = "fact"
    NOTE = "note"
    SUMMARY = "summary"


SCOPE_KEYS = ("guild", "channel", "user")
MAX_SCOPE_CHARS = 200  # a guild, channel or user id (as the REST API's scope fields)


def _scope_value(key: str, value: str) -> str:
    """A scope id as stored and searched by: at most `MAX_SCOPE_CHARS`, no NUL or other control
    character, valid Unicode (a lone surrogate cannot be stored as UTF-8: it failed the write)."""
    if len(value) > MAX_SCOPE_CHARS:
        raise InvalidInputError(f"scope {key} has {len(value):,} characters; the limit is {MAX_SCOPE_CHARS}")
    if any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise InvalidInputError(f"scope {key} {value[:40]!r} holds a control character or a lone surrogate")
    return value


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a block belongs. An empty field means "any" in a search filter."""

    guild: str | None = None
    channel: str | None = None
    user: str | None = None

    @classmethod
    def of(cls, value: Scope | Mapping[str, Any] | None) -> Scope:
        """Accept a Scope, a mapping with guild/channel/user keys, or None."""
        if value is None:
            return cls()
        if isinstance(value, Scope):
            return value
        if not isinstance(value, Mapping):
            raise InvalidTypeError(f"scope must be a Scope or a mapping, not {type(value).__name__}")
        unknown = sorted(set(value) - set(SCOPE_KEYS))
        if unknown:
            raise UnknownScopeKeyError(
                f"unknown scope key(s) {', '.join(map(repr, unknown))}; allowed: guild, channel, user"
            )
        parts: dict[str, str | None] = {}
        for key in SCOPE_KEYS:
            item = value.get(key)
            if item is None or item == "":
                parts[key] = None
            elif isinstance(item, (str, int)) and not isinstance(item, bool):
                parts[key] = _scope_value(key, str(item))
            else:
                raise InvalidTypeError(f"scope {key} must be a string or int, not {type(item).__name__}")
        return cls(**parts)

    def is_empty(self) -> bool:
        return self.guild is None and self.channel is None and self.user is None

    def as_dict(self) -> dict[str, str | None]:
        return {"guild": self.guild, "channel": self.channel, "user": self.user}

    def label(self) -> str:
        """Human-readable: "guild=g1 channel=general", or "(global)"."""
        parts = [f"{name}={value}" for name, value in (("guild", self.guild), ("channel", self.channel),
                                                         ("user", self.user)) if value is not None]
        return " ".join(parts) or "(global)"


def scope_key(scope: Scope) -> str:
    """A scope as one stable string: working memory, STM, the cache and the conversation tables
    key their rows by it."""
    return json.dumps([scope.guild, scope.channel, scope.user], ensure_ascii=False, separators=(",", ":"))


def scope_from_key(key: str) -> Scope:
    guild, channel, user = json.loads(key)
    return Scope(guild, channel, user)


@dataclass(frozen=True, slots=True)
class Block:
    """One long-term record as stored. Forgotten blocks keep only their header and digest."""

    block_index: int
    kind: str
    text: str
    scope: Scope
    speaker: str | None
    event_time: float
    insert_time: float
    importance: float
    keywords: tuple[str, ...]
    tags: tuple[str, ...]
    metadata: dict[str, Any]
    conv_pos: int | None
    content_digest: str
    prev_hash: str
    hash: str
    forgotten: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "block_index": self.block_index,
            "kind": self.kind,
            "text": self.text,
            "scope": self.scope.as_dict(),
            "speaker": self.speaker,
            "event_time": self.event_time,
            "insert_time": self.insert_time,
            "importance": self.importance,
            "keywords": list(self.keywords),
            "tags": list(self.tags),
            "metadata": self.metadata,
            "conv_pos": self.conv_pos,
            "content_digest": self.content_digest,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
            "forgotten": self.forgotten,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Block:
        """The block `as_dict` gave (a server's JSON answer, an export line): `from_dict(b.as_dict()) == b`.
        Fields are converted, not validated: checking a chain is `verify`'s work, not a parser's."""
        conv_pos = data.get("conv_pos")
        return cls(
            block_index=int(data["block_index"]), kind=str(data["kind"]), text=str(data["text"]),
            scope=Scope.of(data.get("scope")), speaker=data.get("speaker"), event_time=float(data["event_time"]),
            insert_time=float(data["insert_time"]), importance=float(data["importance"]),
            keywords=tuple(data.get("keywords") or ()), tags=tuple(data.get("tags") or ()),
            metadata=dict(data.get("metadata") or {}), conv_pos=None if conv_pos is None else int(conv_pos),
            content_digest=str(data["content_digest"]), prev_hash=str(data["prev_hash"]), hash=str(data["hash"]),
            forgotten=bool(data.get("forgotten", False)),
        )


@dataclass(slots=True)
class ScoreBreakdown:
    """Why a hit ranked where it did. Scores are 0 where a signal did not find the block."""

    bm25: float = 0.0
    bm25_rank: int | None = None
    vector: float = 0.0
    vector_rank: int | None = None
    fused: float = 0.0
    neighbour: float = 0.0
    recency: float = 0.0
    importance: float = 0.0
    final: float = 0.0
    learned: float | None = None  # the learned ranker's raw score, when it ranked
    parts: Mapping[str, float] | None = None  # each ranking feature's contribution to `learned`

    def as_dict(self) -> dict[str, Any]:
        return scores_as_sent([(0.0, self)])[0][1]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScoreBreakdown:
        """The breakdown `as_dict` gave (scores rounded to 6 places, as sent)."""
        learned = data.get("learned")
        parts = data.get("parts")
        return cls(bm25=float(data.get("bm25", 0.0)), bm25_rank=_optional_int(data.get("bm25_rank")),
                   vector=float(data.get("vector", 0.0)), vector_rank=_optional_int(data.get("vector_rank")),
                   fused=float(data.get("fused", 0.0)), neighbour=float(data.get("neighbour", 0.0)),
                   recency=float(data.get("recency", 0.0)), importance=float(data.get("importance", 0.0)),
                   final=float(data.get("final", 0.0)), learned=None if learned is None else float(learned),
                   parts=None if parts is None else {str(k): float(v) for k, v in parts.items()})


SCORE_DIGITS = 6  # the places a score is sent with (as_dict): enough to rank by, a third of a float's repr


def _hit_dicts(hits: list[Hit]) -> list[dict[str, Any]]:
    return [{"score": score, "breakdown": breakdown, "block": hit.block.as_dict()}
            for hit, (score, breakdown) in zip(hits, scores_as_sent([(hit.score, hit.breakdown) for hit in hits]))]


def scores_as_sent(scored: list[tuple[float, ScoreBreakdown]]) -> list[tuple[float, dict[str, Any]]]:
    """Each (score, breakdown) as sent: the score and the breakdown's dict, every float rounded to
    SCORE_DIGITS places. All of them are rounded in one numpy call: Python's `round(x, 6)` costs
    ~0.4 µs a value, and a search answer of 100 hits holds ~2,000 (2 ms of a ~9 ms call over HTTP).
    numpy rounds x·10⁶ to an integer and divides: the same float as `round` but where x·10⁶ falls
    within a rounding error of a half (a last-place difference in a score's sixth decimal)."""
    flat: list[float] = []
    parts: list[list[str]] = []
    for score, b in scored:
        flat += (score, b.bm25, b.vector, b.fused, b.neighbour, b.recency, b.importance, b.final,
                 0.0 if b.learned is None else b.learned)
        names: list[str] = []
        if b.learned is not None and b.parts:
            names = list(b.parts.keys())
            flat += b.parts.values()
        parts.append(names)
    values: list[float] = np.round(np.asarray(flat, dtype=np.float64), SCORE_DIGITS).tolist()
    out: list[tuple[float, dict[str, Any]]] = []
    at = 0
    for (_, b), names in zip(scored, parts):
        v = values[at : at + 9 + len(names)]
        at += len(v)
        breakdown: dict[str, Any] = {"bm25": v[1], "bm25_rank": b.bm25_rank, "vector": v[2],
                                     "vector_rank": b.vector_rank, "fused": v[3], "neighbour": v[4],
                                     "recency": v[5], "importance": v[6], "final": v[7]}
        if b.learned is not None:
            breakdown["learned"] = v[8]
            breakdown["parts"] = dict(zip(names, v[9:]))
        out.append((v[0], breakdown))
    return out


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(slots=True)
class Hit:
    block: Block
    score: float
    breakdown: ScoreBreakdown

    def as_dict(self) -> dict[str, Any]:
        return _hit_dicts([self])[0]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hit:
        return cls(block=Block.from_dict(data["block"]), score=float(data["score"]),
                   breakdown=ScoreBreakdown.from_dict(data.get("breakdown") or {}))


@dataclass(slots=True)
class SearchResult:
    """Hits plus where the answer came from and how long it took."""

    query: str
    hits: list[Hit]
    source: str = "full"  # the layer that answered: working_memory | cache | checkpoint | full
    search_time_ms: float = 0.0
    embed_time_ms: float = 0.0
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def result_count(self) -> int:
        return len(self.hits)

    def as_dict(self) -> dict[str, Any]:
        return {"query": self.query, "source": self.source, "search_time_ms": round(self.search_time_ms, 3),
                "embed_time_ms": round(self.embed_time_ms, 3), "result_count": self.result_count,
                "timings_ms": {name: round(ms, 3) for name, ms in self.timings_ms.items()},
                "hits": _hit_dicts(self.hits)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchResult:
        """The result `as_dict` gave; `result_count` is derived from the hits, so it is not read."""
        return cls(query=str(data["query"]), hits=[Hit.from_dict(hit) for hit in data.get("hits") or ()],
                   source=str(data.get("source", "full")), search_time_ms=float(data.get("search_time_ms", 0.0)),
                   embed_time_ms=float(data.get("embed_time_ms", 0.0)),
                   timings_ms={str(k): float(v) for k, v in (data.get("timings_ms") or {}).items()})

    def __iter__(self):  # iterate hits directly: `for hit in memory.search(...)`
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)


@dataclass(slots=True)
class Stats:
    path: str
    blocks: int
    live_blocks: int
    forgotten_blocks: int
    by_kind: dict[str, int]
    channels: int
    embedder: str
    dimension: int
    vector_index: str
    schema_version: int
    file_bytes: int
    # how the vectors held were made from turns ("" before any), and how new ones are made under the
    # current settings: when they differ, `gieok reindex` makes them all one kind (retrieval/passages.py)
    passages: str = ""
    passages_configured: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}
