"""GGUF embedding models (e.g. KURE-v1) through llama-cpp-python, an optional extra.

Build it with CMAKE_ARGS="-DGGML_NATIVE=OFF": the native build crashes on CPUs with AMX.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import EmbedderUnavailableError
from .llama_logs import route_llama_logs
from .prefixed import PrefixedEmbedder

__all__ = ["GGUFEmbedder"]


class GGUFEmbedder(PrefixedEmbedder):
    def __init__(self, path: str, query_prefix: str = "", passage_prefix: str = "") -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise EmbedderUnavailableError(
                "embedder 'gguf:<path>' needs: CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install 'gieok[gguf]'"
            ) from exc
        if not Path(path).is_file():
            raise EmbedderUnavailableError(f"GGUF model file not found: {path}")
        route_llama_logs()  # llama.cpp's log lines to Python logging, not stderr
        self._model = Llama(model_path=path, embedding=True, verbose=False)
        self.name = f"gguf/{Path(path).name}"
        self.dimension = int(self._model.n_embd())
        super().__init__(query_prefix, passage_prefix)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        # A model whose GGUF names a pooling type (KURE-v1, bge-m3: CLS) returns one vector per
        # text; one without it returns a vector per token, which are averaged here.
        rows = [np.asarray(vector, dtype=np.float32) for vector in self._model.embed(list(texts))]
        return np.stack([row.mean(axis=0) if row.ndim == 2 else row for row in rows])
