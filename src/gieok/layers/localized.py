"""Localized search: look only inside the checkpoint radius of relevant slots.

For every active slot whose relevance to the query exceeds `min_relevance` (0.3), score
the blocks within its checkpoint radius by cosine similarity, keep those ≥ `min_similarity`
(0.2), tag them with the slot, de-duplicate by block and rank by
0.7·similarity + 0.3·slot relevance. An empty result tells the caller to fall back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..index.search_index import BlockLookup
from ..store.base import BM25Filter
from .checkpoints import CheckpointManager
from .working import Slot

__all__ = ["LocalizedSearch", "LocalHit"]


@dataclass
class LocalHit:
    block_index: int
    similarity: float
    slot_id: int
    slot_relevance: float
    score: float


class LocalizedSearch:
    """Searches only the blocks around the checkpoints of the slots relevant to a query."""

    def __init__(self, checkpoints: CheckpointManager, *, min_relevance: float = 0.3,
                 min_similarity: float = 0.2) -> None:
        self.checkpoints = checkpoints
        self.min_relevance = min_relevance
        self.min_similarity = min_similarity

    def search(self, slots: list[Slot], query_vector: np.ndarray, k: int, lookup: BlockLookup,
               filt: BM25Filter | None = None, radius: int | None = None) -> list[LocalHit]:
        best: dict[int, LocalHit] = {}
        for slot in slots:
            slot_relevance = slot.affinity(query_vector)
            if slot_relevance is None or slot_relevance <= self.min_relevance:
                continue
            indices = lookup.live_among(self.checkpoints.radius(slot, radius), filt)
            vectors = lookup.vectors_of(indices)
            block_indices = [i for i in indices if i in vectors]
            if not block_indices:
                continue
            sims = np.stack([vectors[i] for i in block_indices]) @ query_vector
            for block_index, sim in zip(block_indices, sims.tolist()):
                if sim < self.min_similarity:
                    continue
                score = 0.7 * sim + 0.3 * slot_relevance
                current = best.get(block_index)
                if current is None or score > current.score:
                    best[block_index] = LocalHit(block_index, sim, slot.slot_id, slot_relevance, score)
        return sorted(best.values(), key=lambda h: (-h.score, h.block_index))[:k]

