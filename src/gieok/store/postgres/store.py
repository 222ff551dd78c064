"""PostgreSQL backend: blocks, pgvector vectors and BM25 postings in one schema of a database that
several processes (`gieok serve` workers, bot shards) share.

**One chain, several writers.** Every append takes `pg_advisory_xact_lock` on a key derived from
the schema before it reads the last block, and holds it until its transaction commits. Appends
are therefore serialised across processes and connections — each sees the previous append's
last index, hash and conversation positions, so the chain has no gaps, no forks and no duplicate
positions — while reads and every other table go on unlocked (an advisory lock blocks nothing
but other appends; a table lock would block readers). The lock is per schema, so tenants (one
schema each) append in parallel. One chain per memory is what SQLite gives too, so `verify`,
export and import mean the same on both.

**Caches that cannot go stale.** The `changes` counter is bumped in the same transaction as every
change to the blocks; `change_token` reads it (one indexed row), and the engine compares it
before every search and write, catching up from the tables when another process wrote. The
expensive shared structure — the HNSW graph — lives here, in pgvector, not in each process.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg

from ...chain import GENESIS
from ...errors import CorruptDatabaseError, StoreError
from ...types import Block, Scope
from ...validate import check_batch
from ..base import (
    PROMOTED_NOTES_SQL,
    TOKENIZER_KEY,
    AppendHook,
    BM25Filter,
    IndexRows,
    NewBlock,
    VerifyReport,
    promoted_from_any,
    stored_list,
    stored_object,
    verify_chain,
)
from ..conversation import ConversationStore, ConversationTables
from ..idempotency import IdempotencyStore, IdempotencyTable
from ..keys import KeyStore, KeyTable
from ..layer_tables import LayerStore, LayerTables, slots_follow_vectors
from ..leases import LeaseStore, LeaseTable
from ..linking import link_blocks
from ..relay import EventRelayStore, EventRelayTable
from ..sequences import EventSequenceStore, EventSequenceTable
from ..sessions import SessionStore, SessionTable
from ..sql import SqlWriter
from ..urls import display_url, split_url
from ..webhooks import WebhookStore, WebhookTable
from .bm25 import bm25_query
from .filters import filter_sql
from .migrate import migrate
from .packs import PACK_EVERY, drop_packs, lock_packs, pack_tail, repack_terms
from .search_index import PostgresSearchIndex
from .session import PgSession, translate
from .vectors import hnsw_index_sql, vector_search_sql

__all__ = ["PostgresStore"]

_BLOCK_COLUMNS = (
    "block_index, kind, guild, channel, user_id, speaker, text, event_time, insert_time, importance, "
    "keywords, tags, metadata, conv_pos, content_digest, prev_hash, hash, forgotten_at"
)


def _row_to_block(row: Sequence[Any]) -> Block:
    (index, kind, guild, channel, user, speaker, text, event_time, insert_time, importance,
     keywords, tags, metadata, conv_pos, digest, prev_hash, hash_, forgotten_at) = row
    return Block(block_index=int(index), kind=kind, text=text, scope=Scope(guild, channel, user), speaker=speaker,
                 event_time=event_time, insert_time=insert_time, importance=importance,
                 keywords=stored_list(keywords), tags=stored_list(tags), metadata=stored_object(metadata),
                 conv_pos=conv_pos, content_digest=digest, prev_hash=prev_hash, hash=hash_,
                 forgotten=forgotten_at is not None)


_INSERT_POSTINGS = "INSERT INTO postings(term, block_index, tf, length) VALUES (?, ?, ?, ?)"
# the server's clock, for what several processes compare (leases): theirs may disagree by seconds
SERVER_CLOCK_SQL = "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"


def _postings(block_index: int, tokens: Sequence[str]) -> list[tuple[str, int, int, int]]:
    """A block's `postings` rows: each distinct term with its frequency and the block's token count."""
    return [(term, block_index, tf, len(tokens)) for term, tf in Counter(tokens).items()]


def _block_params(block: Block, forgotten_at: float | None = None) -> tuple[Any, ...]:
    return (block.block_index, block.kind, block.scope.guild, block.scope.channel, block.scope.user, block.speaker,
            block.text, block.event_time, block.insert_time, block.importance,
            json.dumps(list(block.keywords), ensure_ascii=False), json.dumps(list(block.tags), ensure_ascii=False),
            json.dumps(block.metadata, ensure_ascii=False), block.conv_pos, block.content_digest, block.prev_hash,
            block.hash, forgotten_at)


def _lock_key(schema: str) -> int:
    """The advisory-lock key of one schema's chain (a signed 64-bit int, as PostgreSQL wants)."""
    return int.from_bytes(hashlib.blake2b(f"gieok.append.{schema}".encode(), digest_size=8).digest(), "big",
                          signed=True)


# The vectors' dimension (0 or less: not typed yet, no graph possible) and the graph, if any.
_VECTOR_INDEX_STATE = ("SELECT a.atttypmod, i.indexname FROM pg_attribute a LEFT JOIN pg_indexes i "
                       "ON i.schemaname = current_schema() AND i.indexname = 'embeddings_hnsw' "
                       "WHERE a.attrelid = 'embeddings'::regclass AND a.attname = 'vector'")


def _missing_index(rows: Sequence[Sequence[Any]]) -> bool:
    return bool(rows) and int(rows[0][0]) > 0 and rows[0][1] is None


def _vector(value: Any, dimension: int, block_index: int) -> np.ndarray:
    """A pgvector value as read (numpy already, or a `Vector`), checked against the index's dimension."""
    vector = np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)
    if vector.shape[0] != dimension:
        raise CorruptDatabaseError(
            f"block {block_index} has a {vector.shape[0]}-d vector; the index expects {dimension}")
    return vector

class PostgresStore:
    """A `Store` in one schema (`?schema=name` in the URL, default `gieok`) of a PostgreSQL
    database with pgvector. See the module docstring for how several processes share it."""

    def __init__(self, url: str, *, busy_timeout_ms: int = 10_000, hnsw_m: int = 32, hnsw_ef_construction: int = 120,
                 hnsw_ef_search: int = 96, pool_size: int = 8) -> None:
        conninfo, self.schema = split_url(url)
        self.path = display_url(url)
        timeout_s = max(1.0, busy_timeout_ms / 1000)
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=int(timeout_s)) as conn:
                extension_schema = migrate(conn, self.schema, self.path)
        except psycopg.Error as exc:
            raise translate(exc, self.path) from None
        self.db = PgSession(conninfo, self.schema, extension_schema, where=self.path, timeout_s=timeout_s,
                            ef_search=hnsw_ef_search, max_size=pool_size)
        self._append_lock = _lock_key(self.schema)
        self._hnsw = (int(hnsw_m), int(hnsw_ef_construction))
        self._loads_deferring_graph = 0  # bulk loads under way in this process (vector_index_deferred)
        self._search_sql = {filtered: vector_search_sql("embeddings", filtered=filtered) for filtered in (False, True)}
        self.layers: LayerStore = LayerTables(self.db)
        self.conversation: ConversationStore = ConversationTables(self.db, "postgres")
        self.keys: KeyStore = KeyTable(self.db)
        self.leases: LeaseStore = LeaseTable(self.db, server_clock=SERVER_CLOCK_SQL)
        self.idempotency: IdempotencyStore = IdempotencyTable(self.db)
        self.event_sequences: EventSequenceStore = EventSequenceTable(self.db)
        self.event_relay: EventRelayStore = EventRelayTable(self.db)
        self.sessions: SessionStore = SessionTable(self.db)
        self.webhooks: WebhookStore = WebhookTable(self.db, "postgres")
        self._vector_index_present()  # a bulk load that died before rebuilding it left none

    # -- lifecycle and SqlSession ---------------------------------------------------------------
    def close(self) -> None:
        self.db.close()

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.fetch(sql, params)

    def transaction(self) -> Any:
        return self.db.transaction()

    # -- metadata -------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self.db.fetch("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, items: dict[str, str]) -> None:
        """Record metadata. Recording the `dimension` types the vector column and builds its HNSW
        index (the column is empty then, or holds vectors of that dimension)."""
        with self.db.transaction() as tx:
            tx.executemany("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                           "SET value = excluded.value", list(items.items()))
            if "dimension" in items:
                self._type_vectors(tx, int(items["dimension"]))

    def _type_vectors(self, tx: SqlWriter, dimension: int) -> None:
        current = tx.execute("SELECT atttypmod FROM pg_attribute WHERE attrelid = 'embeddings'::regclass "
                             "AND attname = 'vector'").fetchone()
        if current is not None and int(current[0]) == dimension:
            return
        tx.execute("DROP INDEX IF EXISTS embeddings_hnsw")
        tx.execute(f"ALTER TABLE embeddings ALTER COLUMN vector TYPE vector({int(dimension)})")
        if not self._loads_deferring_graph:  # a fresh memory typed by a bulk load's first write: built after it
            tx.execute(hnsw_index_sql("embeddings_hnsw", "embeddings", *self._hnsw))

    @contextmanager
    def vector_index_deferred(self) -> Iterator[None]:
        """A bulk load without the HNSW graph: it is dropped, the rows go in, and it is built once
        over all of them. Inserting a vector into the graph cost ~9 ms here (m 32, ef_construction
        120); building the graph over loaded rows ~0.6 ms a vector at 1M (docs/architecture.md).
        Searches meanwhile are exact scans. If the process dies first, the next open rebuilds it;
        a process that opens the schema during the load builds it too (then the rest of the load
        goes in row by row: slower, still correct)."""
        with self.db.transaction() as tx:
            tx.execute("DROP INDEX IF EXISTS embeddings_hnsw")
        self._loads_deferring_graph += 1
        try:
            yield
        finally:
            self._loads_deferring_graph -= 1
            if not self._loads_deferring_graph:
                self._vector_index_present()

    def _vector_index_present(self) -> None:
        """Build the HNSW graph if the vectors have a dimension and it is missing (one catalog query
        when it is there; an advisory lock keeps two processes from building it twice)."""
        if not _missing_index(self.db.fetch(_VECTOR_INDEX_STATE)):
            return
        with self.db.transaction() as tx:
            tx.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':hnsw'))")
            if _missing_index(tx.execute(_VECTOR_INDEX_STATE).fetchall()):
                tx.execute(hnsw_index_sql("embeddings_hnsw", "embeddings", *self._hnsw))

    def reset_generated_ids(self) -> None:
        """After rows were copied in with their ids (`gieok migrate`), continue each generated id
        after the highest one (SQLite does this by itself)."""
        with self.db.transaction() as tx:
            for table, column in (("stm_entries", "entry_id"), ("l1_messages", "message_id"),
                                  ("api_keys", "key_id"), ("webhook_endpoints", "endpoint_id"),
                                  ("webhook_deliveries", "delivery_id")):
                tx.execute(f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
                           f"coalesce((SELECT max({column}) FROM {table}), 0) + 1, false)")

    def schema_version(self) -> int:
        return int(self.get_meta("schema_version") or 0)

    def size_bytes(self) -> int:
        """Every table and index of this memory's schema."""
        rows = self.db.fetch("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                             "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND c.relkind = 'r'",
                             (self.schema,))
        return int(rows[0][0])

    # -- writes -----------------------------------------------------------------------------------
    def _lock_chain(self, tx: SqlWriter) -> tuple[int, str]:
        tx.execute("SELECT pg_advisory_xact_lock(?)", (self._append_lock,))
        last = tx.execute("SELECT block_index, hash FROM blocks ORDER BY block_index DESC LIMIT 1").fetchone()
        return (int(last[0]), str(last[1])) if last else (0, GENESIS)

    def append(self, blocks: Sequence[NewBlock], vectors: np.ndarray, insert_time: float,
               within: AppendHook | None = None) -> list[Block]:
        if len(blocks) != len(vectors):
            raise StoreError("append: one vector per block is required")
        with self.db.transaction() as tx:
            index, prev_hash = self._lock_chain(tx)

            def last_position(channel: str) -> int:
                row = tx.execute("SELECT max(conv_pos) FROM blocks WHERE channel = ? AND conv_pos IS NOT NULL",
                                 (channel,)).fetchone()
                return int(row[0] or 0)

            out = link_blocks(blocks, insert_time, index, prev_hash, last_position)
            pack_due = self._insert(tx, out, [list(b.tokens) for b in blocks], vectors, [True] * len(out))
            if within is not None:
                within(tx, out)
        if pack_due:
            self.pack_postings()
        return out

    def append_exact(self, blocks: Sequence[Block], tokens: Sequence[list[str]], vectors: np.ndarray) -> None:
        """Insert blocks that already carry index and hash (import of a full chain)."""
        with self.db.transaction() as tx:
            index, prev_hash = self._lock_chain(tx)
            for block in blocks:
                if block.block_index != index + 1 or block.prev_hash != prev_hash:
                    raise StoreError(f"block {block.block_index} does not continue the chain at {index}")
                index, prev_hash = block.block_index, block.hash
            pack_due = self._insert(tx, list(blocks), list(tokens), vectors, [not b.forgotten for b in blocks])
        if pack_due:
            self.pack_postings()

    def pack_postings(self, minimum: int | None = None) -> int:
        """Pack the BM25 postings of blocks not packed yet, if at least `minimum` (default
        `PACK_EVERY`) of them wait (store/postgres/packs.py); returns how many blocks were packed."""
        minimum = PACK_EVERY if minimum is None else minimum
        row = self.db.fetch("SELECT packed_upto, (SELECT coalesce(max(block_index), 0) FROM blocks) FROM bm25_stats")
        if not row or int(row[0][1]) - int(row[0][0]) < max(1, minimum):
            return 0  # not due: one query, no lock (every database-mode open asks)
        with self.db.transaction() as tx:
            return pack_tail(tx, minimum)

    def _insert(self, tx: SqlWriter, blocks: list[Block], tokens: list[list[str]], vectors: np.ndarray,
                live: list[bool]) -> bool:
        """Write the rows; True when the postings not packed yet reached `PACK_EVERY` blocks."""
        tx.executemany(f"INSERT INTO blocks({_BLOCK_COLUMNS}) VALUES ({', '.join('?' * 18)})",
                       [_block_params(b, None if keep else b.insert_time) for b, keep in zip(blocks, live)])
        kept = [(b, toks, np.asarray(v, dtype=np.float32)) for b, toks, v, keep in zip(blocks, tokens, vectors, live)
                if keep]
        tx.executemany("INSERT INTO embeddings(block_index, vector) VALUES (?, ?)",
                       [(b.block_index, v) for b, _, v in kept])
        tx.executemany("INSERT INTO block_tokens(block_index, tokens, length) VALUES (?, ?, ?)",
                       [(b.block_index, " ".join(toks), len(toks)) for b, toks, _ in kept])
        tx.executemany(_INSERT_POSTINGS, [row for b, toks, _ in kept for row in _postings(b.block_index, toks)])
        row = tx.execute("UPDATE bm25_stats SET documents = documents + ?, total_length = total_length + ? "
                         "RETURNING packed_upto", (len(kept), sum(len(toks) for _, toks, _ in kept))).fetchone()
        tx.execute("UPDATE changes SET counter = counter + 1")
        return bool(blocks) and blocks[-1].block_index - int(row[0] if row else 0) >= PACK_EVERY

    def forget(self, block_indices: Sequence[int], when: float) -> list[int]:
        """Erase content, vector, tokens and postings of live blocks. PostgreSQL keeps the old row
        versions until VACUUM reclaims them; autovacuum does, or run `VACUUM` after a large forget."""
        erased: list[int] = []
        with self.db.transaction() as tx:
            packed_upto = lock_packs(tx)  # the packs of a forgotten block's terms are rebuilt below
            repack: list[str] = []
            for index in dict.fromkeys(int(i) for i in block_indices):
                row = tx.execute("UPDATE blocks SET text = '', speaker = NULL, keywords = '[]', tags = '[]', "
                                 "metadata = '{}', forgotten_at = ? WHERE block_index = ? AND forgotten_at IS NULL "
                                 "RETURNING block_index", (when, index)).fetchone()
                if row is None:
                    continue
                tx.execute("DELETE FROM embeddings WHERE block_index = ?", (index,))
                terms = tx.execute("DELETE FROM postings WHERE block_index = ? RETURNING term", (index,)).fetchall()
                if index <= packed_upto:
                    repack.extend(str(t[0]) for t in terms)
                gone = tx.execute("DELETE FROM block_tokens WHERE block_index = ? RETURNING length",
                                  (index,)).fetchone()
                if gone is not None:
                    tx.execute("UPDATE bm25_stats SET documents = documents - 1, total_length = total_length - ?",
                               (int(gone[0]),))
                erased.append(index)
            repack_terms(tx, repack, packed_upto)
            if erased:
                tx.execute("UPDATE changes SET counter = counter + 1")
        return erased

    def replace_tokens(self, tokens: Mapping[int, Sequence[str]], version: str) -> bool:
        """Re-tokenized live blocks' BM25 tokens, postings and totals and the tokenizer `version`
        that made them, in one transaction — unless `version` is recorded already: then False.
        An advisory lock per schema makes a second process wait, then find it done."""
        with self.db.transaction() as tx:
            tx.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':tokens'))")
            found = tx.execute("SELECT value FROM meta WHERE key = ?", (TOKENIZER_KEY,)).fetchone()
            if found and found[0] == version:
                return False
            delta = 0
            for index, toks in tokens.items():
                old = tx.execute("SELECT length FROM block_tokens WHERE block_index = ?", (int(index),)).fetchone()
                if old is None:  # forgotten meanwhile: it has no tokens to replace
                    continue
                tx.execute("UPDATE block_tokens SET tokens = ?, length = ? WHERE block_index = ?",
                           (" ".join(toks), len(toks), int(index)))
                delta += len(toks) - int(old[0])
                tx.execute("DELETE FROM postings WHERE block_index = ?", (int(index),))
                tx.executemany(_INSERT_POSTINGS, _postings(int(index), toks))
            tx.execute("UPDATE bm25_stats SET total_length = total_length + ?", (delta,))
            if tokens:
                drop_packs(tx)  # packed again from the new rows by the next pack_postings
            tx.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) "
                       "DO UPDATE SET value = excluded.value", (TOKENIZER_KEY, version))
            if tokens:
                tx.execute("UPDATE changes SET counter = counter + 1")
        return True

    def replace_vectors(self, block_indices: Sequence[int], vectors: np.ndarray) -> None:
        with self.db.transaction() as tx:
            # The counter first: its row lock orders these transactions, so the log's ids follow their commits
            tx.execute("UPDATE changes SET counter = counter + 1")
            tx.executemany("UPDATE embeddings SET vector = ? WHERE block_index = ?",
                           [(np.asarray(v, dtype=np.float32), int(i)) for i, v in zip(block_indices, vectors)])
            tx.executemany("INSERT INTO vector_changes(block_index) VALUES (?)", [(int(i),) for i in block_indices])
            slots_follow_vectors(tx, block_indices, vectors)

    def replaced_vectors(self, after: int, dimension: int) -> tuple[int, dict[int, np.ndarray]]:
        with self.db.connection() as conn, conn.cursor(binary=True) as cursor:
            found_last = cursor.execute("SELECT coalesce(max(change_id), 0) FROM vector_changes").fetchone()
            last = int(found_last[0]) if found_last else 0
            rows = cursor.execute(
                "SELECT e.block_index, e.vector FROM embeddings e WHERE e.block_index IN "
                "(SELECT block_index FROM vector_changes WHERE change_id > %s AND change_id <= %s)", (after, last),
            ).fetchall()
        return last, {int(index): _vector(vector, dimension, index) for index, vector in rows}

    def reembed(self, block_indices: Sequence[int], vectors: np.ndarray, meta: dict[str, str]) -> None:
        """Swap every vector and the recorded embedder in one transaction (reindex); the HNSW index
        is rebuilt once, after the rows are in."""
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM embeddings")
            tx.execute("DROP INDEX IF EXISTS embeddings_hnsw")
            if "dimension" in meta:
                tx.execute(f"ALTER TABLE embeddings ALTER COLUMN vector TYPE vector({int(meta['dimension'])})")
            tx.executemany("INSERT INTO embeddings(block_index, vector) VALUES (?, ?)",
                           [(int(i), np.asarray(v, dtype=np.float32)) for i, v in zip(block_indices, vectors)])
            if "dimension" in meta:
                tx.execute(hnsw_index_sql("embeddings_hnsw", "embeddings", *self._hnsw))
            tx.executemany("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                           "SET value = excluded.value", list(meta.items()))
            slots_follow_vectors(tx, block_indices, vectors, every=True)
            tx.execute("UPDATE changes SET counter = counter + 1")

    # -- reads ------------------------------------------------------------------------------------
    def get_many(self, block_indices: Sequence[int]) -> dict[int, Block]:
        if not block_indices:
            return {}
        ids = list(dict.fromkeys(int(i) for i in block_indices))
        rows = self.db.fetch(f"SELECT {_BLOCK_COLUMNS} FROM blocks WHERE block_index = ANY(?)", (ids,))
        return {int(row[0]): _row_to_block(row) for row in rows}

    def list_blocks(self, filt: BM25Filter, *, before: int | None, limit: int) -> list[Block]:
        """Live blocks matching the filter, newest first, with indices below `before` (a cursor)."""
        conditions, params = filter_sql(filt, "")
        conditions.insert(0, "forgotten_at IS NULL")
        if before is not None:
            conditions.append("block_index < ?")
            params.append(before)
        rows = self.db.fetch(f"SELECT {_BLOCK_COLUMNS} FROM blocks WHERE {' AND '.join(conditions)} "
                             "ORDER BY block_index DESC LIMIT ?", [*params, limit])
        return [_row_to_block(row) for row in rows]

    def iter_blocks(self, batch: int = 1000, after: int = 0) -> Iterator[Block]:
        batch = check_batch(batch)
        while True:
            rows = self.db.fetch(f"SELECT {_BLOCK_COLUMNS} FROM blocks WHERE block_index > ? ORDER BY block_index "
                                 "LIMIT ?", (after, batch))
            if not rows:
                return
            for row in rows:
                yield _row_to_block(row)
            after = int(rows[-1][0])

    def bm25(self, tokens: Sequence[str], filt: BM25Filter, limit: int) -> list[tuple[int, float]]:
        """Top `limit` blocks by BM25 over gieok's tokens, with FTS5's formula and constants."""
        terms = list(dict.fromkeys(t for t in tokens if t))
        if not terms or limit <= 0:
            return []
        conditions, params = filter_sql(filt, "b.")
        rows = self.db.fetch(bm25_query(conditions), [terms, *params, limit])
        return [(int(i), float(s)) for i, s in rows]

    def database_index(self, *, ann_threshold: int, cache_size: int) -> PostgresSearchIndex:
        """The search index that answers in SQL (`pg_index = "database"`): nothing loaded per process.
        Postings not packed yet are packed first if enough wait (once after migration 15: ~1 s per
        100k blocks)."""
        self.pack_postings()
        return PostgresSearchIndex(self.db, ann_threshold=ann_threshold, cache_size=cache_size)

    def vector_search(self, query: np.ndarray, k: int, allowed: bytes | None,
                      max_block_index: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (block indices, cosine) from the HNSW index, among blocks whose bit is set in
        `allowed` (bit i of byte i // 8, least significant first) when given, and never past
        `max_block_index` (what the caller's catalog knows). The graph is walked iteratively, so a
        selective filter still yields k rows when that many pass it (`vectors.py`)."""
        params: dict[str, Any] = {"query": np.asarray(query, dtype=np.float32), "last": max_block_index, "k": k}
        if allowed is not None:
            params["allowed"] = allowed
        with self.db.connection() as conn:
            rows = conn.execute(self._search_sql[allowed is not None], params).fetchall()
        rows.sort(key=lambda r: (-float(r[1]), int(r[0])))  # relaxed_order may return near-ties out of order
        return (np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
                np.fromiter((r[1] for r in rows), dtype=np.float32, count=len(rows)))

    def load_index_rows(self, after_block_index: int, dimension: int) -> IndexRows:
        with self.db.connection() as conn, conn.cursor(binary=True) as cursor:
            rows = cursor.execute(
                "SELECT b.block_index, b.kind, b.guild, b.channel, b.user_id, b.event_time, b.importance, "
                "b.conv_pos, b.forgotten_at IS NULL, e.vector, b.speaker FROM blocks b LEFT JOIN embeddings e "
                "ON e.block_index = b.block_index WHERE b.block_index > %s ORDER BY b.block_index",
                (after_block_index,)).fetchall()
        n = len(rows)
        vectors = np.zeros((n, dimension), dtype=np.float32)
        for i, row in enumerate(rows):
            if row[9] is not None:
                vectors[i] = _vector(row[9], dimension, row[0])
        return IndexRows(
            block_index=np.fromiter((r[0] for r in rows), dtype=np.int64, count=n),
            kind=[r[1] for r in rows], guild=[r[2] for r in rows], channel=[r[3] for r in rows],
            user=[r[4] for r in rows], speaker=[r[10] for r in rows],
            event_time=np.fromiter((r[5] for r in rows), dtype=np.float64, count=n),
            importance=np.fromiter((r[6] for r in rows), dtype=np.float32, count=n),
            conv_pos=np.fromiter((r[7] if r[7] is not None else -1 for r in rows), dtype=np.int64, count=n),
            alive=np.fromiter((bool(r[8]) for r in rows), dtype=bool, count=n),
            vectors=vectors,
        )

    def load_tokens(self, after_block_index: int) -> list[tuple[int, str]]:
        """(block_index, space-joined tokens) of live blocks, for the in-memory BM25 index."""
        return [(int(i), str(t)) for i, t in self.db.fetch(
            "SELECT block_index, tokens FROM block_tokens WHERE block_index > ? ORDER BY block_index",
            (after_block_index,))]

    def live_blocks_of_user(self, user_id: str) -> list[int]:
        """The live blocks of a user, any kind: theirs by scope (`user`) or by speaker ("forget me")."""
        return [int(r[0]) for r in self.db.fetch("SELECT block_index FROM blocks WHERE (user_id = ? OR speaker = ?) "
                                                 "AND forgotten_at IS NULL ORDER BY block_index", (user_id, user_id))]

    def notes_promoted_from(self, block_indices: Sequence[int]) -> list[int]:
        return promoted_from_any(self.db.fetch(PROMOTED_NOTES_SQL), block_indices) if block_indices else []

    def orphan_fact_blocks(self) -> list[int]:
        """Fact blocks without their `facts` row: a crash came between the two writes."""
        return [int(r[0]) for r in self.db.fetch(
            "SELECT b.block_index FROM blocks b WHERE b.kind = 'fact' AND b.forgotten_at IS NULL "
            "AND NOT EXISTS (SELECT 1 FROM facts f WHERE f.block_index = b.block_index) "
            "AND b.metadata LIKE '%\"fact_type\"%' ORDER BY b.block_index")]

    def forgotten_indices(self) -> set[int]:
        return {int(r[0]) for r in self.db.fetch("SELECT block_index FROM blocks WHERE forgotten_at IS NOT NULL")}

    def last_block_index(self) -> int:
        return int(self.db.fetch("SELECT coalesce(max(block_index), 0) FROM blocks")[0][0])

    def counts(self) -> dict[str, Any]:
        total, forgotten, channels = self.db.fetch(
            "SELECT count(*), count(forgotten_at), count(DISTINCT channel) FROM blocks")[0]
        by_kind = {str(k): int(n) for k, n in self.db.fetch(
            "SELECT kind, count(*) FROM blocks WHERE forgotten_at IS NULL GROUP BY kind")}
        return {"blocks": int(total), "forgotten": int(forgotten), "by_kind": by_kind, "channels": int(channels)}

    def change_token(self) -> int:
        """Bumped by every transaction that appends, forgets or re-embeds blocks, in any process."""
        return int(self.db.fetch("SELECT counter FROM changes")[0][0])

    def verify(self) -> VerifyReport:
        return verify_chain(self.iter_blocks(batch=2000))
