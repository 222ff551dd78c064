"""The in-process BM25 index keeps, among documents tied at its cut, the oldest ones — the order
the SQL BM25s use (`ORDER BY score DESC, block_index`) — so both PostgreSQL modes and SQLite's
index agree on which of equal turns a search reaches (test_pg_database_index found a seven-way
tie at a score of 1.04 on LoCoMo: equal-length turns sharing one word)."""

from __future__ import annotations

import numpy as np

from gieok.index.bm25 import BM25Index


def test_ties_at_the_cut_keep_the_oldest_documents() -> None:
    index = BM25Index()
    docs = [["고양이", "사진"], ["강아지", "산책"], *[["고양이", "밥"] for _ in range(7)], ["고양이", "고양이", "그림"]]
    index.extend(list(range(len(docs))), docs)
    alive = np.ones(len(docs), dtype=bool)
    rows, scores = index.search(["고양이"], 4, alive)
    assert rows.tolist()[0] == 9, "the document with the word twice ranks first"
    assert rows.tolist()[1:] == [0, 2, 3], "then the oldest of the eight tied ones"
    assert len(set(scores[1:].round(9).tolist())) == 1
    everything, _ = index.search(["고양이"], 20, alive)
    assert everything.tolist() == [9, 0, 2, 3, 4, 5, 6, 7, 8]
    scoped, _ = index.search(["고양이"], 2, alive, rows=np.array([8, 7, 6, 5, 4]))
    assert scoped.tolist() == [4, 5], "within a scope too"
