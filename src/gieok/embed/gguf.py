"""GGUF embedding models (e.g. KURE-v1) through llama-cpp-python, an optional extra.

Build it with CMAKE_ARGS="-DGGML_NATIVE=OFF": the native build crashes on CPUs with AMX.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import EmbedderUnavailableError
from .prefixed import PrefixedEmbedder


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
        self._model = Llama(model_path=path, embedding=True, verbose=False)
        self.name = f"gguf/{Path(path).name}"
        self.dimension = int(self._model.n_embd())
        super().__init__(query_prefix, passage_prefix)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._model.embed(list(texts)), dtype=np.float32)
