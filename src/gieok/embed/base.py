"""The Embedder port: every backend turns texts into L2-normalised float32 rows.

Queries and passages are separate calls because asymmetric models (e5: "query: " /
"passage: ") embed them differently; symmetric models just use one path for both.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import EmbedderError

__all__ = ["Embedder", "CachedEmbedder", "normalise_rows"]


@runtime_checkable
class Embedder(Protocol):
    """`name` is recorded in the database: two embedders with one name must agree on vectors."""

    name: str
    dimension: int

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...


def normalise_rows(matrix: np.ndarray, expected_dim: int | None = None) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    if expected_dim is not None and matrix.shape[1] != expected_dim:
        raise EmbedderError(f"embedder returned dimension {matrix.shape[1]}, expected {expected_dim}")
    if not np.all(np.isfinite(matrix)):
        raise EmbedderError("embedder returned NaN or infinite values")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(matrix / norms, dtype=np.float32)


class CachedEmbedder:
    """LRU cache in front of any embedder: chat repeats itself ("ㅋㅋ", "lol", greetings)."""

    def __init__(self, inner: Embedder, max_items: int = 4096) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.max_items = max_items
        self._cache: OrderedDict[tuple[bool, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, is_query=False)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, is_query=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed([text], is_query=True)[0]

    def _embed(self, texts: Sequence[str], *, is_query: bool) -> np.ndarray:
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for i, text in enumerate(texts):
                row = self._cache.get((is_query, text))
                if row is None:
                    missing.setdefault(text, []).append(i)
                else:
                    self._cache.move_to_end((is_query, text))
                    out[i] = row
                    self.hits += 1
        if missing:
            unique = list(missing)
            fresh = self.inner.embed_queries(unique) if is_query else self.inner.embed_passages(unique)
            fresh = normalise_rows(fresh, self.dimension)
            with self._lock:
                for text, row in zip(unique, fresh):
                    for i in missing[text]:
                        out[i] = row
                    self.misses += len(missing[text])
                    if self.max_items > 0:
                        self._cache[(is_query, text)] = row
                        if len(self._cache) > self.max_items:
                            self._cache.popitem(last=False)
        return out
