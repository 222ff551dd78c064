"""`gieok bench server`: what serving the memory over HTTP costs, against the engine in-process.

A fresh database is filled with N background blocks and gets a write key for the default tenant.
Then, each phase with its own queries (distinct after the search cache's normalisation, never
repeated anywhere in the run, so neither the query-embedding cache nor the result cache answers):

1. in process: `Memory.search(q, 10)` one after another for `duration` seconds;
2. a real `gieok serve` subprocess on 127.0.0.1: once `/readyz` answers 200, its first search
   is timed alone (`first_search_ms`: what the first client of a fresh server waits); then it is
   warmed up with queries of its own, and for each client count c: c concurrent clients (one
   `httpx.AsyncClient`, one connection each) posting `/v1/search` for `duration` seconds —
   latency is the client's wall time per request — then c clients posting `/v1/memories` with
   new texts for min(duration / 4, 5) seconds;
3. sequential `search_memory` calls over MCP's streamable HTTP (the official client, one session
   for every call) for min(duration / 2, 10) seconds;
4. `gieok mcp` over stdio (a new process, as an MCP client starts one per session): the first
   `search_memory` after the session is initialized, then `STDIO_CALLS` more for its warm p50.

Every phase also stops at `queries` requests. The targets (never adjusted): no errors; the HTTP
search p50 at one client within 3 ms of the in-process p50; at the highest client count at least
0.7 × the in-process searches per second; the first search after ready at most 2 × the warm p50,
over REST and over `gieok mcp`.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.corpus import generate_messages, generate_queries
from benchmarks.fill import bench_workdir, filled_memory
from benchmarks.report import median, p50_p95, print_and_write, progress_bar, results_table, table_console
from gieok.layers.cache import normalise_query
from gieok.memory import Memory

__all__ = ["measure_server", "print_server", "run_server_bench", "distinct_queries", "QueryPool",
           "ServeProcess", "create_key", "http_phases", "warm_http"]

K = 10
WARM_QUERIES = 5  # per process, before anything is timed but the first search
STDIO_CALLS = 30  # searches over `gieok mcp` after its first, for the warm p50
FIRST_SEARCH_FACTOR = 2.0  # the first search after ready may take at most this × the warm p50
ADD_CHANNEL = "bench-server"
QUERY_POOL = 200_000  # generate_queries(n) saturates at ~13.6k distinct questions
START_SECONDS = 180.0  # for `gieok serve` to answer /readyz (warm)
STOP_SECONDS = 40.0  # SIGTERM, then this long (uvicorn's graceful shutdown is 30 s) before SIGKILL
REQUEST_SECONDS = 120.0
P50_OVERHEAD_MS = 3.0
THROUGHPUT_SHARE = 0.7


def distinct_queries(n: int = QUERY_POOL) -> list[str]:
    """The benchmark's questions, each distinct after the search cache's normalisation, in a
    fixed order (phases take disjoint slices of it)."""
    seen: set[str] = set()
    out = []
    for query in generate_queries(n):
        key = normalise_query(query)
        if key not in seen:
            seen.add(key)
            out.append(query)
    return out


class QueryPool:
    """Hands out disjoint slices of the distinct queries: no query is ever sent twice."""

    def __init__(self, queries: list[str]) -> None:
        self.queries = queries
        self.used = 0

    def take(self, n: int) -> list[str]:
        if self.used + n > len(self.queries):
            raise ValueError(f"the run needs more than the {len(self.queries)} distinct queries the corpus has: "
                             "lower --queries or use fewer client counts")
        part = self.queries[self.used : self.used + n]
        self.used += n
        return part


@contextmanager
def _clock_bar(description: str, seconds: float) -> Iterator[Callable[[], None]]:
    """A progress bar in seconds of a time-bounded phase; yields `tick()` to call now and then."""
    total = max(1, math.ceil(seconds))
    with progress_bar(description, total) as advance:
        started = time.perf_counter()
        shown = 0

        def tick() -> None:
            nonlocal shown
            now = min(total, int(time.perf_counter() - started))
            if now > shown:
                advance(now - shown)
                shown = now

        yield tick
        advance(total - shown)


def _stats(latencies: Sequence[float], completed: int, elapsed: float) -> dict[str, float]:
    p = p50_p95(latencies)
    return {"search_p50_ms": p["p50"], "search_p95_ms": p["p95"],
            "search_per_s": round(completed / elapsed, 2) if elapsed > 0 else 0.0}


# -- in process ------------------------------------------------------------------------------------

def _in_process(db: Path, warm: list[str], queries: list[str], seconds: float) -> dict[str, Any]:
    memory = Memory(db)
    try:
        for query in warm:
            memory.search(query, K)
        latencies: list[float] = []
        with _clock_bar(f"in process: sequential searches for {seconds:g} s", seconds) as tick:
            started = time.perf_counter()
            deadline = started + seconds
            for query in queries:
                if time.perf_counter() >= deadline:
                    break
                t0 = time.perf_counter()
                memory.search(query, K)
                latencies.append((time.perf_counter() - t0) * 1000)
                tick()
            elapsed = time.perf_counter() - started
    finally:
        memory.close()
    return {**_stats(latencies, len(latencies), elapsed), "_count": len(latencies)}


# -- the server process ----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def create_key(db: Path | str) -> str:
    """A write key for the default tenant of the memory at `db`, a file or a database URL (as
    `gieok keys create`)."""
    from gieok.config import load_settings
    from gieok.server.auth import ApiKeys
    from gieok.server.tenants import DEFAULT_TENANT
    from gieok.store.factory import open_store

    settings = load_settings(db=str(db))
    store = open_store(settings.db_location(), busy_timeout_ms=settings.busy_timeout_ms)
    try:
        key, _ = ApiKeys(store).create(DEFAULT_TENANT, "write", "bench server")
    finally:
        store.close()
    return key


class ServeProcess:
    """`gieok serve --db DB --port P --workers W [extra_args]` on 127.0.0.1 in a subprocess, its
    output in `log`. `db`: a memory file or a database URL. `env`: the server's whole environment
    (default: this process's)."""

    def __init__(self, db: Path | str, log: Path, workers: int = 1, *, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None) -> None:
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.exit_code: int | None = None
        self._sink = log.open("wb")
        self.process = subprocess.Popen([sys.executable, "-m", "gieok.cli", "serve", "--db", str(db),
                                         "--host", "127.0.0.1", "--port", str(self.port),
                                         "--workers", str(workers), *extra_args],
                                        stdin=subprocess.DEVNULL, stdout=self._sink, stderr=subprocess.STDOUT,
                                        env={**(os.environ if env is None else env)}, cwd=log.parent)
        self.ready_seconds: float | None = None
        try:
            started = time.monotonic()
            deadline = started + START_SECONDS
            # One client for the whole wait: each new httpx client builds an SSL context (the CA
            # bundle read, ~40 ms of CPU, even for http://), so a fresh one every 0.05 s took most of
            # a core from the server it waited for.
            with httpx.Client(timeout=2) as probe:
                while True:
                    if self.process.poll() is not None:
                        raise RuntimeError(f"gieok serve exited with {self.process.returncode}: "
                                           f"{self._tail()}")
                    try:
                        if probe.get(f"{self.url}/readyz").status_code == 200:
                            self.ready_seconds = time.monotonic() - started
                            return
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"gieok serve was not ready (/readyz) in {START_SECONDS:g} s: {self._tail()}")
                    time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def _tail(self) -> str:
        self._sink.flush()
        return self.log.read_text(encoding="utf-8", errors="replace")[-2000:]

    def stop(self) -> int | None:
        """SIGTERM, wait for the graceful shutdown, SIGKILL if it does not come. uvicorn
        re-raises the signal after a clean shutdown: a graceful stop exits with -15."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
            self.exit_code = self.process.returncode
        finally:
            self._sink.close()
        return self.exit_code


# -- HTTP load -------------------------------------------------------------------------------------

async def _load(url: str, key: str, clients: int, seconds: float, work: list[Any], description: str,
                request: Callable[[Any, Any], Awaitable[Any]]) -> dict[str, Any]:
    """`clients` connections taking items of `work` in turn, each `await request(http, item)`,
    until `seconds` have passed or `work` is used up. Latency: the client's wall time."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    https = [httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=REQUEST_SECONDS)
             for _ in range(clients)]
    latencies: list[float] = []
    errors: list[str] = []
    items = iter(work)
    try:
        await asyncio.gather(*(http.get("/healthz") for http in https))  # each connection open before the clock
        with _clock_bar(description, seconds) as tick:
            started = time.perf_counter()
            deadline = started + seconds

            async def client(http: httpx.AsyncClient) -> None:
                while time.perf_counter() < deadline:
                    item = next(items, None)
                    if item is None:
                        return
                    t0 = time.perf_counter()
                    try:
                        response = await request(http, item)
                        failed = None if 200 <= response.status_code < 300 else \
                            f"HTTP {response.status_code}: {response.text[:200]}"
                    except Exception as exc:  # a failed request is an error of the run, not a crash
                        failed = f"{type(exc).__name__}: {exc}"
                    if failed is None:
                        latencies.append((time.perf_counter() - t0) * 1000)
                    else:
                        errors.append(failed)
                    tick()

            await asyncio.gather(*(client(http) for http in https))
            elapsed = time.perf_counter() - started
    finally:
        await asyncio.gather(*(http.aclose() for http in https))
    return {"latencies": latencies, "errors": errors, "elapsed": elapsed}


async def http_phases(url: str, key: str, clients: int, seconds: float, add_seconds: float,
                       queries: list[str], texts: list[str]) -> dict[str, Any]:
    async def search(http: Any, query: str) -> Any:
        return await http.post("/v1/search", json={"query": query, "k": K})

    async def add(http: Any, text: str) -> Any:
        return await http.post("/v1/memories", json={"text": text, "kind": "note",
                                                      "scope": {"channel": ADD_CHANNEL}})

    searched = await _load(url, key, clients, seconds, queries, f"HTTP: {clients} client(s) search for {seconds:g} s",
                           search)
    added = await _load(url, key, clients, add_seconds, texts, f"HTTP: {clients} client(s) add for {add_seconds:g} s",
                        add)
    return {**_stats(searched["latencies"], len(searched["latencies"]), searched["elapsed"]),
            "add_p50_ms": round(median(added["latencies"]), 3),
            "errors": len(searched["errors"]) + len(added["errors"]),
            "_searches": len(searched["latencies"]), "_adds": len(added["latencies"]),
            "_first_error": (searched["errors"] + added["errors"])[:1]}


async def warm_http(url: str, key: str, warm: list[str]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=REQUEST_SECONDS) as http:
        for query in warm:
            (await http.post("/v1/search", json={"query": query, "k": K})).raise_for_status()


async def first_http_search(url: str, key: str, query: str) -> float:
    """The wall time of one search on a server no search has reached yet (ms)."""
    import httpx

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=REQUEST_SECONDS) as http:
        await http.get("/healthz")  # the connection is open before the clock starts
        t0 = time.perf_counter()
        (await http.post("/v1/search", json={"query": query, "k": K})).raise_for_status()
        return round((time.perf_counter() - t0) * 1000, 3)


# -- MCP -------------------------------------------------------------------------------------------

async def _mcp(url: str, key: str, warm: list[str], queries: list[str], seconds: float) -> dict[str, Any]:
    """Sequential search_memory calls in one MCP session over streamable HTTP."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    latencies: list[float] = []
    errors: list[str] = []
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                                   timeout=httpx2.Timeout(REQUEST_SECONDS)) as http,
                Client(streamable_http_client(f"{url}/mcp", http_client=http),
                       read_timeout_seconds=REQUEST_SECONDS) as client):
        for query in warm:
            await client.call_tool("search_memory", {"query": query, "k": K})
        with _clock_bar(f"MCP: sequential search_memory for {seconds:g} s", seconds) as tick:
            deadline = time.perf_counter() + seconds
            for query in queries:
                if time.perf_counter() >= deadline:
                    break
                t0 = time.perf_counter()
                try:
                    result = await client.call_tool("search_memory", {"query": query, "k": K})
                    failed = None if not result.is_error else \
                        "tool error: " + " ".join(getattr(c, "text", "") for c in result.content)[:200]
                except Exception as exc:
                    failed = f"{type(exc).__name__}: {exc}"
                if failed is None:
                    latencies.append((time.perf_counter() - t0) * 1000)
                else:
                    errors.append(failed)
                tick()
    return {"search_p50_ms": round(median(latencies), 3), "errors": len(errors), "_calls": len(latencies),
            "_first_error": errors[:1]}


async def _mcp_stdio(db: Path, key: str, queries: list[str], workdir: Path) -> dict[str, Any]:
    """`gieok mcp --db DB` as an MCP client starts it: the time to an initialized session, the
    first search_memory, then `STDIO_CALLS` more for the warm p50."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "gieok.cli", "mcp", "--db", str(db)],
                                   env={**os.environ, "GIEOK_API_KEY": key}, cwd=str(workdir))
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    # The server's log goes to a file of the work directory: the SDK's default is this process's
    # stderr, which has no file descriptor when the command runs inside a test's CliRunner.
    with open(workdir / "mcp-stdio.log", "w", encoding="utf-8") as log:
        async with Client(stdio_client(params, errlog=log), read_timeout_seconds=REQUEST_SECONDS) as client:
            ready_s = time.perf_counter() - started
            for query in queries[: STDIO_CALLS + 1]:
                t0 = time.perf_counter()
                result = await client.call_tool("search_memory", {"query": query, "k": K})
                if result.is_error:
                    errors.append(" ".join(getattr(c, "text", "") for c in result.content)[:200])
                else:
                    latencies.append((time.perf_counter() - t0) * 1000)
    first = latencies[0] if latencies else None
    return {"ready_s": round(ready_s, 3), "first_search_ms": round(first, 3) if first is not None else None,
            "search_p50_ms": round(median(latencies[1:]), 3) if len(latencies) > 1 else None,
            "errors": len(errors), "_calls": len(latencies), "_first_error": errors[:1]}


# -- the run ---------------------------------------------------------------------------------------

def _targets(report: dict[str, Any]) -> dict[str, Any]:
    """The three checks, with the values they compare."""
    in_process = report["in_process"]
    http = report["http"]
    errors = sum(run["errors"] for run in http.values()) + report["mcp"]["errors"]
    one = http.get("1")
    limit = round(in_process["search_p50_ms"] + P50_OVERHEAD_MS, 3)
    top = max(http, key=int)
    floor = round(THROUGHPUT_SHARE * in_process["search_per_s"], 2)
    first = report["first_search"]
    stdio = report["mcp_stdio"]
    rest_limit = round(FIRST_SEARCH_FACTOR * one["search_p50_ms"], 3) if one else None
    stdio_limit = round(FIRST_SEARCH_FACTOR * stdio["search_p50_ms"], 3) if stdio["search_p50_ms"] else None
    errors += stdio["errors"]
    return {
        "first_search_rest": {"first_search_ms": first["first_search_ms"], "limit_ms": rest_limit,
                              "pass": first["first_search_ms"] <= rest_limit if rest_limit else None},
        "first_search_mcp_stdio": {"first_search_ms": stdio["first_search_ms"], "limit_ms": stdio_limit,
                                   "pass": (stdio["first_search_ms"] or math.inf) <= stdio_limit
                                   if stdio_limit else None},
        "zero_errors": {"errors": errors, "pass": errors == 0},
        "http_p50_1_client": {"http_p50_ms": one["search_p50_ms"] if one else None,
                              "in_process_p50_ms": in_process["search_p50_ms"], "limit_ms": limit,
                              "pass": one["search_p50_ms"] <= limit if one else None},
        "throughput_at_max_clients": {"clients": int(top), "http_per_s": http[top]["search_per_s"],
                                      "in_process_per_s": in_process["search_per_s"], "min_per_s": floor,
                                      "pass": http[top]["search_per_s"] >= floor},
    }


def measure_server(blocks: int = 100_000, *, clients: Sequence[int] = (1, 16), duration: float = 20.0,
                   queries: int = 2000, workdir: Path | None = None, cache_dir: Path | None = None) -> dict[str, Any]:
    """In-process search against `gieok serve` over REST and MCP (module docstring)."""
    clients = sorted(set(clients))
    if not clients or clients[0] < 1:
        raise ValueError("clients must be positive integers")
    if duration <= 0 or blocks < 0 or queries < 1:
        raise ValueError("duration > 0, blocks >= 0 and queries >= 1")
    add_seconds = min(duration / 4, 5.0)
    mcp_seconds = min(duration / 2, 10.0)
    pool = QueryPool(distinct_queries())
    warm_local, warm_server = pool.take(WARM_QUERIES), pool.take(WARM_QUERIES)
    phases = 2 + len(clients)  # in process, each client count, MCP
    per_phase = min(queries, (len(pool.queries) - pool.used) // phases)
    notes = [f"{queries} queries per phase asked; the corpus has {per_phase} for each"] if per_phase < queries else []

    workdir = bench_workdir("server", workdir)
    memory = filled_memory("server", blocks, workdir, cache_dir)
    db = memory.path
    memory.close()
    key = create_key(db)

    in_process = _in_process(db, warm_local, pool.take(per_phase), duration)
    messages = generate_messages(per_phase * len(clients), seed=2024)  # texts to add: new to this database
    texts = [f"{m.text} (bench note {i})" for i, m in enumerate(messages)]
    http: dict[str, dict[str, Any]] = {}
    server = ServeProcess(db, workdir / f"server-{blocks}.log")
    try:
        first = {"ready_s": round(server.ready_seconds or 0.0, 3),
                 "first_search_ms": asyncio.run(first_http_search(server.url, key, pool.take(1)[0]))}
        asyncio.run(warm_http(server.url, key, warm_server[:3]))
        for n, c in enumerate(clients):
            http[str(c)] = asyncio.run(http_phases(server.url, key, c, duration, add_seconds, pool.take(per_phase),
                                                    texts[n * per_phase : (n + 1) * per_phase]))
        mcp = asyncio.run(_mcp(server.url, key, warm_server[3:], pool.take(per_phase), mcp_seconds))
    finally:
        exit_code = server.stop()
    stdio = asyncio.run(_mcp_stdio(db, key, pool.take(STDIO_CALLS + 1), workdir))
    counts = {"in_process": in_process.pop("_count"), "mcp": mcp.pop("_calls"), "mcp_stdio": stdio.pop("_calls"),
              **{c: (run.pop("_searches"), run.pop("_adds")) for c, run in http.items()}}
    first_errors = [*mcp.pop("_first_error"), *stdio.pop("_first_error"),
                    *(e for run in http.values() for e in run.pop("_first_error"))]
    report: dict[str, Any] = {"blocks": blocks, "in_process": in_process, "first_search": first, "http": http,
                              "mcp": mcp, "mcp_stdio": stdio}
    report["targets"] = _targets(report)
    report.update(_counts=counts, _duration=duration, _add_seconds=add_seconds, _mcp_seconds=mcp_seconds,
                  _queries=per_phase, _server_exit=exit_code, _notes=notes, _first_errors=first_errors,
                  _db=str(db))
    return report


def print_server(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    table = results_table(f"server: {report['blocks']:,} blocks, k={K}; searches {report['_duration']:g} s per row, "
                          f"adds {report['_add_seconds']:g} s, MCP {report['_mcp_seconds']:g} s "
                          f"(every query new; client-side wall time)",
                          ("path", "clients", "searches", "search p50", "p95", "searches/s", "adds", "add p50",
                           "errors"), left=("path",))
    ip = report["in_process"]
    table.add_row("in process (Memory.search)", "1", str(report["_counts"]["in_process"]),
                  f"{ip['search_p50_ms']:.2f} ms", f"{ip['search_p95_ms']:.2f} ms", f"{ip['search_per_s']:.1f}",
                  "", "", "")
    for c, run in report["http"].items():
        searches, adds = report["_counts"][c]
        table.add_row("HTTP POST /v1/search, /v1/memories", c, str(searches), f"{run['search_p50_ms']:.2f} ms",
                      f"{run['search_p95_ms']:.2f} ms", f"{run['search_per_s']:.1f}", str(adds),
                      f"{run['add_p50_ms']:.2f} ms", str(run["errors"]))
    mcp = report["mcp"]
    table.add_row("MCP search_memory (one session)", "1", str(report["_counts"]["mcp"]),
                  f"{mcp['search_p50_ms']:.2f} ms", "", "", "", "", str(mcp["errors"]))
    stdio = report["mcp_stdio"]
    table.add_row("gieok mcp (stdio) search_memory", "1", str(report["_counts"]["mcp_stdio"]),
                  _ms(stdio["search_p50_ms"]), "", "", "", "", str(stdio["errors"]))
    console.print(table)
    first = report["first_search"]
    starts = results_table("a fresh process: its first search after it says it is ready",
                           ("process", "ready after", "first search", "warm p50"), left=("process",))
    one = report["http"].get("1")
    starts.add_row("gieok serve (/readyz 200)", f"{first['ready_s']:.2f} s", _ms(first["first_search_ms"]),
                   _ms(one["search_p50_ms"] if one else None))
    starts.add_row("gieok mcp (stdio session initialized)", f"{stdio['ready_s']:.2f} s",
                   _ms(stdio["first_search_ms"]), _ms(stdio["search_p50_ms"]))
    console.print(starts)

    targets = report["targets"]
    checks = results_table("targets", ("target", "measured", "needed", "result"), left=("target", "measured", "needed"))

    def verdict(passed: bool | None) -> str:
        return "[green]pass[/]" if passed else "[dim]not measured[/]" if passed is None else "[red]MISS[/]"

    for name, label in (("first_search_rest", "first REST search after /readyz"),
                        ("first_search_mcp_stdio", "first search over gieok mcp (stdio)")):
        row = targets[name]
        checks.add_row(label, _ms(row["first_search_ms"]),
                       f"≤ {FIRST_SEARCH_FACTOR:g} × warm p50 = {_ms(row['limit_ms'])}", verdict(row["pass"]))
    zero = targets["zero_errors"]
    checks.add_row("no errors (HTTP and MCP)", f"{zero['errors']} errors", "0", verdict(zero["pass"]))
    p50 = targets["http_p50_1_client"]
    checks.add_row("HTTP search p50 at 1 client",
                   f"{p50['http_p50_ms']:.2f} ms" if p50["http_p50_ms"] is not None else "(no 1-client run)",
                   f"≤ {p50['in_process_p50_ms']:.2f} + {P50_OVERHEAD_MS:g} = {p50['limit_ms']:.2f} ms",
                   verdict(p50["pass"]))
    top = targets["throughput_at_max_clients"]
    checks.add_row(f"HTTP searches/s at {top['clients']} clients", f"{top['http_per_s']:.1f}/s",
                   f"≥ {THROUGHPUT_SHARE:g} × {top['in_process_per_s']:.1f} = {top['min_per_s']:.1f}/s",
                   verdict(top["pass"]))
    console.print(checks)
    for error in report["_first_errors"]:
        console.print(f"first error: {error}", highlight=False, markup=False)
    for note in report["_notes"]:
        console.print(f"note: {note}", highlight=False, markup=False)
    exit_code = report["_server_exit"]
    console.print(f"gieok serve stopped with SIGTERM: exit {exit_code}"
                  f"{' (graceful)' if exit_code in (0, -signal.SIGTERM) else ' (NOT graceful)'}", highlight=False)


def _ms(value: float | None) -> str:
    return f"{value:.2f} ms" if value is not None else "-"


def run_server_bench(blocks: int = 100_000, json_out: str | Path | None = None, *, clients: Sequence[int] = (1, 16),
                     duration: float = 20.0, queries: int = 2000, workdir: Path | None = None,
                     cache_dir: Path | None = None) -> dict[str, Any]:
    report = measure_server(blocks, clients=clients, duration=duration, queries=queries, workdir=workdir,
                            cache_dir=cache_dir)
    return print_and_write(report, print_server, json_out)
