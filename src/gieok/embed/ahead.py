"""Bulk embedding ahead of its consumer: the vectors of a stream of chunks (an import's, a big
`add_many`'s, a reindex's), queued on the scheduler's engines before the caller needs them, so
every core embeds while the caller commits what is ready."""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterable, Sequence
from concurrent.futures import Future
from typing import TypeVar

import numpy as np

from .base import CachedEmbedder, normalise_rows
from .priority import Priority

__all__ = ["embed_ahead", "AHEAD_TEXTS"]

T = TypeVar("T")

# Texts queued beyond the chunk a bulk write waits for: enough to keep every engine busy while
# the caller commits a chunk, few enough that a withdrawn import leaves little to drop.
AHEAD_TEXTS = 2048


def embed_ahead(embedder: CachedEmbedder, chunks: Iterable[tuple[T, Sequence[str]]], batch_size: int, *,
                priority: Priority | None = None,
                ahead: int = AHEAD_TEXTS) -> Generator[tuple[T, np.ndarray], None, None]:
    """`(payload, passage vectors of its texts)` for each of `chunks`, in order, lazily. With a
    local engine (a scheduler) the texts of the chunks after the one returned are queued too, up
    to `ahead` texts, so every engine embeds while the caller commits; at `priority` (the caller's
    by default; `BULK` work is kept out of the cache). Other engines embed a chunk when it is
    reached, `batch_size` texts a call. Stopping early — an error, or closing the generator —
    withdraws what is still queued. Close it (`contextlib.closing`) when a caller may stop early."""
    source = iter(chunks)
    queued: deque[tuple[T, Sequence[str], list[Future[np.ndarray]] | None]] = deque()
    in_flight = 0
    remember = priority != Priority.BULK
    current: list[Future[np.ndarray]] | None = None
    try:
        while True:
            while not queued or (in_flight < ahead and queued[-1][2] is not None):  # others: no reading ahead
                item = next(source, None)
                if item is None:
                    break
                payload, texts = item
                futures = embedder.futures(texts, priority=priority, remember=remember) if texts else []
                queued.append((payload, texts, futures))
                in_flight += len(texts) if futures is not None else 0
            if not queued:
                return
            payload, texts, current = queued.popleft()
            if current is None:
                vectors = _in_batches(embedder, texts, batch_size)
            else:
                in_flight -= len(texts)
                vectors = (normalise_rows(np.stack([f.result() for f in current]), embedder.dimension) if current
                           else np.zeros((0, embedder.dimension), np.float32))
            current = None
            yield payload, vectors
    finally:
        for futures in [current, *(f for _, _, f in queued)]:
            if futures:
                embedder.withdraw(futures)


def _in_batches(embedder: CachedEmbedder, texts: Sequence[str], batch_size: int) -> np.ndarray:
    parts = [embedder.embed_passages(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]
    return np.concatenate(parts) if parts else np.zeros((0, embedder.dimension), np.float32)
