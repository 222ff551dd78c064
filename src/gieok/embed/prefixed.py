"""Shared shape of local models that mark queries and passages with text prefixes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["PrefixedEmbedder"]


class PrefixedEmbedder:
    """Subclasses set name, dimension and implement `_encode`; prefixes are e.g. e5's "query: "."""

    name: str
    dimension: int

    def __init__(self, query_prefix: str = "", passage_prefix: str = "") -> None:
        self._query_prefix = query_prefix
        self._passage_prefix = passage_prefix

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([self._passage_prefix + t for t in texts])

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([self._query_prefix + t for t in texts])
