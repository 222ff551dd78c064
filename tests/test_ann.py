"""The HNSW path: built past the threshold, agrees with exact search, honours filters and
forgets, and is saved beside the file so a reopen loads instead of rebuilding."""

from __future__ import annotations

import numpy as np
import pytest

import gieok.index.vector as vector_module
from gieok import Memory

TEXTS = [
    f"{speaker}: {topic} 얘기 {i}번째 — talking about {topic} again ({i})"
    for i, (speaker, topic) in enumerate(
        (s, t) for s in ("민지", "Alex", "지훈", "Emily")
        for t in ("고양이", "deploy", "부산 여행", "birthday", "coffee")
    )
]


@pytest.mark.parametrize("backend", ["faiss", "usearch"])
def test_ann_matches_exact_and_survives_reopen(tmp_path, backend, monkeypatch):
    path = tmp_path / f"{backend}.db"
    items = [{"text": t, "scope": {"channel": "a" if i % 2 else "b"}} for i, t in enumerate(TEXTS)]
    with Memory(path, ann_threshold=8, ann_backend=backend) as memory:
        memory.add_many(items)
        assert memory.vectors is not None and memory.vectors.kind == f"{backend}-hnsw"
        alive = memory.catalog.alive()
        for query in ("고양이 이야기", "deployment plans", "birthday party"):
            qv = memory.embedder.embed_query(query)
            approx, _ = memory.vectors.search(qv, 5, None, alive)
            exact, _ = memory.vectors.exact(qv, 5, None, alive)
            assert set(approx.tolist()) == set(exact.tolist())

        # filtered search through the graph (force it by lowering the exact-subset cut-off)
        monkeypatch.setattr(vector_module, "EXACT_SUBSET_MAX", 0)
        hits = memory.search("고양이", 5, scope={"channel": "a"}, mode="vector").hits
        assert hits and all(h.block.scope.channel == "a" for h in hits)

        victim = memory.search("고양이 얘기", 1, mode="vector").hits[0].block.block_index
        memory.forget(victim)
        after = memory.search("고양이 얘기", 10, mode="vector").hits
        assert victim not in [h.block.block_index for h in after]

    sidecar = path.with_name(path.name + ".hnsw")
    assert sidecar.is_file()
    with Memory(path, ann_threshold=8, ann_backend=backend) as memory:
        assert memory.vectors is not None and memory.vectors.kind == f"{backend}-hnsw"
        assert victim not in [h.block.block_index for h in memory.search("고양이 얘기", 10, mode="vector").hits]
        if backend == "faiss":
            import faiss

            saved = faiss.read_index(str(sidecar))
            row = memory.catalog.row_of(victim)
            assert np.count_nonzero(saved.reconstruct(row)) == 0  # the erased vector is not on disk
        memory.add("민지: 새 고양이 사진 보여줄게")
        assert memory.vectors.kind == f"{backend}-hnsw"
        assert memory.search("새 고양이 사진", 1).hits[0].block.text.startswith("민지: 새 고양이")


def test_damaged_sidecar_is_rebuilt(tmp_path):
    path = tmp_path / "m.db"
    with Memory(path, ann_threshold=8) as memory:
        memory.add_many(TEXTS)
    sidecar = path.with_name(path.name + ".hnsw")
    sidecar.write_bytes(b"garbage")
    with Memory(path, ann_threshold=8) as memory:
        assert memory.vectors is not None and memory.vectors.kind == "faiss-hnsw"
        assert len(memory.search("coffee", 3).hits) == 3


def test_two_processes_saving_the_graph_at_once_both_save_it(tmp_path, monkeypatch):
    """`gieok serve --workers 2` on one SQLite file: both workers hold a graph and save it when they
    stop. The second's save runs while the first's is half done (its temporary file written, not
    yet moved into place); both must finish, and the graph on disk must load."""
    import os

    path = tmp_path / "m.db"
    with Memory(path, ann_threshold=8) as memory:
        memory.add_many(TEXTS[:12])
    first, second = Memory(path, ann_threshold=8), Memory(path, ann_threshold=8)
    first.add("민지: 첫 번째 워커가 쓴 고양이 이야기")
    second.add("Alex: the second worker's coffee story")
    real_save = vector_module._FaissHNSW.save
    calls: list[str] = []

    def save_with_the_other_midway(ann, target):
        real_save(ann, target)
        calls.append(target.name)
        if len(calls) == 1:
            monkeypatch.setattr(os, "getpid", lambda: 424242)  # the other worker is another process
            second.close()

    monkeypatch.setattr(vector_module._FaissHNSW, "save", save_with_the_other_midway)
    with pytest.MonkeyPatch.context() as warnings_off:
        records: list[str] = []
        warnings_off.setattr(vector_module.logging.getLogger("gieok.index"), "warning",
                             lambda message, *args: records.append(message % args))
        first.close()
    assert records == []  # neither save failed
    assert len(calls) == 2
    sidecar = path.with_name(path.name + ".hnsw")
    assert sidecar.is_file() and path.with_name(path.name + ".hnsw.json").is_file()
    assert not list(tmp_path.glob("*.tmp"))
    monkeypatch.undo()
    with Memory(path, ann_threshold=8) as memory:
        assert memory.vectors is not None and memory.vectors.kind == "faiss-hnsw"
        texts = [h.block.text for h in memory.search("고양이 이야기 coffee story", 20).hits]
        assert "민지: 첫 번째 워커가 쓴 고양이 이야기" in texts and "Alex: the second worker's coffee story" in texts


def test_a_worker_that_stops_after_another_forgot_a_block_does_not_save_its_vector_again(tmp_path):
    """Two processes of one SQLite file, each with its graph in memory: one forgets a block and
    stops; the other, which had not read since, stops after it. The graph it leaves on disk must not
    hold the forgotten vector ("erasure reaches every copy")."""
    import faiss

    path = tmp_path / "m.db"
    with Memory(path, ann_threshold=8) as memory:
        memory.add_many(TEXTS)
        victim = memory.search("고양이 얘기", 1, mode="vector").hits[0].block.block_index
    forgetting, stale = Memory(path, ann_threshold=8), Memory(path, ann_threshold=8)
    stale.add("Alex: one more coffee, so this worker's graph has something to save")
    row = stale.catalog.row_of(victim)
    forgetting.forget(victim)
    forgetting.close()
    stale.close()
    saved = faiss.read_index(str(path.with_name(path.name + ".hnsw")))
    assert np.count_nonzero(saved.reconstruct(row)) == 0


def test_a_graph_that_cannot_be_checked_against_the_store_is_not_left_on_disk(tmp_path, monkeypatch, caplog):
    from gieok.errors import StoreError

    path = tmp_path / "m.db"
    with Memory(path, ann_threshold=8) as memory:
        memory.add_many(TEXTS)
    sidecar = path.with_name(path.name + ".hnsw")
    assert sidecar.is_file()
    memory = Memory(path, ann_threshold=8)
    memory.add("Alex: a block, so there is a graph to save")

    def unreadable():
        raise StoreError("the database went away")

    monkeypatch.setattr(memory.store, "forgotten_indices", unreadable)
    with caplog.at_level("WARNING", logger="gieok.index"):
        memory.close()
    assert "the database went away" in caplog.text and not sidecar.exists()
    monkeypatch.undo()
    with Memory(path, ann_threshold=8) as memory:  # rebuilt
        assert memory.vectors is not None and memory.vectors.kind == "faiss-hnsw"
        assert memory.search("a block, so there is a graph", 1).hits[0].block.text.startswith("Alex: a block")


def test_an_erasure_then_a_close_leaves_no_erased_vector_in_the_saved_graph(tmp_path):
    """The graph saved beside the file, then a user's turn erased (its neighbour embedded again
    without it) and the memory closed before any search: the graph on disk holds neither the
    erased vector nor the neighbour's old one. (The graph used to be dropped by the neighbour's new
    vector and not saved, so the earlier file stayed, both in it.)"""
    import faiss

    path = tmp_path / "m.db"
    with Memory(path, ann_threshold=8) as memory:
        blocks = [memory.add(t, scope={"channel": "c"}, event_time=1_700_000_000 + 60 * i) for i, t in enumerate(TEXTS)]
    victim = blocks[3].block_index
    with Memory(path, ann_threshold=8) as memory:
        old = memory.vectors.matrix[memory.catalog.row_of(victim + 1)].copy()
        erased, redone = memory.forget_with_neighbours([victim])
        assert erased == [victim] and redone == [victim + 1]
        new = memory.vectors.matrix[memory.catalog.row_of(victim + 1)].copy()
        rows = memory.catalog.row_of(victim), memory.catalog.row_of(victim + 1)
        assert memory.vectors.kind == "faiss-hnsw"  # the graph is kept, not dropped to be built again
    saved = faiss.read_index(str(path.with_name(path.name + ".hnsw")))
    assert np.count_nonzero(saved.reconstruct(rows[0])) == 0
    np.testing.assert_allclose(saved.reconstruct(rows[1]), new, rtol=1e-6)
    assert not np.allclose(old, new)


def test_another_process_takes_a_neighbour_embedded_again_and_saves_only_that(tmp_path):
    """Two processes of one file (`--workers 2`): one erases a turn, and its neighbour is embedded
    again without it. The other, at its next read, searches with the new vector; and a process
    that has not read since saves, when it stops, the new vector and not the one made with the
    erased words."""
    import faiss

    path = tmp_path / "m.db"
    with Memory(path, ann_threshold=8) as memory:
        blocks = [memory.add(t, scope={"channel": "c"}, event_time=1_700_000_000 + 60 * i) for i, t in enumerate(TEXTS)]
    victim = blocks[3].block_index
    erasing, reading, stale = (Memory(path, ann_threshold=8) for _ in range(3))
    reading.search("고양이", 3)
    row = reading.catalog.row_of(victim + 1)
    held = reading.vectors.matrix[row].copy()
    erasing.forget_with_neighbours([victim])
    new = erasing.vectors.matrix[row].copy()
    erasing.close()
    assert not np.allclose(held, new)
    reading.search("고양이", 3)  # its next read
    np.testing.assert_allclose(reading.vectors.matrix[row], new, rtol=1e-6)
    reading.close()

    stale.add("Alex: one more coffee, so this worker's graph has something to save")
    stale.close()  # the last to write the graph
    saved = faiss.read_index(str(path.with_name(path.name + ".hnsw")))
    np.testing.assert_allclose(saved.reconstruct(row), new, rtol=1e-6)
    assert np.count_nonzero(saved.reconstruct(row - 1)) == 0  # the erased turn's own vector


def test_a_graph_saved_before_a_neighbour_was_embedded_again_takes_the_new_vector_when_loaded(tmp_path):
    """The process that erased a turn and embedded its neighbour again was killed before it could
    save its graph: the graph on disk is the one from before. The next open corrects it from the
    store — the erased vector zeroed, the neighbour's new vector in — and saves that."""
    import shutil

    import faiss

    path = tmp_path / "m.db"
    with Memory(path, ann_threshold=8) as memory:
        blocks = [memory.add(t, scope={"channel": "c"}, event_time=1_700_000_000 + 60 * i) for i, t in enumerate(TEXTS)]
    sidecar = path.with_name(path.name + ".hnsw")
    before = tmp_path / "before"
    before.mkdir()
    for file in (sidecar, sidecar.with_name(sidecar.name + ".json")):
        shutil.copy(file, before / file.name)
    victim = blocks[3].block_index
    with Memory(path, ann_threshold=8) as erasing:
        erasing.forget_with_neighbours([victim])
        row = erasing.catalog.row_of(victim + 1)
        new = erasing.vectors.matrix[row].copy()
    for file in before.iterdir():  # as if it had died before its close
        shutil.copy(file, tmp_path / file.name)
    assert not np.allclose(faiss.read_index(str(sidecar)).reconstruct(row), new)
    with Memory(path, ann_threshold=8) as memory:
        rows = memory.catalog.row_of(victim), memory.catalog.row_of(victim + 1)
        assert memory.vectors.kind == "faiss-hnsw"
        np.testing.assert_allclose(memory.vectors.matrix[rows[1]], new, rtol=1e-6)
    saved = faiss.read_index(str(sidecar))
    np.testing.assert_allclose(saved.reconstruct(rows[1]), new, rtol=1e-6)
    assert np.count_nonzero(saved.reconstruct(rows[0])) == 0
