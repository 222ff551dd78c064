"""SQLite backend: one file, WAL, every write one transaction.

The connection is shared by the threads of one process and guarded by a lock;
other processes coordinate through SQLite's own locking (`BEGIN IMMEDIATE` with a
busy timeout), and `change_token` lets the engine notice their changes to the blocks: the
`changes` counter, bumped in the same transaction as every append, forget, re-embedding and
re-tokenizing (the other tables' commits do not count).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...chain import GENESIS
from ...errors import (
    CorruptDatabaseError,
    DatabaseUnavailableError,
    DatabaseUnwritableError,
    MemoryReembeddedError,
    SchemaTooNewError,
    StoreError,
)
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
from ..full import is_storage_full, storage_full_error
from ..idempotency import IdempotencyStore, IdempotencyTable
from ..keys import KeyStore, KeyTable
from ..layer_tables import LayerStore, LayerTables, slots_follow_vectors
from ..leases import LeaseStore, LeaseTable
from ..linking import link_blocks
from ..relay import EventRelayStore, EventRelayTable
from ..sequences import EventSequenceStore, EventSequenceTable
from ..sessions import SessionStore, SessionTable
from ..sql import split_sql
from ..webhooks import WebhookStore, WebhookTable
from .filters import facet_tokens, facets_match, filter_sql, quote, time_sql
from .schema import MIGRATIONS, SCHEMA_VERSION

__all__ = ["SQLiteStore"]

# The channel's last conversation position. `conv_pos IS NOT NULL` lets SQLite use the partial
# index blocks_by_position; without it every append scanned the whole table (18 ms at 100k blocks).
LAST_POSITION_SQL = "SELECT max(conv_pos) FROM blocks WHERE channel = ? AND conv_pos IS NOT NULL"
_CHANGED = "UPDATE changes SET counter = counter + 1"  # in every transaction that changes blocks (change_token)

_BLOCK_COLUMNS = (
    "block_index, kind, guild, channel, user_id, speaker, text, event_time, insert_time, importance, "
    "keywords, tags, metadata, conv_pos, content_digest, prev_hash, hash, forgotten_at"
)


def _row_to_block(row: sqlite3.Row | tuple) -> Block:
    (index, kind, guild, channel, user, speaker, text, event_time, insert_time, importance,
     keywords, tags, metadata, conv_pos, digest, prev_hash, hash_, forgotten_at) = row
    return Block(
        block_index=index,
        kind=kind,
        text=text,
        scope=Scope(guild, channel, user),
        speaker=speaker,
        event_time=event_time,
        insert_time=insert_time,
        importance=importance,
        keywords=stored_list(keywords),
        tags=stored_list(tags),
        metadata=stored_object(metadata),
        conv_pos=conv_pos,
        content_digest=digest,
        prev_hash=prev_hash,
        hash=hash_,
        forgotten=forgotten_at is not None,
    )


class SQLiteStore:
    """The embedded store: blocks, vectors, FTS5 tokens and every layer's tables in one file.
    It is a `Store` (the block operations here; `layers`, `conversation` and `keys` share its
    connection) and a `SqlSession` for those portable tables."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 10_000) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        self._conn = self._connect(Path(path), busy_timeout_ms)
        # The tables reach this store's connection through a weak proxy: held as `self`, each made
        # a reference cycle, and a closed store waited for the cycle collector (gieok/callbacks.py)
        session = weakref.proxy(self)
        self.layers: LayerStore = LayerTables(session)
        self.conversation: ConversationStore = ConversationTables(session)
        self.keys: KeyStore = KeyTable(session)
        self.leases: LeaseStore = LeaseTable(session)
        self.idempotency: IdempotencyStore = IdempotencyTable(session)
        self.event_sequences: EventSequenceStore = EventSequenceTable(session)
        self.event_relay: EventRelayStore = EventRelayTable(session)
        self.sessions: SessionStore = SessionTable(session)
        self.webhooks: WebhookStore = WebhookTable(session)

    # -- lifecycle ------------------------------------------------------------------------
    def _connect(self, path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseUnwritableError(f"cannot create directory {path.parent}: {exc.strerror}") from None
        if path.is_dir():
            raise DatabaseUnwritableError(f"{path} is a directory, not a database file")
        existed = path.exists() and path.stat().st_size > 0
        if not existed and not os.access(path.parent, os.W_OK):
            raise DatabaseUnwritableError(f"cannot create database in {path.parent}: permission denied")
        try:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=busy_timeout_ms / 1000)
        except sqlite3.Error as exc:
            raise DatabaseUnwritableError(f"cannot open {path}: {exc}") from None
        deadline = time.monotonic() + busy_timeout_ms / 1000
        while True:
            try:
                version, existed, mode = self._prepare(conn, path, existed, busy_timeout_ms)
                break
            except sqlite3.OperationalError as exc:
                # Switching a new file to WAL takes a lock that waits for no busy handler: another
                # process opening the same new file at this moment (`--workers N`) makes it "locked".
                if "locked" in str(exc) and time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                conn.close()
                if "locked" in str(exc):
                    raise DatabaseUnavailableError(f"{path} stayed locked by another process for "
                                                   f"{busy_timeout_ms / 1000:g} s: {exc}") from None
                raise _opening_error(exc, path) from None
            except sqlite3.DatabaseError as exc:
                conn.close()
                raise _opening_error(exc, path) from None
            except CorruptDatabaseError:
                conn.close()
                raise
        if mode.lower() != "wal" and existed:
            conn.close()
            raise DatabaseUnwritableError(f"cannot enable WAL on {path} (is the file or its folder read-only?)")
        if version > SCHEMA_VERSION:
            conn.close()
            raise SchemaTooNewError(
                f"{path} has schema version {version}; this gieok understands up to {SCHEMA_VERSION}. Upgrade gieok."
            )
        try:
            self._migrate(conn, version)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "readonly" in str(exc):
                raise DatabaseUnwritableError(f"cannot write {path}: {exc}") from None
            if is_storage_full(exc, path):
                raise storage_full_error(exc, path) from None
            raise CorruptDatabaseError(f"cannot initialise {path}: {exc}") from None
        return conn

    @staticmethod
    def _prepare(conn: sqlite3.Connection, path: Path, existed: bool, busy_timeout_ms: int) -> tuple[int, bool, str]:
        """The connection's settings and the file's schema version: (version, whether it holds a
        schema, the journal mode). Changes nothing in a file that is not a gieok database."""
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("BEGIN")  # the version and the tables from one snapshot: another opener may be creating them
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            conn.execute("COMMIT")
        if existed:
            # Check before changing anything: a foreign file must be left exactly as it was.
            # No tables at all is an empty database, not a foreign one: most often one that another
            # process (a second worker opening the same new tenant) has created and not yet committed
            # its schema to. It is initialised like a new file; `_migrate` waits for the other's.
            existed = bool(tables) or version != 0
            if existed and (version == 0 or "blocks" not in tables):
                raise CorruptDatabaseError(f"{path} is a SQLite file but not a gieok database")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA secure_delete = ON")  # forgotten text is overwritten on disk, not just unlinked
        mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        conn.execute("PRAGMA synchronous = NORMAL")
        return int(version), existed, mode

    @staticmethod
    def _migrate(conn: sqlite3.Connection, version: int) -> None:
        for target in range(version + 1, SCHEMA_VERSION + 1):
            conn.execute("BEGIN IMMEDIATE")
            try:
                # `version` was read before this write lock: another process opening the same file may
                # have migrated it since (two workers warming a new tenant at once). Read it again.
                if conn.execute("PRAGMA user_version").fetchone()[0] >= target:
                    conn.execute("COMMIT")
                    continue
                for statement in split_sql(MIGRATIONS[target - 1]):
                    conn.execute(statement)
                if target == 1:
                    conn.execute("INSERT INTO meta(key, value) VALUES ('created_at', ?)", (str(time.time()),))
                conn.execute(f"PRAGMA user_version = {target}")
                conn.execute("COMMIT")
            except BaseException:
                _roll_back(conn)
                raise

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("PRAGMA optimize")
            self._conn.close()

    # -- SqlSession -------------------------------------------------------------------------
    def transaction(self) -> _Transaction:
        """`with store.transaction() as tx:` — BEGIN IMMEDIATE … COMMIT, or ROLLBACK on any error."""
        return _Transaction(self)

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._query(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                raise _translate(exc, self.path) from None

    def size_bytes(self) -> int:
        """The database file and its write-ahead log."""
        return sum(p.stat().st_size for p in (Path(self.path), Path(f"{self.path}-wal")) if p.exists())

    # -- metadata -------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._query("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, items: dict[str, str]) -> None:
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                list(items.items()),
            )

    def schema_version(self) -> int:
        with self._lock:
            return int(self._query("PRAGMA user_version").fetchone()[0])

    # -- writes ---------------------------------------------------------------------------
    def append(self, blocks: Sequence[NewBlock], vectors: np.ndarray, insert_time: float,
               within: AppendHook | None = None) -> list[Block]:
        if len(blocks) != len(vectors):
            raise StoreError("append: one vector per block is required")
        with self.transaction() as conn:
            _check_dimension(conn, vectors)
            last = conn.execute("SELECT block_index, hash FROM blocks ORDER BY block_index DESC LIMIT 1").fetchone()
            index, prev_hash = (last[0], last[1]) if last else (0, GENESIS)

            def last_position(channel: str) -> int:
                return int(conn.execute(LAST_POSITION_SQL, (channel,)).fetchone()[0] or 0)

            out = link_blocks(blocks, insert_time, index, prev_hash, last_position)
            block_rows = [_block_params(block) for block in out]
            vector_rows = [(b.block_index, np.asarray(v, dtype="<f4").tobytes()) for b, v in zip(out, vectors)]
            fts_rows = [(b.block_index, " ".join(new.tokens), facet_tokens(b.scope, b.kind))
                        for b, new in zip(out, blocks)]
            self._insert_rows(conn, block_rows, vector_rows, fts_rows)
            if within is not None:
                within(conn, out)
        return out

    def append_exact(self, blocks: Sequence[Block], tokens: Sequence[list[str]], vectors: np.ndarray) -> None:
        """Insert blocks that already carry index and hash (import of a full chain)."""
        with self.transaction() as conn:
            _check_dimension(conn, vectors)
            last = conn.execute("SELECT block_index, hash FROM blocks ORDER BY block_index DESC LIMIT 1").fetchone()
            index, prev_hash = (last[0], last[1]) if last else (0, GENESIS)
            block_rows, vector_rows, fts_rows = [], [], []
            for block, toks, vector in zip(blocks, tokens, vectors):
                if block.block_index != index + 1 or block.prev_hash != prev_hash:
                    raise StoreError(f"block {block.block_index} does not continue the chain at {index}")
                index, prev_hash = block.block_index, block.hash
                params = _block_params(block)
                if block.forgotten:
                    params = (*params[:-1], block.insert_time)
                block_rows.append(params)
                if not block.forgotten:
                    vector_rows.append((block.block_index, np.asarray(vector, dtype="<f4").tobytes()))
                    fts_rows.append((block.block_index, " ".join(toks), facet_tokens(block.scope, block.kind)))
            self._insert_rows(conn, block_rows, vector_rows, fts_rows)

    @staticmethod
    def _insert_rows(conn: sqlite3.Connection, block_rows: list, vector_rows: list, fts_rows: list) -> None:
        conn.executemany(f"INSERT INTO blocks({_BLOCK_COLUMNS}) VALUES ({', '.join('?' * 18)})", block_rows)
        conn.executemany("INSERT INTO embeddings(block_index, vector) VALUES (?, ?)", vector_rows)
        conn.executemany("INSERT INTO blocks_fts(rowid, tokens, facets) VALUES (?, ?, ?)", fts_rows)
        conn.execute(_CHANGED)

    def forget(self, block_indices: Sequence[int], when: float) -> list[int]:
        erased: list[int] = []
        with self.transaction() as conn:
            for index in block_indices:
                row = conn.execute("SELECT forgotten_at FROM blocks WHERE block_index = ?", (index,)).fetchone()
                if row is None or row[0] is not None:
                    continue
                conn.execute(
                    "UPDATE blocks SET text = '', speaker = NULL, keywords = '[]', tags = '[]', metadata = '{}', "
                    "forgotten_at = ? WHERE block_index = ?",
                    (when, index),
                )
                conn.execute("DELETE FROM embeddings WHERE block_index = ?", (index,))
                conn.execute("DELETE FROM blocks_fts WHERE rowid = ?", (index,))
                erased.append(index)
            if erased:
                conn.execute(_CHANGED)
                # FTS5 deletes only mark postings as gone until segments merge; merge now so the
                # erased words leave the file (SQLite 3.40 has no FTS5 secure-delete option).
                conn.execute("INSERT INTO blocks_fts(blocks_fts) VALUES ('optimize')")
        if erased:
            # Old pages leave the WAL too; when another reader holds it, the next checkpoint overwrites them.
            with self._lock, contextlib.suppress(sqlite3.DatabaseError):
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return erased

    @contextlib.contextmanager
    def vector_index_deferred(self) -> Iterator[None]:
        """Nothing to defer: the vector index is the process's own (index/vector.py)."""
        yield

    def reembed(self, block_indices: Sequence[int], vectors: np.ndarray, meta: dict[str, str]) -> None:
        """Swap every vector and the recorded embedder in one transaction (reindex)."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM embeddings")
            conn.executemany(
                "INSERT INTO embeddings(block_index, vector) VALUES (?, ?)",
                [(i, np.asarray(v, dtype="<f4").tobytes()) for i, v in zip(block_indices, vectors)],
            )
            conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                list(meta.items()),
            )
            slots_follow_vectors(conn, block_indices, vectors, every=True)
            conn.execute(_CHANGED)

    def replace_vectors(self, block_indices: Sequence[int], vectors: np.ndarray) -> None:
        with self.transaction() as conn:
            _check_dimension(conn, vectors)
            conn.execute(_CHANGED)
            conn.executemany("UPDATE embeddings SET vector = ? WHERE block_index = ?",
                             [(np.asarray(v, dtype="<f4").tobytes(), int(i)) for i, v in zip(block_indices, vectors)])
            conn.executemany("INSERT INTO vector_changes(block_index) VALUES (?)", [(int(i),) for i in block_indices])
            slots_follow_vectors(conn, block_indices, vectors)

    def replaced_vectors(self, after: int, dimension: int) -> tuple[int, dict[int, np.ndarray]]:
        with self._lock:
            last = int(self._query("SELECT coalesce(max(change_id), 0) FROM vector_changes").fetchone()[0])
            rows = self._query(
                "SELECT e.block_index, e.vector FROM embeddings e WHERE e.block_index IN "
                "(SELECT block_index FROM vector_changes WHERE change_id > ? AND change_id <= ?)", (after, last),
            ).fetchall()
        return last, {int(i): _vector(blob, dimension, int(i)) for i, blob in rows}

    def replace_tokens(self, tokens: Mapping[int, Sequence[str]], version: str) -> bool:
        """Re-tokenized live blocks' BM25 tokens and the tokenizer `version` that made them, in one
        transaction — unless `version` is recorded already (another process did it): then False."""
        with self.transaction() as conn:
            found = conn.execute("SELECT value FROM meta WHERE key = ?", (TOKENIZER_KEY,)).fetchone()
            if found and found[0] == version:
                return False
            conn.executemany("UPDATE blocks_fts SET tokens = ? WHERE rowid = ?",
                             [(" ".join(toks), int(index)) for index, toks in tokens.items()])
            if tokens:
                conn.execute(_CHANGED)
            conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                         "value = excluded.value", (TOKENIZER_KEY, version))
        return True

    # -- reads ----------------------------------------------------------------------------
    def _query(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise _translate(exc, self.path) from None

    def get_many(self, block_indices: Sequence[int]) -> dict[int, Block]:
        if not block_indices:
            return {}
        found: dict[int, Block] = {}
        with self._lock:
            ids = list(dict.fromkeys(int(i) for i in block_indices))
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                sql = f"SELECT {_BLOCK_COLUMNS} FROM blocks WHERE block_index IN ({', '.join('?' * len(chunk))})"
                for row in self._query(sql, chunk):
                    found[row[0]] = _row_to_block(row)
        return found

    def list_blocks(self, filt: BM25Filter, *, before: int | None, limit: int) -> list[Block]:
        """Live blocks matching the filter, newest first, with indices below `before` (a cursor)."""
        filters, params = filter_sql(filt)
        conditions = ["forgotten_at IS NULL", *filters]
        if before is not None:
            conditions.append("block_index < ?")
            params.append(before)
        sql = (f"SELECT {_BLOCK_COLUMNS} FROM blocks WHERE {' AND '.join(conditions)} "
               "ORDER BY block_index DESC LIMIT ?")
        with self._lock:
            return [_row_to_block(row) for row in self._query(sql, [*params, limit])]

    def iter_blocks(self, batch: int = 1000, after: int = 0) -> Iterator[Block]:
        """Stream blocks in index order without holding the lock between batches."""
        batch = check_batch(batch)
        while True:
            with self._lock:
                rows = self._query(
                    f"SELECT {_BLOCK_COLUMNS} FROM blocks WHERE block_index > ? ORDER BY block_index LIMIT ?",
                    (after, batch),
                ).fetchall()
            if not rows:
                return
            for row in rows:
                yield _row_to_block(row)
            after = rows[-1][0]

    def bm25(self, tokens: Sequence[str], filt: BM25Filter, limit: int) -> list[tuple[int, float]]:
        """Top `limit` blocks by BM25 (higher is better). Tokens are quoted: no FTS syntax leaks in."""
        terms = list(dict.fromkeys(t for t in tokens if t))
        if not terms or limit <= 0:
            return []
        expression = "tokens : (" + " OR ".join(quote(t) for t in terms) + ")"
        facets = facets_match(filt)
        if facets:
            expression += " AND " + facets
        params: list[Any] = [expression]
        conditions, times = time_sql(filt, "b.")
        if not conditions:
            sql = (
                "SELECT rowid, -rank FROM blocks_fts WHERE blocks_fts MATCH ? "
                "AND rank MATCH 'bm25(1.0, 0.0)' ORDER BY rank LIMIT ?"
            )
        else:
            params.extend(times)
            sql = (
                "SELECT f.rowid, -f.rank FROM blocks_fts f JOIN blocks b ON b.block_index = f.rowid "
                "WHERE blocks_fts MATCH ? AND f.rank MATCH 'bm25(1.0, 0.0)' AND "
                + " AND ".join(conditions)
                + " ORDER BY f.rank LIMIT ?"
            )
        params.append(limit)
        with self._lock:
            return [(int(i), float(s)) for i, s in self._query(sql, params)]

    def load_index_rows(self, after_block_index: int, dimension: int) -> IndexRows:
        with self._lock:
            rows = self._query(
                "SELECT b.block_index, b.kind, b.guild, b.channel, b.user_id, b.event_time, b.importance, "
                "b.conv_pos, b.forgotten_at, e.vector, b.speaker FROM blocks b LEFT JOIN embeddings e "
                "ON e.block_index = b.block_index WHERE b.block_index > ? ORDER BY b.block_index",
                (after_block_index,),
            ).fetchall()
        n = len(rows)
        vectors = np.zeros((n, dimension), dtype=np.float32)
        for i, row in enumerate(rows):
            if row[9] is not None:
                vectors[i] = _vector(row[9], dimension, row[0])
        return IndexRows(
            block_index=np.fromiter((r[0] for r in rows), dtype=np.int64, count=n),
            kind=[r[1] for r in rows],
            guild=[r[2] for r in rows],
            channel=[r[3] for r in rows],
            user=[r[4] for r in rows],
            speaker=[r[10] for r in rows],
            event_time=np.fromiter((r[5] for r in rows), dtype=np.float64, count=n),
            importance=np.fromiter((r[6] for r in rows), dtype=np.float32, count=n),
            conv_pos=np.fromiter((r[7] if r[7] is not None else -1 for r in rows), dtype=np.int64, count=n),
            alive=np.fromiter((r[8] is None for r in rows), dtype=bool, count=n),
            vectors=vectors,
        )

    def load_tokens(self, after_block_index: int) -> list[tuple[int, str]]:
        """(block_index, space-joined tokens) of live blocks, for the in-memory BM25 index."""
        with self._lock:
            return self._query("SELECT rowid, tokens FROM blocks_fts WHERE rowid > ? ORDER BY rowid",
                               (after_block_index,)).fetchall()

    def live_blocks_of_user(self, user_id: str) -> list[int]:
        """The live blocks of a user, any kind: theirs by scope (`user`) or by speaker ("forget me")."""
        with self._lock:
            return [r[0] for r in self._query("SELECT block_index FROM blocks WHERE (user_id = ? OR speaker = ?) "
                                              "AND forgotten_at IS NULL ORDER BY block_index", (user_id, user_id))]

    def notes_promoted_from(self, block_indices: Sequence[int]) -> list[int]:
        if not block_indices:
            return []
        with self._lock:
            return promoted_from_any(self._query(PROMOTED_NOTES_SQL), block_indices)

    def orphan_fact_blocks(self) -> list[int]:
        """Fact blocks without their `facts` row: a crash came between the two writes."""
        with self._lock:
            return [r[0] for r in self._query(
                "SELECT block_index FROM blocks WHERE kind = 'fact' AND forgotten_at IS NULL AND block_index NOT IN "
                "(SELECT block_index FROM facts) AND metadata LIKE '%\"fact_type\"%'")]

    def forgotten_indices(self) -> set[int]:
        with self._lock:
            return {r[0] for r in self._query("SELECT block_index FROM blocks WHERE forgotten_at IS NOT NULL")}

    def last_block_index(self) -> int:
        with self._lock:
            row = self._query("SELECT max(block_index) FROM blocks").fetchone()
        return int(row[0] or 0)

    def counts(self) -> dict[str, Any]:
        with self._lock:
            total, forgotten = self._query(
                "SELECT count(*), count(forgotten_at) FROM blocks"
            ).fetchone()
            by_kind = dict(self._query("SELECT kind, count(*) FROM blocks WHERE forgotten_at IS NULL GROUP BY kind"))
            channels = self._query("SELECT count(DISTINCT channel) FROM blocks").fetchone()[0]
        return {"blocks": total, "forgotten": forgotten, "by_kind": by_kind, "channels": channels}

    def change_token(self) -> int:
        """Bumped by every transaction that appends, forgets, re-embeds or re-tokenizes blocks, in
        any process (the `changes` counter; a commit to another table leaves it)."""
        with self._lock:
            return int(self._query("SELECT counter FROM changes").fetchone()[0])

    def verify(self) -> VerifyReport:
        return verify_chain(self.iter_blocks(batch=2000))


def _check_dimension(conn: sqlite3.Connection, vectors: np.ndarray) -> None:
    """Inside a write's transaction: its vectors are of the dimension the file records. A process
    that opened the memory before another re-embedded it with another model (`gieok reindex`) would
    otherwise store vectors the file can no longer be opened with. (PostgreSQL's typed column refuses them.)"""
    shape = np.shape(vectors)
    if len(shape) != 2 or shape[0] == 0:
        return
    recorded = conn.execute("SELECT value FROM meta WHERE key = 'dimension'").fetchone()
    if recorded is not None and int(recorded[0]) != shape[1]:
        raise MemoryReembeddedError(
            f"this memory now holds {recorded[0]}-d vectors — it was re-embedded (gieok reindex) after this "
            f"process opened it — and these are {shape[1]}-d; nothing was written: open the memory again")


def _vector(blob: bytes, dimension: int, block_index: int) -> np.ndarray:
    if not isinstance(blob, bytes) or len(blob) != 4 * dimension:  # a damaged row, not a NumPy error
        size = len(blob) if isinstance(blob, bytes | str) else 0
        raise CorruptDatabaseError(f"block {block_index}'s vector is damaged ({size} bytes where a {dimension}-d "
                                   "vector has 4 a value): `gieok reindex` embeds every block again")
    return np.frombuffer(blob, dtype="<f4")


def _block_params(block: Block) -> tuple:
    return (
        block.block_index, block.kind, block.scope.guild, block.scope.channel, block.scope.user, block.speaker,
        block.text, block.event_time, block.insert_time, block.importance,
        json.dumps(list(block.keywords), ensure_ascii=False), json.dumps(list(block.tags), ensure_ascii=False),
        json.dumps(block.metadata, ensure_ascii=False), block.conv_pos, block.content_digest, block.prev_hash,
        block.hash, None,
    )


def _opening_error(exc: sqlite3.DatabaseError, path: Path) -> Exception:
    if "readonly" in str(exc) or "unable to open" in str(exc):
        return DatabaseUnwritableError(f"cannot write {path}: {exc}")
    return CorruptDatabaseError(f"{path} is not a usable gieok database: {exc}")


def _translate(exc: sqlite3.DatabaseError, path: str) -> Exception:
    message = str(exc)
    if is_storage_full(exc, path):
        return storage_full_error(exc, path)
    if "readonly" in message or "unable to open" in message or "disk I/O" in message:
        return DatabaseUnwritableError(f"cannot write {path}: {message}")
    if "malformed" in message or "not a database" in message:
        return CorruptDatabaseError(f"{path} is damaged: {message}")
    return StoreError(f"{path}: {message}")


class _Transaction:
    """`with store.transaction() as conn:` — BEGIN IMMEDIATE … COMMIT, or ROLLBACK on any error."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            _roll_back(self.store._conn)  # one a failed write could not undo (an I/O error): undo it now
            self.store._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            self.store._lock.release()
            raise _translate(exc, self.store.path) from None
        return self.store._conn

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                try:
                    self.store._conn.execute("COMMIT")
                except sqlite3.DatabaseError as err:
                    _roll_back(self.store._conn)
                    raise _translate(err, self.store.path) from None
            else:
                _roll_back(self.store._conn)
                if isinstance(exc, sqlite3.DatabaseError):
                    raise _translate(exc, self.store.path) from exc
        finally:
            self.store._lock.release()


def _roll_back(conn: sqlite3.Connection) -> None:
    """Undo the open transaction, if SQLite has not already: on a full disk (SQLITE_FULL) or an I/O
    error it rolls back by itself, and a ROLLBACK then would fail ("no transaction is active") and
    hide the error that says why. The connection stays usable for the next transaction either way."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
