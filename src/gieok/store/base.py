"""The Store port: every persistent operation of the engine goes through it, so a backend
(SQLite, PostgreSQL + pgvector) can be swapped without touching the engine (`memory.py`,
`retrieval/`, `index/`, `layers/`).

Split by area, as graphiti's driver operations are: `BlockStore` (the hash-chained blocks, their
vectors and BM25 tokens; below) is implemented by each backend in its own module, because that is
where backends differ; `LayerStore` (`layer_tables.py`), `ConversationStore` (`conversation.py`)
and `KeyStore` (`keys.py`) are plain rows whose portable SQL is written once. A `Store` is all
four: the block operations directly and the others as `store.layers`, `store.conversation` and
`store.keys`. `tests/test_store_contract.py` runs the same behaviour checks against every backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..chain import GENESIS, digest_of, hash_of
from ..types import Block, Scope
from .conversation import AppendHook, ConversationStore
from .idempotency import IdempotencyStore
from .keys import KeyStore
from .layer_tables import LayerStore
from .leases import LeaseStore
from .relay import EventRelayStore
from .sequences import EventSequenceStore
from .sessions import SessionStore
from .webhooks import WebhookStore

__all__ = ["Store", "BlockStore", "VectorSearchStore", "NewBlock", "IndexRows", "BM25Filter", "VerifyReport",
           "verify_chain", "AppendHook", "TOKENIZER_KEY", "PROMOTED_NOTES_SQL", "promoted_from_any", "stored_list",
           "stored_object"]

TOKENIZER_KEY = "tokenizer"  # the meta key of what made the stored BM25 tokens (`Tokenizer.version`)


@dataclass(slots=True)
class NewBlock:
    """A block before the store has given it an index, a position and a hash."""

    kind: str
    text: str
    scope: Scope
    speaker: str | None
    event_time: float
    importance: float
    keywords: list[str]
    tags: list[str]
    metadata: dict[str, Any]
    tokens: list[str]


@dataclass(slots=True)
class IndexRows:
    """Column arrays the in-memory catalog and vector index are built from."""

    block_index: np.ndarray  # int64
    kind: list[str]
    guild: list[str | None]
    channel: list[str | None]
    user: list[str | None]
    speaker: list[str | None]
    event_time: np.ndarray  # float64
    importance: np.ndarray  # float32
    conv_pos: np.ndarray  # int64, -1 where none
    alive: np.ndarray  # bool
    vectors: np.ndarray  # float32 (n, dim); zeros for forgotten blocks

    def __len__(self) -> int:
        return int(self.block_index.shape[0])


@dataclass(slots=True)
class BM25Filter:
    scope: Scope = field(default_factory=Scope)
    kinds: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None


@dataclass(slots=True)
class VerifyReport:
    ok: bool
    checked: int
    forgotten: int
    first_bad_index: int | None = None
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "forgotten": self.forgotten,
            "first_bad_index": self.first_bad_index,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VerifyReport:
        """The report `as_dict` gave (a server's `GET /v1/verify`)."""
        bad = data.get("first_bad_index")
        return cls(ok=bool(data["ok"]), checked=int(data["checked"]), forgotten=int(data["forgotten"]),
                   first_bad_index=None if bad is None else int(bad), reason=str(data.get("reason") or ""))


def verify_chain(blocks: Iterable[Block]) -> VerifyReport:
    """Walk blocks in index order: no gaps, each links to the one before, each live block's
    content matches its digest and every header matches its hash (backends share this walk)."""
    prev = GENESIS
    checked = forgotten = 0
    expected_index = 1
    for block in blocks:
        checked += 1
        if block.block_index != expected_index:
            return VerifyReport(False, checked, forgotten, block.block_index, f"gap: expected index {expected_index}")
        if block.prev_hash != prev:
            return VerifyReport(False, checked, forgotten, block.block_index,
                                "prev_hash does not match the previous block")
        if block.forgotten:
            forgotten += 1
        elif digest_of(block) != block.content_digest:
            return VerifyReport(False, checked, forgotten, block.block_index, "content does not match its digest")
        if hash_of(block) != block.hash:
            return VerifyReport(False, checked, forgotten, block.block_index, "hash does not match header and digest")
        prev = block.hash
        expected_index += 1
    return VerifyReport(True, checked, forgotten)


# The live notes that may copy a block (`BlockStore.notes_promoted_from`): read with their metadata,
# which says which block each was promoted from (`memory/layered.py`, `promoted_from.source_block`).
PROMOTED_NOTES_SQL = ("SELECT block_index, metadata FROM blocks WHERE kind = 'note' AND forgotten_at IS NULL "
                      "AND metadata LIKE '%\"source_block\"%'")


def stored_list(raw: Any) -> tuple[Any, ...]:
    """A block's JSON list column (keywords, tags) as stored; a damaged one (not JSON, not a list)
    reads as empty: a stored value must not fail a read, and `verify` finds the block (its content
    digest no longer matches)."""
    if raw == "[]":  # most blocks have no tags: a search reads a hundred rows, three JSON columns each
        return ()
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return ()
    return tuple(value) if isinstance(value, list) else ()


def stored_object(raw: Any) -> dict[str, Any]:
    """A block's metadata as stored; a damaged one reads as {} (`stored_list`)."""
    if raw == "{}":
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def promoted_from_any(rows: Iterable[tuple[Any, Any]], blocks: Iterable[int]) -> list[int]:
    """Of `PROMOTED_NOTES_SQL`'s rows, the notes promoted from one of `blocks` (a metadata that does
    not parse names none: a stored value must not fail an erasure)."""
    wanted = set(blocks)
    found = []
    for index, metadata in rows:
        try:
            data = json.loads(metadata)
        except (TypeError, ValueError):
            continue
        promoted = data.get("promoted_from") if isinstance(data, dict) else None
        if isinstance(promoted, dict) and promoted.get("source_block") in wanted:
            found.append(int(index))
    return found


class BlockStore(Protocol):
    """The hash-chained long-term blocks with their vectors and BM25 tokens, and the store's
    key/value metadata. Every write is one transaction; `append` gives consecutive indices and
    links each block to the one before even when several processes append at once."""

    path: str  # where it lives: a file path, or a database URL without its password

    def close(self) -> None: ...

    # metadata (schema version, embedder name and dimension)
    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, items: dict[str, str]) -> None: ...

    def schema_version(self) -> int: ...

    def size_bytes(self) -> int: ...

    # writes: each call is one transaction
    def append(self, blocks: Sequence[NewBlock], vectors: np.ndarray, insert_time: float,
               within: AppendHook | None = None) -> list[Block]: ...

    def append_exact(self, blocks: Sequence[Block], tokens: Sequence[list[str]], vectors: np.ndarray) -> None: ...

    def forget(self, block_indices: Sequence[int], when: float) -> list[int]: ...

    def reembed(self, block_indices: Sequence[int], vectors: np.ndarray, meta: dict[str, str]) -> None: ...

    def replace_vectors(self, block_indices: Sequence[int], vectors: np.ndarray) -> None:
        """New vectors for some live blocks, in one transaction (a turn whose passage held an erased
        neighbour's words is embedded again without them), logged in order for `replaced_vectors`."""
        ...

    def replaced_vectors(self, after: int, dimension: int) -> tuple[int, dict[int, np.ndarray]]:
        """The blocks `replace_vectors` gave new vectors after its change `after` (0: ever), with
        their vectors as stored now, and the last change's id: what a process holding vectors in
        memory has not taken yet, when another process of the memory made the change."""
        ...

    def vector_index_deferred(self) -> AbstractContextManager[None]:
        """Around a bulk load: a vector index the store keeps is built once after it, not row by
        row (PostgreSQL's HNSW graph); a no-op where the process builds its own (SQLite)."""
        ...

    def replace_tokens(self, tokens: Mapping[int, Sequence[str]], version: str) -> bool: ...

    # reads
    def get_many(self, block_indices: Sequence[int]) -> dict[int, Block]: ...

    def list_blocks(self, filt: BM25Filter, *, before: int | None, limit: int) -> list[Block]: ...

    def iter_blocks(self, batch: int = 1000, after: int = 0) -> Iterator[Block]: ...

    def bm25(self, tokens: Sequence[str], filt: BM25Filter, limit: int) -> list[tuple[int, float]]: ...

    def load_index_rows(self, after_block_index: int, dimension: int) -> IndexRows: ...

    def load_tokens(self, after_block_index: int) -> list[tuple[int, str]]: ...

    def live_blocks_of_user(self, user_id: str) -> list[int]: ...

    def notes_promoted_from(self, block_indices: Sequence[int]) -> list[int]:
        """The live notes promoted from these blocks (working memory's copy of a turn it let go):
        what an erasure of the blocks takes along."""
        ...

    def orphan_fact_blocks(self) -> list[int]: ...

    def forgotten_indices(self) -> set[int]: ...

    def last_block_index(self) -> int: ...

    def counts(self) -> dict[str, Any]: ...

    def change_token(self) -> int: ...

    def verify(self) -> VerifyReport: ...


class Store(BlockStore, Protocol):
    """A whole backend: the block operations, plus the other areas' ports."""

    layers: LayerStore
    conversation: ConversationStore
    keys: KeyStore
    leases: LeaseStore
    idempotency: IdempotencyStore
    event_sequences: EventSequenceStore
    event_relay: EventRelayStore
    sessions: SessionStore
    webhooks: WebhookStore


@runtime_checkable
class VectorSearchStore(Protocol):
    """A store that searches vectors itself (PostgreSQL: pgvector HNSW), so no process has to
    build or keep a graph of its own. Scores are cosine similarities (rows are normalised)."""

    def vector_search(self, query: np.ndarray, k: int, allowed: bytes | None,
                      max_block_index: int) -> tuple[np.ndarray, np.ndarray]: ...
