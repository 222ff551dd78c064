"""The approximate vector search of a store that has its own (PostgreSQL's pgvector HNSW), as
the `VectorIndex`'s graph. Nothing is built or kept in the process: the graph lives in the
database, shared by every process and updated in the same transaction as the blocks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..store.base import VectorSearchStore
from .catalog import Catalog

__all__ = ["StoreANN"]


class StoreANN:
    """Speaks the `VectorIndex` graph interface (rows of the catalog) over a store's
    `vector_search` (block indices): a row filter becomes a bitmap of block indices."""

    name = "pgvector-hnsw"

    def __init__(self, store: VectorSearchStore, catalog: Callable[[], Catalog]) -> None:
        self.store = store
        self._catalog = catalog

    @property
    def size(self) -> int:
        return len(self._catalog())

    def add(self, vectors: np.ndarray) -> None:
        """Nothing to do: the store indexed the vectors when it wrote them."""

    def erase(self, rows: list[int]) -> None:
        """Nothing to do: the store deleted the vectors when it forgot the blocks."""

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        catalog = self._catalog()
        last = catalog.last_block_index
        bitmap = None
        if allowed is not None:
            bits = np.zeros(last + 1, dtype=bool)
            bits[catalog.block_index_of(np.flatnonzero(allowed))] = True
            bitmap = np.packbits(bits, bitorder="little").tobytes()
        found, scores = self.store.vector_search(query, k, bitmap, last)
        rows = np.fromiter((catalog.row_of(int(i)) if catalog.row_of(int(i)) is not None else -1 for i in found),
                           dtype=np.int64, count=len(found))
        keep = rows >= 0
        return rows[keep], scores[keep]
