"""Working memory, STM, checkpoints, localized search, cache and the coordinator — each on
its own with a controlled clock, then together through `Memory`."""

from __future__ import annotations

import numpy as np
import pytest

from gieok import Memory, Scope
from gieok.layers.cache import SearchCache, normalise_query
from gieok.layers.working import WorkingMemory, jaccard, time_factor, usage_factor
from gieok.store.base import NewBlock
from gieok.store.sqlite import SQLiteStore
from gieok.text import get_tokenizer
from manual_clock import HOUR, ManualClock

# The seed's thresholds (0.3 / 0.2) make every slot and block qualify with e5, which is what
# these mechanics tests want; the shipped defaults are calibrated (see README "Layers").
SEED = {"min_relevance_threshold": 0.3, "checkpoint_min_similarity": 0.2}


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(tmp_path / "layers.db")
    yield s
    s.close()


def _wm(store, clock, promoted, slots=4, relevance="jaccard"):
    def promote(slot, priority, reason):
        promoted.append((slot.content, round(priority, 6), reason))
        return slot  # stands for the note written (None: nothing was, and it is not counted)

    return WorkingMemory(store.layers, get_tokenizer(), promote, slots=slots, relevance=relevance, clock=clock)


# -- priority arithmetic ---------------------------------------------------------------------
def test_factors_follow_the_seed():
    assert time_factor(0, 0) == 1.0
    assert time_factor(0, 24 * 3600) == pytest.approx(0.5)
    assert time_factor(0, 48 * 3600) == pytest.approx(1 / 3)
    assert time_factor(0, 10_000 * 3600) == 0.1  # floor
    assert usage_factor(3) == pytest.approx(0.3) and usage_factor(50) == 1.0
    assert jaccard(frozenset("ab"), frozenset("bc")) == pytest.approx(1 / 3)


def test_priority_formula_with_controlled_clock(store):
    clock, promoted = ManualClock(), []
    wm = _wm(store, clock, promoted)
    scope = Scope(channel="c")
    slot = wm.add(scope, "민지 고양이 보리", importance=0.8)
    for _ in range(4):
        wm.touch(slot)  # usage 5
    clock.advance(24 * HOUR)
    expected = 0.4 * 0.8 + 0.3 * 0.5 + 0.2 * 0.5 + 0.1 * 0.0
    assert wm.priority(slot) == pytest.approx(expected)
    # relevance: Korean-aware Jaccard — 민지는 / 고양이를 share lemmas with the slot
    with_context = wm.priority(slot, "민지는 고양이를 좋아해")
    assert with_context > expected


def test_eviction_promotes_the_lowest_priority_slot(store):
    clock, promoted = ManualClock(), []
    wm = _wm(store, clock, promoted, slots=2)
    scope = Scope(channel="c")
    wm.add(scope, "important plan", importance=0.9)
    wm.add(scope, "small talk", importance=0.1)
    clock.advance(1 * HOUR)
    wm.add(scope, "new message", importance=0.5)
    assert [p[0] for p in promoted] == ["small talk"]
    assert promoted[0][2] == "evicted"
    contents = sorted(s.content for s in wm.slots(scope))
    assert contents == ["important plan", "new message"]
    stats = wm.statistics(scope)
    assert stats["total_slots"] == 2 and stats["active_slots"] == 2 and stats["available_slots"] == 0
    assert stats["promotion_count"] == 1 and stats["cleanup_count"] == 1


def test_slots_are_separate_per_conversation_and_persist(tmp_path):
    path = tmp_path / "p.db"
    store = SQLiteStore(path)
    clock, promoted = ManualClock(), []
    wm = _wm(store, clock, promoted)
    wm.add(Scope(channel="a"), "hello from a", embedding=np.ones(4, dtype=np.float32) / 2)
    wm.add(Scope(channel="b"), "hello from b")
    store.close()
    reopened = SQLiteStore(path)
    wm2 = _wm(reopened, clock, promoted)
    assert [s.content for s in wm2.slots(Scope(channel="a"))] == ["hello from a"]
    assert [s.content for s in wm2.slots(Scope(channel="b"))] == ["hello from b"]
    assert wm2.slots(Scope(channel="a"))[0].embedding is not None
    reopened.close()


# -- cache ----------------------------------------------------------------------------------
def test_cache_generations_invalidate_only_matching_scopes():
    clock = ManualClock()
    cache = SearchCache(max_entries=10, ttl_seconds=60, clock=clock)
    a, b, everything = Scope(guild="g", channel="a"), Scope(guild="g", channel="b"), Scope()
    for scope in (a, b, everything):
        cache.put(scope, cache.key(scope, "Cat name?"), ("hit",))
    assert cache.get(a, cache.key(a, "  cat   NAME ")) == ("hit",)  # normalised
    cache.invalidate(Scope(guild="g", channel="a", user="u1"))  # a write in channel a
    assert cache.get(a, cache.key(a, "cat name")) is None
    assert cache.get(everything, cache.key(everything, "cat name")) is None  # unscoped saw the write too
    assert cache.get(b, cache.key(b, "cat name")) == ("hit",)  # another channel is untouched
    clock.now += 61
    assert cache.get(b, cache.key(b, "cat name")) is None  # TTL
    assert normalise_query("Ｃａｔ  Name?") == "cat name"


def test_cache_is_bounded_lru():
    cache = SearchCache(max_entries=2, ttl_seconds=60)
    s = Scope(channel="c")
    for q in ("one", "two", "three"):
        cache.put(s, cache.key(s, q), (q,))
    assert cache.get(s, cache.key(s, "one")) is None
    assert cache.get(s, cache.key(s, "three")) == ("three",)


# -- through Memory --------------------------------------------------------------------------
TURNS = [
    "민지: 나 주말에 고양이 입양했어!!",
    "지훈: 헐 대박 이름 뭐야?",
    "민지: 이름은 보리야. 치즈냥이야",
    "Alex: so cute, send pics",
    "Emily: 보리 사진 보여줘",
    "민지: 여기 사진! 보리 첫날",
    "지훈: I fixed the login bug today, timezone issue",
    "Alex: nice, what was it?",
]


@pytest.fixture
def replayed(tmp_path):
    with Memory(tmp_path / "m.db", **SEED) as memory:
        for text in TURNS:
            memory.remember(text, scope={"guild": "g", "channel": "c"}, speaker=text.split(":")[0])
        yield memory


def test_remember_feeds_working_memory_and_stm(replayed):
    slots = replayed.working.slots(Scope("g", "c"))
    assert len(slots) == 4
    # evicted slots that only mirrored a stored, never-recalled turn are released without a copy
    assert [b for b in replayed.iter_blocks() if b.kind == "note"] == []
    assert replayed.working.statistics()["release_count"] == len(TURNS) - 4
    turns = [b for b in replayed.iter_blocks() if b.kind == "turn"]
    assert [b.conv_pos for b in turns] == list(range(1, len(TURNS) + 1))
    stm_entries = replayed.stm.entries(Scope("g", "c"))
    assert len(stm_entries) == len(TURNS)  # hybrid mode writes to both


def test_eviction_promotes_unstored_and_recalled_slots_for_real(tmp_path):
    with Memory(tmp_path / "p.db", wm_slots=2) as memory:
        scope = Scope("g", "c")
        memory.working.add(scope, "민지 생일은 5월 9일", importance=0.2)  # not in long-term memory yet
        recalled = memory.remember("지훈: 부산은 4월 18일에 가", scope={"guild": "g", "channel": "c"}, importance=0.1)
        slot = next(s for s in memory.working.slots(scope) if s.block_index == recalled.block_index)
        memory.working.touch(slot)  # working memory recalled it once
        memory.working.add(scope, "new context one", importance=0.9)
        memory.working.add(scope, "new context two", importance=0.9)
        notes = [b for b in memory.iter_blocks() if b.kind == "note"]
        assert sorted(n.text for n in notes) == sorted(["민지 생일은 5월 9일", "지훈: 부산은 4월 18일에 가"])
        for note in notes:
            provenance = note.metadata["promoted_from"]
            assert provenance["layer"] == "working_memory" and provenance["reason"] == "evicted"
            assert {"slot", "priority", "source_block"} <= set(provenance)
            assert note.conv_pos is None  # notes do not join the turn sequence
        by_text = {n.text: n for n in notes}
        assert by_text["지훈: 부산은 4월 18일에 가"].metadata["promoted_from"]["source_block"] == recalled.block_index
        assert memory.working.statistics()["promotion_count"] == 2


def test_full_search_creates_checkpoints_and_radius_walks_the_conversation(replayed, tmp_path):
    result = replayed.search("보리 고양이 이름", 3, scope={"guild": "g", "channel": "c"})
    assert result.source == "full"
    slots = replayed.working.slots(Scope("g", "c"))
    anchored = [s for s in slots if replayed.checkpoints.get(s)]
    assert anchored, "a successful full search anchors relevant slots"
    slot = anchored[0]
    checkpoints = replayed.checkpoints.get(slot)
    assert len(checkpoints) <= replayed.settings.max_checkpoints_per_slot
    radius = replayed.checkpoints.radius(slot, 1)
    blocks = replayed.store.get_many(radius)
    assert all(b.kind == "turn" and b.scope.channel == "c" for b in blocks.values())
    anchor_positions = {replayed.get(c.block_index).conv_pos for c in checkpoints}
    for block in blocks.values():
        assert min(abs(block.conv_pos - p) for p in anchor_positions) <= 1
    assert len(replayed.checkpoints.radius(slot, 1000)) <= replayed.settings.localized_search_limit


def test_radius_ignores_other_channels_interleaved_in_insert_order(tmp_path):
    with Memory(tmp_path / "i.db", **SEED) as memory:
        for i in range(12):
            memory.remember(f"channel a message {i} about coffee", scope={"channel": "a"})
            memory.add(f"channel b noise {i}", scope={"channel": "b"})
        memory.search("coffee message", 3, scope={"channel": "a"})
        for slot in memory.working.slots(Scope(channel="a")):
            for index in memory.checkpoints.radius(slot, 3):
                assert memory.get(index).scope.channel == "a"


def test_cache_answers_repeats_and_never_serves_stale_results(replayed):
    scope = {"guild": "g", "channel": "c"}
    first = replayed.search("login bug timezone", 3, scope=scope, neighbours=False)
    again = replayed.search("Login bug   timezone?", 3, scope=scope, neighbours=False)
    assert again.source == "cache"
    assert [h.block.block_index for h in again.hits] == [h.block.block_index for h in first.hits]
    new = replayed.add("지훈: the login bug came back, timezone again", scope=scope)
    after_write = replayed.search("login bug timezone", 3, scope=scope, neighbours=False)
    assert after_write.source != "cache"
    assert new.block_index in [h.block.block_index for h in after_write.hits]
    replayed.forget(new.block_index)
    after_forget = replayed.search("login bug timezone", 3, scope=scope, neighbours=False)
    assert after_forget.source != "cache"
    assert new.block_index not in [h.block.block_index for h in after_forget.hits]


def test_cache_outlives_other_connections_commits_but_not_their_blocks(replayed):
    """A server's home store is a second connection to the default memory's file: its key table
    notes a key's use, and it reserves event ids. Those commits are not changes to the blocks and
    keep the cached answers; another connection's block still empties the cache."""
    scope = {"guild": "g", "channel": "c"}
    replayed.search("login bug timezone", 3, scope=scope, neighbours=False)
    other = SQLiteStore(replayed.path)
    try:
        key = other.keys.insert("dddd4444", "hash-d", "default", "read", "", 1.0)
        other.keys.touch(key.key_id, 61.0)
        other.event_sequences.reserve("default", 100)
        assert replayed.search("login bug timezone", 3, scope=scope, neighbours=False).source == "cache"
        text = "the login bug timezone note from another process"
        written = other.append([NewBlock(kind="note", scope=Scope("g", "c"), speaker=None, text=text, event_time=1.0,
                                         importance=0.5, keywords=[], tags=[], metadata={},
                                         tokens=get_tokenizer().analyze(text).tokens)],
                               np.asarray(replayed.embedder.embed_queries([text]), dtype=np.float32), 1.0)
        after = replayed.search("login bug timezone", 3, scope=scope, neighbours=False)
        assert after.source != "cache"
        assert written[0].block_index in [h.block.block_index for h in after.hits]
    finally:
        other.close()


def test_cache_invalidated_by_promotion(replayed):
    scope = {"guild": "g", "channel": "c"}
    replayed.search("coffee beans", 3, scope=scope)
    assert replayed.search("coffee beans", 3, scope=scope).source == "cache"
    replayed.remember("Emily: I bought coffee beans from Jeju", scope=scope)  # evicts + promotes
    assert replayed.search("coffee beans", 3, scope=scope).source != "cache"


def test_stage_1_never_answers_from_checkpoints(tmp_path):
    with Memory(tmp_path / "s1.db", checkpoint_stage=1, **SEED) as memory:
        for text in TURNS:
            memory.remember(text, scope={"channel": "c"})
        sources = {memory.search(q, 3, scope={"channel": "c"}).source for q in ("보리 사진", "login bug", "고양이")}
        assert "checkpoint" not in sources
        assert memory.layer_stats()["checkpoints"]["checkpoints"] > 0  # but anchors were created


def test_stage_2_compares_and_full_answers(tmp_path):
    with Memory(tmp_path / "s2.db", checkpoint_stage=2, **SEED) as memory:
        for text in TURNS:
            memory.remember(text, scope={"channel": "c"})
        memory.search("보리 사진", 3, scope={"channel": "c"})
        result = memory.search("login bug fixed", 3, scope={"channel": "c"})
        assert result.source == "full"
        stats = memory.layer_stats()
        assert stats["layers"]["checkpoint"]["attempts"] >= 1 and stats["layers"]["checkpoint"]["answers"] == 0
        assert stats["stage2_mean_overlap"] is not None and 0.0 <= stats["stage2_mean_overlap"] <= 1.0


def test_stage_3_checkpoint_layer_answers_and_fallback_without_checkpoints(tmp_path):
    with Memory(tmp_path / "s3.db", checkpoint_stage=3, **SEED) as memory:
        for text in TURNS:
            memory.remember(text, scope={"channel": "c"})
        first = memory.search("보리 사진", 3, scope={"channel": "c"})
        assert first.source == "full"  # no checkpoint yet: fall back
        second = memory.search("login bug fixed", 3, scope={"channel": "c"})
        assert second.source == "checkpoint"
        assert all(h.block.scope.channel == "c" for h in second.hits)
        assert len({h.block.block_index for h in second.hits}) == len(second.hits)  # de-duplicated


def test_working_memory_layer_answers_with_three_relevant_slots(tmp_path):
    with Memory(tmp_path / "wm.db", wm_min_relevance=0.2) as memory:
        for text in ("보리 사진 귀여워", "보리 사진 또 보여줘", "보리 사진 최고", "보리 사진 저장함"):
            memory.remember(text, scope={"channel": "c"})
        result = memory.search("보리 사진", 5, scope={"channel": "c"})
        assert result.source == "working_memory"
        assert len(result.hits) >= 3 and all("보리" in h.block.text for h in result.hits)
        assert memory.layer_stats()["layers"]["working_memory"]["answers"] == 1


def test_forget_clears_working_memory_and_stm_copies(replayed):
    slot = replayed.working.slots(Scope("g", "c"))[0]
    replayed.forget(slot.block_index)
    assert slot.block_index not in [s.block_index for s in replayed.working.slots(Scope("g", "c"))]
    assert slot.block_index not in [e["block_index"] for e in replayed.stm.entries()]


@pytest.mark.parametrize("mode", ["hybrid", "legacy", "working_only"])
def test_stm_modes(tmp_path, mode):
    with Memory(tmp_path / f"{mode}.db", stm_mode=mode) as memory:
        for text in TURNS[:6]:
            memory.remember(text, scope={"channel": "c"})
        slots = memory.working.slots(Scope(channel="c"))
        entries = memory.stm.entries(Scope(channel="c"))
        if mode == "legacy":
            assert slots == [] and len(entries) == 6
        elif mode == "working_only":
            assert len(slots) == 4 and entries == []
        else:
            assert len(slots) == 4 and len(entries) == 6
        results = memory.hybrid.search(Scope(channel="c"), "보리 사진", None, 5, threshold=0.1)
        sources = {r["source"] for r in results}
        assert sources <= {"working_memory", "legacy_stm"}
        if mode == "legacy":
            assert sources == {"legacy_stm"}
        if mode == "working_only":
            assert sources <= {"working_memory"}
        stats = memory.hybrid.statistics()
        assert stats["mode"] == mode and stats["hybrid_performance"]["total_requests"] >= 7


def test_stm_expiry_promotes_important_and_drops_the_rest(tmp_path):
    with Memory(tmp_path / "stm.db") as memory:
        clock = ManualClock()
        memory.stm.clock = clock
        memory.stm.add(Scope(channel="c"), "민지 생일은 5월 9일", importance=0.9)
        memory.stm.add(Scope(channel="c"), "ㅋㅋㅋ", importance=0.1)
        memory.stm.add(Scope(channel="c"), "still fresh", importance=0.9, ttl_seconds=10 * 3600)
        clock.advance(2 * HOUR)
        outcome = memory.stm.expire()
        assert outcome == {"promoted": 1, "dropped": 1}
        notes = [b for b in memory.iter_blocks() if b.kind == "note"]
        assert [n.text for n in notes] == ["민지 생일은 5월 9일"]
        assert notes[0].metadata["promoted_from"]["layer"] == "stm"
        assert [e["text"] for e in memory.stm.entries()] == ["still fresh"]


def test_calibrated_defaults_keep_unrelated_slots_out(tmp_path):
    """With the shipped thresholds a query unrelated to every slot never searches a radius."""
    with Memory(tmp_path / "d.db") as memory:
        assert memory.settings.checkpoint_stage == 2
        for text in TURNS:
            memory.remember(text, scope={"channel": "c"})
        memory.search("보리 사진", 3, scope={"channel": "c"})
        qv = memory.embedder.embed_query("quarterly tax filing deadline for corporations")
        local = memory.localized.search(memory.working.slots(Scope(channel="c")), qv, 5, memory.indexes)
        assert local == []


def test_slots_and_checkpoints_survive_reopen(tmp_path):
    path = tmp_path / "r.db"
    with Memory(path, **SEED) as memory:
        for text in TURNS:
            memory.remember(text, scope={"channel": "c"})
        memory.search("보리 사진", 3, scope={"channel": "c"})
        before = {s.slot_id: [c.block_index for c in memory.checkpoints.get(s)]
                  for s in memory.working.slots(Scope(channel="c"))}
    assert any(before.values())
    with Memory(path, **SEED) as memory:
        after = {s.slot_id: [c.block_index for c in memory.checkpoints.get(s)]
                 for s in memory.working.slots(Scope(channel="c"))}
        assert after == before
        slot = next(s for s in memory.working.slots(Scope(channel="c")) if after[s.slot_id])
        assert memory.checkpoints.radius(slot, 2)  # the catalog is there to walk


def test_an_eviction_and_a_search_take_one_lock_in_one_order(tmp_path):
    """A bot's commit fed a full working memory, whose eviction writes to long-term memory, while a
    search of the same memory held the memory's lock and waited for working memory's: a deadlock.
    Here a search starts at the worst moment — inside the eviction's write — and both finish, because
    working memory locks with its memory's lock."""
    import threading
    import time

    with Memory(tmp_path / "d.db", wm_slots=1) as memory:
        scope = Scope("g", "c")
        assert memory.working._lock is memory._lock
        memory.remember("지훈: 안녕, 오늘 뭐 해?", scope={"guild": "g", "channel": "c"}, speaker="지훈")
        memory.working.add(scope, "민지 생일은 5월 9일", importance=0.2)  # unstored: its eviction writes
        write_note = memory.layers.write_note
        searched: list[int] = []

        def search() -> None:
            searched.append(len(memory.search("민지 생일", scope={"guild": "g", "channel": "c"}).hits))

        def write_during_a_search(*args, **kwargs):
            searcher = threading.Thread(target=search, daemon=True)
            searcher.start()
            time.sleep(0.3)  # the search is under way, waiting for the lock the eviction holds
            return write_note(*args, **kwargs)

        memory.layers.write_note = write_during_a_search
        evict = threading.Thread(target=lambda: memory.working.add(scope, "new context", importance=0.9), daemon=True)
        evict.start()
        evict.join(20)
        assert not evict.is_alive(), "the eviction's write deadlocked against a search"
        deadline = time.monotonic() + 20
        while not searched and time.monotonic() < deadline:
            time.sleep(0.05)
        assert searched, "the search never finished"
        assert [b.text for b in memory.iter_blocks() if b.kind == "note"] == ["민지 생일은 5월 9일"]
