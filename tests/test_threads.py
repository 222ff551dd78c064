"""Concurrency: many threads on one Memory, and two Memory objects (two "processes") on one file."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from gieok import Memory, SearchResult

WRITERS = 8
PER_WRITER = 25
CHANNELS = 4  # two writers share each channel, so their positions interleave
GROUPS = [1, 1, 5, 1, 1, 5, 1, 1, 5, 1, 1, 1, 1]  # single adds and add_many batches; sums to 25
assert sum(GROUPS) == PER_WRITER


def _text(writer: int, i: int) -> str:
    return f"writer {writer} message {i}: 스레드 {writer}의 {i}번째 메시지, topic {i % 5}"


def _run(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a thread hung"


def _guarded(errors: list[BaseException], fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)
    return run


@pytest.mark.slow
def test_eight_writers_and_concurrent_readers(memory: Memory) -> None:
    memory.add("warm-up 준비", scope={"channel": "warmup"})  # loads the model before the race
    errors: list[BaseException] = []
    written: dict[int, list] = defaultdict(list)
    start = threading.Barrier(WRITERS + 2)  # 8 writers and 2 readers start together
    writers_done = threading.Event()
    searches: list[SearchResult] = []

    def writer(w: int) -> None:
        scope = {"guild": "g", "channel": f"ch{w % CHANNELS}", "user": f"u{w}"}
        start.wait()
        i = 0
        for size in GROUPS:
            if size == 1:
                written[w].append(memory.add(_text(w, i), scope=scope, speaker=f"u{w}"))
            else:
                items = [{"text": _text(w, i + j), "scope": scope, "speaker": f"u{w}"} for j in range(size)]
                written[w].extend(memory.add_many(items))
            i += size

    def reader(r: int) -> None:
        start.wait()
        queries = ["스레드 메시지", "writer message topic 3", "3번째 메시지", "warm-up"]
        n = 0
        while not writers_done.is_set() or n < 4:
            q = queries[n % len(queries)]
            mode = ("hybrid", "bm25", "vector")[n % 3]
            scope = {"channel": f"ch{n % CHANNELS}"} if n % 2 else None
            searches.append(memory.search(q, k=20, mode=mode, scope=scope))
            n += 1
            # A breath between searches: a loop that never lets go of the GIL starves the writers
            # (~230,000 searches, mostly answered from the cache, and 30 s for 200 writes); this way
            # the readers still search thousands of times while the writes go on.
            time.sleep(0.001)

    threads = [threading.Thread(target=_guarded(errors, lambda w=w: writer(w))) for w in range(WRITERS)]
    readers = [threading.Thread(target=_guarded(errors, lambda r=r: reader(r))) for r in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join(timeout=300)
    writers_done.set()
    for t in readers:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads + readers), "a thread hung"
    assert errors == []

    total = 1 + WRITERS * PER_WRITER
    assert len(memory) == total
    blocks = list(memory.iter_blocks())
    assert [b.block_index for b in blocks] == list(range(1, total + 1))
    report = memory.verify()
    assert report.ok and report.checked == total

    # every write landed exactly once, with the text it was given
    expected_texts = {_text(w, i) for w in range(WRITERS) for i in range(PER_WRITER)}
    assert {b.text for b in blocks[1:]} == expected_texts
    for w, mine in written.items():
        assert [b.text for b in mine] == [_text(w, i) for i in range(PER_WRITER)]
        indices = [b.block_index for b in mine]
        assert indices == sorted(indices)

    # positions are contiguous per channel, in block order
    by_channel: dict[str, list[int]] = defaultdict(list)
    for b in blocks:
        by_channel[b.scope.channel].append(b.conv_pos)
    for channel in (f"ch{c}" for c in range(CHANNELS)):
        assert by_channel[channel] == list(range(1, 2 * PER_WRITER + 1)), channel

    # the in-memory indexes saw every concurrent write: all 50 turns of a channel are vector candidates
    for c in range(CHANNELS):
        channel = f"ch{c}"
        result = memory.search("메시지 message", k=100, mode="vector", scope={"channel": channel})
        assert {h.block.block_index for h in result} == {b.block_index for b in blocks if b.scope.channel == channel}

    # and the concurrent searches returned well-formed results throughout
    assert len(searches) >= 8
    for result in searches:
        for hit in result:
            assert 1 <= hit.block.block_index <= total and hit.block.text


def test_two_memories_on_one_file_see_each_other(db_path: Path) -> None:
    a = Memory(db_path)
    b = None
    try:
        a.add("첫 인사: 안녕하세요", scope={"channel": "c"})  # creates the file and records the embedder
        b = Memory(db_path)

        cat = a.add("민지는 고양이를 키워", scope={"channel": "c"})
        hits = b.search("민지가 키우는 고양이", mode="bm25").hits
        assert hits and hits[0].block == cat
        top = b.search("민지가 키우는 고양이", k=3).hits[0]
        assert top.block == cat and top.breakdown.vector_rank is not None  # b's vector index caught up
        assert len(b) == 2

        puppy = b.add("Alice adopted a puppy named Max", scope={"channel": "c"})
        assert puppy.block_index == 3 and puppy.conv_pos == 3 and puppy.prev_hash == cat.hash
        assert a.search("puppy named Max", k=1).hits[0].block == puppy

        # a writes again after b: it must notice b's block before appending its own
        more = a.add_many([{"text": "고양이 이름은 나비야", "scope": {"channel": "c"}}])
        assert more[0].block_index == 4 and more[0].conv_pos == 4
        # a's indexes hold b's block too, in vector mode as well
        assert puppy.block_index in {h.block.block_index for h in a.search("dog", k=10, mode="vector")}

        assert a.forget(cat.block_index) == [cat.block_index]
        assert b.get(cat.block_index).forgotten
        for mode in ("bm25", "vector", "hybrid"):
            got = {h.block.block_index for h in b.search("민지가 키우는 고양이", k=10, mode=mode)}
            assert cat.block_index not in got, mode

        assert a.verify().ok and b.verify().ok
        assert a.stats().as_dict() | {"file_bytes": 0} == b.stats().as_dict() | {"file_bytes": 0}
    finally:
        a.close()
        if b is not None:
            b.close()


def test_two_memories_writing_concurrently(db_path: Path) -> None:
    with Memory(db_path) as first:
        first.add("setup", scope={"channel": "shared"})
        with Memory(db_path) as second:
            errors: list[BaseException] = []

            def write(memory: Memory, name: str) -> None:
                for i in range(10):
                    memory.add(f"{name} line {i} 줄", scope={"channel": "shared"})

            _run([threading.Thread(target=_guarded(errors, lambda m=m, n=n: write(m, n)))
                  for m, n in ((first, "first"), (second, "second"))])
            assert errors == []
            for memory in (first, second):
                assert len(memory) == 21
                assert memory.verify().ok
            blocks = list(first.iter_blocks())
            assert [b.conv_pos for b in blocks] == list(range(1, 22))
            texts = {b.text for b in blocks}
            assert {f"{n} line {i} 줄" for n in ("first", "second") for i in range(10)} <= texts
            # both in-memory indexes hold all 21 blocks
            for memory in (first, second):
                got = memory.search("line 줄", k=50, mode="vector", scope={"channel": "shared"})
                assert len(got) == 21


def test_two_memories_opened_on_a_fresh_file(db_path: Path) -> None:
    a = Memory(db_path)
    b = Memory(db_path)  # both open before anything is written
    try:
        block = a.add("민지는 고양이를 키워")
        assert b.search("고양이").hits[0].block == block
    finally:
        a.close()
        b.close()


class _GatedEmbedder:
    """The real embedder, but a query waits for `gate` first: the test holds a search in the
    middle of its embedding to see what else can run meanwhile."""

    def __init__(self, inner: object, gate: threading.Event, waiting: threading.Event) -> None:
        self.inner, self.gate, self.waiting = inner, gate, waiting
        self.name, self.dimension = inner.name, inner.dimension  # type: ignore[attr-defined]

    def embed_passages(self, texts):  # type: ignore[no-untyped-def]
        return self.inner.embed_passages(texts)  # type: ignore[attr-defined]

    def embed_queries(self, texts):  # type: ignore[no-untyped-def]
        self.waiting.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return self.inner.embed_queries(texts)  # type: ignore[attr-defined]


def test_a_search_waiting_for_its_query_vector_holds_nobody_else(memory: Memory) -> None:
    """Embedding a query takes the engine ~15 ms; meanwhile other threads' writes and searches
    must go on (the server serves many clients from one memory)."""
    memory.add_many(["민지는 고양이 나비를 키워", "준호는 주말마다 등산을 가", "Alex got the offer from Nuvola Labs"])
    gate, waiting = threading.Event(), threading.Event()
    real = memory.embedder.inner
    memory.embedder.inner = _GatedEmbedder(real, gate, waiting)  # type: ignore[assignment]
    found: dict[str, SearchResult] = {}
    searcher = threading.Thread(target=lambda: found.setdefault("r", memory.search("민지가 키우는 고양이", 2)))
    searcher.start()
    try:
        assert waiting.wait(30), "the search never asked for its vector"
        # this write would wait for a lock the gated search held
        added = memory.add("서연은 다음 달에 부산으로 이사 가", scope={"channel": "general"})
        other = memory.search("Nuvola", 1, mode="bm25")
        assert added.block_index == 4 and other.hits[0].block.text.startswith("Alex")
        assert searcher.is_alive(), "the gated search finished early: nothing was tested"
    finally:
        gate.set()
        searcher.join(60)
        memory.embedder.inner = real
    assert found["r"].hits[0].block.text == "민지는 고양이 나비를 키워"
