"""Local embedding engines behind one queue: the most urgent work first, bulk work on every core.

A local model is one CPU resource shared by every caller in the process. Under chat load
three kinds of work compete for it: a turn that is about to answer (its search query, the
messages its guard must check: `NOW`), messages that just arrived and will be needed when
their debounce ends (`SOON`), and vectors for blocks written after a reply (`LATER`). Served
first-come-first-served, a turn waits behind seconds of background work; here it waits for at
most the one chunk already running.

Bulk work — an import, a big `add_many`, a reindex, a benchmark fill (`BULK`) — runs on engines
of its own, one per core, each in a thread whose OS priority is lowered: they take every idle
core, and a query or a reply (on the urgent engine, at normal priority) preempts them at once
instead of waiting for their chunk. An engine whose backend cannot run twice in a process
(`Embedder` without `parallel_instances`) gets no bulk engines: its one worker then serves bulk
work last, in small chunks.

How a caller says which kind its work is: priority.py.

Requests for the same text coalesce: a turn asking for a message vector that is still queued
as `SOON` promotes it instead of embedding it twice. Queries waiting together (a server with
many clients) share one engine call. A caller that gives up on bulk work withdraws it
(`withdraw`), so the engines do not keep embedding texts nobody will read.

Urgent passages are shared with the bulk engines (`share_urgent`, issue 41): while the urgent
engine is busy, an idle bulk engine takes the next request's passages in line (queries stay on the
urgent engine, whose engine answers a question in a third of the BLAS engine's time), and a request
of many passages is taken `share_chunk` at a time, so its chunks run on every core at once. Many
agents writing at the same time then use both cores instead of queueing for one; a lone request on
an idle engine waits for nobody.

Every scheduler with live workers is closed when the interpreter exits (`_close_live_schedulers`, an
`atexit` hook): the workers are daemon threads, and one still inside an engine call (onnxruntime,
which releases the interpreter lock) when Python finalises is ended by `pthread_exit` as it takes
the lock back — the forced unwind then crosses onnxruntime's `noexcept` C++ frames and the process
aborts ("terminate called without an active exception"). Closing first lets the running call finish.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, Future

import numpy as np

from ..errors import EmbedderError
from .base import Embedder
from .priority import Priority, current_priority

__all__ = ["EmbeddingScheduler", "BULK_NICE", "default_bulk_workers"]

_Key = tuple[bool, str]  # (is_query, text)

# How much lower (in nice steps) the bulk engines' threads run than the process: at +10 the
# kernel gives a thread at the process's own priority ~90 % of a core they share.
BULK_NICE = 10


def default_bulk_workers(threads_per_call: int = 1) -> int:
    """One bulk engine per core this process may run on (one per `threads_per_call` cores when
    each engine call runs that many OpenMP threads; one in all when it runs one per core: 0)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // threads_per_call) if threads_per_call > 0 else 1


# Schedulers whose workers have started and that are not closed yet (closed at exit: module docstring).
_live: weakref.WeakSet[EmbeddingScheduler] = weakref.WeakSet()


def _close_live_schedulers() -> None:
    """Run by `atexit`: after the non-daemon threads are joined, before daemon threads are stopped."""
    for scheduler in list(_live):
        scheduler.close()


atexit.register(_close_live_schedulers)


def _lower_thread_priority(steps: int) -> None:
    """Raise the calling thread's nice value by `steps` (Linux: the priority of a thread id);
    elsewhere, or when refused, nothing changes."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except (AttributeError, OSError):  # pragma: no cover - a sandbox may refuse
        pass


class EmbeddingScheduler:
    """Wraps a local embedder (it is called from one thread only: libgomp keeps a worker pool
    per calling thread, and the engines keep per-model scratch buffers). Urgent work runs one
    request at a time, first come first served, each in one batch of at most `urgent_batch`
    texts: a turn waits for its own texts, not for every other turn's (one 32-text batch of
    several turns held each of them for 0.5 s under the 50-channel load, where batching saves
    only ~10 % of engine time). Queries are the exception: single-text searches waiting at the
    same time share one call of at most `query_group` texts, and go before urgent passages
    asked for earlier (`_urgent_queries`). With `passage_group` > 1 (an engine whose batch costs
    less a text than single calls: the classifiers' encoder, ~2 ms a message in a group of four
    against ~4 alone), the urgent passages of requests waiting together share a call too, until it
    holds that many texts (a request's texts may then span two calls). Background work runs one text at a
    time while its queue is short, so an urgent request waits for one text at most, and in bigger
    chunks once a backlog builds (`_chunk`).

    `engines`: makes another instance of the same engine (vectors identical to `inner`'s); with
    it, `bulk_workers` threads each load one on their first bulk work and embed `BULK` texts
    in chunks of up to `bulk_chunk`, their threads `bulk_nice` steps below the process's priority.
    A bulk engine idle for `bulk_idle_seconds` (None: never) exits and drops its engine — what it
    held (the BLAS engine's float32 weights: ~150 MB a process) goes back to the system, and the
    next bulk work loads engines again (~1 s)."""

    def __init__(self, inner: Embedder, *, urgent_batch: int = 32, query_group: int = 16, passage_group: int = 1,
                 background_chunk: int = 1,
                 background_max_chunk: int = 8, backlog_per_text: int = 8,
                 engines: Callable[[], Embedder] | None = None, bulk_workers: int = 0, bulk_chunk: int = 16,
                 bulk_nice: int = BULK_NICE, bulk_idle_seconds: float | None = None, share_urgent: bool = False,
                 share_chunk: int = 8) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.urgent_batch = urgent_batch
        self.query_group = query_group
        self.passage_group = max(1, passage_group)
        self.background_chunk = background_chunk
        self.background_max_chunk = background_max_chunk
        self.backlog_per_text = backlog_per_text
        self.bulk_workers = bulk_workers if engines is not None else 0
        self.bulk_chunk = bulk_chunk
        self.bulk_nice = bulk_nice
        self.bulk_idle_seconds = bulk_idle_seconds
        self.share_urgent = share_urgent and self.bulk_workers > 0
        self.share_chunk = share_chunk
        self._urgent_busy = False  # the urgent engine is embedding (bulk engines may help with what waits)
        self._engines = engines
        self._bulk_names = itertools.count()
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, int, _Key]] = []  # (level, request, order, key), NOW to LATER
        self._now_queries: list[tuple[int, int, int, _Key]] = []  # urgent queries, apart: `_urgent_queries`
        self._bulk: deque[_Key] = deque()  # BULK keys, first come first served
        self._pending: dict[_Key, Future[np.ndarray]] = {}
        self._best: dict[_Key, int] = {}
        self._wanted: dict[_Key, int] = {}  # how many requests wait for a queued key (withdraw)
        self._key_of: dict[Future[np.ndarray], _Key] = {}
        self._running: set[_Key] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._bulk_threads: list[threading.Thread] = []
        self._bulk_live = 0  # bulk engines loaded and serving
        self._bulk_loading = 0  # bulk engines still loading (the urgent engine leaves bulk work to them)
        self._closed = False
        self.bulk_error: BaseException | None = None  # why a bulk engine could not load, if one could not
        self.busy_seconds = 0.0  # urgent engine time spent embedding (benchmarks report utilisation)
        self.texts_embedded = 0  # by every engine
        self.bulk_busy_seconds = 0.0  # summed over the bulk engines
        self.bulk_texts_embedded = 0
        self.shared_texts_embedded = 0  # urgent passages a bulk engine took (share_urgent)
        self.engines: dict[str, str] = {}  # what runs queries and bulk work, as /health reports it

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
            if self._closed:
                raise EmbedderError("the embedding scheduler is closed")
            self._start(bulk=level == Priority.BULK or (self.share_urgent and self._urgent_busy and not is_query))
            request = next(self._seq)  # the request's texts share it: urgent batches keep requests whole
            for text in texts:
                key = (is_query, text)
                future = self._pending.get(key)
                if future is None:
                    future = self._pending[key] = Future()
                    # Running from the start: a waiter that gives up (a cancelled turn, through
                    # asyncio.wrap_future) cannot cancel a vector other waiters share.
                    future.set_running_or_notify_cancel()
                    self._key_of[future] = key
                    self._best[key] = level
                    self._queue(level, request, key)
                elif level < self._best[key]:  # promote: the old entry becomes stale
                    self._best[key] = level
                    self._queue(level, request, key)
                self._wanted[key] = self._wanted.get(key, 0) + 1
                futures.append(future)
            self._cond.notify_all()
        return futures

    def _queue(self, level: int, request: int, key: _Key) -> None:
        if level >= Priority.BULK:
            self._bulk.append(key)
        else:
            heapq.heappush(self._now_queries if level == Priority.NOW and key[0] else self._heap,
                           (level, request, next(self._seq), key))

    def withdraw(self, futures: Iterable[Future[np.ndarray]]) -> int:
        """Give up on futures `submit` returned (each once, as many times as it was asked for):
        a text nobody else waits for and no engine has started is dropped, its future failing
        with `CancelledError`. Returns how many were dropped."""
        dropped = []
        with self._cond:
            for future in futures:
                key = self._key_of.get(future)
                if key is None or key not in self._wanted:
                    continue  # done already (or never queued here)
                left = self._wanted[key] - 1
                self._wanted[key] = max(0, left)
                if left > 0 or key in self._running:
                    continue
                self._forget(key)
                dropped.append(future)
        for future in dropped:
            future.set_exception(CancelledError())
        return len(dropped)

    def _forget(self, key: _Key) -> Future[np.ndarray]:
        """Called with the lock held: `key` leaves every table (its queue entries become stale)."""
        future = self._pending.pop(key)
        self._best.pop(key, None)
        self._wanted.pop(key, None)
        self._key_of.pop(future, None)
        self._running.discard(key)
        return future

    def queued(self) -> int:
        with self._cond:
            return len(self._pending)

    @property
    def bulk_engines(self) -> int:
        """Bulk engines loaded and serving (they load on the first bulk work)."""
        with self._cond:
            return self._bulk_live

    def close(self, timeout: float = 10.0) -> None:
        """Stop: queued texts fail with `EmbedderError`, engine calls already running finish, the
        workers exit; later `submit`s raise."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            _live.discard(self)
            dropped = [self._forget(key) for key in list(self._pending) if key not in self._running]
            self._heap.clear()
            self._now_queries.clear()
            self._bulk.clear()
            self._cond.notify_all()
        for future in dropped:
            future.set_exception(EmbedderError("the embedding scheduler is closed"))
        for thread in [self._thread, *self._bulk_threads]:
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)

    def _start(self, bulk: bool) -> None:
        _live.add(self)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="gieok-embedder", daemon=True)
            self._thread.start()
        if bulk and self._engines is not None:  # up to bulk_workers (engines idle out one by one)
            for _ in range(self.bulk_workers - len(self._bulk_threads)):
                self._bulk_loading += 1
                thread = threading.Thread(target=self._bulk_work, name=f"gieok-embedder-bulk-{next(self._bulk_names)}",
                                          daemon=True)
                self._bulk_threads.append(thread)
                thread.start()

    def _urgent_queries(self) -> list[_Key]:
        """Called with the lock held: up to `query_group` live urgent queries, oldest first, taken
        off their heap (they are kept apart from the rest, so finding them costs no scan of a long
        queue). An urgent query goes before urgent passages asked for earlier: it is a few
        milliseconds of engine time that a search or a turn's reply waits for, where a passage
        request is a message being stored (and the bulk engines may take passages meanwhile:
        `share_urgent`). Measured (`gieok bench agents`, 32 agents, first come first served): a
        context call waited behind the passages of the adds queued before it."""
        taken: list[_Key] = []
        while self._now_queries and len(taken) < self.query_group:
            key = heapq.heappop(self._now_queries)[3]
            if key in self._pending and key not in self._running and key not in taken:  # else done or withdrawn
                taken.append(key)
        return taken

    def _next_batch(self) -> tuple[bool, list[_Key]]:
        """Called with the lock held: urgent queries, several requests' in one call, first
        (`_urgent_queries`); else the most urgent live entries of one kind (queries and passages are
        separate engine calls), urgent passages of one request."""
        queries = self._urgent_queries() if self._now_queries else []
        if queries:
            return True, queries
        batch: list[_Key] = []
        kind: bool | None = None
        level = request = -1
        skipped: list[tuple[int, int, int, _Key]] = []
        while self._heap:
            entry = self._heap[0]
            entry_level, entry_request, _, key = entry
            if (key not in self._pending or self._best[key] < entry_level or key in batch
                    or key in self._running):  # done, promoted (its better entry counts), or being embedded
                heapq.heappop(self._heap)
                continue
            if kind is None:
                kind, level, request = key[0], entry_level, entry_request
            urgent = level == Priority.NOW  # passages only: urgent queries are kept apart
            limit = self._urgent_chunk() if urgent else self._chunk()
            if entry_level != level or len(batch) >= limit or (
                    urgent and entry_request != request and len(batch) >= self.passage_group):
                break
            heapq.heappop(self._heap)
            if key[0] != kind:
                skipped.append(entry)
                continue
            batch.append(key)
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return bool(kind), batch

    def _urgent_chunk(self) -> int:
        """Urgent passages per engine call: one request's, at most `urgent_batch`; `share_chunk` when
        bulk engines share urgent work, so the rest of a big request goes to them meanwhile."""
        return self.share_chunk if self.share_urgent else self.urgent_batch

    def _next_shared(self, limit: int) -> list[_Key]:
        """Called with the lock held, by a bulk engine: up to `limit` urgent passages of the next
        request in line (queries are left to the urgent engine)."""
        batch: list[_Key] = []
        skipped: list[tuple[int, int, int, _Key]] = []
        level = request = -1
        while self._heap and len(batch) < limit:
            entry = self._heap[0]
            entry_level, entry_request, _, key = entry
            if (key not in self._pending or self._best[key] < entry_level or key in batch
                    or key in self._running):  # done, promoted, or being embedded
                heapq.heappop(self._heap)
                continue
            if key[0]:  # a query: the urgent engine's
                skipped.append(heapq.heappop(self._heap))
                continue
            if batch and (entry_level, entry_request) != (level, request):
                break
            level, request = entry_level, entry_request
            batch.append(heapq.heappop(self._heap)[3])
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return batch

    def _shared_ready(self) -> bool:
        """Urgent passages wait while the urgent engine is busy (lock held)."""
        return self.share_urgent and self._urgent_busy and any(
            not key[0] and key in self._pending and key not in self._running for _, _, _, key in self._heap)

    def _next_bulk(self, limit: int) -> tuple[bool, list[_Key]]:
        """Called with the lock held: up to `limit` live bulk keys of one kind, oldest first."""
        batch: list[_Key] = []
        kind: bool | None = None
        other: list[_Key] = []
        while self._bulk and len(batch) < limit:
            key = self._bulk.popleft()
            if key not in self._pending or self._best[key] < Priority.BULK or key in self._running or key in batch:
                continue  # done, withdrawn, promoted or being embedded
            if kind is None:
                kind = key[0]
            if key[0] != kind:
                other.append(key)
                continue
            batch.append(key)
        self._bulk.extendleft(reversed(other))
        return bool(kind), batch

    def _chunk(self) -> int:
        """Background texts per engine call. One while the queue is short, so urgent work waits
        for at most one text; more as a backlog builds, because the engine is then the
        bottleneck and batches use it better: with other threads busy on the same two cores,
        a text costs 24.7 ms alone and 18.1 ms in a batch of 8 (30 % of a core busy elsewhere;
        33.4 vs 21.6 ms at 60 %)."""
        by_backlog = len(self._pending) // max(1, self.backlog_per_text)
        return max(self.background_chunk, min(self.background_max_chunk, by_backlog))

    def _bulk_chunk(self) -> int:
        """Bulk texts per call of a bulk engine: the backlog shared out over the engines, at most
        `bulk_chunk` (a withdrawn import stops within one chunk)."""
        return max(1, min(self.bulk_chunk, len(self._bulk) // max(1, self._bulk_live)))

    def _urgent_serves_bulk(self) -> bool:
        """No bulk engine serves (or will: none is loading)."""
        return self._bulk_live == 0 and self._bulk_loading == 0

    def _urgent_ready(self) -> bool:
        """Work for the urgent engine: anything above bulk, or bulk work when no bulk engine serves."""
        return bool(self._heap) or bool(self._now_queries) or (bool(self._bulk) and self._urgent_serves_bulk())

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._urgent_ready():
                    self._cond.wait()
                if self._closed:
                    return
                is_query, batch = self._next_batch() if self._heap or self._now_queries else (False, [])
                if not batch and self._bulk and self._urgent_serves_bulk():
                    is_query, batch = self._next_bulk(self._chunk())
                if not batch:
                    continue
                self._running.update(batch)
                self._urgent_busy = True
                if self.share_urgent and not is_query and self._heap:
                    self._start(bulk=True)  # more urgent work waits: the bulk engines may take it
                self._cond.notify_all()
            try:
                self._embed(self.inner, is_query, batch, bulk=False)
            finally:
                with self._cond:
                    self._urgent_busy = False

    def _bulk_work(self) -> None:
        _lower_thread_priority(self.bulk_nice)
        assert self._engines is not None
        try:
            engine = self._engines()
        except BaseException as exc:  # the urgent engine serves bulk work if no bulk engine loads
            with self._cond:
                self.bulk_error = exc
                self._bulk_loading -= 1
                self._cond.notify_all()
            return
        with self._cond:
            self._bulk_loading -= 1
            self._bulk_live += 1
            self._cond.notify_all()
        try:
            while True:
                with self._cond:
                    idle_since = time.monotonic()
                    while not self._closed and not self._bulk and not self._shared_ready():
                        if self.bulk_idle_seconds is None:
                            self._cond.wait()
                            continue
                        left = idle_since + self.bulk_idle_seconds - time.monotonic()
                        if left <= 0:  # idle: leave, so that the engine's memory goes with this thread
                            self._bulk_threads.remove(threading.current_thread())
                            return
                        self._cond.wait(left)
                    if self._closed:
                        return
                    shared = not self._bulk
                    if shared:
                        is_query, batch = False, self._next_shared(self.share_chunk)
                    else:
                        is_query, batch = self._next_bulk(self._bulk_chunk())
                    if not batch:
                        continue
                    self._running.update(batch)
                self._embed(engine, is_query, batch, bulk=True, shared=shared)
        finally:
            with self._cond:
                self._bulk_live -= 1
                self._cond.notify_all()

    def _embed(self, engine: Embedder, is_query: bool, batch: list[_Key], *, bulk: bool, shared: bool = False) -> None:
        texts = [text for _, text in batch]
        started = time.perf_counter()
        try:
            vectors = engine.embed_queries(texts) if is_query else engine.embed_passages(texts)
            vectors = np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)
            error: BaseException | None = None
        except BaseException as exc:  # handed to every waiter; the worker keeps serving
            error = exc
        elapsed = time.perf_counter() - started
        with self._cond:
            if bulk:
                self.bulk_busy_seconds += elapsed
                self.bulk_texts_embedded += len(texts)
                self.shared_texts_embedded += len(texts) if shared else 0
            else:
                self.busy_seconds += elapsed
            self.texts_embedded += len(texts)
            futures = [self._forget(key) for key in batch]
        for i, future in enumerate(futures):
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(vectors[i])
