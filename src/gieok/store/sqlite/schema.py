"""Forward-only schema migrations. `PRAGMA user_version` holds the applied version.

Add a migration by appending to MIGRATIONS; never edit one that has shipped.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]

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
    # 3: the conversation layers: L1 recent messages, L2 rolling summaries, L3 fact validity,
    # and per-channel analysis state. Facts themselves are blocks (kind 'fact'); what changes
    # after they are written (valid_to, superseded_by) lives here, outside the hash chain.
    """
    CREATE TABLE l1_messages (
        message_id   INTEGER PRIMARY KEY,
        scope_key    TEXT NOT NULL,                -- the conversation: guild/channel
        role         TEXT NOT NULL,                -- 'user' | 'assistant'
        content      TEXT NOT NULL,
        user_id      TEXT,
        display_name TEXT,                         -- kept here only: blocks and facts use ids
        created_at   REAL NOT NULL,
        addressed    INTEGER NOT NULL DEFAULT 0,   -- the message called the bot explicitly
        flagged      INTEGER NOT NULL DEFAULT 0,   -- a guardrail fired: never learn from it
        external_id  TEXT,                         -- the transport's message id, if any
        block_index  INTEGER                       -- its turn block once written to long-term memory
    );
    CREATE INDEX l1_by_scope ON l1_messages(scope_key, message_id);
    CREATE INDEX l1_pending ON l1_messages(block_index) WHERE block_index IS NULL;
    CREATE INDEX l1_by_user ON l1_messages(user_id);
    CREATE TABLE summaries (
        scope_key  TEXT PRIMARY KEY,
        data       TEXT NOT NULL,                  -- JSON: the structured summary
        updated_at REAL NOT NULL
    );
    CREATE TABLE facts (
        block_index    INTEGER PRIMARY KEY,        -- the fact's block
        fact_type      TEXT NOT NULL,              -- user_fact | guild_fact | lore
        topic          TEXT NOT NULL,
        guild          TEXT,
        user_id        TEXT,
        source_message TEXT,
        valid_from     REAL NOT NULL,
        valid_to       REAL,                       -- set when a newer fact supersedes it
        superseded_by  INTEGER,
        lore_key       TEXT                        -- lore: digest of the seeded line (idempotent seeding)
    );
    CREATE INDEX facts_by_subject ON facts(fact_type, guild, user_id) WHERE valid_to IS NULL;
    CREATE INDEX facts_by_guild ON facts(guild) WHERE valid_to IS NULL;
    CREATE INDEX facts_by_user ON facts(user_id);
    CREATE UNIQUE INDEX facts_lore ON facts(lore_key) WHERE lore_key IS NOT NULL;
    CREATE TABLE channel_state (
        scope_key       TEXT PRIMARY KEY,
        since_analysis  INTEGER NOT NULL DEFAULT 0,  -- messages since the last stage-2 extraction
        last_message_id INTEGER NOT NULL DEFAULT 0,  -- L1 message id the last extraction covered
        updated_at      REAL NOT NULL
    );
    """,
    # 4: the chat runtime: channels where the bot speaks unprompted (`here` / `leave`)
    """
    CREATE TABLE active_channels (
        scope_key    TEXT PRIMARY KEY,             -- the conversation: guild/channel
        activated_at REAL NOT NULL,
        activated_by TEXT
    );
    """,
    # 5: API keys of `gieok serve` (kept in the deployment's home database). Only a SHA-256 of
    # each key is stored, beside a short prefix that identifies it in lists and logs.
    """
    CREATE TABLE api_keys (
        key_id       INTEGER PRIMARY KEY,
        prefix       TEXT NOT NULL UNIQUE,          -- the visible part: gk_<prefix>_<secret>
        key_hash     TEXT NOT NULL,                 -- sha256 hex of the whole key
        tenant       TEXT NOT NULL,
        role         TEXT NOT NULL,                 -- read | write | admin
        name         TEXT NOT NULL DEFAULT '',
        created_at   REAL NOT NULL,
        revoked_at   REAL,
        last_used_at REAL
    );
    CREATE INDEX api_keys_by_tenant ON api_keys(tenant);
    """,
    # 6: the ids of the messages a client sent (`POST /v1/conversations/messages`), per conversation, kept
    # after L1 trims its rows: a message sent again (a client's retry) is recognised and not stored twice.
    """
    CREATE TABLE message_ids (
        scope_key   TEXT NOT NULL,                 -- the conversation: guild/channel
        external_id TEXT NOT NULL,                 -- the client's message id
        message_id  INTEGER NOT NULL,              -- its L1 row (the row may be trimmed since)
        created_at  REAL NOT NULL,
        PRIMARY KEY (scope_key, external_id)
    );
    """,
    # 7: leases: one process at a time runs a named duty (a tenant's STM expiry, pending extraction)
    """
    CREATE TABLE leases (
        name       TEXT PRIMARY KEY,
        holder     TEXT NOT NULL,                  -- the process that holds it
        expires_at REAL NOT NULL
    );
    """,
    # 8: idempotency keys of the server's writes: a retried write gets the first answer, nothing twice
    """
    CREATE TABLE idempotency_keys (
        idem_key    TEXT PRIMARY KEY,              -- the client's Idempotency-Key
        fingerprint TEXT NOT NULL,                 -- sha256 of the method, the path and the body
        status      INTEGER,                       -- NULL while the first request runs
        response    TEXT,                          -- its answer (JSON)
        holder      TEXT NOT NULL,                 -- the process running it
        created_at  REAL NOT NULL                  -- kept 24 h
    );
    CREATE INDEX idempotency_by_age ON idempotency_keys(created_at);
    """,
    # 9: event sequences of `gieok serve` (home store): the next event id per tenant, so ids survive a restart
    """
    CREATE TABLE event_sequences (
        tenant   TEXT PRIMARY KEY,
        next_seq INTEGER NOT NULL                  -- the first id not handed out yet
    );
    """,
    # 10: dashboard sessions (home store): the cookie holds an opaque id, never the key
    """
    CREATE TABLE dashboard_sessions (
        session_hash TEXT PRIMARY KEY,             -- sha256 hex of the session id in the cookie
        key_id       INTEGER NOT NULL,             -- the API key it was opened with
        created_at   REAL NOT NULL,                -- absolute expiry counts from here
        last_seen_at REAL NOT NULL                 -- idle expiry counts from here
    );
    CREATE INDEX dashboard_sessions_by_key ON dashboard_sessions(key_id);
    """,
    # 11: fencing of a channel's turns (several bot processes). A process that takes a channel's
    # lease gets the next token of a counter in Redis and writes it here; the rows of a turn (its
    # claim on the messages it answers, the reply, the turn blocks) are written only in a
    # transaction that finds no newer token, so a process that stalled past its lease cannot record
    # a late turn. And which L1 messages a turn took care of: the rows already in L1 count as handled.
    # (8 is the idempotency keys of wt-harden, the same text on both branches so either merge order
    # gives one schema.)
    """
    CREATE TABLE channel_fences (
        scope_key TEXT PRIMARY KEY,                -- the conversation: guild/channel
        token     INTEGER NOT NULL                 -- only ever moves forward
    );
    ALTER TABLE l1_messages ADD COLUMN handled_at REAL;  -- when a turn took it (answered or passed over)
    ALTER TABLE l1_messages ADD COLUMN handled_by TEXT;  -- which turn's claim: its retry is not refused
    UPDATE l1_messages SET handled_at = created_at;
    """,
    # 12: the blocks a write stored under its Idempotency-Key, written in the blocks' own transaction:
    # a process killed between that commit and its answer leaves a key a retry answers from them
    """
    ALTER TABLE idempotency_keys ADD COLUMN written TEXT;  -- JSON list of block indices
    """,
    # 13: a counter of the changes to the blocks (appends, forgets, re-embedding, re-tokenizing),
    # bumped in their own transactions, as PostgreSQL's `changes`: what `change_token` reads. Any
    # other connection's commit to any table used to count (PRAGMA data_version), so a server's
    # key table noting a key's use, or reserving event ids, in the home memory emptied that
    # memory's search cache and made its indexes catch up
    """
    CREATE TABLE changes (counter INTEGER NOT NULL);
    INSERT INTO changes(counter) VALUES (0);
    """,
    # 14: time as the conversation lived it. A fact's validity follows the messages that stated it
    # (their event times), and what gieok knew when is kept beside it: `recorded_at` (when the fact
    # was learned) and `expired_at` (when gieok learned it stopped being true). Each statement of a
    # fact is a row of `fact_sources` — the message, its conversation and when it was said — so a
    # fact said again keeps every source, a backfilled older message finds its place in the
    # fact's history, and editing or deleting a message reaches the facts it gave. A client's
    # message id also keeps its turn block (an edit replaces it) and whether it was deleted. And what a
    # user's data needs: who wrote a fact by hand (an operator's or agent's key: `author`), the names each
    # user was seen with, and the erasures under way (one a crash interrupted is finished on the next open).
    """
    ALTER TABLE facts ADD COLUMN recorded_at REAL;
    ALTER TABLE facts ADD COLUMN expired_at REAL;
    UPDATE facts SET recorded_at = valid_from;
    UPDATE facts SET expired_at = valid_to WHERE valid_to IS NOT NULL;
    CREATE TABLE fact_sources (
        block_index INTEGER NOT NULL,              -- the fact (one version of it)
        said_at     REAL NOT NULL,                 -- when the message was said (its event time)
        message_id  INTEGER,                       -- its L1 message id (the row may be trimmed since)
        scope_key   TEXT,                          -- its conversation
        external_id TEXT,                          -- the sender's id for it
        user_id     TEXT,                          -- who said it
        recorded_at REAL NOT NULL,                 -- when gieok learned it from there
        author      TEXT                           -- a fact stated through the API: the key that wrote it
    );
    CREATE INDEX fact_sources_by_fact ON fact_sources(block_index);
    CREATE INDEX fact_sources_by_message ON fact_sources(message_id) WHERE message_id IS NOT NULL;
    INSERT INTO fact_sources(block_index, said_at, external_id, user_id, recorded_at)
        SELECT block_index, valid_from, source_message, user_id, valid_from FROM facts
        WHERE source_message IS NOT NULL;
    ALTER TABLE message_ids ADD COLUMN block_index INTEGER;   -- its turn block once written
    ALTER TABLE message_ids ADD COLUMN deleted_at REAL;       -- erased by its sender (the id stays taken)
    CREATE INDEX message_ids_by_message ON message_ids(message_id);
    UPDATE message_ids SET block_index = (SELECT l.block_index FROM l1_messages l
                                          WHERE l.message_id = message_ids.message_id);
    CREATE TABLE user_names (
        user_id    TEXT NOT NULL,
        name       TEXT NOT NULL,                  -- a display name the user's messages came with
        first_seen REAL NOT NULL,
        last_seen  REAL NOT NULL,
        PRIMARY KEY (user_id, name)
    );
    INSERT INTO user_names(user_id, name, first_seen, last_seen)
        SELECT user_id, display_name, min(created_at), max(created_at) FROM l1_messages
        WHERE user_id IS NOT NULL AND display_name IS NOT NULL GROUP BY user_id, display_name;
    CREATE TABLE erasures (
        user_id    TEXT PRIMARY KEY,               -- whose data is being erased
        started_at REAL NOT NULL,
        reason     TEXT NOT NULL DEFAULT ''        -- who asked (a key, a command)
    );
    """,
    # 15: the chat bot in a community: what the language models cost per guild and day (a daily
    # budget holds across restarts and across the processes of one deployment). No person's data:
    # a guild's total only (direct messages share one row).
    """
    CREATE TABLE model_usage (
        scope  TEXT NOT NULL,                      -- a guild id, or "direct" for direct messages
        day    TEXT NOT NULL,                      -- YYYY-MM-DD in the bot's time zone
        tokens INTEGER NOT NULL,                   -- estimated: prompts and answers, every call
        calls  INTEGER NOT NULL,
        PRIMARY KEY (scope, day)
    );
    """,
    # 16: webhooks of `gieok serve` (home store): each tenant's endpoints, and the deliveries queued for them
    # (an outbox: written as the event is published, posted until the receiver says 2xx, so a delivery
    # survives a restart; a process claims the rows it posts, so two workers never post the same attempt)
    """
    CREATE TABLE webhook_endpoints (
        endpoint_id     INTEGER PRIMARY KEY,
        tenant          TEXT NOT NULL,
        url             TEXT NOT NULL,
        events          TEXT NOT NULL DEFAULT '[]',  -- JSON list of event types (or "fact.*"), empty: every event
        secret          TEXT NOT NULL,               -- whsec_…: signs every delivery
        previous_secret TEXT,                        -- after a rotation, also signs until previous_until
        previous_until  REAL,
        created_at      REAL NOT NULL,
        disabled_at     REAL,                        -- its receiver answered 410 Gone: nothing more is sent
        disabled_reason TEXT NOT NULL DEFAULT '',
        failures        INTEGER NOT NULL DEFAULT 0,  -- attempts in a row that got no 2xx: the receiver is down
        resting_until   REAL                         -- …so only events never tried are sent before then
    );
    CREATE INDEX webhook_endpoints_by_tenant ON webhook_endpoints(tenant);
    CREATE TABLE webhook_deliveries (
        delivery_id   INTEGER PRIMARY KEY,
        endpoint_id   INTEGER NOT NULL,
        event_id      INTEGER NOT NULL,              -- the event's id in its tenant's stream: webhook-id
        event_type    TEXT NOT NULL,
        body          TEXT,                          -- the JSON posted; NULL once delivered or given up
        status        TEXT NOT NULL,                 -- pending | delivered | failed
        attempts      INTEGER NOT NULL DEFAULT 0,
        created_at    REAL NOT NULL,                 -- when the event was queued: retries end a day after
        next_try_at   REAL NOT NULL,
        last_try_at   REAL,
        last_status   INTEGER,                       -- the receiver's HTTP status on the last attempt
        last_error    TEXT,
        delivered_at  REAL,
        claimed_by    TEXT,                          -- the process posting it now
        claimed_until REAL,                          -- …until then: a dead process's claim lapses
        UNIQUE (endpoint_id, event_id)
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries(next_try_at) WHERE status = 'pending';
    CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries(endpoint_id, delivery_id);
    """,
    # 17: the event relay (home store): events of `gieok mcp`, which has no stream of its own, for every
    # `gieok serve` on the memory to stream (store/relay.py); AUTOINCREMENT: an id is never reused after a trim
    """
    CREATE TABLE event_relay (
        relay_id   INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant     TEXT NOT NULL,
        time       REAL NOT NULL,
        type       TEXT NOT NULL,
        data       TEXT NOT NULL,                    -- the event's JSON
        claimed_by TEXT                              -- the server that queued its webhooks
    );
    CREATE INDEX event_relay_by_time ON event_relay(time);
    """,
    # 18: which blocks' vectors `replace_vectors` replaced (a turn embedded again without an erased
    # neighbour's words), in order: another process of the same file holding the vectors in memory
    # (`--workers N`) takes the new ones, and a graph saved before the change is corrected when loaded.
    # Block indices only: nothing of any text.
    """
    CREATE TABLE vector_changes (
        change_id   INTEGER PRIMARY KEY AUTOINCREMENT,
        block_index INTEGER NOT NULL
    );
    """,
    # 19: the blocks each kept answer of an idempotent write stored, by block: an answer of
    # `POST /v1/memories` holds its blocks' text, and forgetting a block (a deleted or edited
    # message's turn, `DELETE /v1/memories/…`) redacts the answers that hold it without reading
    # every kept answer of the last day (store/idempotency.py `redact_written`)
    """
    CREATE TABLE idempotency_blocks (
        block_index INTEGER NOT NULL,
        idem_key    TEXT NOT NULL
    );
    CREATE INDEX idempotency_blocks_by_block ON idempotency_blocks(block_index);
    CREATE INDEX idempotency_blocks_by_key ON idempotency_blocks(idem_key);
    INSERT INTO idempotency_blocks(block_index, idem_key)
        SELECT CAST(j.value AS INTEGER), k.idem_key FROM idempotency_keys k, json_each(k.written) j
        WHERE k.written IS NOT NULL;
    """,
    # 20: what each queued webhook delivery's event is found by when data it holds is erased (the
    # blocks it names, the message it came from: `coordination.events.event_marks`, one a line): a
    # deleted message's queued events are found by them, without reading every pending body (a
    # receiver down for a day holds tens of thousands). NULL on rows queued before: those are read.
    """
    ALTER TABLE webhook_deliveries ADD COLUMN marks TEXT;
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)
