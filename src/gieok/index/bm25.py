"""In-memory BM25 over the same tokens FTS5 stores, for search at chat latency.

FTS5 must score every document that contains any query term (it has no top-k pruning);
on 100k short chat messages with a small shared vocabulary that is several milliseconds
per query. Here each term's postings are numpy arrays and a query is a handful of
vectorised gathers. FTS5 stays the durable copy: this index is rebuilt from it on open
and grows with every add, exactly like the vector index. Scores use the FTS5 / Lucene
BM25 formula with FTS5's constants (k1 = 1.2, b = 0.75, idf floored at 1e-6), so the
two engines rank alike.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from typing import Any

import numpy as np

from ..text.dates import mentions_time

__all__ = ["BM25Index", "best_first", "hangul_share"]

_HANGUL = re.compile(r"[\uac00-\ud7a3]")
_LATIN = re.compile(r"[a-z]")


def hangul_share(tokens: list[str]) -> float:
    """Hangul tokens / (Hangul + Latin tokens): which language a document is written in, as the
    ranker sees it (0.5 when it has neither, e.g. only numbers or emoji)."""
    hangul = latin = 0
    for token in tokens:
        if _HANGUL.match(token):
            hangul += 1
        elif _LATIN.match(token):
            latin += 1
    return hangul / (hangul + latin) if hangul + latin else 0.5


class _Postings:
    __slots__ = ("rows", "size", "tf")

    def __init__(self) -> None:
        self.rows = np.empty(4, dtype=np.int64)
        self.tf = np.empty(4, dtype=np.float32)
        self.size = 0

    def extend(self, rows: list[int], tfs: list[int]) -> None:
        need = self.size + len(rows)
        if need > self.rows.shape[0]:
            capacity = max(need, self.rows.shape[0] * 2)
            grown_rows = np.empty(capacity, dtype=np.int64)
            grown_tf = np.empty(capacity, dtype=np.float32)
            grown_rows[: self.size] = self.rows[: self.size]
            grown_tf[: self.size] = self.tf[: self.size]
            self.rows, self.tf = grown_rows, grown_tf
        self.rows[self.size : need] = rows
        self.tf[self.size : need] = tfs
        self.size = need


class BM25Index:
    """BM25 over numpy postings per term, loaded from FTS5 when a memory opens and grown with
    every add, scored with FTS5's own constants and, by default, the searched scope's statistics."""

    def __init__(self, k1: float = 1.2, b: float = 0.75, scoped_statistics: bool = True) -> None:
        self.k1 = k1
        self.b = b
        self.scoped_statistics = scoped_statistics
        self._postings: dict[str, _Postings] = {}
        self._doc_len = np.zeros(1024, dtype=np.float32)
        self._hangul = np.full(1024, 0.5, dtype=np.float32)
        self._time = np.zeros(1024, dtype=bool)
        self._size = 0
        self._total_len = 0.0
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return self._size

    def extend(self, rows: list[int], token_lists: list[list[str]]) -> None:
        """Index documents at catalog `rows` (rows grow monotonically; gaps are empty docs)."""
        with self._lock:
            top = max(rows) + 1 if rows else self._size
            if top > self._doc_len.shape[0]:
                capacity = max(top, self._doc_len.shape[0] * 2)
                grown = np.zeros(capacity, dtype=np.float32)
                grown[: self._size] = self._doc_len[: self._size]
                self._doc_len = grown
                grown = np.full(capacity, 0.5, dtype=np.float32)
                grown[: self._size] = self._hangul[: self._size]
                self._hangul = grown
                grown_time = np.zeros(capacity, dtype=bool)
                grown_time[: self._size] = self._time[: self._size]
                self._time = grown_time
            batch: dict[str, tuple[list[int], list[int]]] = {}
            for row, tokens in zip(rows, token_lists):
                self._doc_len[row] = len(tokens)
                self._hangul[row] = hangul_share(tokens)
                self._time[row] = mentions_time(tokens)
                self._total_len += len(tokens)
                for term, count in Counter(tokens).items():
                    entry = batch.get(term)
                    if entry is None:
                        entry = batch[term] = ([], [])
                    entry[0].append(row)
                    entry[1].append(count)
            for term, (term_rows, tfs) in batch.items():
                postings = self._postings.get(term)
                if postings is None:
                    postings = self._postings[term] = _Postings()
                postings.extend(term_rows, tfs)
            self._size = max(self._size, top)

    def doc_lengths(self, rows: np.ndarray) -> np.ndarray:
        """Token counts of `rows` (0 for a row never indexed or forgotten)."""
        return self._per_row("_doc_len", rows, 0.0, np.float32)

    def time_mentions(self, rows: np.ndarray) -> np.ndarray:
        """`mentions_time` of each row's tokens (False for a row never indexed)."""
        return self._per_row("_time", rows, False, bool)

    def hangul_shares(self, rows: np.ndarray) -> np.ndarray:
        """`hangul_share` of each row's tokens (0.5 for a row never indexed)."""
        return self._per_row("_hangul", rows, 0.5, np.float32)

    def _per_row(self, column: str, rows: np.ndarray, missing: float | bool, dtype: Any) -> np.ndarray:
        """The per-row array named `column` read at `rows`, `missing` where a row was never
        indexed. Looked up under the lock: `add` replaces the arrays when it grows them."""
        with self._lock:
            rows = np.asarray(rows, dtype=np.int64)
            inside = rows < self._size
            out = np.full(rows.shape[0], missing, dtype=dtype)
            out[inside] = getattr(self, column)[rows[inside]]
            return out

    def remove(self, row: int) -> None:
        """A forgotten document stops counting toward lengths; `alive` masks its postings."""
        with self._lock:
            if row < self._size:
                self._total_len -= float(self._doc_len[row])
                self._doc_len[row] = 0.0

    def search(self, tokens: list[str], k: int, alive: np.ndarray,
               rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (rows, scores) among live documents, or among `rows` when given."""
        with self._lock:
            n = self._size
            terms = [t for t in dict.fromkeys(tokens) if t in self._postings]
            if not terms or n == 0 or k <= 0:
                return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
            doc_len = self._doc_len[:n]
            in_scope = None
            if rows is not None and self.scoped_statistics:
                # Statistics of the searched scope, not the whole store: one conversation's
                # words should not be down-weighted because other channels use them a lot.
                in_scope = np.zeros(n, dtype=bool)
                in_scope[rows[alive[rows]]] = True
                live = max(1, int(in_scope.sum()))
                avgdl = max(1e-9, float(doc_len[in_scope].sum()) / live)
            else:
                live = max(1, int(alive[:n].sum()))
                avgdl = max(1e-9, self._total_len / live)
            scores = np.zeros(n, dtype=np.float32)
            for term in terms:
                postings = self._postings[term]
                p_rows = postings.rows[: postings.size]
                tf = postings.tf[: postings.size]
                # forgotten documents keep their postings (masked by `alive`): they must not count,
                # or a term in every live document gets df > N and a negative log argument
                counted = alive if in_scope is None else in_scope
                df = int(np.count_nonzero(counted[p_rows]))
                idf = max(1e-6, math.log((live - df + 0.5) / (df + 0.5)))  # as FTS5 computes it
                norm = tf + self.k1 * (1.0 - self.b + self.b * doc_len[p_rows] / avgdl)
                scores[p_rows] += (idf * (self.k1 + 1.0)) * tf / norm
        if rows is not None:
            candidate_scores = scores[rows]
            keep = (candidate_scores > 0) & alive[rows]
            cand_rows, cand_scores = rows[keep], candidate_scores[keep]
        else:
            touched = np.flatnonzero(scores)
            touched = touched[alive[touched]]
            cand_rows, cand_scores = touched, scores[touched]
        return best_first(cand_rows, cand_scores, k)


def best_first(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best (rows, scores), best first; among documents tied at the cut, the oldest
    (lowest rows), as the SQL BM25s order them (`ORDER BY score DESC, block_index`): argpartition
    alone would keep an arbitrary few of them, and equal-length turns sharing one word tie often."""
    if rows.shape[0] > k:
        cut = scores[np.argpartition(-scores, k - 1)[k - 1]]
        above = np.flatnonzero(scores > cut)
        tied = np.flatnonzero(scores == cut)
        tied = tied[np.argsort(rows[tied], kind="stable")[: k - above.shape[0]]]
        top = np.concatenate([above, tied])
        rows, scores = rows[top], scores[top]
    order = np.lexsort((rows, -scores))
    return rows[order].astype(np.int64), scores[order]
