"""The runtime half of `gieok bench scale`: `gieok bench runtime`'s load split over several bot
processes that share one database and one Redis.

Each process (`bench.scale_worker`) is a full BotCore with `shared=SharedChannels`; the driver
sends every message of the schedule (channels × rate × duration, each an explicit call with a tag
"[cNN-mMMM]") to one process chosen at random — as a load balancer, or Discord replicas, would —
so one channel's messages arrive at every process. The loopback provider echoes the tags of the
messages a reply answers. After every process has shut down gracefully the driver checks:
every message stored once as a turn (lost / stored twice), every tag answered by exactly one reply
across all processes (duplicate replies), and every reply only in its own channel (misrouted)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import IO, Any

from rich.console import Console

from benchmarks.loopback_llm import TAG, loopback_llm
from benchmarks.report import p50_p95, progress_bar, results_table, table_console
from benchmarks.runtime import ARRIVALS, QUESTIONS, arrival_schedule
from benchmarks.scale_worker import READY
from gieok.memory import Memory

__all__ = ["measure_shared_runtime", "print_shared_runtime"]

START_SECONDS = 300.0  # a worker loading the model and its indexes on a busy machine


def _start_worker(db: str, redis: str, namespace: str, llm_url: str, lease_seconds: float,
                  processes: int) -> subprocess.Popen[str]:
    # Each process embeds with OpenMP threads, one per core by default: several processes on one
    # machine oversubscribe the cores and OpenMP's barriers collapse (as for `gieok serve --workers`).
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // processes))
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.scale_worker", "--db", db, "--redis", redis, "--namespace", namespace,
         "--llm-url", llm_url, "--lease-seconds", str(lease_seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8",
        env={**os.environ, "OMP_NUM_THREADS": threads})


def _wait_ready(worker: subprocess.Popen[str]) -> None:
    assert worker.stdout is not None
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        line = worker.stdout.readline()
        if line.strip() == READY:
            return
        if not line and worker.poll() is not None:
            raise RuntimeError(f"a bot process exited while starting (exit code {worker.returncode})")
    raise RuntimeError("a bot process did not start in time")


def _send(stdin: IO[str], item: dict[str, Any]) -> None:
    stdin.write(json.dumps(item, ensure_ascii=False) + "\n")
    stdin.flush()


def measure_shared_runtime(db: str, redis: str, *, processes: int = 2, channels: int = 20, duration: float = 30.0,
                           rate: float = 1.0, arrivals: str = "random", seed: int = 7,
                           lease_seconds: float = 30.0) -> dict[str, Any]:
    """Run the load against `processes` bot processes on database `db` (already holding whatever
    background it should) and Redis `redis`; returns the `runtime` section of `bench scale`."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, not {arrivals!r}")
    schedule = arrival_schedule(channels, duration, rate, arrivals, seed)
    chooser = random.Random(seed + 1)
    namespace = f"bench-scale-{uuid.uuid4().hex[:8]}"  # a run never meets an earlier run's keys
    sent: dict[str, str] = {}  # tag -> channel
    reports: list[dict[str, Any]] = []
    with loopback_llm() as llm_url:
        workers = [_start_worker(db, redis, namespace, llm_url, lease_seconds, processes) for _ in range(processes)]
        try:
            for worker in workers:
                _wait_ready(worker)
            started = time.monotonic()
            title = (f"{channels} channels × {rate:g} msg/s × {duration:g} s ({arrivals}) "
                     f"over {processes} bot processes")
            with progress_bar(title, len(schedule)) as advance:
                for at, c, number in schedule:
                    delay = started + at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    tag = f"[c{c:02d}-m{number:03d}]"
                    channel = f"scale-{c:02d}"
                    sent[tag] = channel
                    target = workers[chooser.randrange(processes)]
                    assert target.stdin is not None
                    _send(target.stdin, {"channel": channel, "guild": "bench-guild", "user": f"u{c:02d}",
                                         "text": f"누리야 {tag} {QUESTIONS[number % len(QUESTIONS)]}",
                                         "id": f"{c}-{number}"})
                    advance()
            behind = time.monotonic() - started - (schedule[-1][0] if schedule else 0.0)
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.close()  # end of messages: answer what is queued, then report
            for worker in workers:
                assert worker.stdout is not None
                lines = worker.stdout.read().strip().splitlines()
                if worker.wait(timeout=START_SECONDS) != 0 or not lines:
                    raise RuntimeError(f"a bot process failed (exit code {worker.returncode})")
                reports.append(json.loads(lines[-1]))
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
    return _check(db, sent, reports, processes, behind)


def _check(db: str, sent: dict[str, str], reports: list[dict[str, Any]], processes: int,
           behind: float) -> dict[str, Any]:
    answered: Counter[str] = Counter()
    misrouted = 0
    for report in reports:
        for reply in report["replies"]:
            tags = TAG.findall(reply["text"])
            answered.update(tags)
            if any(sent.get(tag) != reply["channel"] for tag in tags):
                misrouted += 1
    with Memory(db) as memory:
        stored: Counter[str] = Counter(tag for block in memory.iter_blocks()
                                       if block.kind == "turn" and block.metadata.get("role") == "user"
                                       for tag in TAG.findall(block.text))
        chain_ok = memory.verify().ok
    overheads = [ms for report in reports for ms in report["turn_overhead_ms"]]
    return {
        "processes": processes,
        "messages_sent": len(sent),
        "messages_lost": sum(1 for tag in sent if stored[tag] == 0),
        "messages_stored_twice": sum(1 for tag in sent if stored[tag] > 1),
        "duplicate_replies": sum(count - 1 for count in answered.values() if count > 1),
        "misrouted_replies": misrouted,
        "messages_answered": sum(1 for tag in sent if answered[tag] > 0),
        "replies": sum(len(report["replies"]) for report in reports),
        "chain_verified": chain_ok,
        "turn_overhead_ms": p50_p95(overheads),
        "seconds_behind_schedule": round(max(0.0, behind), 2),
        "per_process": [{"replies": len(report["replies"]), "turns": len(report["batches"]),
                         **{k: report["health"][k] for k in ("messages_in", "duplicates", "merged")},
                         "shared_failures": report["shared_failures"]} for report in reports],
    }


def print_shared_runtime(report: dict[str, Any], load: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    table = results_table(f"runtime: {load['channels']} channels × {load['rate']:g} msg/s × {load['seconds']:g} s "
                          f"split over {report['processes']} bot processes sharing Redis (loopback provider)",
                          ("sent", "lost", "stored twice", "duplicate replies", "misrouted", "answered", "replies",
                           "turn overhead p50", "p95"))
    table.add_row(str(report["messages_sent"]), str(report["messages_lost"]), str(report["messages_stored_twice"]),
                  str(report["duplicate_replies"]), str(report["misrouted_replies"]),
                  str(report["messages_answered"]), str(report["replies"]),
                  f"{report['turn_overhead_ms']['p50']:.1f} ms", f"{report['turn_overhead_ms']['p95']:.1f} ms")
    console.print(table)
    console.print("per process: " + "; ".join(
        f"{p['messages_in']} in, {p['replies']} replies, {p['turns']} turns" for p in report["per_process"]),
        highlight=False)
