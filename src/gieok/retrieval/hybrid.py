"""Hybrid ranking, written by hand because it is the core of the product.

1. BM25 over pre-tokenized text (FTS5) and cosine over embeddings each give a
   candidate list; both respect the same filters (scope, kinds, time range).
2. Fusion: reciprocal-rank (default; robust to score scales) or weighted scores.
3. Neighbour spreading: a conversation turn is often answered by the turn before or
   after it ("what did she adopt?" → "we got a puppy!" → "his name is Max"), so each
   candidate passes a share of its fused score to turns within ±window in the same
   channel's sequence.
4. Importance and recency are added as small, configurable terms.
Every hit keeps its score breakdown so a user can see why it ranked.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

import numpy as np

from ..config import Settings
from ..index.bm25 import BM25Index
from ..index.catalog import Catalog
from ..index.vector import VectorIndex
from ..store.base import BM25Filter, Store
from ..text.tokenize import Tokenizer
from ..types import Scope, ScoreBreakdown

__all__ = ["HybridRetriever", "RetrievalParams", "SearchRequest"]

MODES = ("hybrid", "bm25", "vector")


@dataclass(frozen=True)
class RetrievalParams:
    """The ranking knobs; their defaults and documentation live in `Settings`."""

    candidates: int
    fusion: str
    rrf_k: float
    bm25_weight: float
    vector_weight: float
    neighbour_weight: float
    neighbour_window: int
    recency_weight: float
    recency_half_life_days: float
    importance_weight: float

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> RetrievalParams:
        settings = settings or Settings()
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


@dataclass
class SearchRequest:
    query: str
    k: int = 10
    scope: Scope = field(default_factory=Scope)
    kinds: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    mode: str = "hybrid"
    neighbours: bool = True


class HybridRetriever:
    """Ranks blocks for a request: BM25 and vector candidates, fused, spread to neighbouring
    turns, plus importance and recency bonuses; every candidate keeps its score breakdown."""

    def __init__(self, store: Store, catalog: Catalog, vectors: VectorIndex, tokenizer: Tokenizer,
                 params: RetrievalParams, bm25: BM25Index | None = None) -> None:
        self.store = store
        self.bm25 = bm25
        self.catalog = catalog
        self.vectors = vectors
        self.tokenizer = tokenizer
        self.params = params

    def rank(self, request: SearchRequest, query_vector: np.ndarray | None,
             timings: dict[str, float] | None = None, slack: int = 0) -> list[tuple[int, ScoreBreakdown]]:
        """Return (block_index, breakdown) best first, at most request.k + slack (the caller
        may drop duplicates)."""
        p = self.params
        timings = timings if timings is not None else {}
        breakdowns: dict[int, ScoreBreakdown] = {}  # keyed by catalog row

        rows = self.catalog.candidate_rows(request.scope, request.kinds, request.since, request.until)
        limit = max(p.candidates, request.k)  # never fewer candidates than hits asked for
        if request.mode in ("hybrid", "bm25"):
            started = time.perf_counter()
            tokens = self.tokenizer.tokens(request.query)
            ranked_rows: Iterable[tuple[int | None, float]]
            if self.bm25 is not None:
                found, scores = self.bm25.search(tokens, limit, self.catalog.alive(), rows)
                ranked_rows = zip(found.tolist(), scores.tolist())
            else:
                filt = BM25Filter(request.scope, request.kinds, request.since, request.until)
                ranked_rows = ((self.catalog.row_of(bi), score) for bi, score in self.store.bm25(tokens, filt, limit))
            rank = 0
            for row, score in ranked_rows:
                if row is None:
                    continue
                rank += 1
                b = breakdowns.setdefault(row, ScoreBreakdown())
                b.bm25, b.bm25_rank = score, rank
            timings["bm25_ms"] = (time.perf_counter() - started) * 1000

        if request.mode in ("hybrid", "vector") and query_vector is not None:
            started = time.perf_counter()
            found, scores = self.vectors.search(query_vector, limit, rows, self.catalog.alive())
            for rank, (row, score) in enumerate(zip(found.tolist(), scores.tolist()), start=1):
                b = breakdowns.setdefault(row, ScoreBreakdown())
                b.vector, b.vector_rank = score, rank
            timings["vector_ms"] = (time.perf_counter() - started) * 1000

        if not breakdowns:
            return []
        started = time.perf_counter()
        self._fuse(breakdowns, request.mode)
        if request.neighbours and request.mode == "hybrid" and p.neighbour_weight > 0 and p.neighbour_window > 0:
            self._spread_to_neighbours(breakdowns, request)
        ranked = self._finalise(breakdowns)
        top = ranked[: request.k + slack]
        block_indices = self.catalog.block_index_of(np.asarray([row for row, _ in top], dtype=np.int64))
        timings["fuse_ms"] = (time.perf_counter() - started) * 1000
        return [(int(bi), b) for bi, (_, b) in zip(block_indices.tolist(), top)]

    # -- steps ------------------------------------------------------------------------------
    def _fuse(self, breakdowns: dict[int, ScoreBreakdown], mode: str) -> None:
        p = self.params
        wb = p.bm25_weight if mode != "vector" else 0.0
        wv = p.vector_weight if mode != "bm25" else 0.0
        if mode != "hybrid":
            wb, wv = (1.0, 0.0) if mode == "bm25" else (0.0, 1.0)
        if p.fusion == "rrf":
            for b in breakdowns.values():
                b.fused = (wb / (p.rrf_k + b.bm25_rank) if b.bm25_rank else 0.0) + (
                    wv / (p.rrf_k + b.vector_rank) if b.vector_rank else 0.0
                )
        else:
            bm25_max = max((b.bm25 for b in breakdowns.values()), default=0.0) or 1.0
            vecs = [b.vector for b in breakdowns.values() if b.vector_rank]
            v_lo, v_hi = (min(vecs), max(vecs)) if vecs else (0.0, 1.0)
            span = (v_hi - v_lo) or 1.0
            for b in breakdowns.values():
                nb = b.bm25 / bm25_max if b.bm25_rank else 0.0
                nv = (b.vector - v_lo) / span if b.vector_rank else 0.0
                b.fused = wb * nb + wv * nv

    def _spread_to_neighbours(self, breakdowns: dict[int, ScoreBreakdown], request: SearchRequest) -> None:
        p = self.params
        sources = sorted(breakdowns.items(), key=lambda item: -item[1].fused)[: p.candidates]
        for row, source in sources:
            for other, distance in self.catalog.neighbours(row, p.neighbour_window):
                target = breakdowns.get(other)
                if target is None:
                    if not self.catalog.passes(other, request.scope, request.kinds, request.since, request.until):
                        continue
                    target = breakdowns[other] = ScoreBreakdown()
                target.neighbour += p.neighbour_weight * source.fused / distance

    def _finalise(self, breakdowns: dict[int, ScoreBreakdown]) -> list[tuple[int, ScoreBreakdown]]:
        p = self.params
        top = max((b.fused + b.neighbour for b in breakdowns.values()), default=0.0) or 1.0
        rows = np.fromiter(breakdowns.keys(), dtype=np.int64, count=len(breakdowns))
        importance = self.catalog.importance(rows) if p.importance_weight else None
        recency = None
        if p.recency_weight:
            age_days = np.maximum(0.0, time.time() - self.catalog.event_time(rows)) / 86_400
            recency = np.power(0.5, age_days / max(p.recency_half_life_days, 1e-9))
        for i, b in enumerate(breakdowns.values()):
            b.final = (b.fused + b.neighbour) / top
            if importance is not None:
                b.importance = p.importance_weight * float(importance[i])
                b.final += b.importance
            if recency is not None:
                b.recency = p.recency_weight * float(recency[i])
                b.final += b.recency
            if not math.isfinite(b.final):
                b.final = 0.0
        return sorted(breakdowns.items(), key=lambda item: (-item[1].final, item[0]))
