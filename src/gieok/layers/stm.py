"""Short-term memory (TTL) and the hybrid manager over it and working memory.

Modes, as in the Phase 2 design: `hybrid` writes to both and searches working memory
first, filling up from STM; `legacy` uses STM alone; `working_only` uses working memory
alone. Expired STM entries are promoted to long-term memory when their importance is at
least `promote_importance` (default 0.7) and dropped otherwise — an entry that has
already been written to long-term memory (it has a block index) is simply dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..store.layer_tables import LayerStore, STMEntry
from ..text.tokenize import Tokenizer
from ..types import Block, Scope, scope_from_key, scope_key
from .working import Clock, WorkingMemory, jaccard

__all__ = ["ShortTermMemory", "HybridSTM", "MODES"]

MODES = ("hybrid", "legacy", "working_only")

# promote(scope, text, importance, metadata) -> block
STMPromoter = Callable[[Scope, str, float, dict[str, Any]], Block]


class ShortTermMemory:
    """Entries that live `ttl_seconds`; on expiry an important one is promoted to a long-term
    note and the rest are dropped."""

    def __init__(self, store: LayerStore, tokenizer: Tokenizer, promote: STMPromoter, *, ttl_seconds: float = 3600.0,
                 promote_importance: float = 0.7, clock: Clock = time.time) -> None:
        self.store = store
        self.tokenizer = tokenizer
        self.promote = promote
        self.ttl = ttl_seconds
        self.promote_importance = promote_importance
        self.clock = clock
        self.promoted = 0
        self.dropped = 0
        self._tokens: dict[int, frozenset[str]] = {}  # entry_id -> tokens; entries never change

    def _entry_tokens(self, entry: STMEntry) -> frozenset[str]:
        tokens = self._tokens.get(entry["entry_id"])
        if tokens is None:
            tokens = frozenset(self.tokenizer.tokens(entry["text"]))
            if len(self._tokens) > 50_000:
                self._tokens.clear()
            self._tokens[entry["entry_id"]] = tokens
        return tokens

    def add(self, scope: Scope, text: str, *, importance: float = 0.5, metadata: dict[str, Any] | None = None,
            block_index: int | None = None, ttl_seconds: float | None = None) -> int:
        now = self.clock()
        return self.store.stm_add(scope_key(scope), text, dict(metadata or {}), float(importance), now,
                                  now + (self.ttl if ttl_seconds is None else ttl_seconds), block_index)

    def entries(self, scope: Scope | None = None, limit: int = 1000) -> list[STMEntry]:
        return self.store.stm_entries(None if scope is None else scope_key(scope), self.clock(), limit)

    def describe(self, entry: STMEntry, now: float | None = None) -> dict[str, Any]:
        """An entry as front-ends show it: its conversation instead of the key, and time left."""
        now = self.clock() if now is None else now
        return {"entry_id": entry["entry_id"], "conversation": scope_from_key(entry["scope_key"]).as_dict(),
                "text": entry["text"], "importance": entry["importance"], "metadata": entry["metadata"],
                "created_at": entry["created_at"], "expires_at": entry["expires_at"],
                "expires_in_seconds": round(max(0.0, entry["expires_at"] - now), 3),
                "block_index": entry["block_index"]}

    def search(self, scope: Scope, query: str, k: int) -> list[tuple[STMEntry, float]]:
        """Live entries of the scope by token overlap with the query, then recency."""
        query_tokens = frozenset(self.tokenizer.tokens(query))
        scored = []
        for position, entry in enumerate(self.entries(scope)):
            overlap = jaccard(query_tokens, self._entry_tokens(entry))
            scored.append((entry, overlap, -position))
        scored.sort(key=lambda item: (-item[1], -item[2]))
        return [(entry, overlap) for entry, overlap, _ in scored[:k]]

    def expire(self) -> dict[str, int]:
        """Apply the expiry rule to every expired entry; returns what happened."""
        promoted = dropped = 0
        for entry in self.store.stm_take_expired(self.clock()):
            if entry["block_index"] is None and entry["importance"] >= self.promote_importance:
                metadata = dict(entry["metadata"])
                metadata["promoted_from"] = {"layer": "stm", "entry": entry["entry_id"], "reason": "expired",
                                             "created_at": entry["created_at"]}
                self.promote(scope_from_key(entry["scope_key"]), entry["text"], entry["importance"], metadata)
                promoted += 1
            else:
                dropped += 1
        self.promoted += promoted
        self.dropped += dropped
        return {"promoted": promoted, "dropped": dropped}


class HybridSTM:
    """One API over working memory and STM, whatever the mode."""

    def __init__(self, working: WorkingMemory, stm: ShortTermMemory, mode: str = "hybrid") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        self.working = working
        self.stm = stm
        self.mode = mode
        self._lock = threading.Lock()
        self.stats = {"total_requests": 0, "working_memory_hits": 0, "legacy_stm_hits": 0, "combined_results": 0}

    def add(self, scope: Scope, text: str, *, importance: float = 0.5, metadata: dict[str, Any] | None = None,
            embedding: np.ndarray | None = None, block_index: int | None = None) -> dict[str, Any]:
        with self._lock:
            self.stats["total_requests"] += 1
        placed: dict[str, Any] = {}
        if self.mode in ("hybrid", "working_only"):
            slot = self.working.add(scope, text, metadata=metadata, importance=importance, embedding=embedding,
                                    block_index=block_index)
            placed["slot_id"] = slot.slot_id
            with self._lock:
                self.stats["working_memory_hits"] += 1
        if self.mode in ("hybrid", "legacy"):
            placed["stm_entry"] = self.stm.add(scope, text, importance=importance, metadata=metadata,
                                               block_index=block_index)
        return placed

    def search_working(self, scope: Scope, query: str, query_embedding: np.ndarray | None, k: int, *,
                       threshold: float) -> list[dict[str, Any]]:
        """Working memory alone (the coordinator's first layer: it must stay sub-millisecond,
        so it never scans STM). Counted like `search`."""
        with self._lock:
            self.stats["total_requests"] += 1
        if self.mode == "legacy":
            return []
        results = self._working_results(scope, query, query_embedding, k, threshold)
        if results:
            with self._lock:
                self.stats["working_memory_hits"] += 1
                self.stats["combined_results"] += 1
        return results

    def search(self, scope: Scope, query: str, query_embedding: np.ndarray | None, k: int, *,
               threshold: float) -> list[dict[str, Any]]:
        """Working memory first; STM fills the remaining places (hybrid / legacy)."""
        results: list[dict[str, Any]] = []
        with self._lock:
            self.stats["total_requests"] += 1
        if self.mode in ("hybrid", "working_only"):
            results.extend(self._working_results(scope, query, query_embedding, k, threshold))
            if results:
                with self._lock:
                    self.stats["working_memory_hits"] += 1
        if self.mode in ("hybrid", "legacy") and len(results) < k:
            seen = {r["block_index"] for r in results if r["block_index"] is not None}
            added = 0
            for entry, overlap in self.stm.search(scope, query, k):
                if len(results) >= k:
                    break
                if entry["block_index"] is not None and entry["block_index"] in seen:
                    continue
                results.append({"source": "legacy_stm", "entry_id": entry["entry_id"], "text": entry["text"],
                                "relevance": overlap, "block_index": entry["block_index"]})
                added += 1
            if added:
                with self._lock:
                    self.stats["legacy_stm_hits"] += 1
        if results:
            with self._lock:
                self.stats["combined_results"] += 1
        return results

    def _working_results(self, scope: Scope, query: str, query_embedding: np.ndarray | None, k: int,
                         threshold: float) -> list[dict[str, Any]]:
        return [{"source": "working_memory", "slot_id": slot.slot_id, "text": slot.content,
                 "relevance": relevance, "block_index": slot.block_index, "slot": slot}
                for slot, relevance in self.working.search(scope, query, query_embedding, threshold=threshold)[:k]]

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            stats = dict(self.stats)
        total = max(1, stats["total_requests"])
        return {
            "mode": self.mode,
            "working_memory": self.working.statistics(),
            "hybrid_performance": stats,
            "working_memory_efficiency": stats["working_memory_hits"] / total,
            "combined_usage_rate": stats["combined_results"] / total,
            "stm": {"entries": self.stm.store.stm_count(), "promoted": self.stm.promoted, "dropped": self.stm.dropped},
        }
