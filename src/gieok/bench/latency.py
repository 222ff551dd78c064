"""`gieok bench latency`: add throughput, search latency and ANN recall at growing sizes.

The corpus is the synthetic bilingual chat of `bench.corpus` (realistic text, not random
vectors); smaller sizes are prefixes of the largest. Passage vectors are cached on disk
per model so a 100k run takes minutes after the first; embedding throughput is measured
fresh on every run and reported separately.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..memory import Memory, remove_memory_files
from .corpus import generate_messages, generate_queries
from .embed_cache import EmbeddingCache, default_cache_dir
from .report import median, percentile, progress_bar, write_json

__all__ = ["run_latency"]

ADD_BATCH = 1000
EMBED_SAMPLE = 256


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_latency(sizes: list[int], json_out: str | Path | None = None, *, queries: int = 200,
                cache_dir: Path | None = None, workdir: Path | None = None,
                settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    sizes = sorted(set(sizes))
    largest = sizes[-1]
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gieok-latency-"))
    workdir.mkdir(parents=True, exist_ok=True)
    messages = generate_messages(largest)
    texts = [m.text for m in messages]
    query_texts = generate_queries(queries)
    overrides = dict(settings_overrides or {})

    results: list[dict[str, Any]] = []
    embed_per_s = 0.0
    for n in sizes:
        db = workdir / f"latency-{n}.db"
        remove_memory_files(db)
        memory = Memory(db, **overrides)
        try:
            embedder = memory.embedder
            if not embed_per_s:
                sample = [f"{t} #{i}" for i, t in enumerate(texts[:EMBED_SAMPLE])]  # defeat every cache
                started = time.perf_counter()
                embedder.inner.embed_passages(sample)
                embed_per_s = len(sample) / (time.perf_counter() - started)
                cache = EmbeddingCache(cache_dir or default_cache_dir(), embedder.name)
                with progress_bar(f"corpus vectors ({largest:,}, cached per model)", largest) as advance:
                    vectors, _ = cache.get_or_compute(texts, "passage", embedder.inner.embed_passages,
                                                      progress=advance)
            memory.tokenizer.tokens("워밍업 문장입니다 warm-up sentence")  # load kiwi's model outside the timing
            add_seconds = 0.0
            with progress_bar(f"add {n:,} blocks", n) as advance:
                for start in range(0, n, ADD_BATCH):
                    stop = min(n, start + ADD_BATCH)
                    batch = messages[start:stop]
                    t0 = time.perf_counter()
                    memory.add_many([{"text": m.text, "scope": {"guild": m.guild, "channel": m.channel},
                                      "speaker": m.speaker, "event_time": m.timestamp} for m in batch],
                                    vectors=vectors[start:stop])
                    add_seconds += time.perf_counter() - t0
                    advance(stop - start)

            warm = [f"{q} (warm-up)" for q in query_texts[:10]]  # not the measured texts: no cache hits
            warm_vectors = np.stack([embedder.embed_query(q) for q in warm])
            for q, qv in zip(warm, warm_vectors):
                memory.search(q, 10, layers=False, query_vector=qv)
            plain_ms, full_ms, ann_recall = [], [], []
            # Three separate passes: the exact scans that score ANN recall sweep the whole matrix
            # through the CPU caches and would slow whatever search came right after them.
            with progress_bar(f"search {n:,}", 3 * len(query_texts)) as advance:
                for q in query_texts:
                    result = memory.search(q, 10)  # end to end, query embedding included
                    full_ms.append(result.search_time_ms)
                    advance()
                query_vectors = [memory.embedder.embed_query(q) for q in query_texts]  # cached now: free
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
                    advance()
            index_kind = memory.vectors.kind if memory.vectors is not None else "exact"
        finally:
            memory.close()
        results.append({
            "n": n,
            "add_per_s": round(n / add_seconds, 1),
            "embed_per_s": round(embed_per_s, 1),
            "search_ms": {"p50": round(median(plain_ms), 3), "p95": round(percentile(plain_ms, 95), 3)},
            "search_with_embedding_ms": {"p50": round(median(full_ms), 3), "p95": round(percentile(full_ms, 95), 3)},
            "ann_recall_at_10": round(float(np.mean(ann_recall)), 4) if ann_recall else None,
            "rss_mb": round(_peak_rss_mb(), 1),
            "index": index_kind,
        })
    report = {"sizes": results}
    _print(report)
    write_json(json_out, report)
    return report


def _print(report: dict[str, Any]) -> None:
    table = Table(title="gieok latency (hybrid search, k=10, unscoped; medians of one run)")
    for column in ("blocks", "index", "add/s", "embed/s", "search p50", "p95", "with embedding p50", "p95",
                   "ANN recall@10", "peak RSS MB"):
        table.add_column(column, justify="right")
    for row in report["sizes"]:
        table.add_row(
            f"{row['n']:,}", row["index"], f"{row['add_per_s']:,.0f}", f"{row['embed_per_s']:,.1f}",
            f"{row['search_ms']['p50']:.2f} ms", f"{row['search_ms']['p95']:.2f} ms",
            f"{row['search_with_embedding_ms']['p50']:.2f} ms", f"{row['search_with_embedding_ms']['p95']:.2f} ms",
            "exact" if row["ann_recall_at_10"] is None else f"{row['ann_recall_at_10']:.3f}",
            f"{row['rss_mb']:,.0f}",
        )
    Console(width=160).print(table)
    sizes = report["sizes"]
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        ratio = b["search_ms"]["p50"] / a["search_ms"]["p50"] if a["search_ms"]["p50"] else float("nan")
        Console(width=160).print(f"search p50 at {b['n']:,} is {ratio:.2f}× the p50 at {a['n']:,}")
