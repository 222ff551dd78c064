"""The Embedder port: every backend turns texts into L2-normalised float32 rows.

Queries and passages are separate calls because asymmetric models (e5: "query: " /
"passage: ") embed them differently; symmetric models just use one path for both.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from contextlib import nullcontext
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import EmbedderError
from .priority import Priority, embedding_priority

__all__ = ["Embedder", "CachedEmbedder", "normalise_rows"]


@runtime_checkable
class Embedder(Protocol):
    """`name` is recorded in the database: two embedders with one name must agree on vectors."""

    name: str
    dimension: int

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...


def normalise_rows(matrix: np.ndarray, expected_dim: int | None = None) -> np.ndarray:
    """Rows scaled to unit length as contiguous float32; wrong dimension, NaN or infinity is an error."""
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    if expected_dim is not None and matrix.shape[1] != expected_dim:
        raise EmbedderError(f"embedder returned dimension {matrix.shape[1]}, expected {expected_dim}")
    if not np.all(np.isfinite(matrix)):
        raise EmbedderError("embedder returned NaN or infinite values")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(matrix / norms, dtype=np.float32)


# Erased texts remembered so that a vector of one still being computed is not cached when it lands
# (a text said again later is embedded again each time until it leaves this window: only slower).
FORGOTTEN_KEPT = 4096


def _lines_of(key: str) -> Iterable[str]:
    """The texts a cached key was made of: each line of a passage (a turn, the turns before it),
    and each without its speaker label ("민지: …", passages.PassageSource.line)."""
    for line in key.split("\n"):
        line = line.strip()
        yield line
        label, sep, rest = line.partition(": ")
        if sep and label and len(label) <= 100:
            yield rest.strip()


class CachedEmbedder:
    """LRU cache in front of any embedder: chat repeats itself ("ㅋㅋ", "lol", greetings), and
    the runtime computes a message's vector once, when it arrives, for every later use."""

    def __init__(self, inner: Embedder, max_items: int = 4096) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.max_items = max_items
        self._cache: OrderedDict[tuple[bool, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self._alongside: list[weakref.ref[CachedEmbedder]] = []  # forget_alongside
        self._forgotten: OrderedDict[str, None] = OrderedDict()  # texts erased lately (forget_texts)
        self._generation = 0  # moved by `forget_everything`: a vector asked for before it is not cached

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, is_query=False)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, is_query=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed([text], is_query=True)[0]

    def _embed(self, texts: Sequence[str], *, is_query: bool) -> np.ndarray:
        generation = self._generation
        out, missing = self._lookup(texts, is_query)
        if missing:
            unique = list(missing)
            fresh = self.inner.embed_queries(unique) if is_query else self.inner.embed_passages(unique)
            self._remember(unique, normalise_rows(fresh, self.dimension), missing, out, is_query, generation)
        return out

    async def aembed_passages(self, texts: Sequence[str], priority: Priority | None = None) -> np.ndarray:
        return await self._aembed(texts, is_query=False, priority=priority)

    async def aembed_queries(self, texts: Sequence[str], priority: Priority | None = None) -> np.ndarray:
        return await self._aembed(texts, is_query=True, priority=priority)

    async def _aembed(self, texts: Sequence[str], *, is_query: bool, priority: Priority | None) -> np.ndarray:
        """The same vectors as the blocking calls, awaited without holding a thread: with dozens
        of channels waiting on one engine, blocked worker threads would starve the pool that
        SQLite reads and message intake need. Engines without a scheduler run in a thread."""
        submit = getattr(self.inner, "submit", None)
        if submit is None:
            call = self.embed_queries if is_query else self.embed_passages
            with embedding_priority(priority) if priority is not None else nullcontext():
                return await asyncio.to_thread(call, texts)
        generation = self._generation
        out, missing = self._lookup(texts, is_query)
        if missing:
            unique = list(missing)
            rows = await asyncio.gather(*(asyncio.wrap_future(f)
                                          for f in submit(unique, is_query=is_query, priority=priority)))
            self._remember(unique, normalise_rows(np.stack(rows), self.dimension), missing, out, is_query, generation)
        return out

    def futures(self, texts: Sequence[str], *, is_query: bool = False, priority: Priority | None = None,
                remember: bool = True) -> list[Future[np.ndarray]] | None:
        """One future per text without waiting, for engines with a scheduler (None for others): a
        cached vector's is done already, the rest are queued at `priority` (the caller's by
        default) and, unless `remember` is false (bulk work would flush the cache), land in the
        cache. Their rows are the engine's: normalise them (`normalise_rows`). Give up on them
        with `withdraw`."""
        submit = getattr(self.inner, "submit", None)
        if submit is None:
            return None
        out: list[Future[np.ndarray] | None] = []
        missing: dict[str, list[int]] = {}
        generation = self._generation
        with self._lock:
            for i, text in enumerate(texts):
                row = self._cache.get((is_query, text))
                if row is None:
                    missing.setdefault(text, []).append(i)
                    out.append(None)
                else:
                    self._cache.move_to_end((is_query, text))
                    self.hits += 1
                    done: Future[np.ndarray] = Future()
                    done.set_result(row)
                    out.append(done)
        if missing:
            unique = list(missing)
            for text, future in zip(unique, submit(unique, is_query=is_query, priority=priority)):
                for i in missing[text]:
                    out[i] = future
                self.misses += len(missing[text])
                if remember and self.max_items > 0:
                    future.add_done_callback(
                        lambda f, text=text: self._store_prefetched(text, f, is_query, generation=generation))
        return [f for f in out if f is not None]

    def withdraw(self, futures: Sequence[Future[np.ndarray]]) -> int:
        """Give up on what `futures` returned (each list once): queued texts nobody else waits
        for are dropped (see `EmbeddingScheduler.withdraw`)."""
        withdraw = getattr(self.inner, "withdraw", None)
        if withdraw is None:
            return 0
        unique = {id(f): f for f in futures if not f.done()}  # one text asked for twice is one future
        return int(withdraw(list(unique.values())))

    def forget_texts(self, texts: Iterable[str]) -> int:
        """Drop the vectors of erased texts, here and in the caches linked by `forget_alongside`: a
        query or a classifier input that is one of them, and a passage holding one as a line (its
        own turn, or the turn before another). An erased message must not stay in memory as a
        cache key (memory/writes.py `forget`). Returns the entries dropped."""
        erased = {t.strip() for t in texts if isinstance(t, str) and t.strip()}
        if not erased:
            return 0
        with self._lock:
            gone = [key for key in self._cache if any(line in erased for line in _lines_of(key[1]))]
            for key in gone:
                del self._cache[key]
            # a vector of one of them still being computed (a query started ahead) is not cached when it lands
            for text in erased:
                self._forgotten[text] = None
                self._forgotten.move_to_end(text)
            while len(self._forgotten) > FORGOTTEN_KEPT:
                self._forgotten.popitem(last=False)
            others = [cache for ref in self._alongside if (cache := ref()) is not None]
        return len(gone) + sum(other.forget_texts(erased) for other in others)

    def forget_everything(self) -> int:
        """Drop every cached vector, here and in the caches linked by `forget_alongside`, and
        those still being computed: another process erased messages whose texts this one cannot
        know any more (the store no longer holds them), and any cached text may be one of them.
        The caches fill again as they are used. Returns the entries dropped."""
        with self._lock:
            gone = len(self._cache)
            self._cache.clear()
            self._generation += 1
            others = [cache for ref in self._alongside if (cache := ref()) is not None]
        return gone + sum(other.forget_everything() for other in others)

    def _erased_lately(self, text: str) -> bool:
        """Whether `text` is, or holds as a line, one of the last `FORGOTTEN_KEPT` texts erased."""
        return any(line in self._forgotten for line in _lines_of(text))

    def forget_alongside(self, other: CachedEmbedder) -> None:
        """Forget in `other` too what this cache is told to forget (`forget_texts`): another
        engine's cache of the same messages (the chat guard's encoder beside a memory's e5).
        Held weakly: this cache does not keep `other` alive."""
        with self._lock:
            self._alongside = [ref for ref in self._alongside if ref() not in (None, other)]
            self._alongside.append(weakref.ref(other))

    def has(self, text: str, *, is_query: bool = False) -> bool:
        """Whether the vector is cached (a prefetch has landed)."""
        with self._lock:
            return (is_query, text) in self._cache

    def prefetch_passages(self, texts: Sequence[str], priority: Priority | None = None,
                          then: Callable[[str, np.ndarray], None] | None = None) -> int:
        """Start embedding passages that will be needed soon (`Priority.SOON` by default; `NOW`
        when a turn is about to ask for them), without waiting; the vectors land in this cache.
        Only engines with a scheduler (local models) take work in advance; for others this does
        nothing. `then(text, vector)` runs once each vector is ready — at once for one already
        cached, else on the engine's thread: keep it short, it must not raise. Returns how many
        texts were queued."""
        return self._prefetch(texts, priority, then, is_query=False)

    def prefetch_queries(self, texts: Sequence[str], priority: Priority | None = None,
                         then: Callable[[str, np.ndarray], None] | None = None) -> int:
        """`prefetch_passages` for query vectors."""
        return self._prefetch(texts, priority, then, is_query=True)

    def _prefetch(self, texts: Sequence[str], priority: Priority | None,
                  then: Callable[[str, np.ndarray], None] | None, *, is_query: bool) -> int:
        submit = getattr(self.inner, "submit", None)
        if submit is None:
            return 0
        cached: list[tuple[str, np.ndarray]] = []
        missing: list[str] = []
        with self._lock:
            for text in dict.fromkeys(texts):
                row = self._cache.get((is_query, text))
                if row is None:
                    missing.append(text)
                else:
                    cached.append((text, row))
        if then is not None:
            for text, row in cached:
                then(text, row)
        if not missing:
            return 0
        level = Priority.SOON if priority is None else priority
        generation = self._generation
        for text, future in zip(missing, submit(missing, is_query=is_query, priority=level)):
            future.add_done_callback(
                lambda f, text=text: self._store_prefetched(text, f, is_query, then, generation=generation))
        return len(missing)

    def _store_prefetched(self, text: str, future: Future[np.ndarray], is_query: bool,
                          then: Callable[[str, np.ndarray], None] | None = None, *, generation: int) -> None:
        if future.exception() is not None:
            return  # whoever needs the vector will ask again and see the error
        row = normalise_rows(future.result()[None, :], self.dimension)
        self._remember([text], row, {text: []}, row, is_query, generation, count=False)
        if then is not None:
            then(text, row[0])

    def _lookup(self, texts: Sequence[str], is_query: bool) -> tuple[np.ndarray, dict[str, list[int]]]:
        """Cached rows filled into `out`; the texts still missing, with their positions."""
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for i, text in enumerate(texts):
                row = self._cache.get((is_query, text))
                if row is None:
                    missing.setdefault(text, []).append(i)
                else:
                    self._cache.move_to_end((is_query, text))
                    out[i] = row
                    self.hits += 1
        return out, missing

    def _remember(self, unique: list[str], fresh: np.ndarray, missing: dict[str, list[int]], out: np.ndarray,
                  is_query: bool, generation: int, *, count: bool = True) -> None:
        """The vectors into `out` and the cache — not into the cache if the text was erased lately,
        or if the cache was emptied (`forget_everything`) since they were asked for, at `generation`."""
        with self._lock:
            keep = self.max_items > 0 and generation == self._generation
            for text, row in zip(unique, fresh):
                for i in missing[text]:
                    out[i] = row
                if count:
                    self.misses += len(missing[text])
                if keep and not (self._forgotten and self._erased_lately(text)):
                    self._cache[(is_query, text)] = row
                    if len(self._cache) > self.max_items:
                        self._cache.popitem(last=False)
