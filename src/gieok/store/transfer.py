"""Copy a whole memory from one store to another (`gieok migrate`: SQLite ⇄ PostgreSQL).

The blocks go over exactly as an import of an export keeps them (`append_exact`: the same
indices, hashes and tombstones, so the chain verifies identically on both sides), with their
stored vectors and tokens (nothing is re-embedded); then every other table — working memory,
checkpoints, STM, the conversation tables and the API keys — row by row. The target must hold
no blocks. Each chunk is one transaction on the target; a crash leaves a prefix of the chain,
which `verify` accepts and a second run refuses (the target is not empty): start again on an
empty target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import InvalidInputError
from ..types import Block
from .base import TOKENIZER_KEY, IndexRows, Store, VerifyReport
from .sql import SqlSession

__all__ = ["copy_store", "TransferReport", "TABLES", "NOT_COPIED"]

CHUNK = 500

# Every table besides the blocks' own, with its columns (the same on every SQL backend).
TABLES: dict[str, tuple[str, ...]] = {
    "wm_slots": ("scope_key", "slot_id", "context", "content", "metadata", "embedding", "importance", "usage_count",
                 "created_at", "last_access", "block_index", "context_hash"),
    "wm_checkpoints": ("scope_key", "slot_id", "block_index", "relevance", "distance", "created_at",
                       "last_accessed"),
    "stm_entries": ("entry_id", "scope_key", "text", "metadata", "importance", "created_at", "expires_at",
                    "block_index"),
    "l1_messages": ("message_id", "scope_key", "role", "content", "user_id", "display_name", "created_at",
                    "addressed", "flagged", "external_id", "block_index", "handled_at", "handled_by"),
    "channel_fences": ("scope_key", "token"),
    "summaries": ("scope_key", "data", "updated_at"),
    "facts": ("block_index", "fact_type", "topic", "guild", "user_id", "source_message", "valid_from", "valid_to",
              "superseded_by", "lore_key", "recorded_at", "expired_at"),
    "fact_sources": ("block_index", "said_at", "message_id", "scope_key", "external_id", "user_id", "recorded_at",
                     "author"),
    "user_names": ("user_id", "name", "first_seen", "last_seen"),
    "erasures": ("user_id", "started_at", "reason"),  # an erasure a crash interrupted finishes on the target
    "model_usage": ("scope", "day", "tokens", "calls"),
    "channel_state": ("scope_key", "since_analysis", "last_message_id", "updated_at"),
    "active_channels": ("scope_key", "activated_at", "activated_by"),
    "api_keys": ("key_id", "prefix", "key_hash", "tenant", "role", "name", "created_at", "revoked_at",
                 "last_used_at"),
    "message_ids": ("scope_key", "external_id", "message_id", "created_at", "block_index", "deleted_at"),
    "idempotency_keys": ("idem_key", "fingerprint", "status", "response", "holder", "created_at", "written"),
    "idempotency_blocks": ("block_index", "idem_key"),
    "event_sequences": ("tenant", "next_seq"),
    "dashboard_sessions": ("session_hash", "key_id", "created_at", "last_seen_at"),
    "webhook_endpoints": ("endpoint_id", "tenant", "url", "events", "secret", "previous_secret", "previous_until",
                          "created_at", "disabled_at", "disabled_reason", "failures", "resting_until"),
    "webhook_deliveries": ("delivery_id", "endpoint_id", "event_id", "event_type", "body", "status", "attempts",
                           "created_at", "next_try_at", "last_try_at", "last_status", "last_error", "delivered_at",
                           "claimed_by", "claimed_until", "marks"),
}
# Tables not copied, and why (tests/test_postgres.py holds every table of the schema to one list or the other).
NOT_COPIED: dict[str, str] = {
    "blocks": "copied block by block through the store's append (the chain re-verified)",
    "embeddings": "copied with their blocks",
    "meta": "the target keeps its own schema version and creation time; the rest is copied",
    "leases": "held by running processes, which a migration stops",
    "event_relay": "events of the last day for running servers to stream (a migration stops them)",
    "changes": "SQLite's change counter for other processes' caches",
    "vector_changes": "which vectors were replaced, for processes holding them in memory; the copy carries the "
                      "vectors as they are now",
    # each backend's own word index, built from the blocks as they are appended
    "blocks_fts": "SQLite's FTS5 index", "block_tokens": "PostgreSQL's BM25 tokens",
    "postings": "PostgreSQL's BM25 postings", "postings_with_length": "PostgreSQL's BM25 postings",
    "posting_packs": "PostgreSQL's BM25 postings", "bm25_stats": "PostgreSQL's BM25 statistics",
}
_NOT_COPIED_META = {"schema_version", "created_at"}


@runtime_checkable
class _GeneratedIds(Protocol):
    def reset_generated_ids(self) -> None: ...


@dataclass(frozen=True)
class TransferReport:
    blocks: int
    rows: dict[str, int]
    source: VerifyReport
    target: VerifyReport

    def as_dict(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "rows": self.rows, "source": self.source.as_dict(),
                "target": self.target.as_dict()}


def copy_store(source: Store, target: Store, *, progress: Callable[[int], None] | None = None) -> TransferReport:
    """Copy everything in `source` into the empty `target`; returns counts and both chains' checks."""
    if target.last_block_index() != 0:
        raise InvalidInputError(f"{target.path} already holds blocks: migrate into an empty memory")
    if not isinstance(source, SqlSession) or not isinstance(target, SqlSession):
        raise InvalidInputError("both stores must be SQL stores")
    meta = {str(k): str(v) for k, v in source.fetch("SELECT key, value FROM meta") if k not in _NOT_COPIED_META}
    meta.setdefault(TOKENIZER_KEY, "")  # tokens copied as they are: made by what made the source's, maybe unknown
    dimension = meta.pop("dimension", None)
    target.set_meta(meta)  # the vector index is built after the rows are in (faster than row by row)
    blocks = _copy_blocks(source, target, int(dimension) if dimension else None, progress)
    if dimension:
        target.set_meta({"dimension": dimension})
    rows = {table: _copy_table(source, target, table, columns) for table, columns in TABLES.items()}
    if isinstance(target, _GeneratedIds):
        target.reset_generated_ids()
    return TransferReport(blocks, rows, source.verify(), target.verify())


def _copy_blocks(source: Store, target: Store, dimension: int | None,
                 progress: Callable[[int], None] | None) -> int:
    tokens = dict(source.load_tokens(0))
    index_rows = source.load_index_rows(0, dimension) if dimension else None
    copied = 0
    chunk: list[Block] = []
    for block in source.iter_blocks(batch=CHUNK):
        chunk.append(block)
        if len(chunk) == CHUNK:
            copied += _append(target, chunk, tokens, index_rows, dimension)
            chunk = []
            if progress:
                progress(CHUNK)
    if chunk:
        copied += _append(target, chunk, tokens, index_rows, dimension)
        if progress:
            progress(len(chunk))
    return copied


def _append(target: Store, chunk: list[Block], tokens: dict[int, str], index_rows: IndexRows | None,
            dimension: int | None) -> int:
    if index_rows is not None:
        rows = np.searchsorted(index_rows.block_index, [b.block_index for b in chunk])
        chunk_vectors = index_rows.vectors[rows]
    else:  # nothing was ever embedded: no block has a vector
        chunk_vectors = np.zeros((len(chunk), dimension or 1), np.float32)
    target.append_exact(chunk, [tokens.get(b.block_index, "").split() for b in chunk], chunk_vectors)
    return len(chunk)


def _copy_table(source: SqlSession, target: SqlSession, table: str, columns: tuple[str, ...]) -> int:
    rows = source.fetch(f"SELECT {', '.join(columns)} FROM {table}")
    insert = f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    for start in range(0, len(rows), CHUNK):
        with target.transaction() as tx:
            tx.executemany(insert, [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                                    for row in rows[start : start + CHUNK]])
    return len(rows)
