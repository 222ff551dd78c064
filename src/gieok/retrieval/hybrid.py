"""Hybrid ranking, written by hand because it is the core of the product.

1. BM25 over pre-tokenized text (FTS5) and cosine over embeddings each give a
   candidate list; both respect the same filters (scope, kinds, time range).
2. Fusion: weighted scores (default: BM25 over the best BM25, cosine min-max scaled) or
   reciprocal rank.
3. Neighbour spreading: a conversation turn is often answered by the turn before or
   after it ("what did she adopt?" → "we got a puppy!" → "his name is Max"), so each
   candidate passes a share of its fused score to turns within ±window in the same
   channel's sequence (and the turns it reaches become candidates).
4. The learned ranker (ranker.py, setting `ranker = "learned"`, the default) scores every
   candidate from its features — both signals' scores and ranks, its neighbours' fused
   scores, its length, its speaker named in the query, a date the query names, the query's
   script — with weights trained on the dev sets. With `ranker = "fusion"` the fused score
   plus the neighbour shares rank instead.
5. Importance and recency are added as small, configurable terms.
Every hit keeps its score breakdown so a user can see why it ranked.

The candidates of one search travel as column arrays (`_Pool`), not one object each: a
search at 100k blocks has ~2 ms in all, and fusing, spreading and ranking ~200 candidates
must stay a fraction of it. Breakdown objects are made only for the hits returned.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, tzinfo

import numpy as np

from ..config import Settings
from ..index.search_index import CandidateFacts, ScopedSearch, SearchIndex
from ..store.base import BM25Filter
from ..text.expand import query_expander
from ..text.tokenize import Tokenizer
from ..types import Scope, ScoreBreakdown
from .ranker import FEATURES, LearnedRanker, candidate_features, display_scores, query_context

__all__ = ["HybridRetriever", "RankingCandidates", "RetrievalParams", "SearchRequest"]

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
    neighbour_sources: int
    recency_weight: float
    recency_half_life_days: float
    importance_weight: float

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> RetrievalParams:
        settings = settings or Settings()
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class RankingCandidates:
    """Every candidate of one hybrid search with its ranking features, for training the
    learned ranker: block indices, the (candidates × FEATURES) matrix, the first-stage score
    (fused + neighbour shares) each would have without the ranker."""

    block_indices: np.ndarray
    features: np.ndarray
    first_stage: np.ndarray
    names: tuple[str, ...] = FEATURES


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
    speaker_names: Mapping[str, str] = field(default_factory=dict)  # stored speaker → name (the ranker)


@dataclass
class _Pool:
    """The candidates of one search as columns; `rows` (the index's ids: catalog rows or block
    indices) ascending, ranks 0 where a signal did not find the row."""

    rows: np.ndarray
    bm25: np.ndarray
    bm25_rank: np.ndarray
    vector: np.ndarray
    vector_rank: np.ndarray
    fused: np.ndarray
    neighbour: np.ndarray

    @classmethod
    def of(cls, bm25_rows: np.ndarray, bm25_scores: np.ndarray, vector_rows: np.ndarray,
           vector_scores: np.ndarray) -> _Pool:
        """Each signal's results, best first, merged by row."""
        rows = np.union1d(bm25_rows, vector_rows).astype(np.int64)
        n = rows.shape[0]
        pool = cls(rows, np.zeros(n), np.zeros(n, np.int64), np.zeros(n), np.zeros(n, np.int64), np.zeros(n),
                   np.zeros(n))
        at = np.searchsorted(rows, bm25_rows)
        pool.bm25[at] = bm25_scores
        pool.bm25_rank[at] = np.arange(1, at.shape[0] + 1)
        at = np.searchsorted(rows, vector_rows)
        pool.vector[at] = vector_scores
        pool.vector_rank[at] = np.arange(1, at.shape[0] + 1)
        return pool

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def add_rows(self, new_rows: np.ndarray) -> None:
        """Rows found by no signal (turns next to the best candidates), with zero scores."""
        if new_rows.shape[0] == 0:
            return
        rows = np.concatenate([self.rows, new_rows])
        order = np.argsort(rows, kind="stable")
        self.rows = rows[order]
        m = new_rows.shape[0]
        for name in ("bm25", "bm25_rank", "vector", "vector_rank", "fused", "neighbour"):
            column = getattr(self, name)
            setattr(self, name, np.concatenate([column, np.zeros(m, dtype=column.dtype)])[order])

    def breakdown(self, i: int) -> ScoreBreakdown:
        return ScoreBreakdown(
            bm25=float(self.bm25[i]), bm25_rank=int(self.bm25_rank[i]) or None,
            vector=float(self.vector[i]), vector_rank=int(self.vector_rank[i]) or None,
            fused=float(self.fused[i]), neighbour=float(self.neighbour[i]),
        )


class HybridRetriever:
    """Ranks blocks for a request: BM25 and vector candidates, fused, spread to neighbouring
    turns, scored by the learned ranker (or fused + neighbour shares), plus importance and
    recency bonuses; every hit keeps its score breakdown."""

    def __init__(self, index: SearchIndex, tokenizer: Tokenizer, params: RetrievalParams, *,
                 ranker: LearnedRanker | None = None, zone: tzinfo = UTC) -> None:
        self.index = index
        self.tokenizer = tokenizer
        self.params = params
        # The ranker reads token counts the index may not know (bm25_engine = "fts5"); then fusion ranks.
        self.ranker = ranker if index.text_features else None
        self.zone = zone

    def rank(self, request: SearchRequest, query_vector: np.ndarray | None,
             timings: dict[str, float] | None = None, slack: int = 0) -> list[tuple[int, ScoreBreakdown]]:
        """Return (block_index, breakdown) best first, at most request.k + slack (the caller
        may drop duplicates)."""
        timings = timings if timings is not None else {}
        scoped = self.index.scoped(BM25Filter(request.scope, request.kinds, request.since, request.until))
        pool = self._candidates(scoped, request, query_vector, timings)
        if not len(pool):
            return []
        started = time.perf_counter()
        self._fuse(pool, request.mode)
        self._spread(pool, request, scoped)
        facts = self.index.facts(pool.rows)
        learned = features = None
        if self.ranker is not None and request.mode == "hybrid":
            features = self._features(pool, facts, request)
            learned = self.ranker.scores(features)
        top = self._finalise(pool, facts, learned, request.k + slack)
        if features is not None:
            assert self.ranker is not None
            for (_, b), parts in zip(top, self.ranker.parts(features[[i for i, _ in top]])):
                b.parts = parts
        block_indices = self.index.block_indices(pool.rows[[i for i, _ in top]])
        timings["fuse_ms"] = (time.perf_counter() - started) * 1000
        return [(int(bi), b) for bi, (_, b) in zip(block_indices.tolist(), top)]

    def ranking_candidates(self, request: SearchRequest, query_vector: np.ndarray | None) -> RankingCandidates:
        """Every hybrid candidate of `request` with its features (see RankingCandidates)."""
        if not self.index.text_features:
            raise ValueError("ranking features need the in-memory BM25 index (bm25_engine = memory)")
        scoped = self.index.scoped(BM25Filter(request.scope, request.kinds, request.since, request.until))
        pool = self._candidates(scoped, request, query_vector, {})
        self._fuse(pool, request.mode)
        self._spread(pool, request, scoped)
        features = self._features(pool, self.index.facts(pool.rows), request)
        return RankingCandidates(self.index.block_indices(pool.rows).astype(np.int64), features,
                                 pool.fused + pool.neighbour)

    # -- steps ------------------------------------------------------------------------------
    def _candidates(self, scoped: ScopedSearch, request: SearchRequest, query_vector: np.ndarray | None,
                    timings: dict[str, float]) -> _Pool:
        """BM25 and vector candidates with their scores and ranks."""
        p = self.params
        limit = max(p.candidates, request.k)  # never fewer candidates than hits asked for
        empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
        bm25_found, vector_found = empty, empty
        if request.mode == "hybrid" and query_vector is not None:  # both at once where the index can
            bm25_found, vector_found, timings["bm25_ms"], timings["vector_ms"] = scoped.both(
                self._query_tokens(request.query), query_vector, limit)
        elif request.mode in ("hybrid", "bm25"):
            started = time.perf_counter()
            bm25_found = scoped.bm25(self._query_tokens(request.query), limit)
            timings["bm25_ms"] = (time.perf_counter() - started) * 1000
        elif request.mode == "vector" and query_vector is not None:
            started = time.perf_counter()
            vector_found = scoped.nearest(query_vector, limit)
            timings["vector_ms"] = (time.perf_counter() - started) * 1000
        return _Pool.of(np.asarray(bm25_found[0], dtype=np.int64), np.asarray(bm25_found[1], dtype=np.float64),
                        np.asarray(vector_found[0], dtype=np.int64), np.asarray(vector_found[1], dtype=np.float64))

    def _query_tokens(self, query: str) -> list[str]:
        """The query's BM25 tokens with the synonyms of its Korean words (text/expand.py)."""
        return query_expander(self.tokenizer).expand(self.tokenizer.tokens(query))

    def _fuse(self, pool: _Pool, mode: str) -> None:
        p = self.params
        wb = p.bm25_weight if mode != "vector" else 0.0
        wv = p.vector_weight if mode != "bm25" else 0.0
        if mode != "hybrid":
            wb, wv = (1.0, 0.0) if mode == "bm25" else (0.0, 1.0)
        found_b = pool.bm25_rank > 0
        found_v = pool.vector_rank > 0
        if p.fusion == "rrf":
            pool.fused = (np.where(found_b, wb / (p.rrf_k + pool.bm25_rank), 0.0)
                          + np.where(found_v, wv / (p.rrf_k + pool.vector_rank), 0.0))
            return
        bm25_max = float(pool.bm25.max(initial=0.0)) or 1.0
        if found_v.any():
            v_lo, v_hi = float(pool.vector[found_v].min()), float(pool.vector[found_v].max())
        else:
            v_lo, v_hi = 0.0, 1.0
        span = (v_hi - v_lo) or 1.0
        pool.fused = (wb * np.where(found_b, pool.bm25 / bm25_max, 0.0)
                      + wv * np.where(found_v, (pool.vector - v_lo) / span, 0.0))

    def _spread(self, pool: _Pool, request: SearchRequest, scoped: ScopedSearch) -> None:
        """Each of the `neighbour_sources` best candidates by fused score passes
        neighbour_weight · fused / distance to the turns within ±neighbour_window of it; turns
        it reaches that pass the filters join the pool."""
        p = self.params
        if not (request.neighbours and request.mode == "hybrid" and p.neighbour_weight > 0
                and p.neighbour_window > 0):
            return
        sources = np.lexsort((pool.rows, -pool.fused))[: p.neighbour_sources]
        source_at, targets, distance, passes = scoped.neighbours(pool.rows[sources], p.neighbour_window)
        if targets.shape[0] == 0:
            return
        shares = p.neighbour_weight * pool.fused[sources][source_at] / distance
        at = np.minimum(np.searchsorted(pool.rows, targets), len(pool) - 1)
        known = pool.rows[at] == targets
        if not known.all():
            new = np.unique(targets[~known & passes])
            if new.shape[0]:
                pool.add_rows(new)
                at = np.minimum(np.searchsorted(pool.rows, targets), len(pool) - 1)
                known = pool.rows[at] == targets
        np.add.at(pool.neighbour, at[known], shares[known])

    def _features(self, pool: _Pool, facts: CandidateFacts, request: SearchRequest) -> np.ndarray:
        query = query_context(request.query, time.time(), self.zone, request.speaker_names)
        return candidate_features(pool.bm25, pool.bm25_rank, pool.vector_rank, pool.fused, facts, query)

    def _finalise(self, pool: _Pool, facts: CandidateFacts, learned: np.ndarray | None,
                  limit: int) -> list[tuple[int, ScoreBreakdown]]:
        """The `limit` best (pool index, breakdown): scored by the learned ranker (mapped into
        (0, 1]) when given, else fused + neighbour shares over the best; then the importance and
        recency terms. Ties go to the older block."""
        p = self.params
        if learned is not None:
            final = display_scores(learned)
        else:
            base = pool.fused + pool.neighbour
            final = base / (float(base.max(initial=0.0)) or 1.0)
        importance = recency = None
        if p.importance_weight:
            importance = p.importance_weight * facts.importance.astype(np.float64)
            final = final + importance
        if p.recency_weight:
            age_days = np.maximum(0.0, time.time() - facts.event_time) / 86_400
            recency = p.recency_weight * np.power(0.5, age_days / max(p.recency_half_life_days, 1e-9))
            final = final + recency
        final = np.where(np.isfinite(final), final, 0.0)
        out = []
        for i in np.lexsort((pool.rows, -final))[:limit].tolist():
            b = pool.breakdown(i)
            b.final = float(final[i])
            if learned is not None:
                b.learned = float(learned[i])
            if importance is not None:
                b.importance = float(importance[i])
            if recency is not None:
                b.recency = float(recency[i])
            out.append((i, b))
        return out
