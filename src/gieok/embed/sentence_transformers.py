"""Any local sentence-transformers model (optional extra; pulls in PyTorch).

The model must already be on disk: gieok never downloads at run time, so
HF_HUB_OFFLINE is forced on while loading.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ..errors import EmbedderUnavailableError
from .prefixed import PrefixedEmbedder

__all__ = ["SentenceTransformerEmbedder"]


class SentenceTransformerEmbedder(PrefixedEmbedder):
    def __init__(self, model: str, query_prefix: str = "", passage_prefix: str = "") -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderUnavailableError(
                "embedder 'st:<model>' needs: pip install 'gieok[sentence-transformers]'"
            ) from exc
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            self._model = SentenceTransformer(model, device="cpu")
        except Exception as exc:
            raise EmbedderUnavailableError(
                f"cannot load sentence-transformers model {model!r} offline: {exc}. "
                "Pass a local directory or an installed model package."
            ) from exc
        self.name = f"st/{model}"
        self.dimension = int(self._model.get_sentence_embedding_dimension())
        super().__init__(query_prefix, passage_prefix)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._model.encode(list(texts), normalize_embeddings=True), dtype=np.float32)
