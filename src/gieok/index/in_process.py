"""The `SearchIndex` answered from arrays in the process: the catalog (filters, neighbours), the
vector matrix (exact, or its HNSW graph) and the BM25 postings — what SQLite always uses, and
PostgreSQL with `pg_index = "memory"`. Ids are catalog rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.base import BlockStore, BM25Filter
from .bm25 import BM25Index
from .catalog import Catalog
from .search_index import (
    BothFound,
    CandidateFacts,
    NeighbourLinks,
    ScopedNeighbours,
    one_after_the_other,
)
from .vector import VectorIndex

__all__ = ["InProcessIndex"]


class _InProcessScope:
    def __init__(self, index: InProcessIndex, filt: BM25Filter) -> None:
        self.index = index
        self.filt = filt
        catalog = index.catalog
        self.rows = catalog.candidate_rows(filt.scope, filt.kinds, filt.since, filt.until)

    def bm25(self, tokens: list[str], limit: int) -> tuple[np.ndarray, np.ndarray]:
        index = self.index
        if index.bm25 is not None:
            return index.bm25.search(tokens, limit, index.catalog.alive(), self.rows)
        # bm25_engine = "fts5": the store scores in SQL (its statistics are the whole store's)
        pairs = [(row, score) for row, score in
                 ((index.catalog.row_of(bi), score) for bi, score in index.store.bm25(tokens, self.filt, limit))
                 if row is not None]
        return (np.asarray([r for r, _ in pairs], dtype=np.int64),
                np.asarray([s for _, s in pairs], dtype=np.float64))

    def nearest(self, query: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.vectors.search(query, limit, self.rows, self.index.catalog.alive())

    def both(self, tokens: list[str], query: np.ndarray, limit: int) -> BothFound:
        return one_after_the_other(self, tokens, query, limit)

    def neighbours(self, ids: np.ndarray, window: int) -> ScopedNeighbours:
        source_at, targets, distance = self.index.neighbour_ids(ids, window)
        f = self.filt
        return source_at, targets, distance, self.index.catalog.passes_many(targets, f.scope, f.kinds, f.since, f.until)


class InProcessIndex:
    """Catalog, vectors and (unless `bm25_engine = "fts5"`) BM25 postings of one memory."""

    def __init__(self, catalog: Catalog, vectors: VectorIndex, bm25: BM25Index | None, store: BlockStore) -> None:
        self.catalog = catalog
        self.vectors = vectors
        self.bm25 = bm25
        self.store = store

    @property
    def text_features(self) -> bool:
        return self.bm25 is not None

    def scoped(self, filt: BM25Filter) -> _InProcessScope:
        return _InProcessScope(self, filt)

    def neighbour_ids(self, ids: np.ndarray, window: int) -> NeighbourLinks:
        return self.catalog.neighbour_rows(ids, window)

    def facts(self, ids: np.ndarray) -> CandidateFacts:
        catalog, bm25 = self.catalog, self.bm25
        n = ids.shape[0]
        return CandidateFacts(
            sequence_keys=catalog.sequence_keys(ids),
            speaker_codes=catalog.speaker_codes(ids),
            speaker_names=catalog.speakers.values,
            event_time=catalog.event_time(ids),
            importance=catalog.importance(ids),
            doc_lengths=bm25.doc_lengths(ids) if bm25 is not None else np.zeros(n, dtype=np.float32),
            hangul_shares=bm25.hangul_shares(ids) if bm25 is not None else np.full(n, 0.5, dtype=np.float32),
            time_mentions=bm25.time_mentions(ids) if bm25 is not None else np.zeros(n, dtype=bool),
        )

    def block_indices(self, ids: np.ndarray) -> np.ndarray:
        return self.catalog.block_index_of(ids)

    # -- by block index ---------------------------------------------------------------------------
    def neighbours_of(self, block_index: int, window: int) -> list[tuple[int, int]]:
        row = self.catalog.row_of(block_index)
        if row is None:
            return []
        pairs = self.catalog.neighbours(row, window)
        indices = self.catalog.block_index_of(np.asarray([r for r, _ in pairs], dtype=np.int64)).tolist()
        return [(int(bi), d) for bi, (_, d) in zip(indices, pairs)]

    def live_among(self, block_indices: Sequence[int], filt: BM25Filter | None) -> list[int]:
        catalog = self.catalog
        alive = catalog.alive()
        out = []
        for block_index in block_indices:
            row = catalog.row_of(block_index)
            if row is None:
                continue
            if filt is not None:
                if catalog.passes(row, filt.scope, filt.kinds, filt.since, filt.until):
                    out.append(block_index)
            elif alive[row]:
                out.append(block_index)
        return out

    def vectors_of(self, block_indices: Sequence[int]) -> dict[int, np.ndarray]:
        out = {}
        for block_index in block_indices:
            row = self.catalog.row_of(block_index)
            if row is not None:
                out[int(block_index)] = self.vectors.matrix[row]
        return out

    def last_turns(self, channel: str, n: int) -> list[int]:
        return self.catalog.last_turns(channel, n)
