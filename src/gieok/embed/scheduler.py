"""One local embedding engine, one calling thread, the most urgent work first.

A local model is one CPU resource shared by every caller in the process. Under chat load
three kinds of work compete for it: a turn that is about to answer (its search query, the
messages its guard must check: `NOW`), messages that just arrived and will be needed when
their debounce ends (`SOON`), and vectors for blocks written after a reply (`LATER`). Served
first-come-first-served, a turn waits behind seconds of background work; here it waits for at
most the one chunk already running.

How a caller says which kind its work is: priority.py.

Requests for the same text coalesce: a turn asking for a message vector that is still queued
as `SOON` promotes it instead of embedding it twice.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from .base import Embedder
from .priority import Priority, current_priority

__all__ = ["EmbeddingScheduler"]

_Key = tuple[bool, str]  # (is_query, text)


class EmbeddingScheduler:
    """Wraps a local embedder (it is called from one thread only: libgomp keeps a worker pool
    per calling thread, and the engines keep per-model scratch buffers). Urgent work runs one
    request at a time, first come first served, each in one batch of at most `urgent_batch`
    texts: a turn waits for its own texts, not for every other turn's (one 32-text batch of
    several turns held each of them for 0.5 s under the 50-channel load, where batching saves
    only ~10 % of engine time). Background work runs one text at a time while its queue is
    short, so an urgent request waits for one text at most, and in bigger chunks once a backlog
    builds (`_chunk`)."""

    def __init__(self, inner: Embedder, *, urgent_batch: int = 32, background_chunk: int = 1,
                 background_max_chunk: int = 8, backlog_per_text: int = 8) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.urgent_batch = urgent_batch
        self.background_chunk = background_chunk
        self.background_max_chunk = background_max_chunk
        self.backlog_per_text = backlog_per_text
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, int, _Key]] = []  # (level, request, order, key)
        self._pending: dict[_Key, Future[np.ndarray]] = {}
        self._best: dict[_Key, int] = {}
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.busy_seconds = 0.0  # engine time spent embedding (benchmarks report utilisation)
        self.texts_embedded = 0

    # -- the Embedder port -------------------------------------------------------------------
    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._gather(self.submit(texts, is_query=False))

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._gather(self.submit(texts, is_query=True))

    def _gather(self, futures: list[Future[np.ndarray]]) -> np.ndarray:
        if not futures:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([f.result() for f in futures]).astype(np.float32, copy=False)

    # -- scheduling --------------------------------------------------------------------------
    def submit(self, texts: Sequence[str], *, is_query: bool,
               priority: Priority | None = None) -> list[Future[np.ndarray]]:
        """One future per text (shared with any identical request already queued)."""
        level = int(current_priority() if priority is None else priority)
        futures = []
        with self._cond:
            self._start()
            request = next(self._seq)  # the request's texts share it: urgent batches keep requests whole
            for text in texts:
                key = (is_query, text)
                future = self._pending.get(key)
                if future is None:
                    future = self._pending[key] = Future()
                    # Running from the start: a waiter that gives up (a cancelled turn, through
                    # asyncio.wrap_future) cannot cancel a vector other waiters share.
                    future.set_running_or_notify_cancel()
                    self._best[key] = level
                    heapq.heappush(self._heap, (level, request, next(self._seq), key))
                elif level < self._best[key]:  # promote: the old heap entry becomes stale
                    self._best[key] = level
                    heapq.heappush(self._heap, (level, request, next(self._seq), key))
                futures.append(future)
            self._cond.notify()
        return futures

    def queued(self) -> int:
        with self._cond:
            return len(self._pending)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="gieok-embedder", daemon=True)
            self._thread.start()

    def _next_batch(self) -> tuple[bool, list[_Key]]:
        """Called with the lock held and the heap non-empty: the most urgent live entries of one
        kind (queries and passages are separate engine calls); urgent ones of one request."""
        batch: list[_Key] = []
        kind: bool | None = None
        level = request = -1
        skipped: list[tuple[int, int, int, _Key]] = []
        while self._heap:
            entry = self._heap[0]
            entry_level, entry_request, _, key = entry
            if key not in self._pending or self._best[key] < entry_level or key in batch:
                heapq.heappop(self._heap)  # done already, or promoted (its better entry counts)
                continue
            if kind is None:
                kind, level, request = key[0], entry_level, entry_request
            urgent = level == Priority.NOW
            limit = self.urgent_batch if urgent else self._chunk()
            if entry_level != level or len(batch) >= limit or (urgent and entry_request != request):
                break
            heapq.heappop(self._heap)
            if key[0] != kind:
                skipped.append(entry)
                continue
            batch.append(key)
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return bool(kind), batch

    def _chunk(self) -> int:
        """Background texts per engine call. One while the queue is short, so urgent work waits
        for at most one text; more as a backlog builds, because the engine is then the
        bottleneck and batches use it better: with other threads busy on the same two cores,
        a text costs 24.7 ms alone and 18.1 ms in a batch of 8 (30 % of a core busy elsewhere;
        33.4 vs 21.6 ms at 60 %)."""
        by_backlog = len(self._pending) // max(1, self.backlog_per_text)
        return max(self.background_chunk, min(self.background_max_chunk, by_backlog))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                is_query, batch = self._next_batch()
            if not batch:
                continue
            texts = [text for _, text in batch]
            started = time.perf_counter()
            try:
                vectors = self.inner.embed_queries(texts) if is_query else self.inner.embed_passages(texts)
                vectors = np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)
                error: BaseException | None = None
            except BaseException as exc:  # handed to every waiter; the worker keeps serving
                error = exc
            elapsed = time.perf_counter() - started
            with self._cond:
                self.busy_seconds += elapsed
                self.texts_embedded += len(texts)
                futures = [self._pending.pop(key) for key in batch]
                for key in batch:
                    self._best.pop(key, None)
            for i, future in enumerate(futures):
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(vectors[i])
