"""On-disk cache of passage embeddings for benchmarks, keyed by model and text.

Embedding 100k passages with e5-small takes long even on every core (bulk work: `embed_ahead`);
the benchmarks measure search and storage, so they may reuse vectors computed once per model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import progress_bar
from gieok.embed import CachedEmbedder, Priority, embed_ahead

__all__ = ["EmbeddingCache", "bulk_passages", "corpus_vectors", "default_cache_dir"]


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
        cached = self._load(path, len(texts))
        if cached is not None:
            if progress:
                progress(len(texts))
            return cached, True
        parts = []
        for start in range(0, len(texts), batch):
            chunk = texts[start : start + batch]
            parts.append(np.asarray(compute(chunk), dtype=np.float32))
            if progress:
                progress(len(chunk))
        return self._save(path, parts), False

    def get_or_embed(self, texts: Sequence[str], embedder: CachedEmbedder, batch: int = 256,
                     progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, bool]:
        """`get_or_compute` for passages of `embedder`, computed as bulk work on every engine
        (`embed_ahead`; kept out of the embedder's cache)."""
        path = self._path(texts, "passage")
        cached = self._load(path, len(texts))
        if cached is not None:
            if progress:
                progress(len(texts))
            return cached, True
        parts = []
        with closing(bulk_passages(embedder, texts, batch)) as chunks:
            for chunk in chunks:
                parts.append(chunk)
                if progress:
                    progress(len(chunk))
        return self._save(path, parts), False

    @staticmethod
    def _load(path: Path, rows: int) -> np.ndarray | None:
        if path.is_file():
            vectors = np.load(path)
            if vectors.shape[0] == rows:
                return vectors
        return None

    def _save(self, path: Path, parts: list[np.ndarray]) -> np.ndarray:
        vectors = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, vectors)
        tmp.replace(path)
        return vectors


def bulk_passages(embedder: CachedEmbedder, texts: Sequence[str],
                  batch: int = 256) -> Generator[np.ndarray, None, None]:
    """Passage vectors of `texts`, `batch` rows at a time, embedded as bulk work (every engine,
    behind any query). Close the iterator (`contextlib.closing`) if you may stop early."""
    chunks = ((None, texts[start : start + batch]) for start in range(0, len(texts), batch))
    with closing(embed_ahead(embedder, chunks, batch, priority=Priority.BULK)) as embedded:
        for _, vectors in embedded:
            yield vectors


def corpus_vectors(embedder: Any, texts: Sequence[str], cache_dir: Path | None = None) -> np.ndarray:
    """Passage vectors of a benchmark corpus, computed once per model and then read from the
    cache (`cache_dir`, the user cache dir by default), behind a progress bar."""
    cache = EmbeddingCache(cache_dir or default_cache_dir(), embedder.name)
    with progress_bar(f"corpus vectors ({len(texts):,}, cached per model)", len(texts)) as advance:
        vectors, _ = cache.get_or_embed(texts, embedder, progress=advance)
    return vectors
