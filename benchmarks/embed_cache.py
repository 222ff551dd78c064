"""On-disk cache of passage embeddings for benchmarks, keyed by model and text.

Embedding 100k passages with e5-small takes ~30 min on two cores; the benchmarks
measure search and storage, so they may reuse vectors computed once per model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import progress_bar

__all__ = ["EmbeddingCache", "corpus_vectors", "default_cache_dir"]


def default_cache_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("gieok", appauthor=False)) / "bench-embeddings"


class EmbeddingCache:
    """One .npy file per (model, corpus) pair, written atomically after a full pass."""

    def __init__(self, directory: Path, model_name: str) -> None:
        self.directory = directory
        self.model_name = model_name

    def _path(self, texts: Sequence[str], kind: str) -> Path:
        digest = hashlib.sha256()
        digest.update(self.model_name.encode())
        digest.update(kind.encode())
        for text in texts:
            digest.update(text.encode("utf-8", "surrogatepass"))
            digest.update(b"\x00")
        safe = self.model_name.replace("/", "_")
        return self.directory / f"{safe}-{kind}-{len(texts)}-{digest.hexdigest()[:16]}.npy"

    def get_or_compute(self, texts: Sequence[str], kind: str,
                       compute: Callable[[Sequence[str]], np.ndarray], batch: int = 256,
                       progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, bool]:
        """Return (vectors, was_cached). Computes in batches, reporting progress."""
        path = self._path(texts, kind)
        if path.is_file():
            vectors = np.load(path)
            if vectors.shape[0] == len(texts):
                if progress:
                    progress(len(texts))
                return vectors, True
        parts = []
        for start in range(0, len(texts), batch):
            chunk = texts[start : start + batch]
            parts.append(np.asarray(compute(chunk), dtype=np.float32))
            if progress:
                progress(len(chunk))
        vectors = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, vectors)
        tmp.replace(path)
        return vectors, False


def corpus_vectors(embedder: Any, texts: Sequence[str], cache_dir: Path | None = None) -> np.ndarray:
    """Passage vectors of a benchmark corpus, computed once per model and then read from the
    cache (`cache_dir`, the user cache dir by default), behind a progress bar."""
    cache = EmbeddingCache(cache_dir or default_cache_dir(), embedder.name)
    with progress_bar(f"corpus vectors ({len(texts):,}, cached per model)", len(texts)) as advance:
        vectors, _ = cache.get_or_compute(texts, "passage", embedder.inner.embed_passages, progress=advance)
    return vectors
