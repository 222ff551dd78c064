"""`gieok bench latency`: add throughput, search latency and ANN recall at growing sizes.

The corpus is the synthetic bilingual chat of `bench.corpus` (realistic text, not random
vectors); smaller sizes are prefixes of the largest. Passage vectors are cached on disk
per model so a 100k run takes minutes after the first; embedding throughput is measured
fresh on every run and reported separately.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.corpus import ChatMessage, generate_messages, generate_queries
from benchmarks.embed_cache import corpus_vectors
from benchmarks.fill import bench_location, bench_target, corpus_items, fresh_memory
from benchmarks.report import p50_p95, print_and_write, progress_bar, results_table, table_console
from gieok.memory import Memory
from gieok.types import Scope

__all__ = ["measure_latency", "print_latency", "run_latency"]

ADD_BATCH = 1000
EMBED_SAMPLE = 256


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _embed_per_s(embedder: Any, texts: Sequence[str]) -> float:
    """Passages embedded per second by the model itself, on texts no cache has seen."""
    sample = [f"{t} #{i}" for i, t in enumerate(texts[:EMBED_SAMPLE])]  # defeat every cache
    started = time.perf_counter()
    embedder.inner.embed_passages(sample)
    return len(sample) / (time.perf_counter() - started)


def _add_seconds(memory: Memory, messages: Sequence[ChatMessage], vectors: np.ndarray) -> float:
    """Seconds spent in `add_many` storing `messages` (vectors ready) in batches of ADD_BATCH."""
    n = len(messages)
    add_seconds = 0.0
    with progress_bar(f"add {n:,} blocks", n) as advance:
        for start in range(0, n, ADD_BATCH):
            stop = min(n, start + ADD_BATCH)
            batch = messages[start:stop]
            t0 = time.perf_counter()
            memory.add_many(corpus_items(batch), vectors=vectors[start:stop])
            add_seconds += time.perf_counter() - t0
            advance(stop - start)
    return add_seconds


def _rows_in(memory: Memory, scope: Scope) -> int:
    rows = memory.catalog.candidate_rows(scope, (), None, None)
    return len(memory.catalog) if rows is None else int(rows.shape[0])


def _search_latencies(memory: Memory, n: int,
                      query_texts: list[str]) -> tuple[list[float], list[float], list[float], list[float]]:
    """(search ms on ready query vectors, search ms with query embedding, ANN recall@10 per query,
    the same recall with a guild filter: the largest guild, a third of the blocks)."""
    embedder = memory.embedder
    warm = [f"{q} (warm-up)" for q in query_texts[:10]]  # not the measured texts: no cache hits
    warm_vectors = np.stack([embedder.embed_query(q) for q in warm])
    for q, qv in zip(warm, warm_vectors):
        memory.search(q, 10, layers=False, query_vector=qv)
    plain_ms, full_ms, ann_recall, filtered_recall = [], [], [], []
    guild = max(memory.catalog.guilds.code_of, key=lambda g: _rows_in(memory, Scope(guild=g)))
    # Three separate passes: the exact scans that score ANN recall sweep the whole matrix
    # through the CPU caches and would slow whatever search came right after them.
    with progress_bar(f"search {n:,}", 3 * len(query_texts)) as advance:
        for q in query_texts:
            result = memory.search(q, 10)  # end to end, query embedding included
            full_ms.append(result.search_time_ms)
            advance()
        query_vectors = [embedder.embed_query(q) for q in query_texts]  # cached now: free
        for q, qv in zip(query_texts, query_vectors):
            t0 = time.perf_counter()
            memory.search(q, 10, layers=False, query_vector=qv)
            plain_ms.append((time.perf_counter() - t0) * 1000)
            advance()
        vectors_index = memory.vectors
        assert vectors_index is not None
        for qv in query_vectors:
            if vectors_index.kind != "exact":
                alive = memory.catalog.alive()
                approx, _ = vectors_index.search(qv, 10, None, alive)
                exact, _ = vectors_index.exact(qv, 10, None, alive)
                ann_recall.append(len(set(approx.tolist()) & set(exact.tolist())) / max(1, len(exact)))
                rows = memory.catalog.candidate_rows(Scope(guild=guild), (), None, None)
                approx, _ = vectors_index.search(qv, 10, rows, alive)
                exact, _ = vectors_index.exact(qv, 10, rows, alive)
                filtered_recall.append(len(set(approx.tolist()) & set(exact.tolist())) / max(1, len(exact)))
            advance()
    return plain_ms, full_ms, ann_recall, filtered_recall


def measure_latency(sizes: list[int], *, queries: int = 200, cache_dir: Path | None = None,
                    workdir: Path | str | None = None,
                    settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """`workdir`: a directory for the SQLite files, or a `postgresql://` URL (a schema per size)."""
    sizes = sorted(set(sizes))
    target = bench_target("latency", None if workdir is None else str(workdir))
    messages = generate_messages(sizes[-1])
    texts = [m.text for m in messages]
    query_texts = generate_queries(queries)
    overrides = dict(settings_overrides or {})

    results: list[dict[str, Any]] = []
    embed_per_s = 0.0
    for n in sizes:
        memory = fresh_memory(bench_location(target, f"latency-{n}.db"), **overrides)
        try:
            if not embed_per_s:
                embed_per_s = _embed_per_s(memory.embedder, texts)
                vectors = corpus_vectors(memory.embedder, texts, cache_dir)
            memory.tokenizer.tokens("워밍업 문장입니다 warm-up sentence")  # load kiwi's model outside the timing
            add_seconds = _add_seconds(memory, messages[:n], vectors)
            plain_ms, full_ms, ann_recall, filtered_recall = _search_latencies(memory, n, query_texts)
            index_kind = memory.vectors.kind if memory.vectors is not None else "exact"
        finally:
            memory.close()
        results.append({
            "n": n,
            "add_per_s": round(n / add_seconds, 1),
            "embed_per_s": round(embed_per_s, 1),
            "search_ms": p50_p95(plain_ms),
            "search_with_embedding_ms": p50_p95(full_ms),
            "ann_recall_at_10": round(float(np.mean(ann_recall)), 4) if ann_recall else None,
            "ann_recall_at_10_guild_filter": round(float(np.mean(filtered_recall)), 4) if filtered_recall else None,
            "rss_mb": round(_peak_rss_mb(), 1),
            "index": index_kind,
        })
    return {"sizes": results}


def print_latency(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    table = results_table("gieok latency (hybrid search, k=10, unscoped; medians of one run)",
                          ("blocks", "index", "add/s", "embed/s", "search p50", "p95", "with embedding p50", "p95",
                           "ANN recall@10", "peak RSS MB"))
    for row in report["sizes"]:
        table.add_row(
            f"{row['n']:,}", row["index"], f"{row['add_per_s']:,.0f}", f"{row['embed_per_s']:,.1f}",
            f"{row['search_ms']['p50']:.2f} ms", f"{row['search_ms']['p95']:.2f} ms",
            f"{row['search_with_embedding_ms']['p50']:.2f} ms", f"{row['search_with_embedding_ms']['p95']:.2f} ms",
            "exact" if row["ann_recall_at_10"] is None else f"{row['ann_recall_at_10']:.3f}",
            f"{row['rss_mb']:,.0f}",
        )
    console.print(table)
    sizes = report["sizes"]
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        ratio = b["search_ms"]["p50"] / a["search_ms"]["p50"] if a["search_ms"]["p50"] else float("nan")
        console.print(f"search p50 at {b['n']:,} is {ratio:.2f}× the p50 at {a['n']:,}")


def run_latency(sizes: list[int], json_out: str | Path | None = None, *, queries: int = 200,
                cache_dir: Path | None = None, workdir: Path | str | None = None,
                settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    report = measure_latency(sizes, queries=queries, cache_dir=cache_dir, workdir=workdir,
                             settings_overrides=settings_overrides)
    return print_and_write(report, print_latency, json_out)
