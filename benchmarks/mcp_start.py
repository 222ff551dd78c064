"""`gieok bench mcp-start`: how long an MCP client that spawns `gieok mcp` waits for its first answer.

An IDE assistant starts `gieok mcp --db …` (stdio) when a session begins and calls a tool at once,
so what it waits is the whole start-up: the interpreter, the imports, the key check, the memory
opening and whatever the first tool needs loaded. A fresh database gets a write key for the
default tenant; then for each run, for each first request — `tools/list`, `add_messages` (one new
message) and `get_context` (a query) — a new `gieok mcp` process is spawned through the official
MCP client (`mcp` SDK, stdio) and timed from the spawn to its `initialize` answer and to the
answer of that first request. The processes run one after another, never side by side.

With `--server`, a throwaway `gieok serve` on the same database is started first (ready and warm
before any clock starts) and each process is `gieok mcp --server URL`: the relay
(client/mcp_relay.py), which opens no memory and hands every message to the server's `/mcp`.

Reported per first request: the p50 (and max) over the runs of spawn → initialized and of
spawn → first answer. The target (issue 41, never adjusted): the first answer ≤ 1.5 s after the
spawn, for each of the three. The machine's load average before and after the runs is reported
beside them: a start-up is CPU-bound, so on a shared machine its time moves with the load. So is
each process's CPU time (user + system, spawn to exit: `cpu_s_p50`), which moves much less with
the load than the wall time, and so compares two versions measured on a busy machine.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from benchmarks.fill import bench_workdir
from benchmarks.report import median, print_and_write, results_table, table_console
from benchmarks.server import ServeProcess, create_key

__all__ = ["FIRST_CALLS", "TARGET_S", "measure_mcp_start", "print_mcp_start", "run_mcp_start_bench"]

TARGET_S = 1.5
REQUEST_SECONDS = 120.0
FIRST_CALLS = ("tools/list", "add_messages", "get_context")
CHANNEL = "bench-start"


async def _one(db: Path, key: str, first: str, run: int, workdir: Path, server: str | None = None,
               ) -> tuple[float, float]:
    """One `gieok mcp` process (`--server`: the relay to that server): (seconds from spawn to
    initialized, to the first answer)."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {name: value for name, value in os.environ.items() if not name.startswith("GIEOK_")}
    where = ["--server", server] if server else ["--db", str(db)]
    params = StdioServerParameters(command=sys.executable, args=["-m", "gieok.cli", "mcp", *where],
                                   env={**env, "GIEOK_API_KEY": key, "OMP_WAIT_POLICY": "PASSIVE"},
                                   cwd=str(workdir))
    # The server's log goes to a file: the SDK's default is this process's stderr, which has no
    # file descriptor when the command runs inside a test's CliRunner.
    with open(workdir / "mcp-start.log", "a", encoding="utf-8") as log:
        started = time.perf_counter()
        async with Client(stdio_client(params, errlog=log), read_timeout_seconds=REQUEST_SECONDS) as client:
            initialized = time.perf_counter() - started
            if first == "tools/list":
                answered = bool((await client.list_tools()).tools)
            elif first == "add_messages":
                result = await client.call_tool("add_messages", {"channel": CHANNEL, "messages": [
                    {"id": f"m{run}", "role": "user", "user": "minji",
                     "text": f"민지: 오늘 고양이 나비랑 산책했어 (run {run}, walked the cat)"}]})
                answered = not result.is_error
            else:
                result = await client.call_tool("get_context", {"channel": CHANNEL, "user": "minji",
                                                                "query": "민지 고양이 이름"})
                answered = not result.is_error
            done = time.perf_counter() - started
    if not answered:
        raise RuntimeError(f"gieok mcp: the first {first} failed (log: {workdir / 'mcp-start.log'})")
    return initialized, done


def measure_mcp_start(runs: int = 5, *, workdir: Path | None = None, via_server: bool = False) -> dict[str, Any]:
    workdir = bench_workdir("mcp-start", workdir)
    db = workdir / "chat.db"
    for stale in workdir.glob("chat.db*"):
        stale.unlink()
    key = create_key(db)
    served = ServeProcess(db, workdir / "serve.log") if via_server else None
    try:
        report = _measure(db, key, runs, workdir, served.url if served else None)
    finally:
        if served is not None:
            served.stop()
    report["mode"] = "relay to gieok serve (gieok mcp --server)" if via_server else "gieok mcp --db"
    return report


def _measure(db: Path, key: str, runs: int, workdir: Path, server: str | None) -> dict[str, Any]:
    times: dict[str, list[tuple[float, float]]] = {first: [] for first in FIRST_CALLS}
    cpu: dict[str, list[float]] = {first: [] for first in FIRST_CALLS}
    load_before = _load_average()
    for run in range(runs):
        for first in FIRST_CALLS:
            spent = _children_cpu_s()
            times[first].append(anyio.run(_one, db, key, first, run, workdir, server))
            cpu[first].append(_children_cpu_s() - spent)  # the client has waited for the process: it is counted
    report: dict[str, Any] = {"runs": runs, "target_s": TARGET_S,
                              "load_average": {"before": load_before, "after": _load_average()},
                              "cpu_s_p50": {first: round(median(spent), 3) for first, spent in cpu.items()},
                              "first_calls": {}}
    for first, pairs in times.items():
        ready = [pair[0] for pair in pairs]
        answered = [pair[1] for pair in pairs]
        p50 = median(answered)
        report["first_calls"][first] = {"initialized_p50_s": round(median(ready), 3),
                                        "first_answer_p50_s": round(p50, 3),
                                        "first_answer_max_s": round(max(answered), 3), "pass": p50 <= TARGET_S}
    return report


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's children that have ended (and been waited for)."""
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages ([] where the system does not say)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return []


def print_mcp_start(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    mode = report.get("mode", "gieok mcp --db")
    table = results_table(f"{mode} (stdio): spawn → first answer, p50 of {report['runs']} fresh process(es) each",
                          ("first request", "initialized", "first answer", "max", "target", "result",
                           "CPU to exit"), left=("first request",))
    for first, row in report["first_calls"].items():
        cpu = report.get("cpu_s_p50", {}).get(first)
        table.add_row(first, f"{row['initialized_p50_s']:.2f} s", f"{row['first_answer_p50_s']:.2f} s",
                      f"{row['first_answer_max_s']:.2f} s", f"≤ {report['target_s']:g} s",
                      "[green]pass[/]" if row["pass"] else "[red]MISS[/]", "" if cpu is None else f"{cpu:.2f} s")
    console.print(table)
    load = report.get("load_average", {})
    if load.get("before") and load.get("after"):
        console.print(f"load average (1 min) {load['before'][0]:g} before, {load['after'][0]:g} after "
                      f"({os.cpu_count() or '?'} cores)", highlight=False)


def run_mcp_start_bench(runs: int = 5, json_out: str | Path | None = None, *,
                        workdir: Path | None = None, via_server: bool = False) -> dict[str, Any]:
    return print_and_write(measure_mcp_start(runs, workdir=workdir, via_server=via_server), print_mcp_start,
                           json_out)
