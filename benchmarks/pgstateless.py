"""`gieok bench pgstateless`: a worker on PostgreSQL with `pg_index = "memory"` (the catalog,
vectors and BM25 postings loaded into the process) against `pg_index = "database"` (SQL, nothing
loaded): the worker's RSS, the time to open a memory cold, search p50/p95 without the query
embedding, and whether the two rank alike.

**The data.** N texts of the benchmark corpus (`bench.corpus`: generated bilingual chat, so BM25
sees real tokens); their vectors are mixed from the real e5 passage vectors of the first `base`
texts as `bench pgindex` does (`mixed_vectors`: embedding 100k passages takes hours on two cores).
The queries are real e5 query vectors of the corpus queries, computed once here and handed to the
workers, which never load the model (`PreEmbedded`): the search is measured without the embedding.

**The workers.** Each mode runs in a fresh process (`python -m benchmarks.pgstateless`), so its RSS
is its own: the Korean analyser is loaded first, then the memory is opened (timed: `open_cold_s`),
then every query searched once unscoped and once in the largest channel (hybrid, k 10, no layers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.corpus import generate_messages, generate_queries
from benchmarks.embed_cache import corpus_vectors
from benchmarks.fill import add_corpus
from benchmarks.pgindex import mixed_vectors
from benchmarks.pgtenants import measure_tenants
from benchmarks.report import p50_p95, print_and_write, progress_bar, results_table, rss_mb, table_console
from gieok import Memory
from gieok.errors import InvalidInputError
from gieok.store.factory import open_store
from gieok.store.urls import with_schema

__all__ = ["measure_pgstateless", "run_pgstateless", "fill_corpus", "PreEmbedded"]

MODES = ("memory", "database")


class PreEmbedded:
    """The recorded embedder's name and dimension, for a worker whose queries arrive embedded:
    it must never embed (a call is a bug in the benchmark, not a fallback)."""

    def __init__(self, name: str, dimension: int) -> None:
        self.name = name
        self.dimension = dimension

    def embed_passages(self, texts: Any) -> np.ndarray:
        raise RuntimeError("the benchmark's workers search with query vectors only")

    embed_queries = embed_passages


def worker(url: str, mode: str, query_file: str, channel: str) -> dict[str, Any]:
    """One worker process's measurements (run in a child: `main`)."""
    from gieok.text.tokenize import get_tokenizer

    get_tokenizer().tokens("워밍업 문장입니다 warm-up sentence")  # the analyser is every worker's, in both modes
    queries = np.load(query_file)
    recorded = open_store(url)
    name, dimension = recorded.get_meta("embedder"), int(recorded.get_meta("dimension") or 0)
    recorded.close()
    rss_before = rss_mb()
    t0 = time.perf_counter()
    memory = Memory(url, pg_index=mode, embedder=PreEmbedded(str(name), dimension))
    len(memory)  # one query: the memory is open and usable
    open_s = time.perf_counter() - t0
    rss_open = rss_mb()
    # Warm-up: other searches first, so the database's buffers hold what every search reads
    # (pgvector's graph, the packed postings) as in a server that has been up a while; the open
    # above was timed cold. Their vectors are mixes of two timed queries' plus noise (none is a
    # timed one), and what they left in the process (the ranking facts' LRU) is dropped after.
    rng = np.random.default_rng(25)
    for i in range(WARM_UP):
        a, b = rng.integers(0, len(queries), 2)
        mixed = queries[a] + queries[b] + rng.standard_normal(queries.shape[1]).astype(np.float32) * 0.05
        memory.search(_WARM_TEXTS[i % len(_WARM_TEXTS)], 10, layers=False, query_vector=mixed / np.linalg.norm(mixed))
    database = memory.indexes.database  # the database mode's index (None in memory mode)
    if database is not None:
        database.drop_caches()
    timings: dict[str, list[float]] = {"all": [], "channel": []}
    ranked: dict[str, list[list[int]]] = {"all": [], "channel": []}
    for vector in queries:
        for where, scope in (("all", None), ("channel", {"channel": channel})):
            t = time.perf_counter()
            text = _QUERY_TEXTS[len(ranked[where]) % len(_QUERY_TEXTS)]
            result = memory.search(text, 10, scope=scope, layers=False, query_vector=vector)
            timings[where].append((time.perf_counter() - t) * 1000)
            ranked[where].append([h.block.block_index for h in result.hits])
    memory.close()
    return {"mode": mode, "rss_before_mb": rss_before, "rss_open_mb": rss_open, "rss_after_mb": rss_mb(),
            "open_cold_s": open_s, "timings_ms": timings, "ranked": ranked}


_QUERY_TEXTS: list[str] = []
_WARM_TEXTS = ["오늘 점심 뭐 먹었어?", "what did we talk about yesterday", "주말 계획 있어?", "any news about the trip"]
WARM_UP = 20  # searches before the timed ones (worker)


def fill_corpus(url: str, n: int, base: int, cache_dir: Path | None,
                queries: list[str]) -> tuple[np.ndarray, str, float | None]:
    """N corpus blocks into a fresh schema: (the `queries`' vectors, the largest channel, adds per second).
    A schema that holds exactly N blocks already (a `--db` kept from an earlier run: the corpus is
    generated the same way every time) is searched as it is — its adds per second are then None —
    also when blocks after the fill were added and forgotten again; any other count is refused
    rather than added to."""
    messages = generate_messages(n)
    with Memory(url, pg_index="database") as memory:  # opens without loading anything
        held = len(memory)
        if held > n and not memory.store.fetch(  # type: ignore[attr-defined]
                "SELECT 1 FROM blocks WHERE block_index > ? AND forgotten_at IS NULL LIMIT 1", (n,)):
            held = n  # a full fill, then adds that were forgotten again (bench scale's adds at size)
        if held not in (0, n):
            raise InvalidInputError(f"schema bench_stateless_{n} of --db holds {held:,} blocks, not "
                                    f"{n:,}: drop it (DROP SCHEMA bench_stateless_{n} CASCADE) or give another --db")
        adds_per_s: float | None = None
        if held == 0:
            real = corpus_vectors(memory.embedder, [m.text for m in messages[:base]], cache_dir)
            vectors, _ = mixed_vectors(real, n)
            started = time.perf_counter()
            # The HNSW graph is built once after the rows (PostgresStore.vector_index_deferred),
            # inside the timed fill: row by row it cost ~9 ms a vector, over 2 h at 1M.
            with memory.store.vector_index_deferred(), \
                    progress_bar(f"fill {n:,} blocks (vectors given)", n) as advance:
                add_corpus(memory, messages, vectors, advance)
            adds_per_s = n / (time.perf_counter() - started)
        vectors_of_queries = np.stack([memory.embedder.embed_query(q) for q in queries])
    counts: dict[str, int] = {}
    for m in messages:
        counts[m.channel] = counts.get(m.channel, 0) + 1
    return vectors_of_queries, max(counts, key=lambda c: counts[c]), adds_per_s


def measure_pgstateless(url: str, sizes: list[int], *, base: int = 1000, queries: int = 50,
                        cache_dir: Path | None = None, tenants: int = 0, tenant_blocks: int = 20,
                        memory_up_to: int | None = None) -> dict[str, Any]:
    """`memory_up_to`: run the in-process mode's worker only at sizes up to this (None: at every size)."""
    _QUERY_TEXTS[:] = generate_queries(queries)
    report: dict[str, Any] = {}
    if sizes:
        report.update(_measure_sizes(url, sizes, base, queries, cache_dir, memory_up_to))
    if tenants:
        report["tenants"] = measure_tenants(url, tenants, blocks=tenant_blocks, base=base, queries=queries,
                                            cache_dir=cache_dir)
    return report


def _measure_sizes(url: str, sizes: list[int], base: int, queries: int, cache_dir: Path | None,
                   memory_up_to: int | None = None) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    for n in sizes:
        location = with_schema(url, f"bench_stateless_{n}")
        query_vectors, channel, adds_per_s = fill_corpus(location, n, base, cache_dir, _QUERY_TEXTS)
        with tempfile.TemporaryDirectory(prefix="gieok-stateless-") as tmp:
            query_file = str(Path(tmp) / "queries.npy")
            np.save(query_file, query_vectors)
            runs = {mode: _run_worker(location, mode, query_file, channel) for mode in MODES
                    if mode == "database" or memory_up_to is None or n <= memory_up_to}
        agreement: dict[str, Any] = {}  # empty where only the database mode ran
        for where in ("all", "channel") if "memory" in runs else ():
            pairs = list(zip(runs["memory"]["ranked"][where], runs["database"]["ranked"][where]))
            agreement[where] = {
                "top1_same": float(np.mean([bool(a and b and a[0] == b[0]) for a, b in pairs])),
                "top10_overlap": float(np.mean([len(set(a) & set(b)) / max(1, len(a)) for a, b in pairs])),
            }
        row: dict[str, Any] = {"blocks": n, "channel_blocks": channel, "adds_per_s": adds_per_s, "agreement": agreement}
        for mode, run in runs.items():
            row[mode] = {
                "worker_rss_mb": run["rss_after_mb"], "rss_before_open_mb": run["rss_before_mb"],
                "rss_after_open_mb": run["rss_open_mb"], "open_cold_s": run["open_cold_s"],
                "search_p50_ms": {w: p50_p95(run["timings_ms"][w])["p50"] for w in ("all", "channel")},
                "search_p95_ms": {w: p50_p95(run["timings_ms"][w])["p95"] for w in ("all", "channel")},
            }
        results.append(row)
    last = results[-1]
    return {
        # the keys, for the database mode (the proposed default on PostgreSQL)
        "blocks": last["blocks"], "worker_rss_mb": last["database"]["worker_rss_mb"],
        "open_cold_s": last["database"]["open_cold_s"],
        "search_p50_ms": {str(r["blocks"]): r["database"]["search_p50_ms"]["all"] for r in results},
        "search_p95_ms": {str(r["blocks"]): r["database"]["search_p95_ms"]["all"] for r in results},
        "adds_per_s": last["adds_per_s"],
        "agreement": next(({"top1_same": r["agreement"]["all"]["top1_same"], "blocks": r["blocks"]}
                           for r in reversed(results) if r["agreement"]), {}),
        "sizes": results, "queries": queries, "base_real_vectors": base,
    }


def _run_worker(url: str, mode: str, query_file: str, channel: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.pgstateless", url, mode, query_file, channel,
                           json.dumps(_QUERY_TEXTS)], capture_output=True, text=True, env=env, timeout=3600,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} worker failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_pgstateless(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    if "sizes" in report:
        table = results_table("PostgreSQL: in-process indexes vs the database",
                              ("blocks", "mode", "RSS MB", "open s", "p50 ms", "p95 ms", "p50 ms (channel)",
                               "top-1 same"), left=("mode",))
        for row in report["sizes"]:
            for mode in MODES:
                if mode not in row:
                    continue
                r = row[mode]
                table.add_row(f"{row['blocks']:,}", mode, f"{r['worker_rss_mb']:.0f}", f"{r['open_cold_s']:.2f}",
                              f"{r['search_p50_ms']['all']:.1f}", f"{r['search_p95_ms']['all']:.1f}",
                              f"{r['search_p50_ms']['channel']:.1f}",
                              f"{row['agreement']['all']['top1_same']:.2f}" if row["agreement"] else "—")
        console.print(table)
    if "tenants" in report:
        t = report["tenants"]
        table = results_table(f"{t['count']:,} tenants × {t['blocks_each']} blocks, {t['workers']} database-mode "
                              "workers round-robin",
                              ("worker", "RSS MB (max)", "RSS at start", "open p50 / p95 ms", "search p50 / p95 ms",
                               "open at end"))
        for i, w in enumerate(t["per_worker"]):
            table.add_row(str(i), f"{w['worker_rss_mb']:.0f}", f"{w['rss_start_mb']:.0f}",
                          f"{w['open_ms']['p50']:.1f} / {w['open_ms']['p95']:.1f}",
                          f"{w['search_ms']['p50']:.1f} / {w['search_ms']['p95']:.1f}",
                          f"{w['open_at_end']} of ≤ {w['max_open']}")
        console.print(table)


def run_pgstateless(url: str, json_out: Path | None, *, sizes: list[int], base: int, queries: int,
                    cache_dir: Path | None, tenants: int = 0, tenant_blocks: int = 20) -> dict[str, Any]:
    report = measure_pgstateless(url, sizes, base=base, queries=queries, cache_dir=cache_dir, tenants=tenants,
                                 tenant_blocks=tenant_blocks)
    return print_and_write(report, print_pgstateless, json_out)


def main() -> None:
    url, mode, query_file, channel, texts = sys.argv[1:6]
    _QUERY_TEXTS[:] = json.loads(texts)
    print(json.dumps(worker(url, mode, query_file, channel)))


if __name__ == "__main__":
    main()
