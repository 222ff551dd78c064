"""The layered search coordinator: working memory → cache → checkpoint → full search.

Working memory answers when at least `wm_answer_min` (3) slots are relevant; the cache
answers a repeated query in an unchanged scope; the checkpoint layer answers when the
localized search finds at least `checkpoint_answer_min` (2) blocks; otherwise the full
hybrid search answers. Checkpoint and full results go into the cache; full searches
create and refresh checkpoints for the slots relevant to the query.

Gradual activation (`checkpoint_stage`): 1 creates checkpoints only; 2 also runs the
localized search beside the full search and records how the two compare (the full search
answers); 3 lets the checkpoint layer answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np

from ..config import Settings
from ..index.search_index import BlockLookup
from ..store.base import BM25Filter, Store
from ..types import Block, Hit, Scope, ScoreBreakdown, SearchResult
from .cache import SearchCache
from .checkpoints import CheckpointManager
from .localized import LocalHit, LocalizedSearch
from .stm import HybridSTM

__all__ = ["SearchCoordinator", "CoordinatorConfig", "LayeredResult", "LAYERS"]

log = logging.getLogger("gieok.layers")

LAYERS = ("working_memory", "cache", "checkpoint", "full")


@dataclass(frozen=True)
class CoordinatorConfig:
    """The coordinator's knobs; their defaults and documentation live in `Settings`."""

    wm_answer_min: int
    wm_min_relevance: float
    checkpoint_enabled: bool
    checkpoint_stage: int
    checkpoint_answer_min: int
    checkpoint_radius: int

    @classmethod
    def from_settings(cls, settings: Settings) -> CoordinatorConfig:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


@dataclass
class _LayerStats:
    attempts: int = 0
    answers: int = 0
    total_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"attempts": self.attempts, "answers": self.answers,
                "hit_rate": self.answers / self.attempts if self.attempts else 0.0,
                "avg_ms": self.total_ms / self.answers if self.answers else 0.0}


@dataclass
class LayeredResult:
    result: SearchResult
    checkpoint_overlap: float | None = None  # stage 2: share of full top-k the localized search also found
    tried: list[str] = field(default_factory=list)


# full_search(query_vector) -> SearchResult ; fetch(block_indices) -> {index: Block} ; vector_of(index) -> vec
FullSearch = Callable[[np.ndarray | None], SearchResult]


class IndexView(BlockLookup, Protocol):
    """What the layers read of a memory's indexes (`memory.indexes.MemoryIndexes`)."""

    store: Store

    @property
    def dimension(self) -> int | None: ...


class SearchCoordinator:
    """Tries working memory, the cache and the checkpoint layer before the full search, and
    counts which layer answered and how fast."""

    def __init__(self, hybrid: HybridSTM, cache: SearchCache, checkpoints: CheckpointManager,
                 localized: LocalizedSearch, config: CoordinatorConfig) -> None:
        self.hybrid = hybrid
        self.cache = cache
        self.checkpoints = checkpoints
        self.localized = localized
        self.config = config
        self._lock = threading.Lock()
        self.layer_stats = {name: _LayerStats() for name in LAYERS}
        self.stage2_comparisons: list[float] = []

    def _record(self, layer: str, answered: bool, ms: float) -> None:
        with self._lock:
            stats = self.layer_stats[layer]
            stats.attempts += 1
            if answered:
                stats.answers += 1
                stats.total_ms += ms

    def search(self, *, query: str, k: int, scope: Scope, filt: BM25Filter, mode: str,
               embed: Callable[[], np.ndarray | None], cache_extra: tuple, full_search: FullSearch, index: IndexView,
               started: float) -> LayeredResult:
        """`embed` is called only when a layer needs the query vector: working memory with
        token relevance and the cache answer without embedding the query at all."""
        conversation = Scope(scope.guild, scope.channel) if scope.channel is not None else None
        tried: list[str] = []
        cfg = self.config

        # Layer 1: working memory (only a search inside one conversation has one)
        if conversation is not None:
            tried.append("working_memory")
            wm_vector = embed() if self.hybrid.working.relevance_mode == "embedding" else None
            wm_slots = self.hybrid.search_working(conversation, query, wm_vector, k, threshold=cfg.wm_min_relevance)
            answered = len(wm_slots) >= cfg.wm_answer_min
            elapsed = (time.perf_counter() - started) * 1000
            self._record("working_memory", answered, elapsed)
            if answered:
                for r in wm_slots:
                    self.checkpoints.touch(r["slot"])
                hits = self._wm_hits(wm_slots[:k], index, filt)
                if len(hits) >= cfg.wm_answer_min:
                    return LayeredResult(self._result(query, hits, "working_memory", started), tried=tried)

        # Layer 2: cache
        tried.append("cache")
        key = self.cache.key(scope, query, *cache_extra)
        cached = self.cache.get(scope, key)
        self._record("cache", cached is not None, (time.perf_counter() - started) * 1000)
        if cached is not None:
            return LayeredResult(self._result(query, list(cached), "cache", started), tried=tried)

        # Layer 3: checkpoint-localized search
        query_vector = embed() if mode != "bm25" else None
        local_hits = None
        if (cfg.checkpoint_enabled and cfg.checkpoint_stage >= 2 and conversation is not None
                and query_vector is not None and mode == "hybrid" and index.dimension is not None):
            tried.append("checkpoint")
            slots = self.hybrid.working.slots(conversation)
            local = self.localized.search(slots, query_vector, k, index, filt, cfg.checkpoint_radius)
            local_hits = self._local_hits(local, index)
            answered = cfg.checkpoint_stage >= 3 and len(local_hits) >= cfg.checkpoint_answer_min
            self._record("checkpoint", answered, (time.perf_counter() - started) * 1000)
            if answered:
                self.cache.put(scope, key, tuple(local_hits))
                return LayeredResult(self._result(query, local_hits, "checkpoint", started), tried=tried)

        # Layer 4: full hybrid search
        tried.append("full")
        full = full_search(query_vector)
        full.source = "full"
        full.search_time_ms = (time.perf_counter() - started) * 1000
        self._record("full", True, full.search_time_ms)
        self.cache.put(scope, key, tuple(full.hits))
        overlap = None
        if local_hits is not None and cfg.checkpoint_stage == 2 and full.hits:
            full_ids = {h.block.block_index for h in full.hits}
            overlap = len(full_ids & {h.block.block_index for h in local_hits}) / len(full_ids)
            with self._lock:
                self.stage2_comparisons.append(overlap)
            log.info("stage 2: localized search found %.0f%% of the full top-%d for %r", overlap * 100, k, query)
        if cfg.checkpoint_enabled and conversation is not None and query_vector is not None and full.hits:
            self._refresh_checkpoints(conversation, query_vector, full.hits, index)
        return LayeredResult(full, checkpoint_overlap=overlap, tried=tried)

    # -- helpers ----------------------------------------------------------------------------
    def _refresh_checkpoints(self, conversation: Scope, query_vector: np.ndarray, hits: list[Hit],
                             index: IndexView) -> None:
        """Anchor every slot relevant to this query to the blocks that answered it."""
        threshold = self.localized.min_relevance
        top = hits[: self.checkpoints.max_per_slot]
        vectors: dict[int, np.ndarray] | None = None
        for slot in self.hybrid.working.slots(conversation):
            if (affinity := slot.affinity(query_vector)) is None or affinity <= threshold:
                continue
            if vectors is None:  # read once, and only when some slot relates to the query
                vectors = index.vectors_of([hit.block.block_index for hit in top])
            related = [(hit.block.block_index, float(hit.breakdown.vector or hit.score),
                        vectors.get(hit.block.block_index)) for hit in top]
            self.checkpoints.create(slot, related)

    def _wm_hits(self, results: list[dict[str, Any]], index: IndexView, filt: BM25Filter) -> list[Hit]:
        indices = [r["block_index"] for r in results if r.get("block_index") is not None]
        blocks = index.store.get_many(indices) if indices else {}
        hits = []
        for r in results:
            block = blocks.get(r["block_index"]) if r.get("block_index") is not None else None
            if block is not None and block.forgotten:
                continue
            if block is None:
                block = _slot_block(r, filt.scope)
            elif filt.kinds and block.kind not in filt.kinds:
                continue
            score = float(r["relevance"])
            hits.append(Hit(block, score, ScoreBreakdown(vector=score, fused=score, final=score)))
        return hits

    def _local_hits(self, local: list[LocalHit], index: IndexView) -> list[Hit]:
        blocks = index.store.get_many([h.block_index for h in local])
        return [Hit(blocks[h.block_index], h.score,
                    ScoreBreakdown(vector=h.similarity, fused=h.score, final=h.score))
                for h in local if h.block_index in blocks]

    @staticmethod
    def _result(query: str, hits: list[Hit], source: str, started: float) -> SearchResult:
        return SearchResult(query=query, hits=hits, source=source,
                            search_time_ms=(time.perf_counter() - started) * 1000)

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            layers = {name: stats.as_dict() for name, stats in self.layer_stats.items()}
            comparisons = list(self.stage2_comparisons)
        total = sum(s["answers"] for s in layers.values())
        for s in layers.values():
            s["share_of_answers"] = s["answers"] / total if total else 0.0
        return {
            "layers": layers,
            "searches": total,
            "checkpoint_stage": self.config.checkpoint_stage if self.config.checkpoint_enabled else 0,
            "stage2_mean_overlap": float(np.mean(comparisons)) if comparisons else None,
            "cache": self.cache.statistics(),
            "checkpoints": self.checkpoints.statistics(),
        }


def _slot_block(result: dict[str, Any], scope: Scope) -> Block:
    """A working-memory entry that mirrors no long-term block is shown as a transient block 0."""
    return Block(block_index=0, kind="note", text=result["text"], scope=scope, speaker=None, event_time=0.0,
                 insert_time=0.0, importance=0.0, keywords=(), tags=("working_memory",),
                 metadata={"slot_id": result.get("slot_id"), "source": result["source"]}, conv_pos=None,
                 content_digest="", prev_hash="", hash="")
