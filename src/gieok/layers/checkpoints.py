"""Checkpoints: each working-memory slot keeps up to N anchors into long-term memory.

An anchor is a block that answered a search while the slot was relevant. The radius
around an anchor walks the anchor's own conversation (its channel's turn sequence), so
"nearby" means "said around the same moment in the same conversation" — not neighbouring
insert order, which interleaves every channel of a busy server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..index.search_index import BlockLookup
from ..store.layer_tables import CheckpointRow, LayerStore, StoredCheckpoint
from ..types import Scope, scope_key
from .working import Clock, Slot

__all__ = ["Checkpoint", "CheckpointManager"]


@dataclass
class Checkpoint:
    block_index: int
    relevance: float
    distance: float  # semantic distance between the slot and the block: 1 - cosine
    created_at: float
    last_accessed: float

    def as_row(self) -> CheckpointRow:
        return CheckpointRow(block_index=self.block_index, relevance=self.relevance, distance=self.distance,
                             created_at=self.created_at, last_accessed=self.last_accessed)


class CheckpointManager:
    """Each working-memory slot's anchors into long-term memory (blocks that answered searches
    while it was relevant), persisted, at most `max_per_slot` per slot, and the blocks within
    `radius` turns of them for the localized search."""

    def __init__(self, store: LayerStore, lookup: BlockLookup, *, max_per_slot: int = 5,
                 radius: int = 15, limit: int = 100, clock: Clock = time.time) -> None:
        self.store = store
        self.lookup = lookup  # the memory's indexes: in the process or in the database
        self.max_per_slot = max_per_slot
        self.radius_default = radius
        self.limit = limit
        self.clock = clock
        self._lock = threading.RLock()
        self._by_slot: dict[tuple[str, int], list[Checkpoint]] = {}
        self._add_rows(self._by_slot, store.load_checkpoints())
        self.created = 0

    @staticmethod
    def _add_rows(by_slot: dict[tuple[str, int], list[Checkpoint]], rows: Iterable[StoredCheckpoint]) -> None:
        for row in rows:
            by_slot.setdefault((row["scope_key"], row["slot_id"]), []).append(
                Checkpoint(row["block_index"], row["relevance"], row["distance"], row["created_at"],
                           row["last_accessed"]))

    def reload(self, scope: Scope) -> None:
        """Read the scope's checkpoints from the store again (see `WorkingMemory.reload`)."""
        key = scope_key(scope)
        fresh: dict[tuple[str, int], list[Checkpoint]] = {}
        self._add_rows(fresh, self.store.load_checkpoints(key))
        with self._lock:
            for stale in [k for k in self._by_slot if k[0] == key]:
                del self._by_slot[stale]
            self._by_slot.update(fresh)

    def get(self, slot: Slot) -> list[Checkpoint]:
        with self._lock:
            return list(self._by_slot.get((slot.scope_key, slot.slot_id), []))

    def create(self, slot: Slot, related: list[tuple[int, float, np.ndarray | None]]) -> list[Checkpoint]:
        """Anchor the slot to (block_index, relevance, block vector) triples; the strongest
        `max_per_slot` of old and new anchors are kept. Persisted with the slot."""
        now = self.clock()
        with self._lock:
            key = (slot.scope_key, slot.slot_id)
            merged = {c.block_index: c for c in self._by_slot.get(key, [])}
            for block_index, relevance, vector in related:
                affinity = slot.affinity(vector)
                distance = 1.0 - (affinity if affinity is not None else float(relevance))
                old = merged.get(block_index)
                if old is None or relevance > old.relevance:
                    merged[block_index] = Checkpoint(block_index, float(relevance), distance,
                                                     old.created_at if old else now, now)
            kept = sorted(merged.values(), key=lambda c: -c.relevance)[: self.max_per_slot]
            self._by_slot[key] = kept
            # only while the slot's row still holds its turn (another process may have erased it)
            self.store.save_slot(slot.as_row(), checkpoints=[c.as_row() for c in kept], held=True)
            self.created += 1
            return kept

    def forget_slot(self, slot: Slot) -> None:
        with self._lock:
            self._by_slot.pop((slot.scope_key, slot.slot_id), None)

    def touch(self, slot: Slot) -> None:
        now = self.clock()
        with self._lock:
            for checkpoint in self._by_slot.get((slot.scope_key, slot.slot_id), []):
                checkpoint.last_accessed = now
            self.store.touch_checkpoints(slot.scope_key, slot.slot_id, now)

    def radius(self, slot: Slot, r: int | None = None) -> list[int]:
        """Block indices within ±r turns of each anchor in the anchor's conversation, nearest
        first, at most `limit` (LOCALIZED_SEARCH_LIMIT)."""
        r = self.radius_default if r is None else r
        ranked: dict[int, int] = {}  # block index -> smallest distance to any anchor
        for checkpoint in self.get(slot):
            ranked[checkpoint.block_index] = 0
            for other, distance in self.lookup.neighbours_of(checkpoint.block_index, r):
                if distance < ranked.get(other, r + 1):
                    ranked[other] = distance
        return sorted(ranked, key=lambda index: (ranked[index], index))[: self.limit]

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            counts = [len(v) for v in self._by_slot.values() if v]
        return {"slots_with_checkpoints": len(counts), "checkpoints": sum(counts), "created": self.created}
