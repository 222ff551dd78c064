"""How a memory answers a search: through the layers (working memory → cache → checkpoint → full)
when they are on, else straight to the full hybrid search; and the full search itself, whose
ranked blocks are read from the store k at a time with repeated text dropped.

The query is embedded at most once, and only when a layer needs its vector; while it is being
embedded the memory's lock is let go, so a ~15 ms model call holds no other search or write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..layers.coordinator import SearchCoordinator
from ..retrieval.hybrid import RankingCandidates, SearchRequest
from ..store.base import BM25Filter, Store
from ..types import Hit, Scope, ScoreBreakdown, SearchResult
from .indexes import MemoryIndexes

__all__ = ["SearchPath"]

DUPLICATE_SLACK = 5  # ranked blocks beyond k, room to drop repeated text


class SearchPath:
    """The search of one memory: its indexes, its coordinator, its lock and how to embed a query."""

    def __init__(self, store: Store, indexes: MemoryIndexes, coordinator: SearchCoordinator,
                 lock: threading.RLock, embed_query: Callable[[str], np.ndarray]) -> None:
        self.store = store
        self.indexes = indexes
        self.coordinator = coordinator
        self.lock = lock
        self.embed_query = embed_query

    def run(self, request: SearchRequest, given: np.ndarray | None, layers: bool) -> SearchResult:
        started = time.perf_counter()
        if layers and self.indexes.retriever is not None:
            return self.layered(request, started, given)
        embed_ms = 0.0
        if given is None and request.mode != "bm25" and (self.indexes.dimension is not None
                                                         or self.store.get_meta("dimension")):
            given = self.embed_query(request.query)
            embed_ms = (time.perf_counter() - started) * 1000
        return self.full(request, given, embed_ms, started)

    def layered(self, request: SearchRequest, started: float, given: np.ndarray | None) -> SearchResult:
        embedded: dict[str, Any] = {} if given is None else {"vector": given}

        def embed() -> np.ndarray | None:
            if "vector" not in embedded:
                t0 = time.perf_counter()
                with _released(self.lock):  # the coordinator asks while it holds the lock
                    embedded["vector"] = self.embed_query(request.query)
                embedded["ms"] = (time.perf_counter() - t0) * 1000
            return embedded["vector"]

        filt = BM25Filter(request.scope, request.kinds, request.since, request.until)
        extra = (request.k, request.kinds, request.since, request.until, request.mode, request.neighbours,
                 tuple(sorted(request.speaker_names.items())))
        with self.lock:
            self.indexes.sync()
            layered = self.coordinator.search(
                query=request.query, k=request.k, scope=request.scope, filt=filt, mode=request.mode, embed=embed,
                cache_extra=extra, index=self.indexes, started=started,
                full_search=lambda vector: self.full(request, vector, embedded.get("ms", 0.0), started))
        result = layered.result
        result.embed_time_ms = embedded.get("ms", 0.0)
        result.timings_ms.setdefault("embed_ms", result.embed_time_ms)
        return result

    def full(self, request: SearchRequest, query_vector: np.ndarray | None, embed_ms: float,
             started: float) -> SearchResult:
        timings: dict[str, float] = {}
        with self.lock:
            self.indexes.sync()
            retriever = self.indexes.retriever
            ranked = [] if retriever is None else retriever.rank(request, query_vector, timings, slack=DUPLICATE_SLACK)
            hits = self._distinct_hits(ranked, request.k)
        timings["embed_ms"] = embed_ms
        return SearchResult(query=request.query, hits=hits, source="full",
                            search_time_ms=(time.perf_counter() - started) * 1000, embed_time_ms=embed_ms,
                            timings_ms=timings)

    def warm(self, query: str, vector: np.ndarray | None) -> None:
        """One full search, its result dropped: every index and the ranker touched once."""
        request = SearchRequest(query=query, k=1, scope=Scope(), mode="hybrid" if vector is not None else "bm25")
        self.full(request, vector, 0.0, time.perf_counter())

    def candidates(self, request: SearchRequest, query_vector: np.ndarray | None) -> RankingCandidates:
        """Every candidate the full search considers, with its ranking features (no layers, no cache)."""
        if query_vector is None:
            query_vector = self.embed_query(request.query)
        with self.lock:
            self.indexes.sync()
            if self.indexes.retriever is None:
                raise InvalidInputError("nothing stored yet: no candidates to rank")
            try:
                return self.indexes.retriever.ranking_candidates(request, query_vector)
            except ValueError as exc:
                raise InvalidInputError(str(exc)) from None

    def _distinct_hits(self, ranked: list[tuple[int, ScoreBreakdown]], k: int) -> list[Hit]:
        """The first k ranked blocks with distinct text per channel (a promoted working-memory note
        repeats the turn it mirrors). Rows are fetched k at a time: usually once."""
        hits: list[Hit] = []
        seen: set[tuple[str | None, str]] = set()
        position = 0
        while len(hits) < k and position < len(ranked):
            batch = ranked[position : position + (k - len(hits))]
            position += len(batch)
            blocks = self.store.get_many([bi for bi, _ in batch])
            for bi, breakdown in batch:
                block = blocks.get(bi)
                if block is None:
                    continue
                identity = (block.scope.channel, " ".join(block.text.split()))
                if identity not in seen:
                    seen.add(identity)
                    hits.append(Hit(block, breakdown.final, breakdown))
        return hits


@contextmanager
def _released(lock: threading.RLock) -> Iterator[None]:
    """Let go of a lock this thread holds (once) for the length of the block, then take it back."""
    lock.release()
    try:
        yield
    finally:
        lock.acquire()
