"""Forward-only schema migrations. `PRAGMA user_version` holds the applied version.

Add a migration by appending to MIGRATIONS; never edit one that has shipped.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: blocks, their vectors, the BM25 index and key/value metadata
    """
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE blocks (
        block_index    INTEGER PRIMARY KEY,          -- monotonic, 1-based, never reused
        kind           TEXT NOT NULL,
        guild          TEXT,
        channel        TEXT,
        user_id        TEXT,
        speaker        TEXT,
        text           TEXT NOT NULL,                -- '' once forgotten
        event_time     REAL NOT NULL,
        insert_time    REAL NOT NULL,
        importance     REAL NOT NULL,
        keywords       TEXT NOT NULL DEFAULT '[]',   -- JSON array
        tags           TEXT NOT NULL DEFAULT '[]',   -- JSON array
        metadata       TEXT NOT NULL DEFAULT '{}',   -- JSON object
        conv_pos       INTEGER,                      -- position within its channel, 1-based
        content_digest TEXT NOT NULL,
        prev_hash      TEXT NOT NULL,
        hash           TEXT NOT NULL,
        forgotten_at   REAL
    );
    -- neighbouring turns of a conversation without a scan
    CREATE UNIQUE INDEX blocks_by_position ON blocks(channel, conv_pos) WHERE conv_pos IS NOT NULL;
    CREATE INDEX blocks_forgotten ON blocks(forgotten_at) WHERE forgotten_at IS NOT NULL;
    CREATE INDEX blocks_by_user ON blocks(user_id) WHERE user_id IS NOT NULL;
    CREATE TABLE embeddings (
        block_index INTEGER PRIMARY KEY REFERENCES blocks(block_index),
        vector      BLOB NOT NULL                    -- float32, little-endian
    );
    -- pre-tokenized text (Korean morphemes, English stems); facets hold scope and kind
    -- tokens so that filters are posting-list intersections, weighted 0 in bm25()
    CREATE VIRTUAL TABLE blocks_fts USING fts5(
        tokens, facets, tokenize = "unicode61 remove_diacritics 0 tokenchars '_'"
    );
    """,
    # 2: working-memory slots, their checkpoints into long-term blocks, short-term memory
    """
    CREATE TABLE wm_slots (
        scope_key    TEXT NOT NULL,                -- the conversation scope the slots belong to
        slot_id      INTEGER NOT NULL,
        context      TEXT NOT NULL,
        content      TEXT NOT NULL,
        metadata     TEXT NOT NULL DEFAULT '{}',
        embedding    BLOB,
        importance   REAL NOT NULL,
        usage_count  INTEGER NOT NULL,
        created_at   REAL NOT NULL,
        last_access  REAL NOT NULL,
        block_index  INTEGER,                      -- the long-term block this slot mirrors, if any
        context_hash TEXT NOT NULL,
        PRIMARY KEY (scope_key, slot_id)
    );
    CREATE TABLE wm_checkpoints (
        scope_key     TEXT NOT NULL,
        slot_id       INTEGER NOT NULL,
        block_index   INTEGER NOT NULL,
        relevance     REAL NOT NULL,
        distance      REAL NOT NULL,
        created_at    REAL NOT NULL,
        last_accessed REAL NOT NULL,
        PRIMARY KEY (scope_key, slot_id, block_index)
    );
    CREATE TABLE stm_entries (
        entry_id    INTEGER PRIMARY KEY,
        scope_key   TEXT NOT NULL,
        text        TEXT NOT NULL,
        metadata    TEXT NOT NULL DEFAULT '{}',
        importance  REAL NOT NULL,
        created_at  REAL NOT NULL,
        expires_at  REAL NOT NULL,
        block_index INTEGER
    );
    CREATE INDEX stm_by_scope ON stm_entries(scope_key, created_at);
    CREATE INDEX stm_by_expiry ON stm_entries(expires_at);
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)
