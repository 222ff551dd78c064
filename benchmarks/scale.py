"""`gieok bench scale`: what more processes buy on one shared database.

**Workers.** One fresh memory (a schema of a PostgreSQL database, or a SQLite file) is filled with
N background blocks and gets a write key. For each worker count w, `gieok serve --workers w` runs
on 127.0.0.1: w uvicorn worker processes, each with its own engine over the same database (each
catches up from the database's change counter, so none keeps an index that can go stale). It takes
the HTTP load of `gieok bench server` (its `http_phases`, not a copy): c concurrent clients search
for `duration` seconds, every query new, then add new texts for min(duration / 4, 5) seconds.
Then a cross-process check: `checks` times (default CHECKS), a note is added on one new connection
and searched for on another (the kernel hands connections to whichever worker accepts, so about half of the pairs
cross processes); a search that does not find the note just written is a stale read.

Before the clock starts, each worker count gets rounds of concurrent warm-up searches on fresh
connections until three rounds in a row see no worker loading the embedding model (a connection
goes to whichever worker accepts it, so this is a strong hint, not a proof, that every worker is
warm). Every phase also stops at `queries` requests.

**Runtime.** Then the load of `gieok bench runtime` (channels × rate × seconds of explicit calls)
split at random over `processes` bot processes on the same database sharing one Redis
(`bench.scale_runtime`): every message stored once, answered by exactly one reply, in its own
channel.

`measure_workers` returns the `"workers"` part of the report, `scale_runtime.measure_shared_runtime`
the `"runtime"` part; `measure_scale` runs both. Targets (never adjusted): no errors and no stale
reads at any worker count; no message lost, no duplicate reply and no misrouted reply.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.corpus import generate_messages
from benchmarks.fill import bench_workdir, filled_memory
from benchmarks.redis_server import throwaway_redis
from benchmarks.report import print_and_write, progress_bar, results_table, table_console
from benchmarks.scale_runtime import measure_shared_runtime, print_shared_runtime
from benchmarks.server import REQUEST_SECONDS, K, QueryPool, ServeProcess, create_key, distinct_queries, http_phases
from gieok.config.settings import is_database_url
from gieok.errors import InvalidInputError
from gieok.store.urls import display_url

__all__ = ["measure_workers", "measure_scale", "print_scale", "run_scale", "CHECKS"]

CHECKS = 20  # add-then-search pairs per worker count
CHECK_CHANNEL = "bench-scale-check"
WARM_ROUNDS = 3  # warm-up rounds in a row without a model load before the clock starts
WARM_EMBED_MS = 1000.0  # a query embedding this slow is a worker loading the model
WARM_SECONDS = 180.0


async def _warm(url: str, key: str, workers: int, pool: QueryPool) -> int:
    """Rounds of 2 × `workers` concurrent searches, each on a connection of its own (a connection
    goes to whichever worker accepts it), until WARM_ROUNDS rounds in a row had no answer that
    spent WARM_EMBED_MS or more embedding (a worker loading the model), or WARM_SECONDS pass.
    Returns the number of warm-up searches sent."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}

    async def one(query: str) -> float:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=REQUEST_SECONDS) as http:
            response = await http.post("/v1/search", json={"query": query, "k": K})
            response.raise_for_status()
            return float(response.json()["embed_time_ms"])

    sent = calm = 0
    deadline = time.monotonic() + WARM_SECONDS
    while calm < WARM_ROUNDS and time.monotonic() < deadline:
        queries = pool.take(2 * workers)
        sent += len(queries)
        slowest = max(await asyncio.gather(*(one(q) for q in queries)))
        calm = calm + 1 if slowest < WARM_EMBED_MS else 0
    return sent


async def _cross_process_reads(url: str, key: str, texts: list[str]) -> dict[str, Any]:
    """Add each text, then search for it on another new connection: (stale reads, errors)."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    stale = 0
    errors: list[str] = []
    with progress_bar(f"add, then search on another connection ({len(texts)}×)", len(texts)) as advance:
        for text in texts:
            try:
                async with httpx.AsyncClient(base_url=url, headers=headers, timeout=REQUEST_SECONDS) as http:
                    added = await http.post("/v1/memories", json={"text": text, "kind": "note",
                                                                  "scope": {"channel": CHECK_CHANNEL}})
                if added.status_code != 201:
                    errors.append(f"add: HTTP {added.status_code}: {added.text[:200]}")
                    continue
                index = added.json()["block_index"]
                async with httpx.AsyncClient(base_url=url, headers=headers, timeout=REQUEST_SECONDS) as http:
                    found = await http.post("/v1/search", json={"query": text, "k": K,
                                                                "scope": {"channel": CHECK_CHANNEL}})
                if found.status_code != 200:
                    errors.append(f"search: HTTP {found.status_code}: {found.text[:200]}")
                    continue
                if index not in {hit["block"]["block_index"] for hit in found.json()["hits"]}:
                    stale += 1
            except Exception as exc:  # a failed request is an error of the run, not a crash
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                advance()
    return {"stale": stale, "errors": errors}


def measure_workers(db: Path | str, key: str, workers: Sequence[int], *, clients: int, duration: float,
                    queries: int, pool: QueryPool, log_dir: Path, checks: int = CHECKS) -> dict[str, Any]:
    """The `"workers"` part of the report, keyed by worker count: `gieok serve --workers w --db db`
    under the load of `gieok bench server`, then the cross-process check (module docstring)."""
    add_seconds = min(duration / 4, 5.0)
    out: dict[str, Any] = {}
    for w in workers:
        searches = pool.take(queries)
        messages = generate_messages(queries + checks, seed=3000 + w)  # texts new to this database
        texts = [f"{m.text} (scale note w{w}-{i})" for i, m in enumerate(messages)]
        server = ServeProcess(db, log_dir / f"serve-{w}-workers.log", workers=w)
        try:
            warmed = asyncio.run(_warm(server.url, key, w, pool))
            run = asyncio.run(http_phases(server.url, key, clients, duration, add_seconds, searches, texts[:queries]))
            check = asyncio.run(_cross_process_reads(server.url, key, texts[queries:]))
        finally:
            exit_code = server.stop()
        first_errors = [*run.pop("_first_error"), *check["errors"][:1]]
        counts = {"searches": run.pop("_searches"), "adds": run.pop("_adds")}
        out[str(w)] = {**run, **counts, "errors": run["errors"] + len(check["errors"]), "stale_reads": check["stale"],
                       "checks": len(texts) - queries, "graceful_stop": exit_code in (0, -signal.SIGTERM),
                       "first_error": first_errors[0] if first_errors else None, "warm_up_searches": warmed}
    return out


def measure_scale(workers: Sequence[int] = (1, 2), *, db: str | None = None, blocks: int = 10_000, clients: int = 8,
                  duration: float = 20.0, queries: int = 2000, checks: int = CHECKS,
                  cache_dir: Path | None = None, redis: str | None = None, processes: int = 2, channels: int = 20,
                  runtime_seconds: float = 30.0, rate: float = 1.0) -> dict[str, Any]:
    """`db`: a `postgresql://` URL (its `bench_scale_…` schema is recreated), a directory for a
    SQLite file, or None (a temp dir). `redis`: the Redis the bot processes share (None: a
    throwaway redis-server); `processes` 0 leaves the runtime part out."""
    if processes < 0 or (processes and (channels < 1 or runtime_seconds <= 0 or rate <= 0)):
        raise InvalidInputError("processes >= 0; with bot processes, channels >= 1, runtime seconds > 0, rate > 0")
    workers = sorted(set(workers))
    if not workers or workers[0] < 1:
        raise InvalidInputError("workers must be positive integers")
    if clients < 1 or duration <= 0 or blocks < 0 or queries < 1 or checks < 0:
        raise InvalidInputError("clients >= 1, duration > 0, blocks >= 0, queries >= 1 and checks >= 0")
    pool = QueryPool(distinct_queries())
    if queries * len(workers) > len(pool.queries) // 2:  # the rest is for the warm-ups
        raise InvalidInputError(f"--queries {queries} × {len(workers)} runs needs more than the {len(pool.queries)} "
                         "distinct queries the corpus has")
    is_url = db is not None and is_database_url(db)
    log_dir = bench_workdir("scale", None if db is None or is_url else Path(db))
    memory = filled_memory("scale", blocks, db if is_url else log_dir, cache_dir)
    location: Path | str = memory.location if is_url else memory.path
    memory.close()
    key = create_key(location)
    report: dict[str, Any] = {
        "backend": "postgres" if is_url else "sqlite", "blocks": blocks, "clients": clients,
        "workers": measure_workers(location, key, workers, clients=clients, duration=duration, queries=queries,
                                   pool=pool, log_dir=log_dir, checks=checks),
    }
    errors = sum(run["errors"] for run in report["workers"].values())
    stale = sum(run["stale_reads"] for run in report["workers"].values())
    report["targets"] = {"zero_errors": {"errors": errors, "pass": errors == 0},
                         "zero_stale_reads": {"stale_reads": stale, "pass": stale == 0}}
    if processes:
        with ExitStack() as stack:
            shared = redis if redis is not None else stack.enter_context(throwaway_redis())
            runtime = measure_shared_runtime(str(location), shared, processes=processes, channels=channels,
                                             duration=runtime_seconds, rate=rate)
        report["runtime"] = runtime
        for name in ("messages_lost", "duplicate_replies", "misrouted_replies"):
            report["targets"][f"zero_{name}"] = {name: runtime[name], "pass": runtime[name] == 0}
        report["_runtime"] = {"channels": channels, "seconds": runtime_seconds, "rate": rate}
    report.update(_duration=duration, _add_seconds=min(duration / 4, 5.0), _queries=queries,
                  _db=display_url(str(location)) if is_url else str(location), _logs=str(log_dir))
    return report


def print_scale(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    table = results_table(f"scale: gieok serve workers on one {report['backend']} database ({report['_db']}), "
                          f"{report['blocks']:,} blocks, {report['clients']} clients; searches "
                          f"{report['_duration']:g} s, adds {report['_add_seconds']:g} s per row (every query new)",
                          ("workers", "search p50", "p95", "searches/s", "add p50", "stale reads", "errors",
                           "stopped"))
    for w, run in report["workers"].items():
        table.add_row(w, f"{run['search_p50_ms']:.2f} ms", f"{run['search_p95_ms']:.2f} ms",
                      f"{run['search_per_s']:.1f}", f"{run['add_p50_ms']:.2f} ms",
                      f"{run['stale_reads']} / {run['checks']}", str(run["errors"]),
                      "graceful" if run["graceful_stop"] else "NOT graceful")
    console.print(table)
    runs = report["workers"]
    if "1" in runs and len(runs) > 1:
        top = max(runs, key=int)
        base = runs["1"]["search_per_s"]
        ratio = runs[top]["search_per_s"] / base if base else float("nan")
        console.print(f"searches/s with {top} workers: {ratio:.2f}× one worker's", highlight=False)
    for name, target in report["targets"].items():
        verdict = "[green]pass[/]" if target["pass"] else "[red]MISS[/]"
        console.print(f"{name.replace('_', ' ')}: {verdict}")
    for w, run in runs.items():
        if run["first_error"]:
            console.print(f"first error with {w} workers: {run['first_error']}", highlight=False, markup=False)
    if "runtime" in report:
        print_shared_runtime(report["runtime"], report["_runtime"], console)
    console.print(f"server logs: {report['_logs']}", highlight=False)


def run_scale(json_out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    return print_and_write(measure_scale(**options), print_scale, json_out)
