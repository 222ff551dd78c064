"""Vector search: an exact matrix product for small sets, HNSW above a threshold.

The matrix and the graph grow with every add; nothing is rebuilt per query (the
originals rebuilt their index on every search: 33 ms at 1k memories). The HNSW graph
is saved beside the database so reopening a large store does not rebuild it either.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

__all__ = ["VectorIndex", "AnnParams", "ExternalANN", "limit_blas_threads"]

_blas_limited = False


def limit_blas_threads(threads: int) -> None:
    """Cap BLAS (OpenBLAS) worker threads, once per process.

    A single query is a matrix-vector product that gains nothing from threads, while
    OpenBLAS's idle workers keep spinning afterwards and starve the embedder's own
    threads: on two cores a query embedding took 43 ms right after a 10k-row product,
    11 ms with BLAS capped at one thread (setting `blas_threads`, 0 = leave alone)."""
    global _blas_limited
    if threads <= 0 or _blas_limited:
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a declared dependency
        return
    threadpool_limits(limits=threads, user_api="blas")
    _blas_limited = True

# Below this many candidate rows an exact product over the subset beats any graph walk.
EXACT_SUBSET_MAX = 8192


@dataclass(frozen=True)
class AnnParams:
    threshold: int = 20_000
    m: int = 32
    ef_construction: int = 120
    ef_search: int = 96
    backend: str = "faiss"  # "faiss" | "usearch"


class _FaissHNSW:
    name = "faiss-hnsw"

    def __init__(self, dim: int, params: AnnParams) -> None:
        import faiss

        self._faiss = faiss
        self.index = faiss.IndexHNSWFlat(dim, params.m, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = params.ef_construction
        self.ef = params.ef_search

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    def add(self, vectors: np.ndarray) -> None:
        self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        faiss = self._faiss
        if allowed is not None:
            bitmap = np.packbits(allowed, bitorder="little")
            selector = faiss.IDSelectorBitmap(allowed.shape[0], faiss.swig_ptr(bitmap))
            params = faiss.SearchParametersHNSW(sel=selector, efSearch=max(self.ef, k))
        else:
            params = faiss.SearchParametersHNSW(efSearch=max(self.ef, k))
        scores, ids = self.index.search(query[None, :], k, params=params)
        keep = ids[0] >= 0
        return ids[0][keep].astype(np.int64), scores[0][keep]

    def erase(self, rows: list[int]) -> None:
        """Zero the stored vectors of forgotten rows in place; their graph links stay but
        score 0 and are masked by `alive`. Nothing of the erased content is saved."""
        self.overwrite(rows, np.zeros((len(rows), self.index.d), dtype=np.float32))

    def overwrite(self, rows: list[int], vectors: np.ndarray) -> None:
        """New stored vectors for these rows, in place: the graph's links stay as they were built."""
        faiss = self._faiss
        storage = faiss.downcast_index(self.index.storage)
        data = faiss.rev_swig_ptr(storage.get_xb(), self.index.ntotal * self.index.d)
        data = data.reshape(self.index.ntotal, self.index.d)
        inside = [i for i, r in enumerate(rows) if r < self.index.ntotal]
        data[[rows[i] for i in inside]] = np.asarray(vectors, dtype=np.float32)[inside]

    def save(self, path: Path) -> None:
        self._faiss.write_index(self.index, str(path))

    def load(self, path: Path) -> None:
        # faiss's stubs return the base Index; the SWIG wrapper hands back the saved IndexHNSWFlat
        self.index = self._faiss.read_index(str(path))  # type: ignore[assignment]


class _USearchHNSW:
    name = "usearch-hnsw"

    def __init__(self, dim: int, params: AnnParams) -> None:
        from usearch.index import Index

        self.index = Index(ndim=dim, metric="ip", dtype="f32", connectivity=params.m,
                           expansion_add=params.ef_construction, expansion_search=params.ef_search)

    @property
    def size(self) -> int:
        return len(self.index)

    def add(self, vectors: np.ndarray) -> None:
        start = len(self.index)
        self.index.add(np.arange(start, start + len(vectors)), np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        # usearch's Python API has no predicate; oversample and post-filter instead.
        fetch = k if allowed is None else min(self.size, k * 8)
        matches = self.index.search(query, fetch)
        ids = np.asarray(matches.keys, dtype=np.int64)
        scores = 1.0 - np.asarray(matches.distances, dtype=np.float32)
        if allowed is not None:
            keep = allowed[ids]
            ids, scores = ids[keep], scores[keep]
        return ids[:k], scores[:k]

    def erase(self, rows: list[int]) -> None:
        self.overwrite(rows, np.zeros((len(rows), self.index.ndim), dtype=np.float32))

    def overwrite(self, rows: list[int], vectors: np.ndarray) -> None:
        for row, vector in zip(rows, np.asarray(vectors, dtype=np.float32)):
            if self.index.contains(row):
                self.index.remove(row)
                self.index.add(row, vector)  # keep keys dense: row ids are positions

    def save(self, path: Path) -> None:
        self.index.save(str(path))

    def load(self, path: Path) -> None:
        self.index.load(str(path))


class ExternalANN(Protocol):
    """A graph kept outside the process (the store's: `index/store_ann.py`), used like ours."""

    name: str

    @property
    def size(self) -> int: ...

    def add(self, vectors: np.ndarray) -> None: ...

    def erase(self, rows: list[int]) -> None: ...

    def search(self, query: np.ndarray, k: int,
               allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]: ...


class VectorIndex:
    """Row-aligned with the Catalog. Scores are cosine similarities (rows are normalised).
    `external`: a graph the store keeps (nothing is built, saved or loaded here for it)."""

    def __init__(self, dim: int, params: AnnParams | None = None, external: ExternalANN | None = None) -> None:
        self.dim = dim
        self.params = params or AnnParams()
        self.external = external
        self._matrix = np.zeros((1024, dim), dtype=np.float32)
        self._size = 0
        self._ann: _FaissHNSW | _USearchHNSW | ExternalANN | None = None
        self._ann_dirty = False
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return self._size

    @property
    def kind(self) -> str:
        return self._ann.name if self._ann is not None else "exact"

    @property
    def matrix(self) -> np.ndarray:
        return self._matrix[: self._size]

    def extend(self, vectors: np.ndarray, *, build_ann: bool = True) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        with self._lock:
            need = self._size + len(vectors)
            if need > self._matrix.shape[0]:
                grown = np.zeros((max(need, self._matrix.shape[0] * 2), self.dim), dtype=np.float32)
                grown[: self._size] = self._matrix[: self._size]
                self._matrix = grown
            self._matrix[self._size : need] = vectors
            self._size = need
            if self._ann is not None:
                self._ann.add(vectors)
                self._ann_dirty = True
            elif build_ann and self._size >= self.params.threshold:
                self._build_ann()

    def _new_ann(self):
        if self.params.backend == "usearch":
            return _USearchHNSW(self.dim, self.params)
        return _FaissHNSW(self.dim, self.params)

    def _build_ann(self) -> None:
        if self.external is not None:  # the store indexed every vector when it wrote it
            self._ann = self.external
            return
        ann = self._new_ann()
        for start in range(0, self._size, 10_000):
            ann.add(self._matrix[start : min(self._size, start + 10_000)])
        self._ann = ann
        self._ann_dirty = True

    def replace_rows(self, rows: list[int], vectors: np.ndarray) -> None:
        """New vectors for some rows (turns embedded again without an erased neighbour): the
        matrix takes them, and so does the storage of a graph built here, in place — its links stay
        as they were built (a node cannot move; the new vector lies near the old one), and the graph
        saved next holds only the new vectors. One the store keeps follows the store.

        It used to drop the graph, built again, whole, by the next add (23 s at 50k blocks:
        `python -m benchmarks.erasure_graph`); and a process that stopped before that add left the
        graph saved earlier on disk, the erased neighbour's vector and the old ones in it."""
        with self._lock:
            if rows:
                vectors = np.asarray(vectors, dtype=np.float32)
                self._matrix[rows] = vectors
                if isinstance(self._ann, (_FaissHNSW, _USearchHNSW)):
                    self._ann.overwrite(rows, vectors)
                    self._ann_dirty = True

    def zero_rows(self, rows: list[int]) -> None:
        """Forgotten blocks: their vector is erased from the matrix and the graph's storage."""
        with self._lock:
            if rows:
                self._matrix[rows] = 0.0
                if self._ann is not None:
                    self._ann.erase(rows)
                    self._ann_dirty = True

    def exact(self, query: np.ndarray, k: int, rows: np.ndarray | None,
              alive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if rows is None:
            scores = self.matrix @ query
            scores = np.where(alive, scores, -np.inf)
            rows_all = None
        else:
            if rows.shape[0] == 0:
                return rows, np.empty(0, dtype=np.float32)
            scores = self._matrix[rows] @ query
            rows_all = rows
        k = min(k, scores.shape[0])
        if k <= 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        top = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(scores.shape[0])
        top = top[np.argsort(-scores[top], kind="stable")]
        top = top[np.isfinite(scores[top])]
        found = top if rows_all is None else rows_all[top]
        return found.astype(np.int64), scores[top].astype(np.float32)

    def search(self, query: np.ndarray, k: int, rows: np.ndarray | None,
               alive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows by cosine among `rows` (None: all live rows)."""
        with self._lock:
            ann = self._ann
            if ann is None or (rows is not None and rows.shape[0] <= EXACT_SUBSET_MAX):
                return self.exact(query, k, rows, alive)
            if rows is None:
                dead = self._size - int(alive.sum())
                if dead == 0:
                    return ann.search(query, k)
                allowed = alive.copy()
            else:
                allowed = np.zeros(self._size, dtype=bool)
                allowed[rows] = True
            ids, scores = ann.search(query, k, allowed)
            if ids.shape[0] < min(k, int(allowed.sum())):
                return self.exact(query, k, np.flatnonzero(allowed), alive)
            return ids, scores

    # -- persistence of the graph -----------------------------------------------------------
    @property
    def keeps_graph(self) -> bool:
        """Whether this process holds a graph of its own that `save` writes (not one the store keeps)."""
        return isinstance(self._ann, (_FaissHNSW, _USearchHNSW))

    def save(self, path: Path, embedder: str, last_block_index: int, vector_change: int = 0) -> None:
        """Write the graph built here (if it changed) and its description: which embedder, how many
        rows, and `vector_change`, the store's last vector replacement it holds (`try_load`)."""
        with self._lock:
            ann = self._ann
            if not isinstance(ann, (_FaissHNSW, _USearchHNSW)) or not self._ann_dirty:
                return  # nothing built here, or the store keeps the graph
            # The temporary file is this process's own: `--workers N` on one SQLite file close together,
            # and two writers of one shared name would each replace the other's file midway.
            tmp, meta = path.with_name(f"{path.name}.{os.getpid()}.tmp"), path.with_name(path.name + ".json")
            try:
                ann.save(tmp)
                os.replace(tmp, path)
                info = {"embedder": embedder, "rows": ann.size, "last_block_index": last_block_index,
                        "backend": ann.name, "m": self.params.m, "vector_change": vector_change}
                meta.write_text(json.dumps(info))
            except (OSError, RuntimeError) as exc:  # faiss and usearch say "No space left" as RuntimeError
                # only a cache: a full disk must not fail the close, nor leave half a graph taking space
                tmp.unlink(missing_ok=True)
                meta.unlink(missing_ok=True)  # no description, no load: the next open rebuilds the graph
                logging.getLogger("gieok.index").warning("the ANN graph was not saved beside the database "
                                                         "(%s); the next open rebuilds it", exc)
                return
            self._ann_dirty = False

    def try_load(self, path: Path, embedder: str) -> int | None:
        """Load a saved graph if it matches this embedder and covers a prefix of our rows: the
        store's last vector replacement it holds (0 for a graph saved before they were counted),
        or None when nothing was loaded."""
        meta = path.with_name(path.name + ".json")
        if self.external is not None or not path.is_file() or not meta.is_file():
            return None
        try:
            info = json.loads(meta.read_text())
            ann = self._new_ann()
            if info.get("embedder") != embedder or info.get("backend") != ann.name or info.get("m") != self.params.m:
                return None
            rows = int(info["rows"])
            vector_change = int(info.get("vector_change", 0))
            if rows > self._size:
                return None
            ann.load(path)
            if ann.size != rows:
                return None
        except Exception:
            return None  # a damaged sidecar is only a cache: rebuild it
        with self._lock:
            if rows < self._size:
                ann.add(self._matrix[rows : self._size])
            self._ann = ann
            self._ann_dirty = rows < self._size
        return vector_change

    def ensure_ann(self) -> None:
        with self._lock:
            if self._ann is None and self._size >= self.params.threshold:
                self._build_ann()
