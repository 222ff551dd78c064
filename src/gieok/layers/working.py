"""Working memory: N slots per conversation scope (default 4), evicted by priority.

priority = 0.4·importance + 0.3·time + 0.2·usage + 0.1·relevance, with
time = max(0.1, 1 / (1 + hours_since_access / 24)), usage = min(1, count / 10) and
relevance = word Jaccard over Korean-aware tokens (or embedding cosine) against the
current context. The evicted slot is promoted to long-term memory as a real block that
records where it came from (`metadata["promoted_from"]`), so nothing evicted is lost.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..store.layer_tables import CheckpointRow, LayerStore, SlotRow
from ..text.tokenize import Tokenizer
from ..types import Block, Scope, scope_from_key, scope_key

__all__ = ["Slot", "SlotPriority", "WorkingMemory", "Clock", "Promoter"]

Clock = Callable[[], float]
# promote(slot, priority, reason) -> the long-term block written for it
Promoter = Callable[["Slot", float, str], Block | None]  # None: nothing to promote (its turn was erased)


@dataclass
class Slot:
    scope_key: str
    slot_id: int
    context: str
    content: str
    metadata: dict[str, Any]
    embedding: np.ndarray | None
    importance: float
    usage_count: int
    created_at: float
    last_access: float
    block_index: int | None = None
    tokens: frozenset[str] = field(default_factory=frozenset)

    @property
    def context_hash(self) -> str:
        return hashlib.sha256(self.context.encode("utf-8")).hexdigest()[:16]

    def affinity(self, vector: np.ndarray | None) -> float | None:
        """The cosine of this slot's embedding with `vector` (both normalised); None without either,
        or when they are of different dimensions — a slot kept from before `gieok reindex` changed
        the model: it is then matched as a slot without an embedding is, by its words."""
        if self.embedding is None or vector is None or self.embedding.shape != vector.shape:
            return None
        return float(np.dot(self.embedding, vector))

    def as_row(self) -> SlotRow:
        return SlotRow(scope_key=self.scope_key, slot_id=self.slot_id, context=self.context, content=self.content,
                       metadata=self.metadata, embedding=self.embedding, importance=self.importance,
                       usage_count=self.usage_count, created_at=self.created_at, last_access=self.last_access,
                       block_index=self.block_index, context_hash=self.context_hash)

    def as_dict(self, priority: SlotPriority, checkpoints: Sequence[CheckpointRow] = ()) -> dict[str, Any]:
        """The slot as front-ends show it: its conversation, content, priority and the parts that
        make it up, and its checkpoints (rows of `Checkpoint.as_row`). No embedding."""
        return {"conversation": scope_from_key(self.scope_key).as_dict(), "slot": self.slot_id,
                "content": self.content, "context": self.context, "metadata": self.metadata,
                "importance": self.importance, "usage_count": self.usage_count, "created_at": self.created_at,
                "last_access": self.last_access, "block_index": self.block_index,
                "priority": round(priority.total, 6), "priority_parts": priority.as_dict(),
                "checkpoints": list(checkpoints)}


@dataclass(frozen=True, slots=True)
class SlotPriority:
    """The four parts of a slot's priority, each 0–1, and their weighted sum."""

    importance: float
    time: float
    usage: float
    relevance: float

    @property
    def total(self) -> float:
        return 0.4 * self.importance + 0.3 * self.time + 0.2 * self.usage + 0.1 * self.relevance

    def as_dict(self) -> dict[str, float]:
        return {"importance": round(self.importance, 6), "time": round(self.time, 6), "usage": round(self.usage, 6),
                "relevance": round(self.relevance, 6)}


def time_factor(last_access: float, now: float) -> float:
    hours = max(0.0, now - last_access) / 3600.0
    return max(0.1, 1.0 / (1.0 + hours / 24.0))


def usage_factor(count: int) -> float:
    return min(1.0, count / 10.0)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


class WorkingMemory:
    """Slots for every scope, persisted through the store on each change (a restart restores them)."""

    def __init__(self, store: LayerStore, tokenizer: Tokenizer, promote: Promoter, *, slots: int = 4,
                 relevance: str = "jaccard", clock: Clock = time.time,
                 on_slot_freed: Callable[[Slot], None] | None = None, lock: threading.RLock | None = None) -> None:
        if slots < 1:
            raise ValueError("working memory needs at least one slot")
        if relevance not in ("jaccard", "embedding"):
            raise ValueError("relevance must be 'jaccard' or 'embedding'")
        self.store = store
        self.tokenizer = tokenizer
        self.promote = promote
        self.capacity = slots
        self.relevance_mode = relevance
        self.clock = clock
        self.on_slot_freed = on_slot_freed  # e.g. drop the slot's checkpoints
        # `lock`: the owning memory's, when there is one. An eviction writes its slot to long-term
        # memory (the memory's lock) and a search reads slots under the memory's lock: with a lock of
        # its own, the two orders deadlocked a bot's commit against its own search.
        self._lock = lock or threading.RLock()
        self._slots: dict[str, dict[int, Slot]] = {}
        self.cleanup_count = 0
        self.promotion_count = 0
        self.release_count = 0
        self._last_tokens: tuple[str, frozenset[str]] | None = None
        for row in store.load_slots():
            slot = self._slot_of(row)
            self._slots.setdefault(slot.scope_key, {})[slot.slot_id] = slot

    def _slot_of(self, row: SlotRow) -> Slot:
        slot = Slot(row["scope_key"], row["slot_id"], row["context"], row["content"], row["metadata"],
                    row["embedding"], row["importance"], row["usage_count"], row["created_at"],
                    row["last_access"], row["block_index"])
        slot.tokens = frozenset(self.tokenizer.tokens(slot.context))
        return slot

    def take_vectors(self, vectors: Mapping[int, np.ndarray]) -> None:
        """Blocks given new vectors (`Store.replace_vectors`, here or in another process): the slots
        fed from them take the new ones, as the store's rows of them did."""
        with self._lock:
            for slots in self._slots.values():
                for slot in slots.values():
                    if slot.block_index is not None and slot.block_index in vectors:
                        slot.embedding = np.asarray(vectors[slot.block_index], dtype=np.float32).copy()

    def forget_blocks(self, block_indices: Collection[int]) -> None:
        """Blocks erased by another process sharing the store (which deleted the slots' rows): the
        slots this process holds of them go from memory, never promoted — an evicted copy would
        have written the erased turn back as a note."""
        gone = set(block_indices)
        with self._lock:
            for slot in [slot for group in self._slots.values() for slot in group.values() if slot.block_index in gone]:
                self.let_go(slot)

    def reload(self, scope: Scope) -> None:
        """Read the scope's slots from the store again: another process that shares the store
        ran this conversation since (the chat runtime calls this when it takes a channel over)."""
        key = scope_key(scope)
        rows = self.store.load_slots(key)
        with self._lock:
            self._slots[key] = {slot.slot_id: slot for slot in map(self._slot_of, rows)}

    # -- arithmetic -----------------------------------------------------------------------
    def _tokens_of(self, text: str) -> frozenset[str]:
        """A context's token set. The last one is kept: an eviction compares one new context
        with every slot and then builds the new slot from it (Korean analysis of the same text
        six times per add was the runtime's largest cost outside the embedder)."""
        last = self._last_tokens
        if last is not None and last[0] == text:
            return last[1]
        tokens = frozenset(self.tokenizer.tokens(text))
        self._last_tokens = (text, tokens)
        return tokens

    def relevance(self, slot: Slot, context: str = "", context_embedding: np.ndarray | None = None) -> float:
        if self.relevance_mode == "embedding" and (affinity := slot.affinity(context_embedding)) is not None:
            return max(0.0, affinity)
        if not context:
            return 0.0
        return jaccard(slot.tokens, self._tokens_of(context))

    def priority(self, slot: Slot, context: str = "", context_embedding: np.ndarray | None = None,
                 now: float | None = None) -> float:
        return self.priority_parts(slot, context, context_embedding, now).total

    def priority_parts(self, slot: Slot, context: str = "", context_embedding: np.ndarray | None = None,
                       now: float | None = None) -> SlotPriority:
        now = self.clock() if now is None else now
        return SlotPriority(slot.importance, time_factor(slot.last_access, now), usage_factor(slot.usage_count),
                            self.relevance(slot, context, context_embedding))

    # -- slots ----------------------------------------------------------------------------
    def slots(self, scope: Scope) -> list[Slot]:
        with self._lock:
            return sorted(self._slots.get(scope_key(scope), {}).values(), key=lambda s: s.slot_id)

    def add(self, scope: Scope, context: str, *, content: str | None = None, metadata: dict[str, Any] | None = None,
            importance: float = 0.5, embedding: np.ndarray | None = None, block_index: int | None = None) -> Slot:
        """Put a context in a free slot, or evict the lowest-priority slot (promoting it)."""
        key = scope_key(scope)
        now = self.clock()
        with self._lock:
            slots = self._slots.setdefault(key, {})
            free = [i for i in range(self.capacity) if i not in slots]
            if free:
                slot_id = free[0]
            else:
                victim = min(slots.values(), key=lambda s: (self.priority(s, context, embedding, now), s.slot_id))
                self.promote_slot(victim, reason="evicted", now=now, context=context, context_embedding=embedding)
                self.cleanup_count += 1
                slot_id = victim.slot_id
            slot = Slot(key, slot_id, context, content if content is not None else context, dict(metadata or {}),
                        None if embedding is None else np.asarray(embedding, dtype=np.float32), float(importance),
                        1, now, now, block_index, self._tokens_of(context))
            slots[slot_id] = slot
            self.store.save_slot(slot.as_row(), checkpoints=[])
            return slot

    def promote_slot(self, slot: Slot, *, reason: str, now: float | None = None, context: str = "",
                     context_embedding: np.ndarray | None = None) -> Block | None:
        """Free the slot, writing it to long-term memory as a block with its provenance.

        A slot that only mirrors a turn already stored (it has a block index) and was never
        recalled carries nothing the long-term store lacks: it is released without a copy.
        Every other slot — unstored content, or a turn that working memory recalled — is
        promoted for real."""
        with self._lock:
            priority = self.priority(slot, context, context_embedding, now)
            if slot.block_index is not None and slot.usage_count <= 1:
                block = None
                self.release_count += 1
            else:
                block = self.promote(slot, priority, reason)
                self.promotion_count += block is not None
            self._free(slot)
            return block

    def _free(self, slot: Slot) -> None:
        self._slots.get(slot.scope_key, {}).pop(slot.slot_id, None)
        self.store.delete_slot(slot.scope_key, slot.slot_id)
        if self.on_slot_freed is not None:
            self.on_slot_freed(slot)

    def discard(self, slot: Slot) -> None:
        """Drop a slot without promoting it (its content was forgotten)."""
        with self._lock:
            self._free(slot)

    def all_slots(self) -> list[Slot]:
        with self._lock:
            return [slot for group in self._slots.values() for slot in group.values()]

    def touch(self, slot: Slot, now: float | None = None) -> None:
        with self._lock:
            slot.usage_count += 1
            slot.last_access = self.clock() if now is None else now
            if not self.store.save_slot(slot.as_row(), held=True):
                self.let_go(slot)

    def let_go(self, slot: Slot) -> None:
        """A slot whose row another process sharing the store emptied (its turn erased) or gave
        another turn: this process's copy goes from memory, neither saved nor promoted."""
        with self._lock:
            if self._slots.get(slot.scope_key, {}).get(slot.slot_id) is slot:
                del self._slots[slot.scope_key][slot.slot_id]
                if self.on_slot_freed is not None:
                    self.on_slot_freed(slot)

    def search(self, scope: Scope, query: str, query_embedding: np.ndarray | None, *,
               threshold: float) -> list[tuple[Slot, float]]:
        """Slots relevant to the query (cosine of embeddings, else token Jaccard), best first.
        A slot that answers is used: its usage count and access time are updated."""
        hits = []
        with self._lock:
            query_tokens = frozenset(self.tokenizer.tokens(query))
            for slot in self.slots(scope):
                affinity = slot.affinity(query_embedding)
                score = affinity if affinity is not None else jaccard(slot.tokens, query_tokens)
                if score >= threshold:
                    hits.append((slot, score))
            hits.sort(key=lambda item: -item[1])
            now = self.clock()
            for slot, _ in hits:
                self.touch(slot, now)
        return hits

    def statistics(self, scope: Scope | None = None) -> dict[str, Any]:
        with self._lock:
            if scope is not None:
                groups = [self._slots.get(scope_key(scope), {})]
            else:
                groups = list(self._slots.values())
            active = [s for g in groups for s in g.values()]
            total = self.capacity * max(1, len(groups))
            now = self.clock()
            return {
                "total_slots": total,
                "active_slots": len(active),
                "available_slots": total - len(active),
                "scopes": len(groups) if scope is None else 1,
                "cleanup_count": self.cleanup_count,
                "promotion_count": self.promotion_count,
                "release_count": self.release_count,
                "average_priority": (sum(self.priority(s, now=now) for s in active) / len(active)) if active else 0.0,
            }
